"""Where a file went: git's rename rule, the one both drift and rebase follow a file by.

A base file the target lacks was renamed to the most similar target file, at least half
alike (git's rename detection: the share of bytes in lines both have), looked for first
among the target's files of the same name, then among the target's files of the same kind
that the base lacks. The target's file list is read once per target (`Files`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path, PurePosixPath

ALIKE = 0.5  # git's default rename threshold (-M50%)


def similarity(a: bytes, b: bytes, *, lines: Counter[bytes] | None = None) -> float:
    """How alike two files are, as git's rename detection measures it: the share of their
    bytes in lines both have (each line counted as often as both have it). `lines`: `a`'s
    lines counted already (one file compared with many)."""
    if not a and not b:
        return 1.0
    if 2 * min(len(a), len(b)) < ALIKE * (len(a) + len(b)):
        return 2 * min(len(a), len(b)) / (len(a) + len(b))  # at most that: sizes too apart
    mine = lines if lines is not None else Counter(a.splitlines(keepends=True))
    theirs = Counter(b.splitlines(keepends=True))
    if len(theirs) < len(mine):
        mine, theirs = theirs, mine
    common = sum(len(line) * min(n, theirs[line]) for line, n in mine.items())
    return 2 * common / (len(a) + len(b))


class Files:
    """A target's files by name, and those a base lacks (read once, lazily)."""

    def __init__(self, target: Path, base: Path | None) -> None:
        self.target, self.base = target, base
        self._by_name: dict[str, list[str]] | None = None
        self._new: list[str] | None = None

    def by_name(self) -> dict[str, list[str]]:
        """The target's regular files (no links, nothing under .git) by file name."""
        if self._by_name is None:
            found: dict[str, list[str]] = {}
            folders = [("", self.target)]
            while folders:
                prefix, folder = folders.pop()
                try:
                    entries = list(os.scandir(folder))
                except OSError:  # a folder that cannot be read has no candidates (as glob)
                    continue
                for entry in entries:
                    if entry.is_symlink() or entry.name == ".git":
                        continue
                    if entry.is_dir():
                        folders.append((f"{prefix}{entry.name}/", Path(entry.path)))
                    elif entry.is_file():
                        found.setdefault(entry.name, []).append(prefix + entry.name)
            self._by_name = {name: sorted(rels) for name, rels in sorted(found.items())}
        return self._by_name

    def new(self) -> list[str]:
        """The target's files the base does not have (where a renamed file may be)."""
        if self._new is None:
            base = self.base
            self._new = [rel for files in self.by_name().values() for rel in files
                         if base is None or not (base / rel).exists()]
        return self._new

    def renamed(self, rel: str, data: bytes,
                read: Callable[[str], bytes | None]) -> str | None:
        """Where the base file `rel` (`data` in the base) went in the target by git's rename
        rule, or None. `read` gives a candidate's bytes (as the caller sees the target)."""
        suffix = PurePosixPath(rel).suffix
        same = self.by_name().get(PurePosixPath(rel).name, [])
        lines = Counter(data.splitlines(keepends=True))
        for candidates in (same, [o for o in self.new() if o.endswith(suffix)]):
            best: tuple[float, str] | None = None
            for other in candidates:
                found = read(other) if other != rel else None
                if found is None:
                    continue
                score = similarity(data, found, lines=lines)
                if score >= ALIKE and (best is None or score > best[0]):
                    best = (score, other)
            if best is not None:
                return best[1]
        return None
