"""One patch carried onto the target as the earlier ones left it (`_Carrier.carry`): text
first, as `git am -3` carries it (git apply, else each file merged three ways, a file
upstream moved followed by git's rename rule, the conflicts text orders settled by
portkit.follow.text); structure only where text cannot (drift's follow engine: relocation
in the target's names, present-upstream); the evidence a reviewer needs added as notes;
the side file of a patch that needs a human.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from portkit.anchors import aliases_of
from portkit.cache import lay_down, read_entry
from portkit.drift import model as dm
from portkit.follow import FUZZ_LIMIT, Follow, identifiers
from portkit.follow.calls import Edit, adapt, calls_of, learn
from portkit.follow.columns import realign
from portkit.follow.counts import only_raises, recount
from portkit.follow.renames import Files
from portkit.follow.repeats import repeated
from portkit.follow.text import ALREADY as THERE_ALREADY
from portkit.follow.text import (
    APART,
    BESIDE,
    COUNT,
    DELETED,
    EDITED,
    LAYOUT,
    SAME_POINT,
    WORDS,
    binary,
    merge,
    merge3,
)
from portkit.follow.translate import translate
from portkit.hunks import ALREADY, apply_hunks
from portkit.index import DECLARATION, FUNCTION, Index, flat, param_arity
from portkit.proc import git
from portkit.rebase.report import (
    DROPPED,
    MERGED,
    NEEDS_HUMAN,
    NEEDS_REVIEW,
    RELOCATED,
    STATUSES,
    UNCHANGED,
    Verdict,
)
from portkit.series import (
    REGULAR,
    SYMLINK,
    FileDiff,
    Hunk,
    Patch,
    Series,
    parse_patch,
    quote_path,
)

_THERE = (dm.ALREADY_APPLIED, dm.PRESENT_UPSTREAM)


_HEADING = re.compile(r"^(@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@).*$", re.M)


_INDEX = re.compile(r"^index [0-9a-f]+\.\.([0-9a-f]+)", re.M)


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


def _style(series: Series) -> tuple[int, bool]:
    """How the series writes its diffs: the length of its blob ids (7 when it has none) and
    whether its @@ lines carry function headings."""
    lengths = Counter(len(m.group(1)) for p in series.patches for m in _INDEX.finditer(p.diff))
    headings = any(h.section for p in series.patches for h in p.hunks)
    return (lengths.most_common(1)[0][0] if lengths else 7), headings


@dataclass(frozen=True)
class _Piece:
    """One hunk (or a file's hunks that land as they are) carried: how, the target file it
    changes and that file's bytes with it, what was done and what a reviewer must check."""

    status: Verdict
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
    status: Verdict
    reason: str
    after: dict[str, bytes | None] = field(default_factory=dict)  # target files it changes
    conflict: str = ""  # the side file's text (needs-human)
    modes: dict[str, int] = field(default_factory=dict)  # git's mode of a file in `after`
    settled: bool = False  # carried only through portkit's settling of git's conflicts
    # needs-human: the target files where its hunks left for a human belong (as drift
    # located them: their code moved there, or its nearest match is there)
    pending: tuple[str, ...] = ()
    # needs-review: the files the review is about (None: those its reason names)
    doubt: tuple[str, ...] | None = None


@dataclass(frozen=True)
class _NoText:
    """Why text does not carry a patch: the files it cannot merge, and those it can."""

    why: str
    failed: tuple[str, ...]
    clean: dict[str, bytes | None]
    modes: dict[str, int]  # git's mode of each file in `clean`
    review: tuple[str, ...] = ()  # what a reviewer must know of how `clean` was merged
    doubt: tuple[str, ...] = ()  # the files of `clean` those notes are about


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
        self.files = Files(lead.target.root, lead.base.root)
        self.left_out_files: dict[str, str] = {}  # a file a left-out patch changes -> it
        self.review_files: dict[str, str] = {}  # a file carried for review of it -> the patch

    def carry(self, patch: Patch, later: frozenset[str] = frozenset()) -> _Outcome:
        """Patch `patch` carried: by text first (what `git am -3` does), by structure only
        where text cannot. `later`: the files the patches after it change (a patch that
        needs a human is carried in part only where they need it)."""
        self.work.load(patch.paths)
        self.base.load(patch.paths)
        linked = [f.path for f in patch.files if f.status == "modified"
                  and self.work.mode(f.path) == SYMLINK and self.base.mode(f.path) != SYMLINK]
        if linked:  # git apply refuses it too ("wrong type"): nothing to carry by text
            where = ", ".join(f"{rel} (to {_text_of(self.work.get(rel))})" for rel in linked)
            reason = (f"a symbolic link in the target, a file in the base: {where}; the patch "
                      "changes it as a file (carry it into the file the link names, or "
                      "make it a file again)")
            return _Outcome(NEEDS_HUMAN, reason, conflict=side_file(patch, reason, patch.diff))
        before_base = {rel: self.base.files[rel] for rel in patch.paths}
        self._before_base = before_base
        self.base_modes = {rel: self.base.mode(rel) for rel in patch.paths}
        # The base takes the whole series as it is: git apply, as it was written there.
        theirs: dict[str, bytes | None] | None = None
        if git_apply(self.base.root, patch.lf_data, self.room, patch.strip):
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
            text = self._realigned(patch, text, before_work, before_base)
            text = self._repeats(patch, text, before_work)
            # on the files as they were before it
            text = self._semantic(patch, text, before_work, before_base)
            for rel, data in text.after.items():
                self.work.put(rel, data, text.modes.get(rel))
            return self._after_left_out(patch, text)
        if text.clean and set(text.failed) < set(patch.paths):
            # text carries some files: structure decides only the others
            rest = self._structure(patch, before_base, frozenset(text.failed))
            if rest.status == DROPPED and set(text.doubt) >= set(text.clean):
                # the rest is upstream's already, and text carried the others only by
                # portkit's settling: structure that finds the whole change there goes first
                there = self._structure(patch, before_base)
                if there.status == DROPPED:
                    return there
            if rest.status != NEEDS_HUMAN:
                return self._mixed(patch, text, rest)
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
            for rel in (*text.failed, *outcome.pending):
                self.left_out_files.setdefault(rel, patch.name)
            # only the files later patches change are carried in part (what no later patch
            # needs waits for the human whole), and none whose every hunk upstream has, as
            # it is or in its own form (carried, the change would be there twice)
            upstream = set()
            for f in patch.files:
                whole, partly = _upstream_made(f, before_work, before_base)
                if f.hunks and len(whole) + len(partly) == len(f.hunks):
                    upstream.add(f.path)
            text = replace(text, clean={rel: d for rel, d in text.clean.items()
                                        if rel not in upstream and rel in later})
            if text.clean:
                part = self._realigned(patch, _Outcome(MERGED, "", dict(text.clean)),
                                       before_work, before_base)
                text = replace(text, clean=part.after)
                for rel, data in text.clean.items():
                    self.work.put(rel, data, text.modes.get(rel))
                kept = ", ".join(sorted(text.clean))
                outcome = replace(outcome, after=dict(text.clean), modes=dict(text.modes),
                                  reason="; ".join(filter(None, (
                    f"carried in part (only {kept}); left for a human: {outcome.reason}",
                    part.reason))))
            return outcome
        outcome = self._realigned(patch, outcome, before_work, before_base)
        outcome = self._repeats(patch, outcome, before_work)
        for rel, data in outcome.after.items():
            self.work.put(rel, data)
        return self._after_left_out(patch, outcome)

    def _mixed(self, patch: Patch, text: _NoText, rest: _Outcome) -> _Outcome:
        """A patch text carries in part and structure carries the rest (or finds it in the
        target already): both, for review, since structure chose where the rest goes."""
        kept = ", ".join(sorted(text.clean))
        how = ("the rest is in the target already, and left out: " if rest.status == DROPPED
               else "the rest carried by structure: ")
        outcome = _Outcome(NEEDS_REVIEW, "; ".join([
            *text.review, f"text carries {kept}, not {', '.join(text.failed)} ({text.why})",
            f"{how}{rest.reason}"]), {**text.clean, **rest.after},
            modes={**text.modes, **rest.modes}, doubt=(*text.doubt, *rest.after))
        ours = {rel: self.work.get(rel) for rel in outcome.after}
        outcome = self._in_target_names(patch, outcome, ours)
        outcome = self._realigned(patch, outcome, ours, self._before_base)
        outcome = self._repeats(patch, outcome, ours)
        outcome = self._semantic(patch, outcome)
        for rel, data in outcome.after.items():
            self.work.put(rel, data, outcome.modes.get(rel))
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

    def _realigned(self, patch: Patch, outcome: _Outcome, ours: dict[str, bytes | None],
                   base: dict[str, bytes | None]) -> _Outcome:
        """What was carried, with the lines the patch adds beside lines upstream realigned
        (a table or declarations respaced into wider columns) realigned the same way
        (portkit.follow.columns). Not what `git am -3` writes, so for review, saying so."""
        def edit(f: FileDiff, data: bytes, new: bytes, old: bytes) -> tuple[bytes, list[str]]:
            out, count = realign(new, old, data, (line for h in f.hunks for line in h.added))
            return out, [f"{count} line(s) it adds realigned to the columns upstream gave the "
                         "lines beside them"] if count else []
        return self._edited(patch, outcome, ours, base, edit)

    def _repeats(self, patch: Patch, outcome: _Outcome,
                 ours: dict[str, bytes | None]) -> _Outcome:
        """What was carried, without a case or an enumerator of the patch's that the target
        has in that switch or enum already (portkit.follow.repeats: twice, the file would
        not compile). Not what `git am -3` writes, so for review, saying so."""
        def edit(f: FileDiff, data: bytes, new: bytes, _: bytes) -> tuple[bytes, list[str]]:
            return repeated(new, data, (line for h in f.hunks for line in h.added))
        return self._edited(patch, outcome, ours, None, edit)

    def _edited(self, patch: Patch, outcome: _Outcome, ours: dict[str, bytes | None],
                base: dict[str, bytes | None] | None,
                edit: Callable[[FileDiff, bytes, bytes, bytes], tuple[bytes, list[str]]]
                ) -> _Outcome:
        """What was carried, each file of it edited by `edit(section, carried, the target's
        file, the base's file)`, which says what it did: for review where it did anything."""
        if outcome.status not in (UNCHANGED, MERGED, NEEDS_REVIEW, RELOCATED) \
                or not outcome.after:
            return outcome
        after = dict(outcome.after)
        said: list[tuple[str, str]] = []
        for f in patch.files:
            data, new = after.get(f.path), ours.get(f.path)
            old = base.get(f.path) if base is not None else b""
            if data is None or new is None or old is None:
                continue
            after[f.path], notes = edit(f, data, new, old)
            said += [(f.path, note) for note in notes]
        if not said:
            return outcome
        return replace(outcome, status=NEEDS_REVIEW, after=after,
                       reason="; ".join([*(f"{rel}: {note}" for rel, note in said),
                                         outcome.reason]),
                       doubt=None if outcome.doubt is None else (
                           *outcome.doubt, *dict.fromkeys(rel for rel, _ in said)))

    def _there_already(self, patch: Patch, outcome: _Outcome, ours: dict[str, bytes | None],
                       base: dict[str, bytes | None]) -> _Outcome:
        """A patch text carried, a hunk of which adds only lines the target has already in
        that file and the base did not: upstream took the same change, and carrying it
        may write it twice. Never a drop (text carried it): a note for a reviewer."""
        if outcome.status not in (UNCHANGED, MERGED, NEEDS_REVIEW) or not outcome.after:
            return outcome
        made = [_upstream_made(f, ours, base) for f in patch.files]
        notes = [f"{f.path}:{hunk.old_start}: every line it adds is in the target already: "
                 "carried, it may be there twice"
                 for f, (there, _) in zip(patch.files, made, strict=True) for hunk in there]
        whole = len(notes)
        notes += [f"{f.path}:{hunk.old_start}: upstream added {len(lines)} of the lines it "
                  f"adds ({lines[0].strip()[:60]}): the target may have this change in its "
                  "own form"
                  for f, (_, partly) in zip(patch.files, made, strict=True)
                  for hunk, lines in partly]
        if not notes:
            return outcome
        if outcome.settled and whole == len(notes) == len(patch.hunks):
            # git's merge did not take it, and all of it is there: present upstream
            return _Outcome(DROPPED, "; ".join(note.replace(
                ": carried, it may be there twice", " (git's merge does not take it)")
                for note in notes))
        return replace(outcome, status=NEEDS_REVIEW, reason="; ".join([*notes, outcome.reason]))

    def _uses_left_out(self, patch: Patch) -> list[str]:
        """A note for each name the patch's added lines use that a left-out patch brings."""
        return [f"it uses {name}, which {self.left_out[name]} brings and which was left out"
                for name in identifiers(line for h in patch.hunks for line in h.added)
                if name in self.left_out]

    def _semantic(self, patch: Patch, outcome: _Outcome,
                  ours: dict[str, bytes | None] | None = None,
                  base: dict[str, bytes | None] | None = None) -> _Outcome:
        """A patch text carried whose added lines use a symbol that changed upstream (drift's
        semantic check, symbols resolved without doubt): for a reviewer. A call that no
        longer fits a function whose parameters upstream changed is adapted as upstream
        adapted its own calls in that file (`ours`, the target's files, against `base`),
        where they agree (portkit.follow.calls), and said so."""
        if outcome.status not in (UNCHANGED, MERGED, NEEDS_REVIEW) or not outcome.after:
            return outcome
        written = self._new_lines(outcome.after)
        review = []
        after = dict(outcome.after)
        for change in self.lead.semantic(patch):
            if change.change == "renamed" and not re.search(rf"\b{change.symbol}\b", written):
                continue
            how = self._adapt_calls(change, after, ours, base) if ours is not None and \
                base is not None else None
            review.append(f"it uses {change.symbol}: {how + '; ' if how else ''}"
                          f"{change.detail}")
        outcome = replace(outcome, after=after)
        review += self._uses_left_out(patch)
        if not review:
            return outcome
        return replace(outcome, status=NEEDS_REVIEW,
                       reason="; ".join([*review, outcome.reason]))


    def _adapt_calls(self, change: dm.SemanticChange, after: dict[str, bytes | None],
                     ours: dict[str, bytes | None], base: dict[str, bytes | None]
                     ) -> str | None:
        """The calls of `change.symbol` (a function whose parameters upstream changed) in
        the carried files `after` adapted in place as upstream adapted its own in each file;
        what was done, or None."""
        if change.change != "signature" or not change.detail.startswith("it calls "):
            return None
        word = change.symbol

        def fits(index: Index) -> Callable[[int], bool]:
            arities = [param_arity(s.param_list or "()") for s in index.find(word)
                       if s.kind in (FUNCTION, DECLARATION)]
            return lambda n: any(lo <= n and (hi is None or n <= hi) for lo, hi in arities)

        now, then = fits(self.lead.target.index), fits(self.lead.base.index)
        said = []
        for rel, data in after.items():
            old, new = base.get(rel), ours.get(rel)
            if data is None or old is None or new is None:
                continue
            for arity in sorted({len(c.args) for c in calls_of(data, word)
                                 if not now(len(c.args)) and then(len(c.args))}):
                learned = learn(old, new, word, arity, now)
                if learned is None:
                    continue
                data, done = adapt(data, word, arity, learned[0], now)
                if done:
                    after[rel] = data
                    said.append(f"{done} call(s) in {rel} adapted as upstream adapted "
                                f"{learned[1]} of its own ({_said_edit(learned[0])})")
        return "; ".join(said) or None

    def _after_left_out(self, patch: Patch, outcome: _Outcome) -> _Outcome:
        """A patch carried onto a file that an earlier patch, left out, also changes: its
        result is not the file the series means, and a reviewer is told. So too onto a file
        an earlier patch carried for review of that very file (a settled merge, a place
        structure chose): this one's result there stands on that one's, and changes with
        it. A patch carried for review of a file marks it for the patches after it."""
        if outcome.status == NEEDS_REVIEW:
            for rel in outcome.after:
                if rel in (outcome.doubt if outcome.doubt is not None else outcome.reason):
                    self.review_files.setdefault(rel, patch.name)
        if outcome.status not in (UNCHANGED, MERGED):
            return outcome
        before = sorted({f"{rel} ({self.left_out_files[rel]})" for rel in patch.paths
                         if rel in self.left_out_files})
        on_review = sorted({f"{rel} ({self.review_files[rel]})" for rel in patch.paths
                            if rel in self.review_files and rel not in self.left_out_files})
        if not before and not on_review:
            return outcome
        said = [outcome.reason]
        if before:
            said.append("an earlier patch that was left out changes the same file: "
                        + ", ".join(before))
        if on_review:
            said.append("carried onto what an earlier patch, for review there, made of "
                        + ", ".join(on_review))
        return replace(outcome, status=NEEDS_REVIEW, reason="; ".join(said))

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
        offsets = git_apply_at(room, patch.lf_data, self.room, patch.strip)
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
        # A file the patch renames (and edits) is one merge, as git's rename detection makes
        # it: the target's old file, the base's old file and the patch's new one; the result
        # goes to the new name, and the old one is gone.
        renames = {f.new_path: f.old_path for f in patch.files
                   if f.old_path and f.new_path and f.old_path != f.new_path
                   and ours.get(f.new_path) is None and ours.get(f.old_path) is not None
                   and before_base.get(f.old_path) is not None
                   and theirs.get(f.old_path) is None and theirs.get(f.new_path) is not None}
        for rel in patch.paths:
            if rel in renames.values():
                continue  # made with its new name
            o, b, t = ours[rel], before_base[rel], theirs[rel]
            home = rel
            if rel in renames:
                gone = renames[rel]
                o, b = ours[gone], before_base[gone]
                ours_modes[rel] = ours_modes.get(gone, REGULAR)
                if o != b:
                    said.append(f"{gone} renamed to {rel}, with what upstream changed in it")
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
            elif binary(o, b, t):
                conflicts.append(f"{rel}: a binary file upstream changed too (git merges no "
                                 "binary files)")
                failed.append(rel)
                continue
            else:
                merged = merge(o, b, t, room=self.room)
                if merged.conflicts:
                    conflicts.append(f"{rel}: {merged.conflicts} conflict(s) in a 3-way merge")
                    failed.append(rel)
                    continue
                result, raised = recount([h for h in patch.hunks if h.path == rel], b, o,
                                         merged.data)
                said += [f"{home}:{h.old_start}: upstream made this hunk's change already (the "
                         "carried patch is without it)"
                         for h in patch.hunks if h.path == rel and _made_already(h, o, b)]
                review += [f"{home}: {note}" for note in raised]
                same = merged.settled.count(SAME_POINT)
                beside = merged.settled.count(BESIDE)
                deleted = merged.settled.count(DELETED)
                edited = merged.settled.count(EDITED)
                words = merged.settled.count(WORDS)
                apart = merged.settled.count(APART)
                if THERE_ALREADY in merged.settled:
                    said.append(f"{home}: what it inserts at "
                                f"{merged.settled.count(THERE_ALREADY)} "
                                "place(s) git's merge stops at is in the target already")
                if same:
                    review.append(f"{home}: upstream inserted lines where this patch inserts "
                                  f"its own ({same}x): the patch's lines were put after "
                                  "upstream's (before them only where that keeps a sorted "
                                  "list in order)")
                if beside:
                    review.append(f"{home}: git's merge stops at {beside} insertion(s) right "
                                  "next to lines upstream rewrote: each was kept on its side "
                                  "of them")
                if deleted:
                    review.append(f"{home}: git's merge stops at {deleted} deletion(s) right "
                                  "next to lines upstream rewrote: the lines were deleted as "
                                  "they were")
                if apart:
                    review.append(f"{home}: git's merge stops at {apart} change(s) that end "
                                  "right where one upstream made begins: both were made, "
                                  "each on its own lines")
                if words:
                    review.append(f"{home}: upstream changed the lines this patch changes "
                                  f"({words}x), other words of them: merged word by word")
                if edited:
                    review.append(f"{home}: upstream edited the lines this patch deletes "
                                  f"({edited}x): they were deleted as upstream has them")
                if COUNT in merged.settled:
                    review.append(f"{home}: upstream changed the count this patch raises "
                                  f"({merged.settled.count(COUNT)}x): the target's count "
                                  "raised as the patch raises it")
                if LAYOUT in merged.settled:
                    review.append(f"{home}: upstream re-spaced lines around the ones this "
                                  f"patch changes ({merged.settled.count(LAYOUT)}x): merged "
                                  "with blanks ignored (git merge -Xignore-all-space), "
                                  "upstream's lines as upstream spaced them")
            if rel in renames:
                after[renames[rel]] = None
                after[home] = result
                modes[home] = mode
            elif result != o or (result is not None and mode != ours_modes.get(home)):
                after[home] = result
                modes[home] = mode
        if conflicts:
            return _NoText("; ".join(conflicts), tuple(failed), after, modes, tuple(review),
                           tuple(rel for rel in after if any(r.startswith(f"{rel}: ")
                                                             for r in review)))
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
        return git_apply_at(room, patch.lf_data, self.room, patch.strip, reverse=True,
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
        """Where the file `rel` (`data` in the base) went in the target, by git's rename
        rule (portkit.follow.renames), and its bytes there; None when there is none.
        Candidates are read, not loaded into the working copy."""
        home = self.files.renamed(rel, data, lambda other: self.work.files[other]
                                  if other in self.work.files else self.work.original(other))
        chosen = self.work.get(home) if home is not None else None
        return (home, chosen) if home is not None and chosen is not None else None

    def _structure(self, patch: Patch, before_base: dict[str, bytes | None],
                   only: frozenset[str] | None = None) -> _Outcome:
        """The patch carried hunk by hunk where drift follows its code; `only`: just the
        hunks of those files (the ones text could not carry)."""
        with apply_hunks([patch], self.work.root, fuzz=FUZZ_LIMIT) as run:
            presult = run.patches[0]
        drift = self.lead.patch(presult, self.work.files)
        if any(hr.status == ALREADY for hr in presult.hunks):  # say where the engine found it
            drift = replace(drift, hunks=tuple(
                replace(d, reason=f"{d.reason}, at line {hr.line}")
                if d.status == dm.ALREADY_APPLIED and hr.status == ALREADY and hr.line else d
                for hr, d in zip(presult.hunks, drift.hunks, strict=False)))
        return self._decide(patch, drift, before_base, only)

    def _decide(self, patch: Patch, drift: dm.PatchDrift,
                before_base: dict[str, bytes | None],
                only: frozenset[str] | None = None) -> _Outcome:
        pairs = [(h, d) for h, d in zip(patch.hunks, drift.hunks, strict=False)
                 if only is None or h.path in only]
        hunks = [d for _, d in pairs] if only is not None else list(drift.hunks)
        if all(h.status in _THERE for h in hunks):
            return _Outcome(DROPPED, "; ".join(dict.fromkeys(
                f"{_where(h)}: {h.reason}" for h in hunks)))
        if not patch.hunks:  # a binary patch, a rename alone: drift has no hunk to follow
            return self._human(patch, drift, "; ".join(h.reason for h in hunks), before_base)
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
        review += self._uses_left_out(patch)
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
        if data is None and d.status == dm.CONFLICT:
            worded = self._translated(hunk, d)
            if worded is not None:
                return worded
        if data is None:
            return f"{_where(d)}: {d.reason}"
        return _Piece(UNCHANGED, f.path, data, "", f"{_where(d)} lands only with fuzz "
                      f"{d.fuzz} and no 3-way merge is clean")

    def _translated(self, hunk: Hunk, d: dm.HunkDrift) -> _Piece | None:
        """A hunk drift left in conflict, written where its nearest match is when that is
        its kept and deleted lines in upstream's words (portkit.follow.translate), for
        review: the place and the rewording are learned, not given."""
        if d.nearest is None:
            return None
        self.work.load([d.nearest.file])
        data = self.work.get(d.nearest.file)
        done = translate(hunk, data, d.nearest.line) if data is not None else None
        if done is None:
            return None
        words = ", ".join(f"{a} -> {b or '(nothing)'}" for a, b in done.rewordings)
        return _Piece(RELOCATED, d.nearest.file, done.data,
                      f"{_where(d)}: written at {d.nearest.file}:{done.line}",
                      f"{_where(d)}: {d.reason}; its lines are at {d.nearest.file}:"
                      f"{done.line} in upstream's words: written there"
                      + (f" as upstream rewrote them ({words})" if words else "")
                      + (f", without {done.left_out} line(s) of its context upstream rewrote"
                         if done.left_out else ""))

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
        pending = tuple(dict.fromkeys(
            place.file for d in drift.hunks if d.status == dm.CONFLICT
            for place in (d.moved_to or d.nearest,) if place is not None))
        return _Outcome(NEEDS_HUMAN, reason, pending=pending,
                        conflict=self._side_file(patch, drift, reason, before_base))

    def _side_file(self, patch: Patch, drift: dm.PatchDrift, reason: str,
                   before_base: dict[str, bytes | None]) -> str:
        """Both sides of a patch that needs a human: each hunk as the series has it, what
        drift found in the target, its nearest match there, and the 3-way merge's conflicts
        where the base and the target both have the file."""
        out = [side_file(patch, reason).rstrip("\n") + "\n"]
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
            if binary(ours, base, theirs):
                out += [f"=== {f.path}: a binary file both sides changed (not merged)", ""]
                continue
            merged, conflicts = merge3(ours, base, theirs, room=self.room)
            if conflicts:
                out += [f"=== {f.path}: git merge-file (target | base | series), "
                        f"{conflicts} conflict(s)", *_conflict_blocks(merged), ""]
        return "\n".join(out).rstrip("\n") + "\n"


def side_file(patch: Patch, reason: str, body: str = "") -> str:
    """A needs-human side file: which patch, its subject and why, then `body`."""
    return (f"portkit rebase: {patch.name} needs a human\nSubject: {patch.subject}\n"
            f"Reason: {reason}\n\n{body}")


def _said_edit(edit: Edit) -> str:
    """An argument-list edit in words: `gf` dropped, `nullptr` inserted after argument 8."""
    return ", ".join(f"`{old}` dropped" if op == "delete" else
                     (f"`{new}` inserted after argument {i}" if i else f"`{new}` inserted first")
                     if op == "insert" else
                     f"`{old}` made `{new}`" for op, i, old, new in edit)


def _made_already(hunk: Hunk, ours: bytes, base: bytes) -> bool:
    """Whether the target's file has the hunk's change itself: its new side (context and
    added lines, in a row) is there, its old side is not, and the base had the old side."""
    def block(lines: Sequence[str]) -> bytes:
        return "".join(x if x.endswith("\n") else x + "\n" for x in lines).encode(
            "utf-8", "surrogateescape")
    if not (hunk.added or hunk.removed) or not hunk.old_lines or not hunk.new_lines:
        return False
    old, new = block(hunk.old_lines), block(hunk.new_lines)
    return new in ours and old not in ours and old in base


def _upstream_made(f: FileDiff, ours: dict[str, bytes | None], base: dict[str, bytes | None]
                   ) -> tuple[list[Hunk], list[tuple[Hunk, list[str]]]]:
    """What upstream made of the hunks of file section `f`, read off the lines the target's
    file (`ours`) has and the base's did not: the hunks that add only such lines (upstream
    took them as they are), and the others with the lines they add that upstream added too
    (lines that say something on their own: a name in them, more than a bracket and a
    keyword; like the `case` of a switch upstream now handles itself). A hunk that only
    raises a count upstream raised too is neither (recount raises it once more)."""
    if f.status not in ("modified", "renamed") or ours.get(f.path) is None:
        return [], []
    here = {flat(x) for x in _text_of(ours[f.path]).splitlines()}
    before = {flat(x) for x in _text_of(base.get(f.path)).splitlines()}
    whole: list[Hunk] = []
    partly: list[tuple[Hunk, list[str]]] = []
    for hunk in f.hunks:
        if only_raises(hunk):
            continue
        added = [a for a in (flat(x) for x in hunk.added) if len(a) >= 4]
        if added and all(a in here and a not in before for a in added):
            whole.append(hunk)
            continue
        lines = [x for x in hunk.added if len(flat(x)) >= _SAYS and _NAMED.search(x)
                 and flat(x) in here and flat(x) not in before]
        if lines:
            partly.append((hunk, lines))
    return whole, partly


_SAYS = 12  # a line that, flattened, is at least this long says something on its own
_NAMED = re.compile(r"[A-Za-z_][A-Za-z_0-9]{3,}")


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
