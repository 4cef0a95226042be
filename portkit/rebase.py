"""Rebase: carry a patch series onto a newer tree, patch by patch, and say what is left.

Each patch goes, in order, onto the target as the patches carried before it left it (a
working copy of the files they touch; the base gets the whole series the same way). Drift
(portkit.drift) says how each hunk fares there; the engine (portkit.hunks, GNU patch), git
apply and git's 3-way merge make the bytes, one hunk at a time. A patch is

  unchanged     every hunk applies as it is, at most some lines away, inside what its
                function became: the same change, its diff made again on the target;
  merged        `git merge-file` of the target's file, the base file as the earlier patches
                left it, and the same with the hunk, is clean: context that changed around
                it, or a hunk the target already has verbatim (carried without it);
  relocated     a hunk went where drift followed its code (renamed, moved, another file),
                re-expressed in the target's names;
  dropped       the target has the change already (drift's present-upstream or
                already-applied: where is said);
  needs-human   nothing safe: the patch is left out of the series, and the side file
                needs-human/<patch>.conflict holds both sides, the nearest match and why;
  needs-review  carried, but a reviewer must look: a symbol its added code uses changed
                (drift's semantic check), a hunk landed only by ignoring context (fuzz) or
                by a guess, a hunk was left out as upstream's in another form, it uses a name
                that a patch left out brings, or (--compile) it does not compile.

GNU patch's word is never taken alone: it misplaces hunks, with fuzz and without (the same
context twice). A hunk that needs fuzz is merged 3-way when the base file is known, else
carried for review; one whose context is found whole must land in what its function
became.

The carried series keeps every patch's mail (From, Date, Subject, body), file name and the
series' conventions (portkit.series); its diffs are git's (`git diff --no-index`, sealed from
the user's configuration), with `index` lines and function headings where the series has
them. Nothing is written until the whole series has been carried, and then all at once.

In an ollama-style fork, `plan_fork` and `move_fork` move the fork itself: its vendored
files refreshed from the target under its rsync rules, its pin, its series; one transaction.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from portkit.anchors import aliases_of
from portkit.apply import refuse_uncommitted
from portkit.cache import lay_down, read_entry
from portkit.drift import model as dm
from portkit.errors import ApplyConflict, ToolMissing, TreeError, UsageError
from portkit.follow import FUZZ_LIMIT, Follow, follow, identifiers, tree_view
from portkit.follow.text import ALREADY as THERE_ALREADY
from portkit.follow.text import BESIDE, SAME_POINT, merge, merge3
from portkit.fork import (  # noqa: F401  (FILTER, Rule, read_filter, sent: re-exported)
    FILTER,
    Rule,
    Scoped,
    Vendoring,
    deleted,
    fork_scope,
    not_vendored_line,
    put_back,
    read_filter,
    sent,
)
from portkit.fork import files as _files
from portkit.hunks import ALREADY, apply_hunks
from portkit.index import flat
from portkit.proc import git, run
from portkit.series import (
    REGULAR,
    FileDiff,
    Hunk,
    Patch,
    Series,
    Unreadable,
    git_diff,
    parse_patch,
    quote_path,
    read_series,
)
from portkit.transaction import Delete, Write, checkpoint, settle, transaction, tree_lock
from portkit.tree import OLLAMA, Tree, pin_matches

SCHEMA = "portkit-rebase/2"

UNCHANGED = "unchanged"
MERGED = "merged"
RELOCATED = "relocated"
DROPPED = "dropped"
NEEDS_HUMAN = "needs-human"
NEEDS_REVIEW = "needs-review"
STATUSES = (UNCHANGED, MERGED, RELOCATED, DROPPED, NEEDS_HUMAN, NEEDS_REVIEW)
ATTENTION = (NEEDS_HUMAN, NEEDS_REVIEW)
ATTENTION_EXIT = dm.ATTENTION_EXIT  # as drift: the series needs a person, portkit ran fine
CONFLICTS = "needs-human"  # the side files' folder in --out
FORMATS = ("table", "json", "markdown")

_THERE = (dm.ALREADY_APPLIED, dm.PRESENT_UPSTREAM)
_HEADING = re.compile(r"^(@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@).*$", re.M)
_INDEX = re.compile(r"^index [0-9a-f]+\.\.([0-9a-f]+)", re.M)


# -- the report ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RebasedPatch:
    """One patch of the series on the target: what became of it and why."""

    file: str
    subject: str
    status: str
    reason: str
    output: str | None  # its file name in the carried series; None when left out
    conflict: str | None = None  # the side file (relative to --out) of a needs-human patch

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {', '.join(STATUSES)}")


@dataclass(frozen=True)
class RebaseReport:
    """The series carried onto one target, patches in series order."""

    series: str
    base: str | None  # the base's pin
    target: str
    pin: str | None  # the target's pin
    patches: tuple[RebasedPatch, ...]
    fork: bool = False  # a fork's series: a dropped patch leaves it, and needs attention
    not_vendored: tuple[tuple[str, str], ...] = ()  # (patch, file): sections not checked

    @property
    def summary(self) -> dict[str, int]:
        counts = Counter(p.status for p in self.patches)
        return {s: counts[s] for s in STATUSES}

    def needs_attention(self, p: RebasedPatch) -> bool:
        """A patch needs a human or a review; in a fork, also a patch it drops."""
        return p.status in ATTENTION or (self.fork and p.status == DROPPED)

    @property
    def attention(self) -> list[RebasedPatch]:
        return [p for p in self.patches if self.needs_attention(p)]

    @property
    def exit_code(self) -> int:
        """ATTENTION_EXIT when a patch needs attention, else 0."""
        return ATTENTION_EXIT if self.attention else 0

    @property
    def not_vendored_line(self) -> str | None:
        if not self.not_vendored:
            return None
        files = sorted({f for _, f in self.not_vendored})
        return f"{not_vendored_line(len(self.not_vendored))} ({', '.join(files)})"

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "series": self.series, "base": self.base,
                "target": self.target, "pin": self.pin, "fork": self.fork,
                "summary": self.summary,
                "attention": [p.file for p in self.attention],
                "not_vendored": [{"patch": p, "file": f} for p, f in self.not_vendored],
                "patches": [{"file": p.file, "subject": p.subject, "status": p.status,
                             "reason": p.reason, "output": p.output, "conflict": p.conflict}
                            for p in self.patches]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


@dataclass
class Rebased:
    """A finished rebase: the report, the carried series and the side files (by path
    relative to --out), ready to be written."""

    report: RebaseReport
    series: Series
    side_files: dict[str, bytes] = field(default_factory=dict)
    # the target's files the carried series changes, as it leaves them (by series path)
    carried: dict[str, bytes | None] = field(default_factory=dict)

    def files(self) -> dict[str, bytes]:
        """Every file of --out, by relative path."""
        out = {p.name: p.data for p in self.series.patches}
        if self.series.kind == "quilt":
            out["series"] = "".join(
                p.name + (f" -p{p.strip}" if p.strip != 1 else "") + "\n"
                for p in self.series.patches).encode("utf-8", "surrogateescape")
        return {**out, **self.side_files}


def render(report: RebaseReport, fmt: str) -> str:
    """The report as text: table, json or markdown."""
    if fmt == "json":
        return report.to_json()
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    counts = ", ".join(f"{n} {s}" for s, n in report.summary.items() if n)
    title = (f"{report.series} onto {report.target}"
             + (f" ({report.pin[:12]})" if report.pin else "") + f": {counts}")
    attention = report.attention
    notes = [f"{len(attention)} patch{'es' if len(attention) != 1 else ''} need"
             f"{'s' if len(attention) == 1 else ''} attention"
             + (f": {', '.join(p.file for p in attention)}" if attention else "")]
    if report.fork and any(p.status == DROPPED for p in report.patches):
        notes.append("in a fork a dropped patch needs attention: its file leaves "
                     "llama/patches with the move")
    if report.not_vendored_line:
        notes.append(report.not_vendored_line)
    mark = {True: "!", False: " "}
    if fmt == "markdown":
        lines = [f"### portkit rebase: {_md(title)}", "",
                 "| # | patch | status | attention | output | reason |",
                 "|---|---|---|---|---|---|"]
        lines += [f"| {i} | `{_md(p.file)}` | {p.status} | "
                  f"{'yes' if report.needs_attention(p) else '-'} | "
                  f"{'`' + _md(p.output) + '`' if p.output else '-'} | "
                  f"{_md(p.reason)}{' (`' + _md(p.conflict) + '`)' if p.conflict else ''} |"
                  for i, p in enumerate(report.patches, 1)]
        lines += [""] + [f"{_md(n)}." for n in notes]
        return "\n".join(lines) + "\n"
    width = max((len(p.file) for p in report.patches), default=5)
    lines = [title, ""]
    lines += [f"{i:>3} {mark[report.needs_attention(p)]}{p.file:<{width}}  {p.status:<12}  "
              f"{p.reason}" for i, p in enumerate(report.patches, 1)]
    lines += [""] + notes
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# -- working copies ------------------------------------------------------------------------


class _Copy:
    """The files a series touches in a tree, as the patches carried so far left them: a
    scratch folder laid out as the tree, each file taken from `source` on first use."""

    def __init__(self, source: Path, root: Path) -> None:
        self.source = source
        self.root = root
        self.files: dict[str, bytes | None] = {}
        self.modes: dict[str, int] = {}  # git's mode of each file present (100644 if not)

    def original(self, rel: str, *, here: bool = False) -> bytes | None:
        """The file in the source tree (or, `here`, in the working copy): a symbolic link
        is its target, as git shows it, never the file it points to."""
        found = read_entry((self.root if here else self.source) / rel)
        return found[0] if found is not None else None

    def original_mode(self, rel: str, *, here: bool = False) -> int:
        found = read_entry((self.root if here else self.source) / rel)
        return found[1] if found is not None else REGULAR

    def load(self, rels: Sequence[str]) -> None:
        for rel in rels:
            if rel not in self.files:
                self.put(rel, self.original(rel), self.original_mode(rel))

    def get(self, rel: str) -> bytes | None:
        self.load([rel])
        return self.files[rel]

    def mode(self, rel: str) -> int:
        self.load([rel])
        return self.modes.get(rel, REGULAR)

    def put(self, rel: str, data: bytes | None, mode: int | None = None) -> None:
        self.files[rel] = data
        if mode is not None:
            self.modes[rel] = mode
        lay_down(self.root, {rel: data}, {rel: self.modes.get(rel, REGULAR)})


# -- git's tools, sealed -------------------------------------------------------------------


def git_apply(root: Path, patch: bytes, room: Path, strip: int = 1) -> bool:
    """`git apply` of `patch` to the files under `root` (no repository); whether it did."""
    return git_apply_at(root, patch, room, strip) is not None


_CHECKING = re.compile(r"^Checking patch (.+?)(?: => .+?)?\.\.\.$")
_SUCCEEDED = re.compile(r"^Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)\.$")


def git_apply_at(root: Path, patch: bytes, room: Path, strip: int = 1,
                 reverse: bool = False, check: bool = False) -> dict[tuple[str, int], int] | None:
    """`git apply` of `patch` to the files under `root` (no repository): None when it does
    not apply, else how far from its line git put each hunk that it moved, by (the file as
    git names it, the hunk's number in its file section from 1)."""
    (room / "apply.patch").write_bytes(patch)
    done = git(["apply", "-v", f"-p{strip}", "--whitespace=nowarn",
                *(["-R"] if reverse else []), *(["--check"] if check else []),
                room / "apply.patch"], cwd=root, check=False, ceiling=root)
    if done.returncode != 0:
        return None
    offsets: dict[tuple[str, int], int] = {}
    current = ""
    for line in done.stderr.splitlines():
        if found := _CHECKING.match(line):
            current = found.group(1)
        elif found := _SUCCEEDED.match(line):
            offsets[(current, int(found.group(1)))] = int(found.group(3))
    return offsets


def similarity(a: bytes, b: bytes) -> float:
    """How alike two files are, as git's rename detection measures it: the share of their
    bytes in lines both have (each line counted as often as both have it)."""
    mine, theirs = Counter(a.splitlines(keepends=True)), Counter(b.splitlines(keepends=True))
    common = sum(len(line) * min(n, theirs[line]) for line, n in mine.items())
    return 2 * common / (len(a) + len(b)) if a or b else 1.0


def _style(series: Series) -> tuple[int, bool]:
    """How the series writes its diffs: the length of its blob ids (7 when it has none) and
    whether its @@ lines carry function headings."""
    lengths = Counter(len(m.group(1)) for p in series.patches for m in _INDEX.finditer(p.diff))
    headings = any(h.section for p in series.patches for h in p.hunks)
    return (lengths.most_common(1)[0][0] if lengths else 7), headings


# -- one patch ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Piece:
    """One hunk (or a file's hunks that land as they are) carried: how, the target file it
    changes and that file's bytes with it, what was done and what a reviewer must check."""

    status: str
    file: str
    data: bytes | None
    said: str = ""
    concern: str = ""


def _by_file(pieces: Sequence[_Piece]) -> dict[str, list[bytes | None]]:
    out: dict[str, list[bytes | None]] = {}
    for piece in pieces:
        out.setdefault(piece.file, []).append(piece.data)
    return out


@dataclass
class _Outcome:
    status: str
    reason: str
    after: dict[str, bytes | None] = field(default_factory=dict)  # target files it changes
    conflict: str = ""  # the side file's text (needs-human)
    modes: dict[str, int] = field(default_factory=dict)  # git's mode of a file in `after`
    settled: bool = False  # carried only through portkit's settling of git's conflicts


@dataclass(frozen=True)
class _NoText:
    """Why text does not carry a patch: the files it cannot merge, and those it can."""

    why: str
    failed: tuple[str, ...]
    clean: dict[str, bytes | None]
    modes: dict[str, int]  # git's mode of each file in `clean`


def _sub_patch(f: FileDiff, hunks: Sequence[Hunk]) -> Patch:
    """A patch of `hunks` of file `f` alone."""
    old = quote_path("a/" + f.old_path) if f.old_path else "/dev/null"
    new = quote_path("b/" + f.new_path) if f.new_path else "/dev/null"
    body = "".join(h.text if h.text.endswith("\n") else h.text + "\n" for h in hunks)
    return parse_patch("part.patch", f"--- {old}\n+++ {new}\n{body}".encode(
        "utf-8", "surrogateescape"))


def _where(h: dm.HunkDrift) -> str:
    return f"{h.file}:{h.old_start}"


class _Carrier:
    """The state of a rebase between patches: the two working copies and what was left out."""

    def __init__(self, lead: Follow, scratch: Path) -> None:
        self.lead = lead
        self.work = _Copy(lead.target.root, scratch / "work")
        self.base = _Copy(lead.base.root, scratch / "base")
        self.room = scratch / "room"  # where merges and single hunks are made
        for folder in (self.room / "hunk", self.base.root, self.work.root):
            folder.mkdir(parents=True)
        self.left_out: dict[str, str] = {}  # a name a left-out patch brings -> that patch
        self._by_name: dict[str, list[str]] | None = None
        self.left_out_files: dict[str, str] = {}  # a file a left-out patch changes -> it

    def carry(self, patch: Patch) -> _Outcome:
        """Patch `patch` carried: by text first (what `git am -3` does), by structure only
        where text cannot."""
        self.work.load(patch.paths)
        self.base.load(patch.paths)
        before_base = {rel: self.base.files[rel] for rel in patch.paths}
        self.base_modes = {rel: self.base.mode(rel) for rel in patch.paths}
        # The base takes the whole series as it is: git apply, as it was written there.
        theirs: dict[str, bytes | None] | None = None
        if git_apply(self.base.root, patch.data, self.room, patch.strip):
            for rel in patch.paths:
                self.base.files[rel] = self.base.original(rel, here=True)
                self.base.modes[rel] = self.base.original_mode(rel, here=True)
            theirs = {rel: self.base.files[rel] for rel in patch.paths}
        before_work = {rel: self.work.get(rel) for rel in patch.paths}
        text = self._text(patch, before_base, theirs)
        if isinstance(text, _Outcome):
            text = self._there_already(patch, text, before_work, before_base)
        if isinstance(text, _Outcome) and text.status == DROPPED:
            return text
        if isinstance(text, _Outcome) and text.settled:
            # git's merge stopped and portkit's settling carried it: structure that finds
            # the change in the target already (drift's present-upstream) goes first
            there = self._structure(patch, before_base)
            if there.status == DROPPED:
                return there
        if isinstance(text, _Outcome):
            text = self._in_target_names(patch, text, before_work)
            text = self._semantic(patch, text)  # on the files as they were before it
            for rel, data in text.after.items():
                self.work.put(rel, data, text.modes.get(rel))
            return self._after_left_out(patch, text)
        outcome = self._structure(patch, before_base)
        if outcome.status in (UNCHANGED, MERGED):
            outcome = replace(outcome, status=NEEDS_REVIEW, reason=(
                f"text does not carry it ({text.why}); {outcome.status} by structure: "
                f"{outcome.reason}"))
        if outcome.status == NEEDS_HUMAN:
            brings = set(identifiers(h for hk in patch.hunks for h in hk.added))
            for name in brings - self.lead.base.all_words - self.lead.target.all_words:
                self.left_out.setdefault(name, patch.name)
            # What text did carry, it still carries: later patches find those files as the
            # series leaves them, and only the files left for a human are missing.
            for rel in text.failed:
                self.left_out_files.setdefault(rel, patch.name)
            # a file whose every hunk upstream has already is not carried in part
            upstream = {f.path for f in patch.files
                        if f.hunks and len(_hunks_there(f, before_work, before_base))
                        == len(f.hunks)}
            text = replace(text, clean={rel: d for rel, d in text.clean.items()
                                        if rel not in upstream})
            if text.clean:
                for rel, data in text.clean.items():
                    self.work.put(rel, data, text.modes.get(rel))
                kept = ", ".join(sorted(text.clean))
                outcome = replace(outcome, after=dict(text.clean), modes=dict(text.modes),
                                  reason=(
                    f"carried in part (only {kept}); left for a human: {outcome.reason}"))
            return outcome
        for rel, data in outcome.after.items():
            self.work.put(rel, data)
        return self._after_left_out(patch, outcome)

    def _in_target_names(self, patch: Patch, outcome: _Outcome,
                         ours: dict[str, bytes | None]) -> _Outcome:
        """What text carried, with the names its added lines use that the target knows by
        another name (a rename of portkit/data/aliases.toml: the base defines the name, the
        target only its alias) written as the target writes them: text cannot know a
        rename, structure can. Not what `git am -3` writes, so for review, saying so."""
        if outcome.status not in (UNCHANGED, MERGED, NEEDS_REVIEW) or not outcome.after:
            return outcome
        renames: dict[str, str] = {}
        for word in identifiers(line for h in patch.hunks for line in h.added):
            if self.lead.target.index.find(word) or not self.lead.base.index.find(word):
                continue
            alias = next((a for a in aliases_of(word)
                          if a != word and self.lead.target.index.find(a)), None)
            if alias is not None:
                renames[word] = alias
        if not renames:
            return outcome
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, renames)) + r")\b")
        after = dict(outcome.after)
        for rel, data in outcome.after.items():
            if data is None:
                continue
            old = (ours.get(rel) or b"").splitlines(keepends=True)
            new = data.splitlines(keepends=True)
            start, end, lines = _region(old, new)
            kept = Counter(old[start:end])
            written = []
            for line in lines:
                if kept[line] > 0:
                    kept[line] -= 1
                    written.append(line)
                else:
                    written.append(pattern.sub(lambda m: renames[m.group(1)], line.decode(
                        "utf-8", "surrogateescape")).encode("utf-8", "surrogateescape"))
            after[rel] = b"".join(new[:start] + written + new[len(new) - (len(old) - end):])
        said = ", ".join(f"{a} -> {b}" for a, b in sorted(renames.items()))
        return replace(outcome, status=NEEDS_REVIEW, after=after, reason=(
            f"written with the target's names ({said}: renames upstream made); "
            f"{outcome.reason}"))

    def _there_already(self, patch: Patch, outcome: _Outcome, ours: dict[str, bytes | None],
                       base: dict[str, bytes | None]) -> _Outcome:
        """A patch text carried, a hunk of which adds only lines the target has already in
        that file and the base did not: upstream took the same change, and carrying it
        may write it twice. Never a drop (text carried it): a note for a reviewer."""
        if outcome.status not in (UNCHANGED, MERGED, NEEDS_REVIEW) or not outcome.after:
            return outcome
        notes = [f"{f.path}:{hunk.old_start}: every line it adds is in the target already: "
                 "carried, it may be there twice"
                 for f in patch.files for hunk in _hunks_there(f, ours, base)]
        if not notes:
            return outcome
        if outcome.settled and len(notes) == len(patch.hunks):
            # git's merge did not take it, and all of it is there: present upstream
            return _Outcome(DROPPED, "; ".join(note.replace(
                ": carried, it may be there twice", " (git's merge does not take it)")
                for note in notes))
        return replace(outcome, status=NEEDS_REVIEW, reason="; ".join([*notes, outcome.reason]))

    def _semantic(self, patch: Patch, outcome: _Outcome) -> _Outcome:
        """A patch text carried whose added lines use a symbol that changed upstream (drift's
        semantic check, symbols resolved without doubt): for a reviewer."""
        if outcome.status not in (UNCHANGED, MERGED, NEEDS_REVIEW) or not outcome.after:
            return outcome
        written = self._new_lines(outcome.after)
        review = []
        for change in self.lead.semantic(patch):
            if change.change == "renamed" and not re.search(rf"\b{change.symbol}\b", written):
                continue
            review.append(f"it uses {change.symbol}: {change.detail}")
        for name in identifiers(line for h in patch.hunks for line in h.added):
            if name in self.left_out:
                review.append(f"it uses {name}, which {self.left_out[name]} brings and which "
                              "was left out")
        if not review:
            return outcome
        return replace(outcome, status=NEEDS_REVIEW,
                       reason="; ".join([*review, outcome.reason]))


    def _after_left_out(self, patch: Patch, outcome: _Outcome) -> _Outcome:
        """A patch carried onto a file that an earlier patch, left out, also changes: its
        result is not the file the series means, and a reviewer is told."""
        if outcome.status not in (UNCHANGED, MERGED):
            return outcome
        before = sorted({f"{rel} ({self.left_out_files[rel]})" for rel in patch.paths
                         if rel in self.left_out_files})
        if not before:
            return outcome
        return replace(outcome, status=NEEDS_REVIEW, reason=(
            f"{outcome.reason}; an earlier patch that was left out changes the same file: "
            + ", ".join(before)))

    def _text(self, patch: Patch, before_base: dict[str, bytes | None],
              theirs: dict[str, bytes | None] | None) -> _Outcome | _NoText:
        """The patch carried as `git am -3` carries it: `git apply` of the whole patch onto
        the target as the earlier patches left it; failing that, each file it touches
        merged three ways (the target's file, the base's file as the earlier patches left
        it, and the same with this patch). The outcome, or why text cannot carry it."""
        room = self.room / "text"
        if room.exists():
            shutil.rmtree(room)
        room.mkdir()
        ours = {rel: self.work.get(rel) for rel in patch.paths}
        ours_modes = {rel: self.work.mode(rel) for rel in patch.paths}
        lay_down(room, ours, ours_modes)
        offsets = git_apply_at(room, patch.data, self.room, patch.strip)
        if offsets is not None:
            return self._applied(patch, room, ours, ours_modes, offsets)
        if theirs is None:
            return _NoText("it does not apply, and not to its own base either",
                           tuple(patch.paths), {}, {})
        after: dict[str, bytes | None] = {}
        modes: dict[str, int] = {}
        conflicts: list[str] = []
        failed: list[str] = []
        said: list[str] = []
        review: list[str] = []
        for rel in patch.paths:
            o, b, t = ours[rel], before_base[rel], theirs[rel]
            home = rel
            if o is None and b is not None and b != t:
                moved = self.moved(rel, b)
                if moved is not None:
                    home, o = moved
                    ours_modes[home] = self.work.mode(home)
                    said.append(f"{rel} is {home} in the target (git's rename rule)")
            # git's mode (executable, a link) as the merge of trees takes it: the patch's
            # where it changes it, else the target's
            mode = self.base.modes.get(rel, REGULAR) \
                if self.base.modes.get(rel, REGULAR) != self.base_modes[rel] \
                else ours_modes.get(home, REGULAR)
            if o in (b, t):
                result: bytes | None = t
            elif t == b:
                result = o
            elif o is None or b is None or t is None:
                conflicts.append(f"{rel}: " + ("the target has no such file" if o is None
                                               else "the target has it already, otherwise"
                                               if b is None else "the target changed it"))
                failed.append(rel)
                continue
            else:
                merged = merge(o, b, t, room=self.room)
                if merged.conflicts:
                    conflicts.append(f"{rel}: {merged.conflicts} conflict(s) in a 3-way merge")
                    failed.append(rel)
                    continue
                result = merged.data
                same = merged.settled.count(SAME_POINT)
                beside = merged.settled.count(BESIDE)
                if THERE_ALREADY in merged.settled:
                    said.append(f"{home}: what it inserts at "
                                f"{merged.settled.count(THERE_ALREADY)} "
                                "place(s) git's merge stops at is in the target already")
                if same:
                    review.append(f"{home}: upstream inserted lines where this patch inserts "
                                  f"its own ({same}x): the patch's lines were put first, "
                                  "right after the line they follow")
                if beside:
                    review.append(f"{home}: git's merge stops at {beside} insertion(s) right "
                                  "next to lines upstream rewrote: each was kept on its side "
                                  "of them")
            if result != o or (result is not None and mode != ours_modes.get(home)):
                after[home] = result
                modes[home] = mode
        if conflicts:
            return _NoText("; ".join(conflicts), tuple(failed), after, modes)
        how = "; ".join(["merged 3-way (git apply does not take it as it is)", *said])
        if not after and self._reverses(patch, room):
            return _Outcome(MERGED, "the target has this change already (it reverse-applies)")
        if review:
            return _Outcome(NEEDS_REVIEW, "; ".join([*review, how]), after, modes=modes,
                            settled=True)
        return _Outcome(MERGED, how, after, modes=modes)

    def _applied(self, patch: Patch, room: Path, ours: dict[str, bytes | None],
                 ours_modes: dict[str, int], offsets: dict[tuple[str, int], int]) -> _Outcome:
        """A patch git applies as it is (in `room`, laid out as `ours`), with what a
        reviewer must know: a hunk outside what its code became, a patch that also applies
        in reverse."""
        entries = {rel: read_entry(room / rel) for rel in patch.paths}
        applied = {rel: e[0] if e is not None else None for rel, e in entries.items()}
        modes = {rel: e[1] for rel, e in entries.items() if e is not None}
        shifts = sorted(set(offsets.values()))
        how = "applies as it is" if not shifts else \
            "applies " + ", ".join(f"{o:+d}" for o in shifts) + " lines away"
        review = self._landings(patch, offsets)
        lay_down(room, ours, ours_modes)
        if self._reverses(patch, room):
            review.append("it also applies in reverse: the target may have it already")
        after = {rel: d for rel, d in applied.items()
                 if d != ours[rel] or (d is not None and modes[rel] != ours_modes[rel])}
        modes = {rel: m for rel, m in modes.items() if rel in after}
        if review:
            return _Outcome(NEEDS_REVIEW, "; ".join([*review, how]), after, modes=modes)
        return _Outcome(UNCHANGED, how, after, modes=modes)

    def _reverses(self, patch: Patch, room: Path) -> bool:
        """Whether `patch` applies in reverse to the files in `room`: text that is there
        already (git does not check the old mode of a mode change, so a patch with a
        section without text is never taken for one that is there)."""
        if not patch.hunks or any(f.text_free for f in patch.files):
            return False
        return git_apply_at(room, patch.data, self.room, patch.strip, reverse=True,
                            check=True) is not None

    def _landings(self, patch: Patch, offsets: dict[tuple[str, int], int]) -> list[str]:
        """Each hunk git put outside what its code in the base became (drift's Locator,
        where it finds that without doubt): text decides, this is for a reviewer."""
        self.lead.look_at(self.work.files)
        out = []
        for f in patch.files:
            if f.status != "modified":
                continue
            for number, hunk in enumerate(f.hunks, 1):
                home = self.lead.home(hunk)
                if home is None:
                    continue
                file, first, last, name = home
                line = hunk.old_start + offsets.get((f.path, number), 0)
                if file != f.path or not first - 3 <= line <= last + 3:
                    out.append(f"{f.path}:{hunk.old_start}: git puts it at line {line}, but "
                               f"its code in the base is {name} ({file}:{first}) in the "
                               "target")
        return out

    def moved(self, rel: str, data: bytes) -> tuple[str, bytes] | None:
        """Where the file `rel` (`data` in the base) went in the target, as git's rename
        detection finds it: the most similar file, at least half alike, among those of the
        same name, else among the target's files of the same kind that the base lacks;
        None when there is none."""
        name = PurePosixPath(rel).name
        suffix = PurePosixPath(rel).suffix
        same = self.lead_files().get(name, [])
        new = [other for files in self.lead_files().values() for other in files
               if other.endswith(suffix) and other not in same
               and not (self.lead.base.root / other).exists()]
        for candidates in (same, new):
            best: tuple[float, str] | None = None
            for other in candidates:
                if other == rel or self.work.get(other) is None:
                    continue
                score = similarity(data, self.work.get(other) or b"")
                if score >= 0.5 and (best is None or score > best[0]):
                    best = (score, other)
            if best is not None:
                found = self.work.get(best[1])
                return (best[1], found) if found is not None else None
        return None

    def lead_files(self) -> dict[str, list[str]]:
        """The target's files by file name."""
        if self._by_name is None:
            self._by_name = {}
            root = self.lead.target.root
            for path in sorted(root.rglob("*")):
                if path.is_file() and not path.is_symlink() and ".git" not in path.parts:
                    rel = path.relative_to(root).as_posix()
                    self._by_name.setdefault(path.name, []).append(rel)
        return self._by_name

    def _structure(self, patch: Patch, before_base: dict[str, bytes | None]) -> _Outcome:
        """The patch carried hunk by hunk where drift follows its code."""
        with apply_hunks([patch], self.work.root, fuzz=FUZZ_LIMIT) as run:
            presult = run.patches[0]
        drift = self.lead.patch(presult, self.work.files)
        if any(hr.status == ALREADY for hr in presult.hunks):  # say where the engine found it
            drift = replace(drift, hunks=tuple(
                replace(d, reason=f"{d.reason}, at line {hr.line}")
                if d.status == dm.ALREADY_APPLIED and hr.status == ALREADY and hr.line else d
                for hr, d in zip(presult.hunks, drift.hunks, strict=False)))
        return self._decide(patch, drift, before_base)

    def _decide(self, patch: Patch, drift: dm.PatchDrift,
                before_base: dict[str, bytes | None]) -> _Outcome:
        hunks = drift.hunks
        if all(h.status in _THERE for h in hunks):
            return _Outcome(DROPPED, "; ".join(dict.fromkeys(
                f"{_where(h)}: {h.reason}" for h in hunks)))
        if not patch.hunks:  # a binary patch, a rename alone: drift has no hunk to follow
            return self._human(patch, drift, "; ".join(h.reason for h in hunks), before_base)
        pairs = list(zip(patch.hunks, hunks, strict=True))
        carry = [(h, d) for h, d in pairs if d.status not in _THERE]
        skipped = [d for _, d in pairs if d.status in _THERE]
        status = MERGED if skipped else UNCHANGED
        review = [f"{_where(d)} was left out: the target has it in another form ({d.reason})"
                  for d in skipped if d.status == dm.PRESENT_UPSTREAM]
        how = [f"{_where(d)} is in the target already ({d.reason}); carried without it"
               for d in skipped if d.status == dm.ALREADY_APPLIED]
        found = self._pieces(patch, carry, before_base)
        if isinstance(found, str):
            return self._human(patch, drift, found, before_base)
        pieces = found
        after: dict[str, bytes | None] = {}
        for rel, versions in _by_file(pieces).items():
            combined = versions[0] if len(versions) == 1 else self._combine(rel, versions)
            if combined is None and len(versions) > 1:
                return self._human(patch, drift, f"the hunks carried into {rel} overlap",
                                   before_base)
            after[rel] = combined
        for piece in pieces:
            status = max(status, piece.status, key=STATUSES.index)
            how += [piece.said] if piece.said else []
            review += [piece.concern] if piece.concern else []
        written = self._new_lines(after)
        for change in drift.semantic:
            if change.change == "renamed" and not re.search(rf"\b{change.symbol}\b", written):
                how.append(f"written with the target's name for {change.symbol}")
            else:
                review.append(f"it uses {change.symbol}: {change.detail}")
        for name in identifiers(line for h in patch.hunks for line in h.added):
            if name in self.left_out:
                review.append(f"it uses {name}, which {self.left_out[name]} brings and which "
                              "was left out")
        if not how:
            offsets = sorted({d.offset for _, d in carry if d.offset})
            how.append("applies as it is" if not offsets else
                       "applies " + ", ".join(f"{o:+d}" for o in offsets) + " lines away")
        if review:
            return _Outcome(NEEDS_REVIEW, "; ".join(review + how), after)
        return _Outcome(status, "; ".join(how), after)

    def _pieces(self, patch: Patch, carry: list[tuple[Hunk, dm.HunkDrift]],
                before_base: dict[str, bytes | None]) -> list[_Piece] | str:
        """Each hunk carried on its own: the file it changes and that file's bytes with it;
        or why one cannot be."""
        pieces: list[_Piece] = []
        for hunk, d in carry:
            f = next(f for f in patch.files if f.path == hunk.path)
            if f.status == "deleted":  # the whole file goes, or nothing does
                with apply_hunks([_sub_patch(f, [hunk])], self.work.root, fuzz=0) as run:
                    gone = run.patches[0].applied
                piece: _Piece | str = _Piece(UNCHANGED, f.path, None) if gone else \
                    f"{_where(d)}: the file it deletes is not the one the target has"
            elif d.status in (dm.CLEAN, dm.OFFSET):
                piece = self._landed(f, hunk, d, before_base)
            else:
                piece = self._hunk(f, hunk, d, before_base)
            if isinstance(piece, str):
                return piece
            pieces.append(piece)
        return pieces

    def _landed(self, f: FileDiff, hunk: Hunk, d: dm.HunkDrift,
                before_base: dict[str, bytes | None]) -> _Piece | str:
        """A hunk whose context GNU patch finds whole, where it says or some lines away. The
        same context may be there twice (one function written like another): it must land
        inside what its function became, else it is carried there, for review; and where
        a 3-way merge puts it elsewhere, or nothing vouches for the place, a reviewer is
        told."""
        mine = self.work.get(f.path)
        alone = self._git_apply(f, [hunk], mine) if mine is not None and f.status == "modified" \
            else self._apply(f, [hunk], self.work.root, fuzz=0)
        merged = self._merge3(f, hunk, before_base)
        home = self.lead.home(hunk)
        strays = self._strays(f.path, alone, home)
        found = f"{d.offset:+d} lines away" if d.offset else "at its line"
        if strays:
            landing = self.lead.relocate(hunk)
            if landing is not None:
                return _Piece(RELOCATED, landing.file, landing.data, f"{_where(d)}: relocated",
                              f"{_where(d)}: GNU patch finds its context {found}, {strays}; "
                              "it was put there" + (f" ({landing.guess})" if landing.guess
                                                    else ""))
            if merged is not None and not self._strays(f.path, merged, home):
                return _Piece(MERGED, f.path, merged, f"{_where(d)}: merged 3-way",
                              f"{_where(d)}: GNU patch finds its context {found}, {strays}; "
                              "a 3-way merge puts it there")
            return f"{_where(d)}: GNU patch finds its context {found}, {strays}"
        if alone is None:
            return _Piece(MERGED, f.path, merged, f"{_where(d)}: merged 3-way") \
                if merged is not None else f"{_where(d)}: {d.reason}, but not on its own"
        if merged is None or merged == alone:
            return _Piece(UNCHANGED, f.path, alone, "", "" if home or merged or not d.offset
                          else f"{_where(d)}: GNU patch finds its context {found}; no 3-way "
                               "merge and no symbol confirm the place")
        return _Piece(MERGED, f.path, merged, f"{_where(d)}: merged 3-way",
                      f"{_where(d)}: GNU patch finds its context {found}, but a 3-way merge "
                      "puts it elsewhere")

    def _strays(self, rel: str, data: bytes | None,
                home: tuple[str, int, int, str] | None) -> str:
        """Why `data` (the file `rel` with a hunk in it) has the change outside `home`, what
        its function became; "" when inside, or when that is unknown."""
        before = self.work.get(rel)
        if home is None or data is None or before is None:
            return ""
        start, _, _ = _region(before.splitlines(keepends=True), data.splitlines(keepends=True))
        file, first, last, name = home
        if file == rel and first - 3 <= start + 1 <= last + 3:
            return ""
        return f"line {start + 1}, but it belongs in {name} ({file}:{first})"

    def _git_apply(self, f: FileDiff, hunks: Sequence[Hunk], data: bytes) -> bytes | None:
        """`data` (the file `f`) with `hunks` applied by git apply (no fuzz), or None."""
        where = self.room / "hunk" / f.path
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_bytes(data)
        if not git_apply(self.room / "hunk", _sub_patch(f, hunks).data, self.room):
            return None
        return where.read_bytes()

    def _hunk(self, f: FileDiff, hunk: Hunk, d: dm.HunkDrift,
              before_base: dict[str, bytes | None]) -> _Piece | str:
        """One hunk whose context is not where it says: where drift relocated it, else merged
        3-way where the base and the target have its file, else (fuzz) where GNU patch puts
        it, for review; or why none of that."""
        if d.status == dm.RELOCATED:
            landing = self.lead.landing(hunk)
            if landing is None:
                return f"{_where(d)}: {d.reason}, but drift cannot say how it reads there"
            self.work.load([landing.file])
            concerns = ([f"{_where(d)} lands in {landing.file} only with fuzz {landing.fuzz}"]
                        if landing.fuzz else []) + (
                [f"{_where(d)}: {landing.guess}"] if landing.guess else [])
            return _Piece(RELOCATED, landing.file, landing.data, f"{_where(d)}: {d.reason}",
                          "; ".join(concerns))
        merged = self._merge3(f, hunk, before_base)
        if merged is not None:
            concern = (f"{_where(d)}: drift finds no place for it ({d.reason}), a 3-way merge "
                       "does" if d.status == dm.CONFLICT else "")
            return _Piece(MERGED, f.path, merged, f"{_where(d)}: {d.reason}; merged 3-way",
                          concern)
        data = self._apply(f, [hunk], self.work.root, fuzz=FUZZ_LIMIT) \
            if d.status == dm.FUZZ else None
        if data is None:
            return f"{_where(d)}: {d.reason}"
        return _Piece(UNCHANGED, f.path, data, "", f"{_where(d)} lands only with fuzz "
                      f"{d.fuzz} and no 3-way merge is clean")

    def _apply(self, f: FileDiff, hunks: Sequence[Hunk], root: Path, fuzz: int) -> bytes | None:
        """The file `f` under `root` with `hunks` applied by the engine, or None."""
        with apply_hunks([_sub_patch(f, hunks)], root, fuzz=fuzz) as run:
            if not run.patches[0].applied:
                return None
            return run.files.get(f.path) or b""

    def _merge3(self, f: FileDiff, hunk: Hunk,
                before_base: dict[str, bytes | None]) -> bytes | None:
        """The target's file merged with what `hunk` does to the base file, when the base and
        the target both have the file and the merge is clean."""
        if f.status != "modified":
            return None
        ours, base = self.work.get(f.path), before_base.get(f.path)
        theirs = self._git_apply(f, [hunk], base) if ours is not None and base is not None \
            else None
        if ours is None or base is None or theirs is None:
            return None
        merged, conflicts = merge3(ours, base, theirs, room=self.room)
        return None if conflicts else merged

    def _new_lines(self, after: dict[str, bytes | None]) -> str:
        """The lines the carried patch writes (and those around them), as one text."""
        out = []
        for rel, data in after.items():
            before = self.work.get(rel)
            _, _, lines = _region((before or b"").splitlines(keepends=True),
                                  (data or b"").splitlines(keepends=True))
            out.append(b"".join(lines).decode("utf-8", "surrogateescape"))
        return "".join(out)

    def _combine(self, rel: str, versions: list[bytes | None]) -> bytes | None:
        """One file changed by several pieces, each made from the file before the patch:
        the lines each one changes, all put together; None when two of them touch."""
        ancestor = self.work.get(rel)
        if ancestor is None or any(v is None for v in versions):
            return None
        old = ancestor.splitlines(keepends=True)
        regions = sorted(_region(old, v.splitlines(keepends=True))
                         for v in versions if v is not None)
        out: list[bytes] = []
        at = 0
        for start, end, lines in regions:
            if start < at or (start == at and out and start == end):
                return None  # two pieces change the same lines, or insert at one place
            out += old[at:start] + lines
            at = end
        return b"".join(out + old[at:])

    def _human(self, patch: Patch, drift: dm.PatchDrift, reason: str,
               before_base: dict[str, bytes | None]) -> _Outcome:
        return _Outcome(NEEDS_HUMAN, reason,
                        conflict=self._side_file(patch, drift, reason, before_base))

    def _side_file(self, patch: Patch, drift: dm.PatchDrift, reason: str,
                   before_base: dict[str, bytes | None]) -> str:
        """Both sides of a patch that needs a human: each hunk as the series has it, what
        drift found in the target, its nearest match there, and the 3-way merge's conflicts
        where the base and the target both have the file."""
        out = [f"portkit rebase: {patch.name} needs a human", f"Subject: {patch.subject}",
               f"Reason: {reason}", ""]
        for number, (hunk, d) in enumerate(zip(patch.hunks, drift.hunks, strict=False), 1):
            out += [f"=== hunk {number}: {hunk.path} @@ -{hunk.old_start},{hunk.old_len} "
                    f"({d.status})", f"why: {d.reason}",
                    "--- the series (as the patch changes the base):", hunk.body.rstrip("\n")]
            if d.nearest is not None:
                out += [f"--- the target, nearest match at {d.nearest.file}:{d.nearest.line}:",
                        d.nearest.text]
            else:
                out.append("--- the target: no near match")
            out.append("")
        for f in patch.files:
            ours, base, theirs = (self.work.get(f.path), before_base.get(f.path),
                                  self.base.files.get(f.path))
            if f.status != "modified" or ours is None or base is None or theirs is None \
                    or theirs == base:
                continue
            merged, conflicts = merge3(ours, base, theirs, room=self.room)
            if conflicts:
                out += [f"=== {f.path}: git merge-file (target | base | series), "
                        f"{conflicts} conflict(s)", *_conflict_blocks(merged), ""]
        return "\n".join(out).rstrip("\n") + "\n"


def _hunks_there(f: FileDiff, ours: dict[str, bytes | None],
                 base: dict[str, bytes | None]) -> list[Hunk]:
    """The hunks of file section `f` that add only lines the target's file (`ours`) has and
    the base's did not: what upstream took as it is."""
    if f.status not in ("modified", "renamed") or ours.get(f.path) is None:
        return []
    here = {flat(x) for x in _text_of(ours[f.path]).splitlines()}
    before = {flat(x) for x in _text_of(base.get(f.path)).splitlines()}
    out = []
    for hunk in f.hunks:
        added = [a for a in (flat(x) for x in hunk.added) if len(a) >= 4]
        if added and all(a in here and a not in before for a in added):
            out.append(hunk)
    return out


def _text_of(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", "surrogateescape")


def _region(old: list[bytes], new: list[bytes]) -> tuple[int, int, list[bytes]]:
    """Where `new` differs from `old`: old[start:end] is replaced by the returned lines."""
    start = 0
    while start < min(len(old), len(new)) and old[start] == new[start]:
        start += 1
    end = 0
    while end < min(len(old), len(new)) - start and old[-1 - end] == new[-1 - end]:
        end += 1
    return start, len(old) - end, new[start:len(new) - end]


def _conflict_blocks(merged: bytes, context: int = 3) -> list[str]:
    """The conflict-marked regions of a merge result, with a few lines around each."""
    lines = merged.decode("utf-8", "surrogateescape").splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("<<<<<<< "):
            i += 1
            continue
        end = next((k for k in range(i, len(lines)) if lines[k].startswith(">>>>>>> ")),
                   len(lines) - 1)
        lo, hi = max(i - context, 0), min(end + context + 1, len(lines))
        out += [f"@ line {lo + 1}", *lines[lo:hi], ""]
        i = end + 1
    return out


# -- the whole series -----------------------------------------------------------------------


def _written(patch: Patch, diff: str) -> Patch:
    """The patch with `diff` for its diff, written as the patch itself is written: the same
    mail or preamble byte for byte, its diffstat made again where it has one, `index` lines
    only where it has them, the same signature and line ends (Patch.with_diff)."""
    return patch.with_diff(diff)


def base_spec(spec: str, target: Path | None = None) -> str:
    """--base as `portkit tree fetch` takes it; or, when the target is a local git checkout
    and `spec` names no tree, a commit of that repository (as git:REPO@COMMIT)."""
    if target is None or Path(spec).is_dir() or spec.startswith(("pypi:", "git:")) \
            or not (target / ".git").exists():
        return spec
    found = git(["rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}"], cwd=target,
                check=False)
    return f"git:{target.resolve()}@{found.stdout.strip()}" if found.returncode == 0 else spec


def rebase(series: Series, target: Tree, *, base: Tree | None = None, fork: Tree | None = None,
           series_label: str = "series", target_label: str = "target") -> Rebased:
    """Carry `series` (written against `base`, or against `fork` with the series taken out)
    onto `target`. Nothing is written: see write_rebased. With `fork`, the series is
    carried as the fork vendors llama.cpp (portkit.fork): the sections for files it does not
    vendor are not checked and go back into each carried patch unchanged, every tree is seen
    as the fork would vendor it, and a dropped patch needs attention."""
    abbrev, headings = _style(series)
    with ExitStack() as stack:
        scoped: Scoped | None = None
        if fork is not None:
            seen = stack.enter_context(fork_scope(fork, series, [target], base))
            scoped, (view,), base_view = seen.scoped, seen.trees, seen.base
        lead = stack.enter_context(follow(
            scoped.series if scoped else series, base_view if scoped else base,
            view if scoped else target, target_label, fork))
        tmp = stack.enter_context(_scratch("portkit-rebase-"))
        carrier = _Carrier(lead, tmp)
        rows: list[RebasedPatch] = []
        carried: list[Patch] = []
        side: dict[str, bytes] = {}
        kept: dict[str, bytes] = {}
        mine = {p.name: p for p in scoped.series.patches} if scoped else {}
        for patch in series.in_order():
            if isinstance(patch, Unreadable):  # its own verdict; kept for the human as it is
                kept[patch.name] = patch.data
                rows.append(RebasedPatch(patch.name, patch.name, NEEDS_HUMAN,
                                         f"it cannot be read: {patch.reason}", patch.name))
                continue
            original, away = patch, scoped.left_out.get(patch.name, []) if scoped else []
            if scoped is not None and patch.name in scoped.untouched:
                carried.append(patch)  # nothing of it is vendored: kept as it is
                rows.append(RebasedPatch(patch.name, patch.subject, UNCHANGED,
                                         "it touches only files this fork does not vendor: "
                                         "not checked, kept as it is", patch.name))
                continue
            patch = mine.get(patch.name, patch)
            had = dict(carrier.work.files)
            had_modes = dict(carrier.work.modes)
            outcome = carrier.carry(patch)
            if outcome.status == DROPPED or (outcome.status == NEEDS_HUMAN
                                             and not outcome.after):
                name = f"{CONFLICTS}/{Path(patch.name).stem}.conflict" \
                    if outcome.status == NEEDS_HUMAN else None
                if name is not None:
                    side[name] = outcome.conflict.encode("utf-8", "surrogateescape")
                rows.append(RebasedPatch(patch.name, patch.subject, outcome.status,
                                         outcome.reason, None, name))
                continue
            before = {rel: had[rel] if rel in had else carrier.work.original(rel)
                      for rel in outcome.after}
            before_modes = {rel: had_modes[rel] if rel in had_modes
                            else carrier.work.original_mode(rel) for rel in outcome.after}
            after_modes = {rel: outcome.modes.get(rel, before_modes[rel])
                           for rel in outcome.after}
            diff = git_diff(before, outcome.after, abbrev=patch.conventions.abbrev or abbrev,
                            prefix=patch.strip != 0, modes=(before_modes, after_modes),
                            renames=any(f.rename_from for f in patch.files))
            if not headings:
                diff = _HEADING.sub(r"\1", diff)
            if not diff:
                rows.append(RebasedPatch(patch.name, patch.subject, DROPPED,
                                         f"it changes nothing on the target ({outcome.reason})",
                                         None))
                continue
            if away:  # the sections for files the fork does not vendor, as they were
                diff = put_back(diff, original, away)
            carried.append(_written(original, diff))
            name = None
            if outcome.status == NEEDS_HUMAN:  # carried in part: the rest in its side file
                name = f"{CONFLICTS}/{Path(patch.name).stem}.conflict"
                side[name] = outcome.conflict.encode("utf-8", "surrogateescape")
            rows.append(RebasedPatch(patch.name, patch.subject, outcome.status, outcome.reason,
                                     patch.name, name))
        changed = {rel: data for rel, data in carrier.work.files.items()
                   if data != carrier.work.original(rel)}
    report = RebaseReport(series_label, base.pin if base else fork.pin if fork else None,
                          target_label, target.pin, tuple(rows), fork=fork is not None,
                          not_vendored=tuple((u.patch, u.path) for u in scoped.unvendored)
                          if scoped else ())
    out = Series(series.folder, series.kind, tuple(carried), series.conventions)
    return Rebased(report, out, {**kept, **side}, changed)


@contextmanager
def _scratch(prefix: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


def write_rebased(rebased: Rebased, out: Path) -> None:
    """Write the carried series and the side files to `out` (absent or empty) all at once:
    they are made in a hidden sibling and renamed into place."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} exists and is not an empty folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.portkit-"))
    try:
        for rel, data in rebased.files().items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# -- a fork: its vendored tree moved onto the target ------------------------------------------
#
# An ollama-style fork vendors llama.cpp in llama/llama.cpp and ggml in ml/backend/ggml/ggml,
# each refreshed from upstream by rsync with the fork's own rules (.rsync-filter in each
# folder), pins upstream in Makefile.sync (FETCH_HEAD) and keeps its series in llama/patches.

_FETCH_HEAD = re.compile(r"^(\s*FETCH_HEAD\s*[:?]?=\s*)([0-9a-fA-F]{7,40})(\s*)$", re.M)
_LLAMA_COMMIT = re.compile(r'(LLAMA_COMMIT\s*=\s*")([0-9a-fA-F]{7,40})(")')


# (Imports of this part are made where they are used: the top of the module belongs to the
# carrier above.)
#
# What a move reads of a fork (relative to its root): its plan is made from a private copy of
# these, and the fork must still hold exactly that copy, under its lock, when it is written.
_FORK_FILES = ("Makefile.sync", "llama/build-info.cpp")
_FORK_FOLDERS = ("llama/llama.cpp", "llama/patches", "ml/backend/ggml/ggml")


def fork_state(root: Path) -> dict[str, str]:
    """What a move of the fork at `root` depends on: every file (sha256) and symbolic link
    (its target) of its pin files, vendored folders and series, without following links."""
    return _fork_copy(root, None)


def _fork_copy(root: Path, into: Path | None) -> dict[str, str]:
    """fork_state(root); with `into`, those very bytes copied there as well (one read)."""
    from portkit.transaction import sha256

    state: dict[str, str] = {}

    def take(rel: str) -> None:
        path = root / rel
        if path.is_symlink():
            state[rel] = "link " + os.readlink(path)
            if into is not None:
                (into / rel).parent.mkdir(parents=True, exist_ok=True)
                (into / rel).symlink_to(os.readlink(path))
        elif path.is_file():
            data = path.read_bytes()
            state[rel] = sha256(data)
            if into is not None:
                (into / rel).parent.mkdir(parents=True, exist_ok=True)
                (into / rel).write_bytes(data)

    for rel in _FORK_FILES:
        take(rel)
    for top in _FORK_FOLDERS:
        if (root / top).is_symlink():
            take(top)
            continue
        for folder, dirs, names in os.walk(root / top):
            here = Path(folder).relative_to(root).as_posix()
            dirs[:] = sorted(d for d in dirs if d != ".git")
            for name in [*dirs, *sorted(names)]:
                rel = f"{here}/{name}"
                if name in names or (root / rel).is_symlink():
                    take(rel)
            if into is not None:
                (into / here).mkdir(parents=True, exist_ok=True)
    return state


@dataclass
class ForkMove:
    """What `rebase --onto` does to a fork, all in one transaction: the vendored files
    refreshed from the target with the carried series, the new pin, the new series.
    `state` is the fork as the plan read it (fork_state): the move is only written onto
    exactly that fork."""

    fork: Tree
    rebased: Rebased
    pin: str
    changes: list[Write | Delete] = field(default_factory=list)
    state: dict[str, str] = field(default_factory=dict)
    # how it was planned, to plan it again on the fork as it is once the lock is taken
    target: Tree | None = None
    base: Tree | None = None
    target_label: str = "target"
    compiled: bool = False  # compile_check was run on the carried series

    @property
    def blocked(self) -> list[RebasedPatch]:
        """The patches that need a human: the fork is not moved while there are any."""
        return [p for p in self.rebased.report.patches if p.status == NEEDS_HUMAN]

    def describe(self) -> str:
        """The plan, one line per change (for --dry-run), then the patches the move drops
        from the series and what holds it back."""
        old = self.fork.pin or "?"
        lines = [f"move {self.fork.root} from {old[:12]} to {self.pin[:12]}:"]
        lines += [f"  {'write' if isinstance(c, Write) else 'delete'} {c.rel}"
                  for c in self.changes]
        dropped = [p for p in self.rebased.report.patches if p.status == DROPPED]
        folder = (self.fork.series_dir.relative_to(self.fork.root).as_posix()
                  if self.fork.series_dir else "llama/patches")
        if dropped:
            lines.append(f"dropped from {folder} with the move ({len(dropped)}):")
            lines += [f"  {folder}/{p.file}: {p.reason}" for p in dropped]
        review = [p for p in self.rebased.report.patches if p.status == NEEDS_REVIEW]
        if review:
            lines.append(f"carried for review ({len(review)}): "
                         + ", ".join(p.file for p in review))
        if self.blocked:
            lines.append(f"blocked: {len(self.blocked)} patch(es) need a human: "
                         + ", ".join(p.file for p in self.blocked))
        return "\n".join(lines) + "\n"


def refuse_self_target(fork: Tree, target: Tree, label: str = "target") -> None:
    """A fork is not moved onto itself: a target that is the fork (or a folder of it), or
    that is at the fork's own pin (its base), is a bad --onto (UsageError)."""
    mine, theirs = fork.root.resolve(), target.root.resolve()
    if theirs == mine or theirs.is_relative_to(mine) or mine.is_relative_to(theirs):
        raise UsageError(f"--onto {label} is the fork itself ({mine}): give the newer "
                         f"llama.cpp tree to move it onto")
    if fork.pin and target.pin and pin_matches(fork.pin, target.pin):
        raise UsageError(f"--onto {label} is at llama.cpp {target.pin[:12]}, the fork's own "
                         f"pin ({fork.pin_source}): nothing to move it onto")


def plan_fork(fork: Tree, target: Tree, *, base: Tree | None = None,
              target_label: str = "target") -> ForkMove:
    """Carry the fork's series onto `target` (its base: `base`, else the fork with the series
    taken out) and plan the move. Nothing is written: see move_fork. The plan is made from a
    private copy of what it reads of the fork, and remembers it (ForkMove.state)."""
    if fork.layout != OLLAMA or fork.series_dir is None:
        raise UsageError(f"{fork.root} is not an ollama-style fork with llama/patches "
                         "(give the series with --series)")
    from portkit.errors import TreeError
    from portkit.tree import detect

    refuse_self_target(fork, target, target_label)
    if target.pin is None or not re.fullmatch(r"[0-9a-fA-F]{7,40}", target.pin):
        raise TreeError(f"the commit of {target.root} is not known: the fork's pin cannot "
                           "be moved to it (give a git target)")
    with _scratch("portkit-fork-") as tmp:
        state = _fork_copy(fork.root, tmp / "fork")
        copy = detect(tmp / "fork")
        if copy.layout != OLLAMA or copy.series_dir is None:  # moved away as it was read
            raise TreeError(f"{fork.root} changed while portkit read it: run it again")
        move = _plan(copy, target, base, target_label)
    move.fork, move.state = fork, state
    move.target, move.base, move.target_label = target, base, target_label
    return move


def _plan(fork: Tree, target: Tree, base: Tree | None, target_label: str) -> ForkMove:
    assert fork.series_dir is not None
    series = read_series(fork.series_dir)
    rebased = rebase(series, target, base=base, fork=fork,
                     series_label=fork.series_dir.relative_to(fork.root).as_posix(),
                     target_label=target_label)
    move = ForkMove(fork, rebased, target.pin or "")
    move.changes += _vendored(fork, target, rebased.carried)
    move.changes += _pin_changes(fork, move.pin)
    folder = fork.series_dir.relative_to(fork.root).as_posix()
    kept = {p.name: p.data for p in rebased.series.patches}
    for patch in series.patches:
        if patch.name not in kept:
            move.changes.append(Delete(f"{folder}/{patch.name}"))
        elif kept[patch.name] != patch.data:
            move.changes.append(Write(f"{folder}/{patch.name}", kept[patch.name]))
    return move


def _vendored(fork: Tree, target: Tree, carried: dict[str, bytes | None]) -> list[Write | Delete]:
    """The vendored files refreshed: each side (llama.cpp, ggml) sent from the target with
    the carried series applied, under the rules rsync syncs that side with (portkit.fork:
    the side's .rsync-filter and what Makefile.sync's rsync line adds); a file the target
    does not send is deleted where rsync --delete would delete it."""
    vendoring = Vendoring.of(fork)
    new: dict[str, bytes | None] = {path: source.read_bytes() if not source.is_symlink()
                                    else os.fsencode(os.readlink(source))
                                    for path, source in vendoring.layout_files(target).items()}
    for path, data in carried.items():
        if vendoring.sends(path):
            new[path] = data
    changes: list[Write | Delete] = []
    apart = len(vendoring.sides) > 1
    for side in vendoring.sides:
        mine = fork.root / side.folder
        skip = frozenset({"ggml"}) if apart and not side.prefix else frozenset()
        current = set(_files(mine, [], skip))
        ours = {path.removeprefix(side.prefix): data for path, data in new.items()
                if vendoring.side(path)[0] == side}
        for rel, data in sorted(ours.items()):
            if data is None:
                if rel in current:
                    changes.append(Delete(f"{side.folder}/{rel}"))
            elif rel not in current or (mine / rel).read_bytes() != data:
                changes.append(Write(f"{side.folder}/{rel}", data))
        changes += [Delete(f"{side.folder}/{rel}") for rel in sorted(current - set(ours))
                    if rel != FILTER and deleted(side.rules, rel)]
    return changes


def _pin_changes(fork: Tree, pin: str) -> list[Write | Delete]:
    """Makefile.sync's FETCH_HEAD (and llama/build-info.cpp's LLAMA_COMMIT, when it names
    the old pin) set to `pin`."""
    out: list[Write | Delete] = []
    sync = fork.root / "Makefile.sync"
    if sync.is_file():
        text = sync.read_text()
        if not _FETCH_HEAD.search(text):
            raise TreeError(f"{sync} has no FETCH_HEAD line to move")
        out.append(Write("Makefile.sync", _FETCH_HEAD.sub(
            lambda m: m.group(1) + pin + m.group(3), text, count=1).encode()))
    info = fork.root / "llama" / "build-info.cpp"
    if info.is_file() and fork.pin:
        text = info.read_text()
        new = _LLAMA_COMMIT.sub(lambda m: m.group(1) + pin + m.group(3)
                                if pin_matches(m.group(2), fork.pin or "") else m.group(0), text)
        if new != text:
            out.append(Write("llama/build-info.cpp", new.encode()))
    return out


def move_fork(move: ForkMove, *, replan: bool = True) -> tuple[ForkMove, str | None]:
    """Make the move's changes to the fork in one transaction; a failure anywhere leaves the
    fork as it was. Everything about the fork is checked under its lock, once it is taken:
    the fork must be exactly as the plan read it (ForkMove.state), else the move is planned
    again on the fork as it is now, under the lock (with replan=False: refused, TreeError);
    a fork that another portkit moved to this very pin meanwhile is refused (TreeError);
    then its uncommitted files. Returns the move written (a replanned one that
    needs a human is returned unwritten: see .blocked) and what the lock's settling said (a
    roll-back of an earlier, killed portkit), if anything."""
    if move.blocked:
        raise ApplyConflict(f"{len(move.blocked)} patch(es) need a human "
                           f"({', '.join(p.file for p in move.blocked)}): the fork is not moved")
    from portkit.errors import TreeError
    from portkit.tree import detect

    root = move.fork.root
    with tree_lock(root):
        checkpoint("rebase:locked")
        said = settle(root, writer=True)
        if fork_state(root) != move.state:
            now = detect(root)
            if now.pin and pin_matches(now.pin, move.pin):
                raise TreeError(f"{root} was moved to llama.cpp {now.pin[:12]} by another "
                                f"portkit while this one waited: nothing was changed")
            if not replan or move.target is None:
                raise TreeError(f"{root} changed since the move was planned (pin "
                                f"{(now.pin or '?')[:12]}): nothing was changed; run it again")
            checkpoint("rebase:replan")
            again = plan_fork(now, move.target, base=move.base, target_label=move.target_label)
            if move.compiled:
                again.rebased, again.compiled = compile_check(again.rebased, move.target), True
            move = again
            if move.blocked:
                return move, said
        refuse_uncommitted(root, [c.rel for c in move.changes])
        with transaction(root, f"rebase onto {move.pin[:12]}", move.changes):
            checkpoint("rebase:written")
    return move, said


# -- --compile: what the carried series does to the build -------------------------------------

_UNITS = (".c", ".cc", ".cpp")
_DIAGNOSTIC = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: "
                         r"(?P<message>.*)$", re.M)
# Where llama.cpp's sources find their headers (relative to the llama.cpp root).
INCLUDE_DIRS = ("include", "src", "common", "ggml/include", "ggml/src", "ggml/src/ggml-cpu")


@dataclass(frozen=True)
class CompileError:
    file: str  # relative to the llama.cpp root
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


def compile_errors(root: Path, unit: str) -> list[CompileError]:
    """The errors of compiling `unit` (syntax and types only) in the llama.cpp tree at
    `root`, with the layout's include paths."""
    c = unit.endswith(".c")
    compiler = shutil.which("cc" if c else "c++")
    if compiler is None:
        raise ToolMissing("no C/C++ compiler (apt-get install g++)")
    flags = ["-std=gnu11"] if c else ["-std=gnu++17"]
    includes = [f"-I{d}" for d in INCLUDE_DIRS if (root / d).is_dir()]
    done = run([compiler, *flags, "-fsyntax-only", "-w", "-fmax-errors=20",
                "-fno-diagnostics-color", *includes, unit], cwd=root, check=False)
    return [CompileError(os.path.normpath(m["file"]), int(m["line"]), m["message"].strip())
            for m in _DIAGNOSTIC.finditer(done.stderr)]


def _overlay(source: Path, files: dict[str, bytes | None], dest: Path) -> Path:
    """`dest` made to read as `source` with `files` in place of its own: symbolic links to
    everything else, real folders only along the paths of `files`."""
    def populate(real: Path, src: Path) -> None:
        for entry in src.iterdir():
            (real / entry.name).symlink_to(entry)

    dest.mkdir(parents=True, exist_ok=True)
    populate(dest, source)
    for rel, data in files.items():
        here, there = dest, source
        for part in rel.split("/")[:-1]:
            here, there = here / part, there / part
            if here.is_symlink():
                here.unlink()
            if not here.exists():
                here.mkdir()
                if there.is_dir():
                    populate(here, there)
        path = dest / rel
        if path.is_symlink() or path.exists():
            path.unlink()
        if data is not None:
            path.write_bytes(data)
    return dest


def compile_check(rebased: Rebased, target: Tree) -> Rebased:
    """Compile the translation units the carried series touches, on the target without and
    with it. Each error only the carried tree has is charged to the patch that wrote its
    line (else to the last patch that changed its file, else its unit), which is then
    needs-review, with the error."""
    units = sorted(rel for rel, data in rebased.carried.items()
                   if rel.endswith(_UNITS) and data is not None)
    charged: dict[str, list[str]] = {}
    with tree_view(target) as view, _scratch("portkit-compile-") as tmp:
        carried = _overlay(view, rebased.carried, tmp / "tree")
        for unit in units:
            before = {(e.file, e.message) for e in compile_errors(view, unit)
                      if (view / unit).is_file()}
            for error in compile_errors(carried, unit):
                if (error.file, error.message) in before:
                    continue
                text = _line(carried / error.file, error.line)
                patch = _author(rebased.series.patches, error.file, text, unit)
                if patch is not None:
                    charged.setdefault(patch, []).append(str(error))
    rows = []
    for row in rebased.report.patches:
        errors = charged.get(row.file)
        if errors and row.output is not None:
            row = RebasedPatch(row.file, row.subject, NEEDS_REVIEW,
                               f"it does not compile: {'; '.join(errors[:3])}; {row.reason}",
                               row.output, row.conflict)
        rows.append(row)
    report = RebaseReport(rebased.report.series, rebased.report.base, rebased.report.target,
                          rebased.report.pin, tuple(rows))
    return Rebased(report, rebased.series, rebased.side_files, rebased.carried)


def _line(path: Path, number: int) -> str:
    try:
        lines = path.read_bytes().decode("utf-8", "surrogateescape").splitlines()
    except OSError:
        return ""
    return lines[number - 1].strip() if 0 < number <= len(lines) else ""


def _author(patches: Sequence[Patch], file: str, text: str, unit: str) -> str | None:
    """The carried patch that wrote the line `text` of `file`: the last one that adds it;
    else the last that changes the file, else the last that changes the unit."""
    for patch in reversed(patches):
        if text and any(h.path == file and any(a.strip() == text for a in h.added)
                        for h in patch.hunks):
            return patch.name
    for path in (file, unit):
        for patch in reversed(patches):
            if path in patch.paths:
                return patch.name
    return None
