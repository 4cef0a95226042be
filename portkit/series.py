"""Patch series as git-am mail files: write them, read them, and name them like format-patch."""

from __future__ import annotations

import difflib
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from unidiff.patch import PatchSet


@dataclass(frozen=True)
class MailPatch:
    """One patch of a series: a mail header, a message, and a unified diff."""

    subject: str
    body: str
    diff: str
    author: str
    date: str

    def files(self) -> list[str]:
        return [f.path for f in PatchSet(self.diff)]

    def stat(self) -> str:
        patch = PatchSet(self.diff)
        width = max((len(f.path) for f in patch), default=0)
        lines = [f" {f.path.ljust(width)} | {f.added + f.removed:4d} {'+' * min(f.added, 40)}"
                 f"{'-' * min(f.removed, 40)}" for f in patch]
        lines.append(f" {len(patch)} file{'s' if len(patch) != 1 else ''} changed, "
                     f"{patch.added} insertions(+), {patch.removed} deletions(-)")
        return "\n".join(lines)

    def render(self, number: int, total: int) -> str:
        commit = hashlib.sha1(f"{self.subject}\n{self.diff}".encode()).hexdigest()
        tag = f"[PATCH {number}/{total}]" if total > 1 else "[PATCH]"
        return (f"From {commit} Mon Sep 17 00:00:00 2001\n"
                f"From: {self.author}\n"
                f"Date: {self.date}\n"
                f"Subject: {tag} {self.subject}\n\n"
                f"{self.body.strip()}\n"
                f"---\n{self.stat()}\n\n"
                f"{self.diff}"
                f"-- \nportkit\n\n")


def unified_diff(path: str, before: bytes, after: bytes) -> str:
    """A git-style unified diff of one file, three lines of context."""
    a = before.decode("utf-8").splitlines(keepends=True)
    b = after.decode("utf-8").splitlines(keepends=True)
    out = [f"diff --git a/{path} b/{path}\n"]
    for line in difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", n=3):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def file_name(number: int, subject: str) -> str:
    """format-patch's file name: NNNN-subject-with-dashes.patch."""
    slug = re.sub(r"[^A-Za-z0-9._]+", "-", subject).strip("-.")[:52].rstrip("-.")
    return f"{number:04d}-{slug}.patch"


def next_number(folder: Path) -> int:
    numbers = [int(m.group(1)) for p in folder.glob("*.patch")
               if (m := re.match(r"(\d{4})-", p.name))]
    return max(numbers, default=0) + 1
