"""Patch series as data: read a folder of format-patch mails, quilt patches or plain diffs into
typed objects, write it back byte for byte, and write new patches in a series' own style.

Diffs are parsed by unidiff; this module only finds where the diff sits in a file (after the
mail header, message and diffstat; before the signature) and names what it finds. Text is
decoded as UTF-8 with surrogateescape, so any bytes survive a round trip.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import tempfile
import unicodedata
from collections import Counter
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.header import decode_header, make_header
from email.utils import parseaddr
from pathlib import Path, PurePosixPath
from typing import Literal, TypeVar

from unidiff.errors import UnidiffParseError
from unidiff.patch import Hunk as UnidiffHunk
from unidiff.patch import PatchedFile, PatchSet

from portkit.errors import (
    CoverLetter,
    FileError,
    InputError,
    PortkitError,
    ToolFailed,
    UnreadablePatch,
)
from portkit.paths import EXECUTABLE as EXECUTABLE  # git's modes, for readers of FileDiff
from portkit.paths import REGULAR as REGULAR
from portkit.paths import SYMLINK as SYMLINK
from portkit.paths import link_problem, path_problem
from portkit.proc import git

ZERO_COMMIT = "0" * 40
MBOX_DATE = "Mon Sep 17 00:00:00 2001"  # format-patch's fixed date on the mbox From line
PATCH_SUFFIXES = (".patch", ".diff")
SIGNATURE_LINE = "-- \n"
STAT_WIDTH = 72  # format-patch's diffstat width (git's MAIL_DEFAULT_WRAP)
HEADER_WIDTH = 78  # format-patch folds Subject and From at this width
RFC2047_WIDTH = 76

T = TypeVar("T")
Kind = Literal["format-patch", "quilt", "plain"]
FileStatus = Literal["modified", "created", "deleted", "renamed", "copied"]


# ---------------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True)
class Hunk:
    """One hunk of a patch, with the file's lines on each side exactly as in the file (a last
    line without newline has none)."""

    path: str  # the file in the tree (its new name for a rename)
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    section: str  # the heading after @@ (often the enclosing function)
    old_lines: tuple[str, ...]  # context and removed lines
    new_lines: tuple[str, ...]  # context and added lines
    added: tuple[str, ...]
    removed: tuple[str, ...]
    index: int  # within its file, from 0
    patch_index: int  # within its patch, from 0
    text: str  # the @@ line and the body, as in the patch

    @property
    def body(self) -> str:
        return self.text.split("\n", 1)[1]


@dataclass(frozen=True)
class FileDiff:
    """What a patch does to one file."""

    old_path: str | None  # None when the patch creates the file
    new_path: str | None  # None when the patch deletes it
    status: FileStatus
    binary: bool
    git: bool  # has a `diff --git` header (so renames and modes are meaningful)
    extended: tuple[str, ...]  # git's extended header lines (modes, index, rename, similarity)
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        path = self.new_path or self.old_path
        assert path is not None
        return path

    def header(self, key: str) -> str | None:
        """The value of an extended header line (`new file mode`, `similarity index`, ...)."""
        for line in self.extended:
            if line.startswith(key + " "):
                return line[len(key) + 1:].rstrip("\n")
        return None

    @property
    def old_mode(self) -> int | None:
        """git's mode of the file before the patch (REGULAR, EXECUTABLE, SYMLINK), from `old
        mode`, `deleted file mode` or the `index` line; None when absent before or unsaid."""
        if self.old_path is None:
            return None
        return _mode(self.header("old mode") or self.header("deleted file mode")
                     or self._index_mode())

    @property
    def new_mode(self) -> int | None:
        """git's mode of the file after the patch; None when the patch deletes it or says
        nothing (a diff without git's header)."""
        if self.new_path is None:
            return None
        return _mode(self.header("new mode") or self.header("new file mode")
                     or self._index_mode())

    def _index_mode(self) -> str | None:
        index = self.header("index")
        return index.split()[1] if index and len(index.split()) > 1 else None

    @property
    def mode_changed(self) -> bool:
        return (self.old_mode is not None and self.new_mode is not None
                and self.old_mode != self.new_mode)

    @property
    def rename_from(self) -> str | None:
        """The source of a rename or a copy (the path the new file is made from)."""
        return self.old_path if self.status in ("renamed", "copied") else None

    @property
    def rename_to(self) -> str | None:
        """The target of a rename or a copy."""
        return self.new_path if self.status in ("renamed", "copied") else None

    @property
    def is_copy(self) -> bool:
        return self.status == "copied"

    @property
    def is_symlink(self) -> bool:
        """The file is a symbolic link on either side (mode 120000)."""
        return SYMLINK in (self.old_mode, self.new_mode)

    @property
    def link_target(self) -> str | None:
        """What a symbolic link the patch leaves points to (its new side's text)."""
        if self.new_mode != SYMLINK or not self.hunks:
            return None
        return "".join(self.hunks[-1].new_lines)

    def header_hunk(self) -> Hunk:
        """A hunk of no line standing for a text-free section (a rename, a copy, a mode
        change), so that a per-hunk report has a row for it; patch_index -1: no @@ line."""
        return Hunk(self.path, 0, 0, 0, 0, "", (), (), (), (), 0, -1,
                    "@@ -0,0 +0,0 @@\n")

    @property
    def text_free(self) -> bool:
        """Nothing to do to any line: a rename, a copy, a mode change or an empty file made
        or removed, all of which `git apply` (and GNU patch) do from the header alone."""
        return not self.hunks and not self.binary


@dataclass(frozen=True)
class Patch:
    """One file of a series. `data` is the file byte for byte; `header + diff + trailer` is its
    text (with CRLF line ends read as LF when the whole file uses them, as git am and GNU patch
    do)."""

    name: str  # relative to the series folder
    data: bytes = field(repr=False)
    header: str = field(repr=False)  # mail header, message and diffstat, or a plain preamble
    diff: str = field(repr=False)
    trailer: str = field(repr=False)  # the `-- ` signature block, or ""
    commit: str | None  # from the mbox From line
    author: str | None
    date: str | None
    subject: str  # without the [PATCH n/m] tag; "" when the file says nothing
    body: str
    stat: str | None  # the diffstat block, when there is one
    number: int | None  # n and m of [PATCH n/m]
    total: int | None
    subject_prefix: str | None  # "PATCH", "RFC PATCH v2", ...
    strip: int  # leading path components of the diff's names (quilt's -pN)
    crlf: bool
    files: tuple[FileDiff, ...]
    patchset: PatchSet = field(repr=False, compare=False, hash=False)

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "surrogateescape")

    @property
    def lf_data(self) -> bytes:
        """The file as git am reads it: a mail whose every line ends in CRLF (as a mail
        client saved it) with LF line ends; any other file byte for byte."""
        if not self.crlf:
            return self.data
        return (self.header + self.diff + self.trailer).encode("utf-8", "surrogateescape")

    @property
    def is_mail(self) -> bool:
        return self.author is not None or self.commit is not None

    @property
    def signature(self) -> str | None:
        return self.trailer[len(SIGNATURE_LINE):].rstrip("\n") if self.trailer else None

    @property
    def hunks(self) -> tuple[Hunk, ...]:
        return tuple(h for f in self.files for h in f.hunks)

    @property
    def paths(self) -> tuple[str, ...]:
        """Every tree path the patch reads or writes."""
        seen: dict[str, None] = {}
        for f in self.files:
            for p in (f.old_path, f.new_path):
                if p is not None:
                    seen[p] = None
        return tuple(seen)

    @property
    def conventions(self) -> Conventions:
        """How this patch alone is written (its diffstat, `index` lines and their digits, its
        signature, ...): a series that mixes styles keeps each patch's own when it is
        written again."""
        return detect_conventions([self])

    def with_diff(self, diff: str) -> Patch:
        """This patch with `diff` (as git shows it) for its diff, written as the patch itself
        is: its header byte for byte (mbox line, From, Date, Subject, MIME headers, message:
        raw bytes stay raw), its diffstat made again where it has one, `index` lines only
        where it has them, the same signature block and line ends."""
        if not any(f.header("index") for f in self.files):
            diff = re.sub(r"^index .*\n", "", diff, flags=re.M)
        if self.files and not any(f.git for f in self.files):
            diff = _as_plain(diff, _plain_headers(self), self.strip)
        header = self.header
        if self.stat is not None:
            try:
                stat = diffstat(diff)
            except PortkitError:
                stat = self.stat  # a binary file: git's own figures stay
            cut = header.rfind("---\n" + self.stat)
            if cut >= 0:
                at = cut + len("---\n")
                header = header[:at] + stat + header[at + len(self.stat):]
        text = header + diff + self.trailer
        if self.crlf:
            text = text.replace("\n", "\r\n")
        return parse_patch(self.name, text.encode("utf-8", "surrogateescape"), strip=self.strip)


def _plain_headers(patch: Patch) -> dict[str, tuple[str, str, str]]:
    """A plain (not git) diff's own file headers, by file: the lines between the previous
    file's hunks and this file's `--- ` line (quilt's `Index:` and `====`; the first file's
    are in the patch's header), and its `--- ` and `+++ ` lines (quilt's llama.orig/ and
    llama/, timestamps), byte for byte. Read off the hunks as parsed; {} where they cannot
    be found in order."""
    found: dict[str, tuple[str, str, str]] = {}
    at = 0
    for f in patch.files:
        if not f.hunks or (start := patch.diff.find(f.hunks[0].text, at)) < 0:
            return {}
        head = patch.diff[at:start].splitlines(keepends=True)
        k = next((i for i in range(len(head) - 2, -1, -1) if head[i].startswith("--- ")
                  and head[i + 1].startswith("+++ ")), None)
        if k is None:
            return {}
        found[f.path] = ("".join(head[:k]), head[k], head[k + 1])
        for hunk in f.hunks:
            if (start := patch.diff.find(hunk.text, at)) < 0:
                return {}
            at = start + len(hunk.text)
    return found


def _as_plain(diff: str, headers: dict[str, tuple[str, str, str]], strip: int) -> str:
    """git's diff of a patch written as plain diffs, each file with the patch's own header
    lines where the patch had them (git's `diff --git` and extended lines only where not)."""
    sections = re.split(r"(?m)^(?=diff --git )", diff)
    out = [sections[0]]
    for k, section in enumerate(sections[1:]):
        lines = section.splitlines(keepends=True)
        at = next((i for i, line in enumerate(lines) if line.startswith("--- ")), None)
        names = [] if at is None or at + 1 >= len(lines) else [
            x[4:].rstrip("\n").split("\t", 1)[0] for x in (lines[at + 1], lines[at])]
        name = next((n.split("/", 1)[-1] if strip else n for n in names if n != "/dev/null"),
                    None)
        if at is None or name not in headers:
            out.append(section)
            continue
        before, minus, plus = headers[name]
        out.append((before if k else "") + minus + plus + "".join(lines[at + 2:]))
    return "".join(out)


@dataclass(frozen=True)
class Conventions:
    """How a series writes its patches, so that a new patch looks like its neighbours.
    `style` "format-patch" is git's own output; "portkit" is MailPatch.render's."""

    style: Literal["format-patch", "portkit"] = "format-patch"
    numbered: bool = False  # [PATCH n/m] rather than [PATCH]
    zero_commit: bool = True
    signature: str | None = None  # the text after "-- ", or no signature
    diffstat: bool = True
    index_lines: bool = True  # `index abc..def` lines in the diffs
    numbered_names: bool = True  # NNNN-slug.patch file names
    next_number: int = 1
    subject_prefix: str = "PATCH"
    abbrev: int = 7  # hex digits of the blob ids on `index` lines


# What MailPatch.render writes (the committed series under patches/ depend on it).
PORTKIT = Conventions(style="portkit", numbered=True, zero_commit=False, signature="portkit",
                      index_lines=False)
# What ollama's Makefile.sync writes: format-patch --no-signature --no-numbered --zero-commit.
OLLAMA = Conventions()


@dataclass(frozen=True)
class Unreadable:
    """A file of the series that is not a patch portkit can read, kept byte for byte: its
    verdict is `reason` (one line naming the file), never the whole series' refusal. A cover
    letter (`cover`) is kept the same way, but it is no fault: it has no verdict."""

    name: str  # relative to the series folder
    position: int  # where it sits in the series (among all its files, from 0)
    reason: str
    data: bytes = field(repr=False)
    strip: int = 1
    cover: bool = False
    absent: bool = False  # no file to keep: a link to nothing, a folder


@dataclass(frozen=True)
class Series:
    folder: Path
    kind: Kind
    patches: tuple[Patch, ...]  # the patches portkit could read, in series order
    conventions: Conventions
    series_file: bytes | None = field(default=None, repr=False)  # quilt's, byte for byte
    unreadable: tuple[Unreadable, ...] = ()  # only from read_series(..., lenient=True)

    @property
    def paths(self) -> tuple[str, ...]:
        """Every tree path the series reads or writes, in first-seen order."""
        return tuple(dict.fromkeys(p for patch in self.patches for p in patch.paths))

    def in_order(self) -> list[Patch | Unreadable]:
        """Every file of the series, read or not, in series order."""
        out: list[Patch | Unreadable] = list(self.patches)
        for bad in sorted(self.unreadable, key=lambda u: u.position):
            out.insert(min(bad.position, len(out)), bad)
        return out

    def listing(self) -> bytes:
        """Quilt's series file for these patches: the one read, byte for byte, while it
        lists them; without the lines of patches that are gone (its comments and blank lines
        stay) when only that changed; else made anew."""
        listed = self.series_file if self.series_file is not None else b""
        wanted = [(p.name, p.strip) for p in self.in_order()]
        if _quilt_names(listed) == wanted:
            return listed
        left = b"".join(line for line in listed.splitlines(keepends=True)
                        if not (named := _quilt_names(line)) or named[0] in wanted)
        if _quilt_names(left) == wanted:
            return left
        return "".join(name + (f" -p{strip}" if strip != 1 else "") + "\n"
                       for name, strip in wanted).encode("utf-8", "surrogateescape")

    def write(self, folder: Path) -> list[Path]:
        """Write every patch (and quilt's series file) into `folder`. An unchanged series is
        written byte for byte as it was read."""
        written = []
        entries = self.in_order()
        for patch in entries:
            path = folder / patch.name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(patch.data)
            written.append(path)
        if self.kind == "quilt":
            listed = self.listing()
            (folder / "series").write_bytes(listed)
            written.append(folder / "series")
        return written


# ---------------------------------------------------------------------------------------------
# Reading


def read_series(path: Path, *, lenient: bool = False) -> Series:
    """A series folder: a quilt folder (it has a `series` file, or `path` is one), or a folder
    of .patch/.diff files in name order (format-patch mails or plain diffs).

    A file that is not a readable patch (not a diff, a malformed one, a path no patch may
    name) is an UnreadablePatch naming it; with `lenient`, it is left out of `patches` and
    kept in `unreadable` with its reason instead, and the rest of the series is read. A
    cover letter is kept there (as `cover`) either way."""
    if path.is_file() and path.name == "series":
        path = path.parent
    if not path.is_dir():
        raise InputError(f"{path}: not a patch series folder")
    listing = path / "series"
    if listing.is_file():
        try:
            series_file = listing.read_bytes()
        except OSError as exc:
            raise FileError(f"{listing}: cannot read it ({exc.strerror})") from exc
        entries = _quilt_entries(listing, series_file, lenient)
        kind: Kind = "quilt"
    else:
        series_file = None
        try:
            # hidden files (an editor's, macOS's ._ files) are no patches of the series; a
            # link to nothing is one that cannot be read, not a gap in the series
            entries = [(p.name, 1) for p in sorted(path.iterdir())
                       if p.suffix in PATCH_SUFFIXES and not p.name.startswith(".")
                       and (p.is_file() or p.is_symlink())]
        except OSError as exc:
            raise FileError(f"{path}: cannot list it ({exc.strerror})") from exc
        kind = "plain"
    patches: list[Patch] = []
    unreadable: list[Unreadable] = []
    for position, (name, strip) in enumerate(entries):
        try:
            patches.append(_read_patch(path, name, strip))
        except UnreadablePatch as exc:
            cover = isinstance(exc, CoverLetter)
            if not lenient and not cover:
                raise
            absent = not (path / name).is_file()
            data = b"" if absent else (path / name).read_bytes()
            unreadable.append(Unreadable(name, position, exc.message, data, strip, cover,
                                         absent))
    if all(bad.cover for bad in unreadable) and not patches:
        raise InputError(f"{path}: no patches in it")
    if kind == "plain" and any(p.is_mail for p in patches):
        kind = "format-patch"
    return Series(path, kind, tuple(patches), detect_conventions(patches), series_file,
                  tuple(unreadable))


def _read_patch(folder: Path, name: str, strip: int) -> Patch:
    path = folder / name
    if path.is_symlink() and not path.exists():
        raise UnreadablePatch(f"{path}: a symbolic link to nothing")
    if path.is_dir():
        raise UnreadablePatch(f"{path}: a folder, not a patch file")
    if not path.is_file():
        raise UnreadablePatch(f"{folder / 'series'}: {name} does not exist")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UnreadablePatch(f"{path}: cannot read it ({exc.strerror})") from exc
    return parse_patch(name, data, strip=strip, where=str(path))


def _quilt_names(data: bytes) -> list[tuple[str, int]]:
    """(name, strip level) of each line of a quilt series file."""
    entries = []
    for line in data.decode("utf-8", "surrogateescape").split("\n"):
        words = re.sub(r"(^|\s)#.*", "", line).split()
        if words:
            strip = 1
            for option in words[1:]:
                if not (m := re.fullmatch(r"-p(\d+)", option)):
                    raise ValueError(option)
                strip = int(m.group(1))
            entries.append((words[0], strip))
    return entries


def _quilt_entries(listing: Path, data: bytes, lenient: bool) -> list[tuple[str, int]]:
    try:
        entries = _quilt_names(data)
    except ValueError as exc:
        raise InputError(f"{listing}: unsupported option {exc.args[0]}") from exc
    folder = listing.parent.resolve()
    for name, _ in entries:
        pure = PurePosixPath(name)
        if pure.is_absolute() or ".." in pure.parts or not (folder / name).resolve(
                ).is_relative_to(folder):
            raise InputError(f"{listing}: {name} is outside the series folder")
        if not lenient and not (folder / name).is_file():
            raise InputError(f"{listing}: {name} does not exist")
    return entries


# The line git format-patch starts each mail with (an mbox's separator).
_MBOX_FROM = re.compile(r"From [0-9a-f]{40} Mon Sep 17 00:00:00 2001\n?\Z")


def parse_patch(name: str, data: bytes, *, strip: int = 1, where: str | None = None) -> Patch:
    """One patch file: a format-patch mail, or a plain diff with an optional preamble."""
    where = where or name
    text = data.decode("utf-8", "surrogateescape")
    if not text.strip():
        raise UnreadablePatch(f"{where}: empty patch")
    ends = text.count("\n")
    crlf = ends > 0 and text.count("\r\n") == ends
    if crlf:
        text = text.replace("\r\n", "\n")
    lines = _lines(text)
    mails = sum(1 for line in lines if _MBOX_FROM.match(line))
    if mails > 1:  # git format-patch --stdout: one file, several commits
        raise UnreadablePatch(f"{where}: {mails} mails in one file (split it into one file "
                              "a mail, e.g. with git mailsplit)")
    start = _diff_start(lines)
    if start is None:
        if _is_cover(name, lines):
            raise CoverLetter(f"{where}: a cover letter (no diff): kept as it is")
        raise UnreadablePatch(f"{where}: no diff in it (not a patch)")
    diff_lines = lines[start:]
    patchset, cut = _parse_diff(where, diff_lines)
    if not patchset:
        raise UnreadablePatch(f"{where}: no diff in it (not a patch)")
    head = _read_head(lines[:start])
    if not head.subject and (head.author is not None or head.commit is not None):
        head.subject = _subject_from_name(name)  # a mail without Subject: its file stands in
    files = tuple(_file_diff(where, f, strip, diff_lines[:cut], offset)
                  for f, offset in zip(patchset, _hunk_offsets(patchset), strict=True))
    return Patch(
        name=name, data=data, header="".join(lines[:start]), diff="".join(diff_lines[:cut]),
        trailer="".join(diff_lines[cut:]), commit=head.commit, author=head.author,
        date=head.date, subject=head.subject, body=head.body, stat=head.stat,
        number=head.number, total=head.total, subject_prefix=head.prefix, strip=strip,
        crlf=crlf, files=files, patchset=patchset)


def _subject_from_name(name: str) -> str:
    """A subject made of a patch's file name: `0003-fix-the-cache.patch` says "fix the cache"."""
    stem = PurePosixPath(name).name
    for suffix in PATCH_SUFFIXES:
        stem = stem.removesuffix(suffix)
    return re.sub(r"^\d+-", "", stem).replace("-", " ").strip() or stem


def _lines(text: str) -> list[str]:
    """Lines with their ends, split at \\n only (a \\r is content, as for git)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _diff_start(lines: list[str]) -> int | None:
    """The first line of the diff: a `diff --git` line, or a `--- ` line followed by `+++ `."""
    for i, line in enumerate(lines):
        if line.startswith("diff --git ") or (
                line.startswith("--- ") and i + 1 < len(lines)
                and lines[i + 1].startswith("+++ ")):
            return i
    return None


def _parse_diff(where: str, lines: list[str]) -> tuple[PatchSet, int]:
    """The diff parsed by unidiff, and where its signature block (`-- ` to the end) starts. A
    `-- ` line is the signature only when no hunk needs it and no diff follows it."""
    sig = max((i for i, line in enumerate(lines) if line == SIGNATURE_LINE), default=None)
    text = "".join(lines)
    fed = _spaced_names(lines) if _TWO_SIDES.search(text) else lines
    if sig is not None and not any(line.startswith(("diff --git ", "--- ", "+++ ", "@@ "))
                                   for line in lines[sig:]):
        try:
            return PatchSet("".join(fed[:sig])), sig
        except UnidiffParseError:
            pass  # the `-- ` line is a removed "- " line of the last hunk
    try:
        return PatchSet(text if fed is lines else "".join(fed)), len(lines)
    except UnidiffParseError as exc:
        detail = str(exc).strip().split("\n")[0]
        raise UnreadablePatch(f"{where}: malformed diff ({detail})") from exc


# a `diff --git` line with ` b/` more than once: a name may hold it (cheap test, on the text)
_TWO_SIDES = re.compile(r'(?m)^diff --git .*[ "]b/.*[ "]b/')


def _spaced_names(lines: list[str]) -> list[str]:
    """The lines as unidiff is given them: where a `diff --git` line names a path holding
    ` b/`, which unidiff's split would cut there, that section's names are written C-quoted
    with each space as \\040 (the same path, as git reads quoting), on its `diff --git`
    line and its ---/+++ lines, so that they agree."""
    fed, spaced = list(lines), False
    for i, line in enumerate(lines):
        if line.startswith("diff --git "):
            rest = line[len("diff --git "):].rstrip("\r\n")
            names = diff_git_names(rest)
            spaced = any(" b/" in name or ' "b/' in name for name in names) \
                or rest.count(" b/") + rest.count(' "b/') > 1
            if spaced:
                fed[i] = f"diff --git {_spaceless(names[0])} {_spaceless(names[1])}\n"
        elif not line.startswith(("--- ", "+++ ")):
            spaced = spaced and not line.startswith(("@@ ", "diff "))
        elif spaced:
            name, tab, stamp = line[4:].rstrip("\r\n").partition("\t")
            fed[i] = f"{line[:4]}{_spaceless(name)}{tab}{stamp}\n"
    return fed


def _spaceless(name: str) -> str:
    if name == "/dev/null":
        return name
    body = name[1:-1] if len(name) >= 2 and name[0] == name[-1] == '"' else name
    return '"' + body.replace(" ", "\\040") + '"'


def _hunk_offsets(patchset: PatchSet) -> list[int]:
    """Index within the patch of each file's first hunk."""
    offsets, n = [], 0
    for f in patchset:
        offsets.append(n)
        n += len(f)
    return offsets


def _file_diff(where: str, f: PatchedFile, strip: int, lines: list[str],
               first_index: int) -> FileDiff:
    old = _tree_path(where, f.source_file, strip)
    new = _tree_path(where, f.target_file, strip)
    if old is None and new is None:
        raise UnreadablePatch(f"{where}: a diff from /dev/null to /dev/null")
    info = list(f.patch_info or [])
    git = bool(info) and info[0].startswith("diff --git ")
    if not git and old and new and old != new:
        # Without git's header a diff renames nothing: it patches one file, the one GNU patch
        # prefers (fewest components, then shortest base name, then shortest name).
        old = new = min((old, new), key=lambda p: (p.count("/"), len(p.rsplit("/", 1)[-1]),
                                                   len(p)))
    if not git and new is not None and _epoch(f.target_timestamp) and all(
            h.target_length == 0 for h in f):
        new = None  # diff -N's absent new file: GNU patch deletes it
    if not git and old is not None and new is not None and _epoch(f.source_timestamp) and all(
            h.source_length == 0 for h in f):
        old = None  # diff -N's absent old file: GNU patch creates it
    extended = tuple(line for line in info[1:] if git and _GIT_EXTENDED.match(line))
    copied = any(line.startswith("copy from ") for line in extended)
    status: FileStatus = ("created" if old is None else "deleted" if new is None
                          else "modified" if old == new else "copied" if copied else "renamed")
    path = new or old
    assert path is not None
    named = [p for p in (old, new) if p is not None]
    named += [unquote_path(line.rstrip("\n").split(" ", 2)[2]) for line in extended
              if re.match(r"(rename|copy) (from|to) ", line)]
    for name in named:
        if problem := path_problem(name):
            raise UnreadablePatch(f"{where}: refusing {quote_path(name)}: {problem}")
    hunks = tuple(_hunk(path, h, i, first_index + i, lines) for i, h in enumerate(f))
    diff = FileDiff(old, new, status, f.is_binary_file, git, extended, hunks)
    if diff.new_mode == SYMLINK and diff.new_path is not None:
        problem = link_problem(diff.new_path, diff.link_target or "")
        if problem:
            raise UnreadablePatch(f"{where}: refusing {quote_path(diff.new_path)}: {problem}")
    return diff


_STAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.\d+)?(?: ([+-])(\d\d)(\d\d))?")


def _epoch(stamp: str | None) -> bool:
    """Whether a plain diff's timestamp is the Epoch (in any zone): how `diff -N` marks a
    file absent on that side, as GNU patch reads it."""
    text = (stamp or "").strip()
    m = _STAMP.fullmatch(text)
    if m is None:  # diff -c's traditional form
        return bool(re.fullmatch(r"\w{3} \w{3} +1 00:00:00 1970", text))
    year, month, day, hour, minute, second = (int(x) for x in m.groups()[:6])
    try:
        local = datetime(year, month, day, hour, minute, second)
    except ValueError:
        return False
    offset = timedelta(hours=int(m.group(8) or 0), minutes=int(m.group(9) or 0))
    utc = local - offset if m.group(7) != "-" else local + offset
    return utc == datetime(1970, 1, 1)


def _mode(value: str | None) -> int | None:
    return int(value, 8) if value and re.fullmatch(r"[0-7]{6}", value) else None


_GIT_EXTENDED = re.compile(
    r"(old mode|new mode|deleted file mode|new file mode|copy from|copy to|rename from|"
    r"rename to|similarity index|dissimilarity index|index) ")


def _tree_path(where: str, name: str, strip: int) -> str | None:
    """The path GNU patch's -p`strip` makes of a name: the shortest prefix holding `strip`
    slashes (a run of slashes counting as one) removed."""
    if name == "/dev/null":
        return None
    path = unquote_path(name)
    for _ in range(strip):
        m = re.match(r"[^/]*/+", path)
        if not m:
            raise UnreadablePatch(f"{where}: cannot strip {strip} components from {name}")
        path = path[m.end():]
    if not path:
        raise UnreadablePatch(f"{where}: {name} names no file")
    return path


def _hunk(path: str, h: UnidiffHunk, index: int, patch_index: int, lines: list[str]) -> Hunk:
    numbered = [line.diff_line_no for line in h if line.diff_line_no is not None]
    first, last = min(numbered) - 2, max(numbered)  # the @@ line; one past the body
    while last < len(lines) and lines[last].startswith("\\"):
        last += 1  # "\ No newline at end of file"
    old: list[str] = []
    new: list[str] = []
    added: list[str] = []
    removed: list[str] = []
    touched: tuple[list[str], ...] = ()
    for line in h:
        if line.line_type == "\\":
            for group in touched:  # the line before the marker has no newline in the file
                group[-1] = group[-1].removesuffix("\n")
            continue
        touched = {" ": (old, new), "-": (old, removed), "+": (new, added)}.get(line.line_type, ())
        for group in touched:
            group.append(line.value)
    return Hunk(path, h.source_start, h.source_length, h.target_start, h.target_length,
                h.section_header, tuple(old), tuple(new), tuple(added), tuple(removed),
                index, patch_index, "".join(lines[first:last]))


@dataclass
class _Head:
    commit: str | None = None
    author: str | None = None
    date: str | None = None
    subject: str = ""
    body: str = ""
    stat: str | None = None
    number: int | None = None
    total: int | None = None
    prefix: str | None = None


def _is_cover(name: str, lines: list[str]) -> bool:
    """A mail without a diff that format-patch --cover-letter wrote: numbered 0 of N
    (`[PATCH 0/3]`, `[RFC PATCH v2 00/10]`), or named 0000-cover-letter.patch."""
    head = _read_head(lines)
    if head.author is None and head.commit is None:
        return False  # not a mail
    return (head.number == 0 and head.total is not None) or bool(
        re.fullmatch(r"0+-cover-letter\.(patch|diff)", PurePosixPath(name).name))


def _read_head(lines: list[str]) -> _Head:
    """What the text before the diff says: mbox From line, mail (or DEP-3) headers, message,
    diffstat."""
    head = _Head()
    i, dep3 = 0, False
    if lines and lines[0].startswith("From ") and not lines[0].startswith("From: "):
        m = re.match(r"From ([0-9a-f]{40}) ", lines[0])  # any mbox From line; git's has the id
        head.commit, i = (m.group(1) if m else None), 1
    first = next((k for k in range(i, len(lines)) if lines[k].strip()), i)
    headers, after = _headers(lines, first)  # a header may follow blank lines
    i = after if headers else i
    if headers:
        author = headers.get("from") or headers.get("author")
        if author:
            name, addr = parseaddr(author)
            head.author = f"{_quote_name(name)} <{addr}>" if name and addr else author
        head.date = headers.get("date")
        # DEP-3 (a Description, or a Subject in a header with no mail's From)
        dep3 = "from" not in headers and bool({"description", "subject"} & headers.keys())
        subject, more = _description(lines[:i]) if dep3 else (headers.get("subject", ""), "")
        _read_subject(head, subject)
    message = lines[i:]
    while message and _FILE_HEADER.match(message[-1]):
        message = message[:-1]  # a plain diff's own lines before its first file's `--- `
    if headers and dep3:  # DEP-3: the long description is the message; after the `---`
        cut = next((k for k, line in enumerate(message) if line == "---\n"), None)
        message = ([more + "\n", "\n"] if more else []) + message[:cut]  # free text
    sep = _stat_separator(message)
    if sep is not None:
        end = next((k for k in range(sep + 1, len(message)) if not message[k].strip()),
                   len(message))
        head.stat = "".join(message[sep + 1:end])
        message = message[:sep]
    if sep is None and (head.commit is not None or (headers and "from" in headers)):
        # a mail with no diffstat: its message ends at its first `---`, as git am reads it
        cut = next((k for k, line in enumerate(message) if line == "---\n"), None)
        message = message[:cut] if cut is not None else message
    head.body = "".join(message).strip("\n")
    return head


# What a plain diff writes before a file's `--- ` line: quilt's `Index:` and its rule of
# `=`, and diff's own command line (`diff -Naur a/x b/x`).
_FILE_HEADER = re.compile(r"(Index: .*|={20,}|diff -.*)\n?\Z")


def _description(header: list[str]) -> tuple[str, str]:
    """DEP-3's Description (or Subject) field: its first line, the synopsis, and the long
    description of its continuation lines (one space in; ` .` an empty line)."""
    for k, line in enumerate(header):
        if re.match(r"(?i)(description|subject):", line):
            more = []
            for cont in header[k + 1:]:
                if cont[:1] not in (" ", "\t") or not cont.strip():
                    break
                more.append("" if cont.strip() == "." else cont[1:].rstrip("\n"))
            return line.split(":", 1)[1].strip(), "\n".join(more).strip("\n")
    return "", ""


def _headers(lines: list[str], i: int) -> tuple[dict[str, str], int]:
    """RFC 822 headers from line i (unfolded, RFC 2047 decoded, keys lower case) and the line
    after them (and after the blank line that ends them). None unless From or Subject (or
    DEP-3's Author or Description) is among them."""
    raw: list[list[str]] = []
    j = i
    while j < len(lines):
        line = lines[j]
        if raw and line[:1] in (" ", "\t") and line.strip():
            raw[-1].append(line)
        elif line.startswith("Index: "):
            break  # quilt's line before a file's diff: no header field
        elif re.match(r"[A-Za-z][A-Za-z0-9-]*:", line):
            raw.append([line])
        else:
            break
        j += 1
    headers: dict[str, str] = {}
    for parts in raw:
        key, value = "".join(parts).split(":", 1)
        headers.setdefault(key.lower(), _decode_header(value))
    if not {"from", "subject", "author", "description"} & headers.keys():
        return {}, i
    if j < len(lines) and not lines[j].strip():
        j += 1
    return headers, j


def _decode_header(value: str) -> str:
    unfolded = re.sub(r"\n(?=[ \t])", "", value).strip()
    if "=?" not in unfolded:
        return unfolded
    try:
        return str(make_header(decode_header(unfolded)))
    except (ValueError, LookupError, UnicodeError):
        return unfolded


def _read_subject(head: _Head, subject: str) -> None:
    m = re.match(r"\[([^\]]*)\]\s*(.*)", subject, re.S)
    if m and (re.search(r"\bPATCH\b", m.group(1), re.I)
              or re.search(r"\d+/\d+\s*$", m.group(1))):
        tag, subject = m.group(1), m.group(2)
        if n := re.search(r"\s*(\d+)/(\d+)\s*$", tag):
            head.number, head.total = int(n.group(1)), int(n.group(2))
            tag = tag[:n.start()]
        head.prefix = tag.strip()
    head.subject = subject.strip()


_STAT_LINE = re.compile(r" .* \| +(\d+|Bin)\b| \d+ files? changed| (create|delete) mode "
                        r"| rename | copy | mode change | rewrite ")


def _stat_separator(message: list[str]) -> int | None:
    """The `---` line that starts format-patch's diffstat: the last one followed by stat lines
    up to a blank line (a `---` in the message body is not)."""
    for k in range(len(message) - 1, -1, -1):
        if message[k] != "---\n":
            continue
        block = []
        for line in message[k + 1:]:
            if not line.strip():
                break
            block.append(line)
        if block and all(_STAT_LINE.match(line) for line in block) and any(
                re.match(r" \d+ files? changed", line) for line in block):
            return k
    return None


def unquote_path(name: str) -> str:
    """A path as git writes it: C-quoted ("a/t\\303\\251st") when it has unusual bytes."""
    if not (len(name) >= 2 and name[0] == name[-1] == '"'):
        return name
    out = bytearray()
    body = name[1:-1]
    i = 0
    escapes = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "0123" and re.match(r"[0-7]{3}", body[i + 1:i + 4]):
                out.append(int(body[i + 1:i + 4], 8))
                i += 4
                continue
            out.append(escapes.get(nxt, ord(nxt)))
            i += 2
            continue
        out += c.encode("utf-8", "surrogateescape")
        i += 1
    return out.decode("utf-8", "surrogateescape")


def quote_path(name: str) -> str:
    """The inverse of unquote_path: git's quoting (core.quotePath on)."""
    data = name.encode("utf-8", "surrogateescape")
    named = {7: "a", 8: "b", 9: "t", 10: "n", 11: "v", 12: "f", 13: "r", 34: '"', 92: "\\"}
    if not any(b < 0x20 or b >= 0x7f or b in (34, 92) for b in data):
        return name
    out = []
    for b in data:
        if b in named:
            out.append("\\" + named[b])
        elif b < 0x20 or b >= 0x7f:
            out.append(f"\\{b:03o}")
        else:
            out.append(chr(b))
    return '"' + "".join(out) + '"'


# ---------------------------------------------------------------------------------------------
# Conventions


def detect_conventions(patches: Sequence[Patch]) -> Conventions:
    """The conventions most of the series follows (format-patch's defaults for no patch)."""
    if not patches:
        return Conventions()
    mails = [p for p in patches if p.is_mail] or list(patches)
    numbers = [int(m.group(1)) for p in patches if (m := re.match(r"(\d{4})-", p.name))]
    signature = _most(p.signature for p in mails)
    return Conventions(
        style="portkit" if signature == "portkit" else "format-patch",
        numbered=_most(p.total is not None for p in mails),
        zero_commit=_most(p.commit == ZERO_COMMIT for p in mails),
        signature=signature,
        diffstat=_most(p.stat is not None for p in mails),
        index_lines=_most(any(f.header("index") for f in p.files) for p in mails),
        numbered_names=len(numbers) == len(patches),
        next_number=max(numbers, default=len(patches)) + 1,
        subject_prefix=_most(p.subject_prefix for p in mails) or "PATCH",
        abbrev=_most([len(m.group(1)) for p in mails for f in p.files
                      if (m := _INDEX_LINE.match(f.header("index") or ""))] or [7]),
    )


def _most(values: Iterable[T]) -> T:
    """The most common value; the latest among equals (a series drifts towards its newest
    patches' style)."""
    counts = Counter(reversed(list(values)))
    return counts.most_common(1)[0][0]


# ---------------------------------------------------------------------------------------------
# Writing new patches


def new_patch(conventions: Conventions, *, subject: str, body: str, author: str,
              date: str | datetime, diff: str, number: int | None = None,
              total: int | None = None, commit: str | None = None) -> Patch:
    """A new patch written as the series writes its patches: the mail as `git format-patch`
    with the series' options would write it for that commit (or as MailPatch.render does, for
    portkit's own style), named NNNN-slug.patch. `diff` is the commit's diff as git shows it
    (with `index` lines when the series has them: conventions.index_lines)."""
    number = conventions.next_number if number is None else number
    total = number if total is None else total
    text = render_mail(conventions, subject=subject, body=body, author=author, date=date,
                       diff=diff, number=number, total=total, commit=commit)
    name = (file_name(number, subject) if conventions.style == "portkit"
            else format_patch_name(number, subject))
    return parse_patch(name, text.encode("utf-8", "surrogateescape"))


def render_mail(conventions: Conventions, *, subject: str, body: str, author: str,
                date: str | datetime, diff: str, number: int = 1, total: int = 1,
                commit: str | None = None) -> str:
    if isinstance(date, datetime):
        date = git_date(date)
    if conventions.style == "portkit":
        return MailPatch(subject, body, diff, author, date).render(number, total)
    if conventions.zero_commit:
        commit = ZERO_COMMIT
    elif commit is None:
        commit = hashlib.sha1(f"{subject}\n{diff}".encode("utf-8", "surrogateescape")).hexdigest()
    digits = len(str(total))  # format-patch pads n to the width of m: [PATCH 03/12]
    tag = conventions.subject_prefix + (f" {number:0{digits}d}/{total}" if conventions.numbered
                                        else "")
    subject_line = f"Subject: [{tag}] " if tag else "Subject: "
    body = body.strip("\n")
    out = [f"From {commit} {MBOX_DATE}\n", _from_header(author), f"Date: {date}\n",
           subject_line + _header_text(subject, len(subject_line), address=False) + "\n"]
    if _non_ascii(subject) or _non_ascii(body):
        out.append("MIME-Version: 1.0\nContent-Type: text/plain; charset=UTF-8\n"
                   "Content-Transfer-Encoding: 8bit\n")
    out.append("\n")
    if body:
        out.append(body + "\n")
    out.append("---\n" + diffstat(diff) + "\n" if conventions.diffstat else "\n")
    out.append(diff)
    if conventions.signature is not None:
        out.append(f"{SIGNATURE_LINE}{conventions.signature}\n\n")
    return "".join(out)


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def git_date(when: datetime) -> str:
    """A date as git writes it in a mail (RFC 2822, day not zero-padded, C locale names)."""
    if when.tzinfo is None:
        raise InputError("a patch date needs a time zone")
    return (f"{_DAYS[when.weekday()]}, {when.day} {_MONTHS[when.month - 1]} {when.year} "
            f"{when:%H:%M:%S %z}")


def _non_ascii(text: str) -> bool:
    return any(ord(c) >= 0x80 or c == "\x1b" for c in text)


def _from_header(author: str) -> str:
    """format-patch's From: name encoded or quoted as needed, the address on its own line when
    the line would be too long."""
    name, addr = split_author(author)
    start = "From: "
    if _needs_rfc2047(name):
        text, width = _rfc2047(name, len(start), address=True), RFC2047_WIDTH
    else:
        text, width = _fold(_quote_name(name), len(start)), HEADER_WIDTH
    last = len((start + text).rsplit("\n", 1)[-1])
    brk = "\n" if width < last + len(" <") + len(addr) + len(">") else ""
    return f"{start}{text}{brk} <{addr}>\n"


def split_author(author: str) -> tuple[str, str]:
    """Name and address of `Name <email>` (the name may be in RFC 822 quotes, and may hold a
    comma: git's `%an <%ae>` does not quote it). Real series hold anything: `nobody <>` is
    ("nobody", ""), a bare address is ("", address), a bare name is (name, "")."""
    m = re.fullmatch(r"\s*(.*?)\s*<([^<>]*)>\s*", author, re.S)
    if not m:
        bare = author.strip()
        return ("", bare) if re.fullmatch(r"[^\s@<>]+@[^\s@<>]+", bare) else (bare, "")
    name = m.group(1)
    if len(name) >= 2 and name[0] == name[-1] == '"':
        name = re.sub(r"\\(.)", r"\1", name[1:-1])
    return name, m.group(2)


def _quote_name(name: str) -> str:
    """A display name in double quotes when RFC 822 needs them (a comma, a dot, ...)."""
    if re.search(r'[()<>\[\]:;@,."\\]', name):
        return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return name


def _header_text(text: str, column: int, *, address: bool) -> str:
    if _needs_rfc2047(text):
        return _rfc2047(text, column, address=address)
    return _fold(text, column)


def _needs_rfc2047(text: str) -> bool:
    # Bytes that are not UTF-8 (read with surrogateescape) are written back as they were:
    # encoded as UTF-8 they would become another text.
    if any("\udc80" <= c <= "\udcff" for c in text):
        return False
    return _non_ascii(text) or "=?" in text


def _rfc2047(text: str, column: int, *, address: bool) -> str:
    """RFC 2047 Q-encoding as git writes it: whole characters per encoded word, `=XX` for
    anything special, words folded so that no line passes 76 columns."""
    out, width = ["=?UTF-8?q?"], column + len("=?UTF-8?q?")
    for ch in text:
        raw = ch.encode("utf-8", "surrogateescape")
        special = len(raw) > 1 or _rfc2047_special(raw[0], address)
        encoded = "".join(f"={b:02X}" for b in raw) if special else ch
        if width + len(encoded) + 2 > RFC2047_WIDTH:
            out.append("?=\n =?UTF-8?q?")
            width = len("=?UTF-8?q?") + 1
        out.append(encoded)
        width += len(encoded)
    return "".join(out) + "?="


def _rfc2047_special(b: int, address: bool) -> bool:
    c = chr(b)
    if b >= 0x80 or not c.isprintable() or c.isspace() or c in "=?_":
        return True
    return address and not (c.isalnum() or c in "!*+-/")


def _fold(text: str, column: int) -> str:
    """format-patch's folding of a header: a word that would end past column 78 starts a new
    line, indented by one space, in place of the space before it."""
    out = []
    for i, word in enumerate(text.split(" ")):
        sep = " " if i else ""
        if column + len(sep) + _width(word) <= HEADER_WIDTH:
            out.append(sep + word)
            column += len(sep) + _width(word)
        else:
            out.append("\n " + word)
            column = 1 + _width(word)
    return "".join(out)


def _width(text: str) -> int:
    """Display columns of a text (East Asian wide characters count two)."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF"
               else 1 for c in text)


def format_patch_name(number: int, subject: str, *, max_length: int = 64,
                      suffix: str = ".patch") -> str:
    """The file name git format-patch gives a commit: NNNN-, the subject with every run of
    characters other than ASCII letters, digits, `.` and `_` made one `-` (runs of dots made
    one), cut to `max_length` (format.filenameMaxLength) with the suffix."""
    slug: list[str] = []
    gap = False
    data = subject.encode("utf-8", "surrogateescape")
    i = 0
    while i < len(data):
        c = chr(data[i])
        if c.isascii() and (c.isalnum() or c in "._"):
            if gap and slug:
                slug.append("-")
            gap = False
            slug.append(c)
            while c == "." and i + 1 < len(data) and data[i + 1] == ord("."):
                i += 1
        else:
            gap = True
        i += 1
    name = f"{number:04d}-" + "".join(slug).rstrip(".-")
    return name[:max_length - len(suffix) - 1] + suffix


def diffstat(diff: str) -> str:
    """format-patch's diffstat and summary of a diff (72 columns), each line ending in \\n."""
    try:
        files = parse_patch("diff", diff.encode("utf-8", "surrogateescape")).files
    except PortkitError as exc:
        raise InputError(f"cannot write a diffstat: {exc.message}") from exc
    rows = []
    for f in files:
        if f.binary:
            raise InputError(f"{f.path}: cannot write a diffstat line for a binary patch")
        rows.append((_stat_name(f), sum(len(h.added) for h in f.hunks),
                     sum(len(h.removed) for h in f.hunks)))
    max_len = max(_width(name) for name, _, _ in rows)
    max_change = max(a + d for _, a, d in rows)
    number_width = len(str(max_change))
    width = max(STAT_WIDTH, 16 + 6 + number_width)
    graph_width, name_width = max_change, max_len
    if name_width + number_width + 6 + graph_width > width:
        if graph_width > width * 3 // 8 - number_width - 6:
            graph_width = max(width * 3 // 8 - number_width - 6, 6)
        if name_width > width - number_width - 6 - graph_width:
            name_width = width - number_width - 6 - graph_width
        else:
            graph_width = width - number_width - 6 - name_width

    def scale(n: int) -> int:  # at least one mark for any change
        return 0 if not n else 1 + n * (graph_width - 1) // max_change

    out = []
    for name, added, removed in rows:
        prefix, room = "", name_width
        if _width(name) > name_width:
            prefix, room = "...", max(name_width - 3, 0)
            while _width(name) > room:
                name = name[1:]
            if "/" in name:
                name = name[name.index("/"):]
        plus, minus = added, removed
        if graph_width <= max_change:
            total = scale(added + removed)
            if total < 2 and added and removed:
                total = 2
            if added < removed:
                plus = scale(added)
                minus = total - plus
            else:
                minus = scale(removed)
                plus = total - minus
        changed = added + removed
        out.append(f" {prefix}{name}{' ' * max(room - _width(name), 0)} | "
                   f"{changed:>{number_width}}{' ' if changed else ''}{'+' * plus}{'-' * minus}\n")
    inserted = sum(a for _, a, _ in rows)
    deleted = sum(d for _, _, d in rows)
    total_line = f" {len(rows)} file{'s' if len(rows) != 1 else ''} changed"
    if inserted or not deleted:
        total_line += f", {inserted} insertion{'s' if inserted != 1 else ''}(+)"
    if deleted or not inserted:
        total_line += f", {deleted} deletion{'s' if deleted != 1 else ''}(-)"
    out.append(total_line + "\n")
    for f in files:
        out.extend(_summary(f))
    return "".join(out)


def _stat_name(f: FileDiff) -> str:
    if f.status not in ("renamed", "copied"):
        return quote_path(f.path)
    assert f.old_path is not None and f.new_path is not None
    return _rename_name(f.old_path, f.new_path)


def _rename_name(old: str, new: str) -> str:
    """git's short form of a rename: the common leading directories and trailing path outside
    braces, `dir/{a => b}/file`."""
    if quote_path(old) != old or quote_path(new) != new:
        return f"{quote_path(old)} => {quote_path(new)}"
    prefix = 0
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            break
        if a == "/":
            prefix = i + 1
    suffix = 0
    i, j = len(old) - 1, len(new) - 1
    floor = prefix - 1 if prefix else 0  # the suffix may reuse the prefix's closing slash
    while i >= floor and j >= floor and old[i] == new[j]:
        if old[i] == "/":
            suffix = len(old) - i
        i -= 1
        j -= 1
    old_mid = old[prefix:max(len(old) - suffix, prefix)]
    new_mid = new[prefix:max(len(new) - suffix, prefix)]
    if prefix + suffix:
        return f"{old[:prefix]}{{{old_mid} => {new_mid}}}{old[len(old) - suffix:]}"
    return f"{old_mid} => {new_mid}"


def _summary(f: FileDiff) -> list[str]:
    name = quote_path(f.path)
    if f.status == "created":
        return [f" create mode {f.header('new file mode')} {name}\n"]
    if f.status == "deleted":
        return [f" delete mode {f.header('deleted file mode')} {name}\n"]
    lines = []
    if f.status in ("renamed", "copied"):
        kind = "rename" if f.status == "renamed" else "copy"
        lines.append(f" {kind} {_stat_name(f)} ({f.header('similarity index')})\n")
    old_mode, new_mode = f.header("old mode"), f.header("new mode")
    if old_mode and new_mode:
        lines.append(f" mode change {old_mode} => {new_mode} {name}\n")
    return lines


# ---------------------------------------------------------------------------------------------
# portkit's own rendering (the committed series under patches/ depend on it byte for byte)


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


_INDEX_LINE = re.compile(r"([0-9a-f]{4,40})\.\.[0-9a-f]{4,40}")


# git's own heading rules (builtin diff drivers) a series may have been written with, by the
# file suffixes they serve and the headings only they make (git's default rule takes a line
# that starts with a letter, `_` or `$`): Objective-C's `@implementation`, `- (void)m`.
_DRIVERS = {"objc": ((".m", ".mm"), re.compile(r"@(implementation|interface|protocol)\s|"
                                               r"[-+]\s*\("))}


def heading_drivers(patches: Iterable[Patch]) -> dict[str, str]:
    """The builtin heading rules a series' @@ lines show it was written with, by file
    suffix (`{".m": "objc"}`): its diffs made again write the same headings."""
    found: dict[str, str] = {}
    for driver, (suffixes, only) in _DRIVERS.items():
        if any(only.match(h.section) for p in patches for h in p.hunks
               if PurePosixPath(h.path).suffix in suffixes):
            found.update(dict.fromkeys(suffixes, driver))
    return found


def git_diff(before: dict[str, bytes | None], after: dict[str, bytes | None], *,
             abbrev: int = 7, prefix: bool = True, renames: bool = False,
             modes: tuple[dict[str, int], dict[str, int]] | None = None,
             drivers: dict[str, str] | None = None) -> str:
    """The diff from `before` to `after` (files by path; None: absent) as git writes it:
    `diff --git`, `index <old>..<new> <mode>` with blob ids cut to `abbrev` digits, and
    function headings in the @@ lines. `modes` gives git's mode of files on each side
    (100644 where not given): an executable, a symbolic link (its bytes are its target),
    and a mode change are written as git writes them; `renames` finds renames and copies
    as git's -M does; `drivers` (heading_drivers) gives a file suffix git's heading rule
    for it, as the series was written."""
    with tempfile.TemporaryDirectory(prefix="portkit-diff-") as tmp:
        root = Path(tmp)
        for k, (side, files) in enumerate((("a", before), ("b", after))):
            (root / side).mkdir()
            for rel, data in files.items():
                if data is None:
                    continue
                path = root / side / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                mode = modes[k].get(rel, REGULAR) if modes is not None else REGULAR
                if mode == SYMLINK:
                    os.symlink(os.fsdecode(data), path)
                else:
                    path.write_bytes(data)
                    path.chmod(0o755 if mode == EXECUTABLE else 0o644)
        attributes = root / "attributes"
        attributes.write_text("".join(f"*{suffix} diff={driver}\n"
                                      for suffix, driver in (drivers or {}).items()))
        args = ["-c", f"core.attributesFile={attributes}", "-c", "core.quotePath=true",
                "diff", "--no-index", "--no-prefix", "--no-color", "--no-ext-diff", "--binary",
                f"--abbrev={abbrev}" if abbrev < 40 else "--full-index",
                "-M" if renames else "--no-renames", "a", "b"]
        done = git(args, cwd=root, check=False, ceiling=root)
        if done.returncode not in (0, 1):
            raise ToolFailed(f"git diff failed: {done.stderr.strip()}")
    text = done.stdout
    # Run on two folders named a and b, git names a created file b/x on both sides of the
    # `diff --git` line, and a deleted one a/x: a repository's diff says a/x b/x for both.
    # (a path with unusual bytes is C-quoted, its prefix inside the quotes, as git quotes it)
    known = set(before) | set(after)

    def named(m: re.Match[str]) -> str:
        old, new = diff_git_paths(m.group(1), known)
        sides = ("a/", "b/") if prefix else ("", "")
        return f"diff --git {quote_path(sides[0] + old)} {quote_path(sides[1] + new)}"

    text = re.sub(r"^diff --git (.*)$", named, text, flags=re.M)
    # and names the two sides of a rename or copy by the folders too
    text = re.sub(r'^((?:rename|copy) (?:from|to) "?)[ab]/', r"\1", text, flags=re.M)
    if not prefix:
        text = re.sub(r'^(--- "?|\+\+\+ "?)[ab]/', r"\1", text, flags=re.M)
    return text


_QUOTED = r'"(?:[^"\\]|\\.)*"'


def _unprefixed(name: str) -> str:
    path = unquote_path(name)
    return path[2:] if path[:2] in ("a/", "b/") else path


def diff_git_paths(rest: str, known: Container[str] = (),
                   prefixed: bool = True) -> tuple[str, str]:
    """The two paths of a `diff --git` line (`rest`: the text after `diff --git `),
    unquoted, and their a/ and b/ taken off where the diff is `prefixed`. A name not quoted
    may hold spaces, even ` b/`: the split is the one whose two paths are `known`, else the
    one whose two paths are one (git's own rule for a file not renamed), else the one
    before ` b/`, else the first space."""
    path = _unprefixed if prefixed else unquote_path
    old, new = diff_git_names(rest, known, path)
    return path(old), path(new)


def diff_git_names(rest: str, known: Container[str] = (),
                   path: Callable[[str], str] = _unprefixed) -> tuple[str, str]:
    """The two names of a `diff --git` line as written (C-quoted or not), split as
    diff_git_paths says; `path` makes a name a path (a/ and b/ taken off or not)."""
    m = re.fullmatch(rf"({_QUOTED}) (.+)", rest) or re.fullmatch(rf"(.+?) ({_QUOTED})", rest)
    splits = [(m.group(1), m.group(2))] if m else \
        [(rest[:i], rest[i + 1:]) for i, c in enumerate(rest) if c == " "] or [(rest, rest)]
    for rule in (lambda a, b: path(a) in known and path(b) in known,
                 lambda a, b: path(a) == path(b),
                 lambda a, b: b.startswith("b/")):
        for a, b in splits:
            if rule(a, b):
                return a, b
    return splits[0]


def unified_diff(path: str, before: bytes, after: bytes) -> str:
    """A git-style unified diff of one file, three lines of context."""
    a = before.decode("utf-8").splitlines(keepends=True)
    b = after.decode("utf-8").splitlines(keepends=True)
    out = [f"diff --git a/{path} b/{path}\n"]
    for line in difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", n=3):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def file_name(number: int, subject: str) -> str:
    """portkit's file name for a patch: NNNN-subject-with-dashes.patch (format_patch_name is
    git's exact rule)."""
    slug = re.sub(r"[^A-Za-z0-9._]+", "-", subject).strip("-.")[:52].rstrip("-.")
    return f"{number:04d}-{slug}.patch"


def next_number(folder: Path) -> int:
    numbers = [int(m.group(1)) for p in folder.glob("*.patch")
               if (m := re.match(r"(\d{4})-", p.name))]
    return max(numbers, default=0) + 1
