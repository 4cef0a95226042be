"""Per-hunk application of a patch series, on a scratch copy of the files it touches.

GNU patch does all the matching, so offsets and fuzz are its own figures. Each file of each
patch goes to it alone, and its per-hunk verdicts are read back. A hunk it cannot place is
tried once more, alone and reversed (dry run): if its new side is already there, the hunk is
`already-applied`, else `failed`, with a reason. A hunk it places only with fuzz or at an
offset is tried reversed too: when its new side matches better than its old side did, it is
already applied (GNU patch would have added it a second time). A patch is kept in the scratch
when none of its hunks failed (its already-applied hunks are skipped, the others applied);
otherwise it is left out and the next patches run without it.

GNU patch runs with --force, not --batch: --batch takes a first hunk that looks reversed as a
reason to apply the whole file reversed, and --forward skips the whole file; --force assumes
the patch is not reversed, so every hunk gets its own verdict.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from types import TracebackType

from portkit.errors import InputError, PortkitError, ToolFailed, ToolMissing
from portkit.paths import path_problem
from portkit.proc import git, last_line
from portkit.series import (
    EXECUTABLE,
    REGULAR,
    SYMLINK,
    FileDiff,
    Hunk,
    Patch,
    Series,
    parse_patch,
    quote_path,
)
from portkit.transaction import checkpoint


class Landed(StrEnum):
    """What the patch engine (GNU patch) says of one hunk."""

    CLEAN = "clean"
    OFFSET = "offset"
    FUZZ = "fuzz"
    ALREADY = "already-applied"
    FAILED = "failed"


CLEAN, OFFSET, FUZZ, ALREADY, FAILED = Landed
LANDED = (CLEAN, OFFSET, FUZZ)
SEVERITY = {CLEAN: 0, OFFSET: 1, FUZZ: 2, ALREADY: 3, FAILED: 4}
DEFAULT_FUZZ = 2

# Variables that change what GNU patch does or prints.
_PATCH_ENV = ("POSIXLY_CORRECT", "PATCH_GET", "PATCH_VERSION_CONTROL", "VERSION_CONTROL",
              "SIMPLE_BACKUP_SUFFIX", "QUOTING_STYLE")


@dataclass(frozen=True)
class HunkResult:
    patch: str  # the patch's file name
    file: str  # the file in the tree
    index: int  # the hunk's index within its file, from 0 (GNU patch's "Hunk #" is index + 1)
    old_start: int
    status: Landed
    offset: int = 0  # lines from where the hunk says it belongs (GNU patch's figure)
    fuzz: int = 0
    # where it landed (GNU patch's figure, in the patched file), where its new side was found
    # (already-applied, in the file before the patch), or where GNU patch expected it (failed)
    line: int | None = None
    reason: str = ""  # why it failed
    hunk: Hunk | None = field(default=None, repr=False, compare=False)

    @property
    def landed(self) -> bool:
        return self.status in LANDED

    def describe(self) -> str:
        """One line: which hunk, what happened, where."""
        where = f"{self.patch}: {self.file} hunk #{self.index + 1} (@@ -{self.old_start})"
        if self.status == FAILED:
            at = f" at line {self.line}" if self.line is not None else ""
            return f"{where} failed{at}: {self.reason}"
        figures = [f"offset {self.offset:+d}"] if self.offset else []
        figures += [f"fuzz {self.fuzz}"] if self.fuzz else []
        extra = f" ({', '.join(figures)})" if figures else ""
        at = f" at line {self.line}" if self.line is not None else ""
        return f"{where} {self.status}{at}{extra}"


@dataclass
class PatchResult:
    patch: Patch
    hunks: list[HunkResult]
    applied: bool  # kept in the scratch (no hunk failed)
    problems: list[str] = field(default_factory=list)  # file-level failures, one line each

    @property
    def worst(self) -> str:
        if self.problems:
            return FAILED
        return max((h.status for h in self.hunks), key=SEVERITY.__getitem__, default=CLEAN)

    @property
    def failed(self) -> list[HunkResult]:
        return [h for h in self.hunks if h.status == FAILED]


@dataclass
class SeriesResult:
    """What the series did to the scratch copy. Use it as a context manager (or call close)
    to delete the scratch folder."""

    patches: list[PatchResult]
    files: dict[str, bytes | None]  # final bytes of every touched file; None: absent
    scratch: Path  # the scratch copy of the touched files, laid out as in the tree
    _tmp: tempfile.TemporaryDirectory[str] = field(repr=False)
    # git's mode of every touched file that is present at the end (REGULAR, EXECUTABLE or
    # SYMLINK); a symbolic link's bytes in `files` (and in the scratch) are its target
    modes: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every hunk landed (clean, offset or fuzz) and every patch was applied."""
        return all(p.applied and all(h.landed for h in p.hunks) for p in self.patches)

    @property
    def hunks(self) -> list[HunkResult]:
        return [h for p in self.patches for h in p.hunks]

    def close(self) -> None:
        self._tmp.cleanup()

    def __enter__(self) -> SeriesResult:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def apply_hunks(series: Series | Sequence[Patch], root: Path, *, fuzz: int = DEFAULT_FUZZ,
                reverse: bool = False, exact: bool = False) -> SeriesResult:
    """Apply `series` patch after patch to a scratch copy of the files it touches under `root`
    (the tree itself is never written) and report every hunk. `reverse` takes the series out
    (last patch first); `exact` allows no fuzz and no offset."""
    patches = list(series.patches if isinstance(series, Series) else series)
    for patch in patches:
        _refuse_unsafe_paths(patch)
    _check_gnu_patch()
    if reverse:
        patches.reverse()
    tmp = tempfile.TemporaryDirectory(prefix="portkit-hunks-")
    try:
        base = Path(tmp.name)
        tree = base / "tree"
        tree.mkdir()
        paths = list(dict.fromkeys(p for patch in patches for p in patch.paths))
        modes = {}
        for rel in paths:
            mode = _copy_in(root / rel, tree / rel)
            if mode is not None:
                modes[rel] = mode
        run = _Run(tree, base / "try", 0 if exact else fuzz, reverse, exact, modes)
        results = [run.patch(patch) for patch in patches]
        files = {rel: ((tree / rel).read_bytes() if (tree / rel).is_file() else None)
                 for rel in paths}
    except BaseException:
        tmp.cleanup()
        raise
    return SeriesResult(results, files, tree, tmp,
                        {rel: run.modes.get(rel, REGULAR) for rel, data in files.items()
                         if data is not None})


def _copy_in(src: Path, dst: Path) -> int | None:
    """Copy a tree's file into the scratch, never following a symbolic link: a link is
    copied as a file holding its target (its text in a git diff). Its git mode, None when
    there is no file."""
    try:
        st = src.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        data, mode = os.fsencode(os.readlink(src)), SYMLINK
    elif stat.S_ISREG(st.st_mode):
        data, mode = src.read_bytes(), EXECUTABLE if st.st_mode & 0o100 else REGULAR
    else:
        return None
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)
    return mode


def _refuse_unsafe_paths(patch: Patch) -> None:
    """A hostile series must not reach outside the scratch copy (parse_patch refuses such
    paths already: this holds for a Patch made some other way too)."""
    for f in patch.files:
        for path in (f.old_path, f.new_path):
            if path is not None and (problem := path_problem(path)):
                raise InputError(f"{patch.name}: refusing {quote_path(path)}: {problem}")


@functools.cache
def _check_gnu_patch() -> None:
    out = _gnu(["--version"])[1]
    if not out or "GNU patch" not in out[0]:
        raise ToolMissing("`patch` is not GNU patch: install the Debian package `patch`")


# What GNU patch says about a patch it cannot read, as opposed to its own failures.
_PATCH_PROBLEM = re.compile(r"malformed patch|Only garbage|unexpected end of|unexpectedly ends|"
                            r"can't find file|Reversed|not a regular file|refusing")


def _gnu(args: list[str], cwd: Path | None = None) -> tuple[int, list[str]]:
    """Run GNU patch in the C locale; its exit code and output lines. (Not proc.run, which
    inherits stdin and decodes strictly: GNU patch prints file names as raw bytes.)"""
    return _gnu_end(_gnu_start(args, cwd))


def _gnu_start(args: list[str], cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """GNU patch started (see `_gnu`); `_gnu_end` waits for it and reads what it said."""
    env = {k: v for k, v in os.environ.items() if k not in _PATCH_ENV}
    env["LC_ALL"] = "C"
    checkpoint("run:patch")
    try:
        return subprocess.Popen(["patch", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError as exc:
        raise ToolMissing("GNU patch not found: install the Debian package `patch`, or put "
                          "it on PATH") from exc


def _gnu_end(proc: subprocess.Popen[bytes]) -> tuple[int, list[str]]:
    stdout, stderr = proc.communicate()
    out = (stdout + stderr).decode("utf-8", "surrogateescape")
    lines = out.splitlines()
    trouble = next((ln[len("patch: **** "):] for ln in lines if ln.startswith("patch: **** ")
                    and not _PATCH_PROBLEM.search(ln)), None)
    if proc.returncode not in (0, 1, 2) or (proc.returncode == 2 and trouble):
        # GNU patch itself failed (a full disk, a signal): not a verdict on any hunk
        last = trouble or next((ln for ln in reversed(lines) if ln.strip()), "")
        raise ToolFailed(f"GNU patch failed (exit {proc.returncode}): {last}")
    return proc.returncode, lines


@dataclass(frozen=True)
class _Verdict:
    """GNU patch's line about one hunk."""

    word: str  # succeeded, FAILED or ignored
    line: int
    fuzz: int
    offset: int
    note: str  # another parenthesis, e.g. "different line endings"


_HUNK_LINE = re.compile(r"Hunk #(\d+) (succeeded|FAILED|ignored) at (-?\d+)(.*)\.$")


def _verdicts(lines: list[str]) -> dict[int, _Verdict]:
    found = {}
    for line in lines:
        if m := _HUNK_LINE.match(line):
            tail = m.group(4)
            fuzz = re.search(r"with fuzz (\d+)", tail)
            offset = re.search(r"\(offset (-?\d+) lines?\)", tail)
            note = re.search(r"\((?!offset )([^)]*)\)", tail)
            found[int(m.group(1))] = _Verdict(
                m.group(2), int(m.group(3)), int(fuzz.group(1)) if fuzz else 0,
                int(offset.group(1)) if offset else 0, note.group(1) if note else "")
    return found


def _fatal(lines: list[str]) -> str | None:
    """GNU patch's own error, if it gave one (malformed patch, not a regular file, ...)."""
    for line in lines:
        if line.startswith("patch: **** "):
            return line[len("patch: **** "):]
        if "-- refusing to patch" in line or "can't patch" in line:
            return line
    return None


def _own_section(patch: Patch, f: FileDiff) -> str | None:
    """The patch's own text of a file's `diff --git` section (a binary one's data with it):
    the section that names the file's paths, however it quotes and prefixes them."""
    for section in re.split(r"(?m)^(?=diff --git )", patch.diff)[1:]:
        text = section if section.endswith("\n") else section + "\n"
        try:
            files = parse_patch(patch.name, text.encode("utf-8", "surrogateescape"),
                                strip=patch.strip).files
        except PortkitError:
            continue
        if [(g.old_path, g.new_path) for g in files] == [(f.old_path, f.new_path)]:
            return text
    return None


def _ended(name: str) -> str:
    return name + "\t" if " " in name and not name.startswith('"') else name


def _section(f: FileDiff, hunks: Sequence[str]) -> str:
    """One file of a patch as GNU patch reads it, with `hunks` as its hunks. Names are the
    tree paths under a/ and b/ (run with -p1), so GNU patch sees what unidiff read."""
    old = quote_path("a/" + f.old_path) if f.old_path else "/dev/null"
    new = quote_path("b/" + f.new_path) if f.new_path else "/dev/null"
    out = []
    if f.git:
        out.append(f"diff --git {quote_path('a/' + (f.old_path or f.path))} "
                   f"{quote_path('b/' + (f.new_path or f.path))}\n")
        for line in f.extended:
            key = re.match(r"(rename|copy) (from|to) ", line)
            if key:
                path = f.old_path if key.group(2) == "from" else f.new_path
                out.append(f"{key.group(0)}{quote_path(path or '')}\n")
            elif line.startswith(("new file mode ", "deleted file mode ")):
                # modes are the engine's own business (_Run.modes): GNU patch sees every
                # file, a symbolic link too, as a regular file holding its text
                out.append(line.rsplit(" ", 1)[0] + " 100644\n")
            elif not line.startswith(("index ", "old mode ", "new mode ")):
                out.append(line if line.endswith("\n") else line + "\n")
    if hunks:  # a name with a space ends at a tab, as git writes it (GNU patch reads so)
        out += [f"--- {_ended(old)}\n", f"+++ {_ended(new)}\n"]
        out += [h if h.endswith("\n") else h + "\n" for h in hunks]
    return "".join(out)


class _Run:
    """One application of a series: the scratch tree, and a try folder for each patch."""

    def __init__(self, tree: Path, trial: Path, fuzz: int, reverse: bool, exact: bool,
                 modes: dict[str, int]) -> None:
        self.tree = tree
        self.trial = trial
        self.fuzz = fuzz
        self.reverse = reverse
        self.exact = exact
        self.modes = modes  # git's mode of each file present in the scratch tree
        # GNU patch's output for a file's whole section, run ahead of `_section` (see
        # `_run_ahead`), by (file, its hunks' numbers)
        self._ahead: dict[tuple[str, tuple[int, ...]], list[str]] = {}

    def patch(self, patch: Patch) -> PatchResult:
        shutil.rmtree(self.trial, ignore_errors=True)
        self.trial.mkdir()
        for rel in patch.paths:
            if (self.tree / rel).is_file():
                (self.trial / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(self.tree / rel, self.trial / rel)
        result = PatchResult(patch, [], applied=False)
        for f in patch.files:
            self._file(patch, f, result)
        result.applied = not result.problems and not result.failed
        if result.applied:
            for f in patch.files:
                self._carry_mode(f)
            for rel in patch.paths:
                src, dst = self.trial / rel, self.tree / rel
                if src.is_file():
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dst)
                else:
                    dst.unlink(missing_ok=True)
        return result

    def _carry_mode(self, f: FileDiff) -> None:
        """The file's git mode once the patch is in (or out, reversed), as git apply sets it:
        the side's own mode where the patch says it, else the mode the file had."""
        old, new = (f.new_path, f.old_path) if self.reverse else (f.old_path, f.new_path)
        old_mode, new_mode = (f.new_mode, f.old_mode) if self.reverse else (f.old_mode,
                                                                             f.new_mode)
        had = self.modes.get(old, REGULAR) if old is not None else REGULAR
        moved = old != new and not f.is_copy
        if old is not None and (new is None or moved):
            self.modes.pop(old, None)
        if f.is_copy and self.reverse:
            self.modes.pop(f.new_path or "", None)  # the copy goes; its source stays
            return
        if new is not None:
            self.modes[new] = new_mode if f.git and new_mode is not None else had

    def _args(self, patch_file: Path, *, reverse: bool, dry_run: bool) -> list[str]:
        return ["--force", "--verbose", "-p1", "--no-backup-if-mismatch", "--reject-file=-",
                f"--fuzz={self.fuzz}", *(["-R"] if reverse else []),
                *(["--dry-run"] if dry_run else []), "-i", str(patch_file)]

    def _run_ahead(self, patch: Patch) -> None:
        """GNU patch on each file of a patch that changes several files in place (no
        creation, removal, rename, copy or binary: each run reads and writes its own file
        only), all at once: `_section` then reads each file's output as if it had run GNU
        patch itself, one file after the other (the two cores overlap the runs)."""
        files = patch.files
        if len(files) < 2 or len({f.path for f in files}) < len(files) or not all(
                f.hunks and not f.binary and f.status == "modified" and not f.is_copy
                and f.old_path == f.new_path for f in files):
            return
        started: list[tuple[FileDiff, subprocess.Popen[bytes]]] = []
        failed = ""  # the first run's failure (each waited for all the same)
        try:
            for number, f in enumerate(files):
                section = self.trial.parent / f"section-{number}.diff"
                section.write_bytes(_section(f, [h.text for h in f.hunks]).encode(
                    "utf-8", "surrogateescape"))
                started.append((f, _gnu_start(self._args(section, reverse=self.reverse,
                                                          dry_run=False), self.trial)))
            for f, proc in started:
                try:
                    self._ahead[(f.path, tuple(h.index for h in f.hunks))] = _gnu_end(proc)[1]
                except ToolFailed as exc:
                    failed = failed or str(exc)
        except BaseException:  # one failed to start, or a signal: none is left running
            self._ahead.clear()
            for _, proc in started:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            raise
        if failed:
            self._ahead.clear()
            raise ToolFailed(failed)

    def _write(self, text: str) -> Path:
        """The patch file GNU patch reads next (one at a time)."""
        path = self.trial.parent / "section.diff"
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        return path

    def _file(self, patch: Patch, f: FileDiff, result: PatchResult) -> None:
        if f.binary:
            self._binary(patch, f, result)
            return
        if self.reverse and f.is_copy and f.new_path is not None:
            # A copy taken out is its new file taken out: its hunks undone on it, then it goes.
            done = len(result.hunks)
            self._file(patch, replace(f, old_path=f.new_path, status="modified", extended=()),
                       result)
            if not result.problems and all(h.landed for h in result.hunks[done:]):
                (self.trial / f.new_path).unlink(missing_ok=True)
            return
        if not f.hunks:
            problems = len(result.problems)
            self._hunkless(f, result)
            if f.text_free and f.status != "modified" or f.mode_changed:
                # what git apply does from the header alone is a change the report shows
                carried = len(result.problems) == problems
                result.hunks.append(HunkResult(
                    patch.name, f.path, 0, 0, CLEAN if carried else FAILED,
                    reason="" if carried else result.problems[-1], hunk=f.header_hunk()))
            return
        if SYMLINK not in (f.old_mode, f.new_mode) and any(
                p and self.modes.get(p) == SYMLINK for p in (f.old_path, f.new_path)):
            # the tree has a symbolic link where the patch changes a file's text: GNU patch
            # ("not a regular file") and git apply ("wrong type") refuse it
            result.hunks += [HunkResult(patch.name, f.path, h.index, h.old_start, FAILED,
                                        reason="a symbolic link in the tree, where the patch "
                                        "changes a file", hunk=h) for h in f.hunks]
            return
        # A hunk GNU patch placed but whose new side turns out to be there already is taken
        # out, and the file patched again without it (GNU patch would have doubled it).
        settled: dict[int, HunkResult] = {}
        while True:
            todo = [h for h in f.hunks if h.index not in settled]
            results, doubled = self._section(patch, f, todo) if todo else ([], [])
            if not doubled or any(r.status == FAILED for r in results):
                break
            settled.update((r.index, r) for r in doubled)
            self._restore(f)
        result.hunks += sorted([*settled.values(), *results], key=lambda r: r.index)

    def _section(self, patch: Patch, f: FileDiff,
                 hunks: list[Hunk]) -> tuple[list[HunkResult], list[HunkResult]]:
        """GNU patch's run over these hunks of the file in the try folder: a result for each,
        and those it applied that were there already."""
        lines = self._ahead.pop((f.path, tuple(h.index for h in hunks)), None)
        if lines is None:
            section = self._write(_section(f, [h.text for h in hunks]))
            _, lines = _gnu(self._args(section, reverse=self.reverse, dry_run=False),
                            self.trial)
        verdicts = _verdicts(lines)
        missing = any("can't find file to patch" in line for line in lines)
        fatal = _fatal(lines)
        results, doubled = [], []
        last_offset = 0  # GNU patch looks for a hunk where the one before it landed
        # a deletion whose lines GNU patch took out, but not the file: it has more than the
        # patch deletes (upstream added to it), and neither GNU patch nor git deletes it
        kept = (f.status == ("created" if self.reverse else "deleted")) and any(
            line.startswith("Not deleting file") for line in lines)
        for number, hunk in enumerate(hunks, 1):
            verdict = verdicts.get(number)
            if kept and verdict is not None and verdict.word == "succeeded":
                verdict = None
            start = hunk.new_start if self.reverse else hunk.old_start
            base = HunkResult(patch.name, f.path, hunk.index, hunk.old_start, FAILED, hunk=hunk)
            if verdict is not None and verdict.word == "succeeded":
                hr = self._landed(f, hunk, base, verdict, start + last_offset)
                if hr.landed:
                    last_offset = hr.offset
                elif hr.status == ALREADY:
                    doubled.append(hr)
                results.append(hr)
                continue
            # either name will do: a creation's file may be there, a rename may be done
            exists = any((self.tree / p).is_file() for p in (f.old_path, f.new_path) if p)
            removing = (f.status == "created") if self.reverse else (f.status == "deleted")
            found = self._already_there(f, hunk, start + last_offset, self.fuzz) if (
                exists or removing) else None
            if found is not None:
                results.append(self._already(base, hunk, found, start))
                continue
            line = verdict.line if verdict is not None and verdict.word == "FAILED" else None
            results.append(replace(base, line=line, reason=self._reason(
                f, verdict, missing, exists, fatal, lines)))
        return results, doubled

    def _landed(self, f: FileDiff, hunk: Hunk, base: HunkResult, verdict: _Verdict,
                at: int) -> HunkResult:
        """A hunk GNU patch placed. Placed with fuzz or offset, it may rather be there already:
        when its new side is found too, the match that checks more of the hunk's lines (a
        side's lines less the context fuzz ignored at each end) wins, then the nearer one."""
        start = hunk.new_start if self.reverse else hunk.old_start
        if verdict.fuzz or verdict.offset:
            found = self._already_there(f, hunk, at, self.fuzz)
            placed, present = ((hunk.new_lines, hunk.old_lines) if self.reverse
                               else (hunk.old_lines, hunk.new_lines))
            if found is not None and (
                    len(placed) - 2 * verdict.fuzz, -abs(verdict.offset)) < (
                    len(present) - 2 * found.fuzz, -abs(found.line - start)):
                return self._already(base, hunk, found, start)
        if self.exact and verdict.offset:
            return replace(base, line=verdict.line, offset=verdict.offset,
                           reason=f"found {verdict.offset:+d} lines away; exact mode takes "
                                  "no offset")
        status = FUZZ if verdict.fuzz else OFFSET if verdict.offset else CLEAN
        return replace(base, status=status, offset=verdict.offset, fuzz=verdict.fuzz,
                       line=verdict.line)

    @staticmethod
    def _already(base: HunkResult, hunk: Hunk, found: _Verdict, start: int) -> HunkResult:
        offset = found.line - start if hunk.old_len and hunk.new_len else 0
        return replace(base, status=ALREADY, line=found.line, offset=offset, fuzz=found.fuzz)

    def _already_there(self, f: FileDiff, hunk: Hunk, at: int, fuzz: int) -> _Verdict | None:
        """GNU patch's verdict on undoing this hunk alone (dry run, up to `fuzz`) in the scratch
        tree as it stands before the patch: a success means its new side is there already.
        The hunk is moved to where the forward attempt looked, and given its own start as the
        line to report, so that the line GNU patch prints is where the new side was found."""
        if not self._could_be_there(f, hunk):
            return None
        text = hunk.text
        if hunk.old_len and hunk.new_len:  # a creation or deletion keeps its 0,0 side
            header, body = text.split("\n", 1)
            tail = re.sub(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", "", header)
            text = f"@@ -{at},{hunk.old_len} +{at},{hunk.new_len} @@{tail}\n{body}"
        section = self._write(_section(f, [text]))
        args = self._args(section, reverse=not self.reverse, dry_run=True)
        args = [f"--fuzz={fuzz}" if a.startswith("--fuzz=") else a for a in args]
        _, lines = _gnu(args, self.tree)
        verdict = _verdicts(lines).get(1)
        return verdict if verdict is not None and verdict.word == "succeeded" else None

    def _could_be_there(self, f: FileDiff, hunk: Hunk) -> bool:
        """False when undoing the hunk cannot succeed, without asking GNU patch: a line it
        would have to take out again (one the hunk adds; one it removes, when undoing) is
        nowhere in the file (not even as part of a line), and fuzz only ever spares context
        lines."""
        need = hunk.removed if self.reverse else hunk.added
        path = next((self.tree / p for p in (f.new_path, f.old_path)
                     if p and (self.tree / p).is_file()), None)
        if not need or path is None:
            return True  # GNU patch says
        data = path.read_bytes()
        return all(line.rstrip("\r\n").encode("utf-8", "surrogateescape") in data
                   for line in need)

    def _restore(self, f: FileDiff) -> None:
        """The try folder's copy of the file as the scratch tree has it."""
        for rel in (f.old_path, f.new_path):
            if rel is None:
                continue
            if (self.tree / rel).is_file():
                (self.trial / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(self.tree / rel, self.trial / rel)
            else:
                (self.trial / rel).unlink(missing_ok=True)

    def _reason(self, f: FileDiff, verdict: _Verdict | None, missing: bool, exists: bool,
                fatal: str | None, lines: list[str]) -> str:
        creating = (f.status == "deleted") if self.reverse else (f.status == "created")
        if fatal:
            return fatal
        if missing or (not exists and not creating):
            return "file missing"
        if creating and exists:
            return "file exists"
        if any(line.startswith("Not deleting file") for line in lines):
            return "file differs from the one the patch deletes"
        if verdict is None:
            return "GNU patch said nothing about this hunk"
        if verdict.note:
            return verdict.note
        return "context not found"

    def _binary(self, patch: Patch, f: FileDiff, result: PatchResult) -> None:
        """A binary file's section, as git applies it (GNU patch has no binary patches):
        it applies where the file is the one the patch was made on (its blob id), it is
        there already where it is the one the patch makes."""
        text = _own_section(patch, f)
        if text is None:
            result.problems.append(f"{f.path}: binary patch whose section cannot be found")
            return
        section = self._write(text)

        def git_apply(*more: str) -> subprocess.CompletedProcess[str]:
            return git(["apply", "--binary", f"-p{patch.strip}", *more, section],
                       cwd=self.trial, check=False, ceiling=self.trial)

        done = git_apply(*(["-R"] if self.reverse else []))
        if done.returncode == 0:
            status, reason = CLEAN, ""
        elif git_apply("--check", *([] if self.reverse else ["-R"])).returncode == 0:
            status, reason = ALREADY, ("the file is the one this binary patch was made on"
                                       if self.reverse else
                                       "the file is the one this binary patch makes")
        else:
            status, reason = FAILED, f"binary patch: {last_line(done) or 'it does not apply'}"
        result.hunks.append(HunkResult(patch.name, f.path, 0, 0, status, reason=reason,
                                       hunk=f.header_hunk()))

    def _hunkless(self, f: FileDiff, result: PatchResult) -> None:
        """A rename, mode change or empty-file creation or deletion, without hunks."""
        old = f.new_path if self.reverse else f.old_path
        new = f.old_path if self.reverse else f.new_path
        if f.status == "modified":
            if f.mode_changed and not (self.trial / f.path).is_file():
                result.problems.append(f"{f.path}: file missing (to change its mode)")
            return  # a mode change (_carry_mode) or an `index` line alone: no text to patch
        if old is not None and new is not None and old != new:
            if not (self.trial / old).exists():
                if not (self.trial / new).exists():
                    result.problems.append(f"{old}: file missing (to rename to {new})")
                return  # renamed already
        elif old is None and new is not None and (self.trial / new).exists():
            if (self.trial / new).stat().st_size:
                result.problems.append(f"{new}: file exists")
            return
        elif new is None and old is not None and not (self.trial / old).exists():
            return  # deleted already
        section = self._write(_section(f, []))
        code, lines = _gnu(self._args(section, reverse=self.reverse, dry_run=False), self.trial)
        if code != 0:
            last = next((ln for ln in reversed(lines) if ln.strip() and ln != "done"), "")
            result.problems.append(f"{f.path}: {_fatal(lines) or last.strip()}")
