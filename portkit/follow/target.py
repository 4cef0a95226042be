"""One hunk followed from the base into the target (`_Target`): text first (GNU patch's
placement), then for a hunk that fails: its enclosing symbol located (anchors.Locator),
the hunk relocated into it in the target's names, the presence rules (portkit.follow.
presence), the nearest match; and semantic drift of the symbols a patch uses, for symbols
resolved without doubt.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from bisect import bisect_right
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path, PurePosixPath

from portkit.anchors import Candidate, Locator, aliases_of, canonical, find
from portkit.cache import read_entry
from portkit.drift.model import (
    ALREADY_APPLIED,
    CLEAN,
    CONFLICT,
    FUZZ,
    OFFSET,
    PRESENT_UPSTREAM,
    RELOCATED,
    HunkDrift,
    Moved,
    Nearest,
    PatchDrift,
    SemanticChange,
    TargetDrift,
)
from portkit.follow.presence import PRESENCE_RULES, Place, there_under_upstreams_names
from portkit.follow.relocate import (
    MARGIN,
    SURE,
    Landing,
    _changed_offset,
    _find_block,
    _hunk_key,
    _insert,
    _one_block,
    _patch_lines,
    place_insertion,
)
from portkit.follow.renames import Files
from portkit.follow.repeats import repeats, squashed
from portkit.follow.sequence import (
    FUZZ_LIMIT,
    _Carry,
    _fast_tmp,
    _has_run,
    _partly_there,
    _wholly_there,
)
from portkit.follow.sides import Side
from portkit.follow.text import line_blocks
from portkit.follow.words import (
    _CONSTRUCTS,
    _IDENT,
    _KEYWORDS,
    _MEANINGFUL,
    _MEMBER_USE,
    _NEAR,
    _akin,
    _bare_names,
    _defines,
    _meaningful,
    _tokens,
    _unify,
    code_of,
    identifiers,
)
from portkit.hunks import (
    ALREADY,
    Landed,
    PatchResult,
    _gnu,
    _verdicts,
)
from portkit.hunks import CLEAN as H_CLEAN
from portkit.hunks import FUZZ as H_FUZZ
from portkit.hunks import OFFSET as H_OFFSET
from portkit.index import (
    CLASS,
    DECLARATION,
    ENUM,
    ENUMERATOR,
    FIELD,
    FUNCTION,
    MACRO,
    VARIABLE,
    Index,
    Symbol,
    calls,
    flat,
    flat_all,
    param_arity,
)
from portkit.series import Hunk, Patch, Series

_USED_KINDS = (FUNCTION, DECLARATION, FIELD, ENUMERATOR, MACRO, CLASS, ENUM, VARIABLE)


# `Class * name`, `const struct Class & name`, followed by `,` `)` `=` `;` `{`: name is a Class
_DECLARES = re.compile(r"\b(?:struct\s+)?([A-Za-z_]\w*)\s*(?:const\s*)?[*&]+\s*(?:const\s+)?"
                       r"([A-Za-z_]\w*)\s*(?=[,)=;{\[])")


class _Target:
    """One target: the engine's run of the series on it, and the follow-up of failed hunks."""

    def __init__(self, series: Series, base: Side, target: Side,
                 upstream: dict[str, str] | None = None) -> None:
        self.series = series
        self.base = base
        self.target = target
        self.upstream = upstream or {}  # subject -> why, for a feature series portkit knows
        if target.beside is None:
            target.beside = base  # (the base's index first: the target's shares its files)
        self.locator = Locator(base.index, target.index)
        self.current: dict[str, bytes | None] = {}
        self.homes: dict[str, str | None] = {}
        self.files = Files(target.root, base.root)
        self.starts: dict[tuple[str, int, int, str], int] = {}
        self.places: dict[tuple[str, str, int], tuple[Candidate | None, str]] = {}
        self.landings: dict[tuple[str, int, int, str], Landing] = {}  # relocated hunks' bytes
        self.follow_lines = False  # map the index's lines into `current` (see _line_now)
        self._blocks: dict[str, tuple[bytes | None, list[tuple[int, int]]]] = {}
        self._now: dict[str, tuple[object, list[str], list[str]]] = {}
        self._room: tempfile.TemporaryDirectory[str] | None = None  # for _gnu_trial
        self._meaningful: dict[tuple[str, str], list[str]] = {}  # (side, file) -> its lines
        self._flat_sets: dict[str, frozenset[str] | None] = {}  # see _flat_set

    def run(self) -> TargetDrift:
        """The series patch by patch on the target, each on the files as the earlier ones
        were carried (what of them landed, relocated hunks included; see _Carry)."""
        patches = []
        with _Carry.on(self.series, self.target.root) as carry:
            for patch in self.series.patches:
                before = carry.files()
                presult = carry.patch(patch)
                self.current = carry.files()
                self.landings.clear()
                patches.append(self.patch(presult, before))
                if not presult.applied:
                    carry.lend({landing.file: self.current[landing.file]
                                for landing in self.landings.values()})
        return TargetDrift(self.target.label, self.target.pin, tuple(patches))

    def patch(self, presult: PatchResult,
              before: dict[str, bytes | None] | None = None) -> PatchDrift:
        """One patch as the engine fared with it on `self.current`, hunk by hunk. With
        `before` (the files as they were before it; `self.current` is then what the series
        carried, this patch included), a landing that writes a label twice is told."""
        patch = presult.patch
        at = _patch_lines(patch)
        hunks: list[HunkDrift] = []
        blocks: dict[int, str] = {}  # landed hunks whose added block the target has already
        landed: list[Hunk] = []
        for hr in presult.hunks:
            assert hr.hunk is not None
            line = at.get(hr.hunk.patch_index, 1)
            landed.append(hr.hunk)  # (one a hunk, beside `hunks`)
            if patch.subject in self.upstream and hr.status != ALREADY:
                hunks.append(HunkDrift(
                    hr.file, hr.old_start, PRESENT_UPSTREAM, "the target has this part of "
                    f"the feature upstream ({self.upstream[patch.subject]})", line))
                continue
            hunks.append(self._hunk(patch, hr.hunk, hr.status, hr.offset, hr.fuzz,
                                    hr.reason, line, hr.line))
            if hunks[-1].status in (CLEAN, OFFSET):
                block = self.there_as_block(hr.hunk)
                if block:
                    blocks[len(hunks) - 1] = block
        repeats_only: set[int] = set()  # landed hunks that only repeat upstream's label
        if before is not None:
            hunks = self.repeats(patch, hunks, landed, blocks, repeats_only, before)
        if not hunks:  # nothing to apply hunk by hunk (a binary patch, say)
            where = patch.paths[0] if patch.paths else patch.name
            hunks = [HunkDrift(where, 1, CONFLICT, problem, 1)
                     for problem in presult.problems or ["the patch changes no text"]]
        landing = hunks
        hunks = _wholly_there(hunks, blocks)
        hunks = [replace(h, status=CONFLICT, offset=0, fuzz=0, reason=(
                 f"the patch is partly upstream: {_it(landing[i].reason)}, but {blocks[i]}, "
                 "and landing it would write it twice; refresh the patch without this hunk"))
                 if i in repeats_only and h.status != PRESENT_UPSTREAM else h
                 for i, h in enumerate(hunks)]
        hunks = _partly_there(hunks)
        there = all(h.status in (PRESENT_UPSTREAM, ALREADY_APPLIED) for h in hunks)
        return PatchDrift(patch.name, patch.subject, tuple(hunks),
                          () if there else tuple(self.semantic(patch)))

    # -- one hunk ----------------------------------------------------------------------

    def _hunk(self, patch: Patch, hunk: Hunk, status: Landed, offset: int, fuzz: int,
              reason: str, patch_line: int, found: int | None = None) -> HunkDrift:
        base_sym = self.base_symbol(hunk)
        name = base_sym.qualname if base_sym else None
        if status == H_FUZZ:
            there = self.there_verbatim(hunk)
            if there:
                return HunkDrift(hunk.path, hunk.old_start, PRESENT_UPSTREAM,
                                 f"it lands only with fuzz {fuzz}, and the target has it "
                                 f"already: {there}", patch_line, offset, fuzz, name)
        if status in (H_CLEAN, H_OFFSET, H_FUZZ):
            # Text first: where GNU patch places a hunk, that is its verdict. No presence
            # rule and no locator overrules it (they may only be wrong where text is not).
            mapped = {H_CLEAN: CLEAN, H_OFFSET: OFFSET, H_FUZZ: FUZZ}[status]
            said = "applies as it is" if mapped == CLEAN else (
                f"applies {offset:+d} lines away" + (f" with fuzz {fuzz}" if fuzz else ""))
            note = self.review_note(hunk)
            if note:
                said += f"; to review: upstream may have it already ({note})"
            away = self.landed_away(hunk, base_sym, offset)
            if away:
                said += f"; to review: {away}"
            return HunkDrift(hunk.path, hunk.old_start, mapped, said, patch_line, offset, fuzz,
                             name)
        if status == ALREADY:
            return HunkDrift(hunk.path, hunk.old_start, ALREADY_APPLIED,
                             "the target has exactly this change (it reverse-applies)",
                             patch_line, symbol=name,
                             nearest=Nearest(hunk.path, found, "\n".join(
                                 hunk.new_lines[:12])) if found else None)
        return self.follow(hunk, base_sym, reason, patch_line)

    def repeats(self, patch: Patch, hunks: list[HunkDrift], landed: list[Hunk],
                blocks: dict[int, str], only: set[int],
                before: dict[str, bytes | None]) -> list[HunkDrift]:
        """`hunks` (of `landed`), where one that lands writes a label its target has already
        (a `case` in that switch, an enumerator, a map key: portkit.follow.repeats) told so:
        the patch's with code of its own is a conflict (the two must become one); one that
        only repeats upstream's is there already (present upstream with the rest of the
        patch, else a hunk to leave out: `only` gets its index, `blocks` its reason). Text
        would land it, but the file would not compile."""
        out = list(hunks)
        for f in patch.files:
            old, new = before.get(f.path), self.current.get(f.path)
            if old is None or new is None or old == new:
                continue
            ones = [i for i, h in enumerate(landed) if h.path == f.path
                    and out[i].status in (CLEAN, OFFSET, FUZZ, RELOCATED)]
            # (only labels the file has once: drift reads every patch of a series, and
            # reading a file with tree-sitter for each would double its time)
            adds = {i: {squashed(a) for a in landed[i].added} for i in ones}
            for r in repeats(old, new, (line for i in ones for line in landed[i].added),
                             once=True):
                i = next((i for i in ones if r.first in adds[i]), None)
                if i is None:
                    continue
                said = f"{r.what()} (line {r.twin + 1})"
                h = out[i]
                rest = adds[i] - r.text - {b""}
                if r.own or rest:
                    verdict = ("the patch's has code of its own: the two must become one"
                               if r.own else "leave the patch's repeat out")
                    out[i] = replace(h, status=CONFLICT, offset=0, fuzz=0, reason=(
                        f"{_it(h.reason)}, but {said}: {r.landing()}; {verdict}"))
                    blocks.pop(i, None)
                else:
                    blocks[i] = said
                    only.add(i)
        return out

    def landed_away(self, hunk: Hunk, base_sym: Symbol | None, offset: int) -> str:
        """For a hunk GNU patch lands: where that is outside what its code in the base became
        (found without doubt), why a reviewer should look, or "". Text keeps its verdict.
        Cheap first: a landing inside a symbol of the same name in its own file is home."""
        if base_sym is None or hunk.path not in self.target.index.files:
            return ""
        line = hunk.old_start + offset + _changed_offset(hunk)  # its first change
        there = self.target.index.enclosing(hunk.path, line)
        if there is not None and there.qualname == base_sym.qualname:
            return ""
        cand = self.located(base_sym)[0]
        if cand is None:
            return ""
        ts = cand.symbol
        first, last = self._line_now(ts.file, ts.start_line), self._line_now(ts.file, ts.end_line)
        if ts.file == hunk.path and first - 3 <= line <= last + 3:
            return ""
        return (f"GNU patch puts it at line {line}, but its code in the base "
                f"({base_sym.qualname}) is {ts.qualname} at {ts.file}:{first} in the target")

    def there_verbatim(self, hunk: Hunk) -> str:
        """For a hunk GNU patch lands only by ignoring context (fuzz: git apply would not
        take it): why the target's file has its change already by a rule that reads the
        lines as they are, when the lines it adds are new to the file since the base."""
        place = self.place(hunk, hunk.path, None)
        if place is None:
            return ""
        if not place.added or set(place.added) <= set(self.base.flat_lines(hunk.path)):
            return ""
        for rule in PRESENCE_RULES:
            if rule.verbatim:
                why = rule.holds(place)
                if why:
                    return why
        return ""

    def there_as_block(self, hunk: Hunk) -> str:
        """For a hunk that lands and only adds lines: why landing it would write upstream's
        lines a second time, or "": the target's file (as upstream has it) has every
        meaningful line it adds (two at least), in order and next to each other, and the
        base's file did not have them so. Evidence only: the hunk keeps what text says
        unless the rest of its patch is there too (`_wholly_there`)."""
        added = _meaningful(hunk.added)
        if len(added) < 2 or _meaningful(hunk.removed) or \
                not set(_IDENT.findall("\n".join(hunk.added))) <= self.target.file_words(hunk.path):
            return ""  # (cheap first: a name it adds that the file lacks)

        def meaningful(side: Side) -> list[str]:
            key = (side.label, hunk.path)
            if key not in self._meaningful:
                self._meaningful[key] = [f for f in side.flat_lines(hunk.path)
                                         if len(f) >= _MEANINGFUL]
            return self._meaningful[key]

        if not _has_run(meaningful(self.target), added) or \
                _has_run(meaningful(self.base), added):
            return ""
        return f"its {len(added)} added lines are there as one block, new since the base"

    def review_note(self, hunk: Hunk) -> str:
        """For a hunk that applies: a function or declaration it adds that upstream seems to
        have added under an akin name (a note only: the hunk's status is what text says)."""
        if hunk.removed or hunk.path not in self.target.index.files:
            return ""
        known = self.base.file_words(hunk.path)
        if not any(_defines(w, hunk.added) for w in identifiers(hunk.added) if w not in known):
            return ""  # it defines no new name
        place = self.place(hunk, hunk.path, None)
        return there_under_upstreams_names(place) if place is not None else ""

    def between(self, hunk: Hunk) -> str:
        """What a hunk between definitions goes next to, and whether the target has it."""
        said = []
        for sym, side in zip(self.neighbours(hunk), ("after", "before"), strict=True):
            if sym is not None:
                cand, _ = self.located(sym)
                said.append(f"it goes {side} {sym.qualname}, " + (
                    f"which is {cand.symbol.qualname} at {cand.symbol.where}" if cand
                    else "which is not in the target"))
        return "; " + "; ".join(said) if said else ""

    def neighbours(self, hunk: Hunk) -> tuple[Symbol | None, Symbol | None]:
        """The base's definitions just above and just below a hunk between definitions."""
        if hunk.path not in self.base.index.files:
            return None, None
        at = self.base_start(hunk) + _changed_offset(hunk) + 1
        index = self.base.index
        top = [s for s in index.symbols if s.file == hunk.path and s.kind != FIELD
               and index.enclosing(hunk.path, s.start_line) in (s, None)]
        above = [s for s in top if s.end_line < at]
        below = [s for s in top if s.start_line >= at]
        return (max(above, key=lambda s: s.end_line) if above else None,
                min(below, key=lambda s: s.start_line) if below else None)

    def base_start(self, hunk: Hunk) -> int:
        """Where the hunk's old side is in the base file (0-based), or where it says."""
        key = (hunk.path, hunk.patch_index, hunk.old_start, hunk.text)
        if key not in self.starts:
            exact = None if _at_end(hunk) else _exact_block(self.base.lines(hunk.path) or [],
                                                            hunk.old_lines, hunk.old_start - 1)
            if exact is not None:  # its lines as they are: no layout-blind search
                self.starts[key] = exact
                return exact
            hay = self.base.flat_lines(hunk.path)
            if _at_end(hunk):  # a hunk that ends its file is where the base's file ends
                at = len(hay) - len(hunk.old_lines)
                found = at if at >= 0 and hay[at:] == [flat(x) for x in hunk.old_lines] \
                    else None
            else:
                found = _find_block(hay, list(hunk.old_lines), hunk.old_start - 1)
                if found is None:  # lines an earlier patch added are not in the base
                    found = _voted_start(hay, list(hunk.old_lines), hunk.old_start - 1)
            self.starts[key] = found if found is not None else hunk.old_start - 1
        return self.starts[key]

    def base_symbol(self, hunk: Hunk) -> Symbol | None:
        """The base's symbol around the hunk's first change."""
        if hunk.path not in self.base.index.files:
            return None
        first = self.base_start(hunk) + _changed_offset(hunk)
        last = max(len(self.base.lines(hunk.path) or ()), 1)
        if first >= last:  # past the base's end (lines earlier patches added): no symbol
            return None
        sym = self.base.index.enclosing(hunk.path, min(first + 1, last))
        if hunk.removed or sym is None:
            return sym
        # A pure insertion goes between two lines: it is inside what holds both of them.
        before = self.base.index.enclosing(hunk.path, min(max(first, 1), last))
        return sym if before is not None and before.qualname == sym.qualname else None

    def located(self, sym: Symbol) -> tuple[Candidate | None, str]:
        """Where `sym` went in the target: one sure candidate, or why there is none."""
        key = (sym.qualname, sym.file, sym.start_line)
        if key not in self.places:
            self.places[key] = self._locate(sym)
        return self.places[key]

    def _locate(self, sym: Symbol) -> tuple[Candidate | None, str]:
        found = self.locator.locate(sym, floor=SURE)
        if not found or found[0].confidence < SURE:
            return None, f"{sym.qualname} is not in the target"
        if len(found) > 1 and found[0].confidence - found[1].confidence < MARGIN:
            first, second = found[0].symbol, found[1].symbol
            if first.qualname != second.qualname:
                return None, (f"{sym.qualname} could be {first.qualname} or "
                              f"{second.qualname} in the target")
            if first.file != second.file and sym.file == second.file:
                return found[1], ""  # one name defined in two files: the one it was in
            if first.file != second.file and sym.file != first.file:
                # one name defined in two files, neither the one it was in: which is it?
                return None, (f"{sym.qualname} could be the one in {first.file} or the one "
                              f"in {second.file} in the target")
        return found[0], ""

    def follow(self, hunk: Hunk, base_sym: Symbol | None, reason: str,
               patch_line: int) -> HunkDrift:
        name = base_sym.qualname if base_sym else None
        cand, why_not = self.located(base_sym) if base_sym else (None, "")
        if cand is not None and base_sym is not None:
            tsym = cand.symbol
            upstream = self.present(hunk, tsym.file, (tsym.start_line, tsym.end_line))
            if upstream:
                return HunkDrift(hunk.path, hunk.old_start, PRESENT_UPSTREAM,
                                 f"{tsym.qualname} in the target has it already: {upstream}",
                                 patch_line, symbol=name)
            moved = self.relocate(hunk, base_sym, tsym)
            if moved is not None:
                line, offset, fuzz = moved
                where = ("renamed " if tsym.name != base_sym.name else "") + (
                    f"moved to {tsym.file}" if tsym.file != base_sym.file else "")
                return HunkDrift(
                    hunk.path, hunk.old_start, RELOCATED,
                    f"{base_sym.qualname} is {tsym.qualname} at {tsym.where} in the target"
                    f"{' (' + where.strip() + ')' if where.strip() else ''}; found by "
                    f"{cand.strategy}", patch_line, offset, fuzz, name,
                    Moved(tsym.file, line, tsym.qualname, cand.strategy or "similarity"))
            near = self.nearest(hunk, tsym.file, (tsym.start_line, tsym.end_line))
            if near is None:  # its lines are not in the symbol: elsewhere, in another file?
                away = self.nearest(hunk, tsym.file, None) or self.nearest_anywhere(hunk)
                if away is not None:
                    return HunkDrift(
                        hunk.path, hunk.old_start, CONFLICT,
                        f"context changed: its lines are not in {tsym.qualname} ({tsym.where}) "
                        f"any more; the nearest are at {away.file}:{away.line}", patch_line,
                        symbol=name, nearest=away)
            into = self.base_start(hunk) + 1 - base_sym.start_line
            line = near.line if near is not None else min(
                tsym.start_line + max(into, 0), tsym.end_line)
            return HunkDrift(hunk.path, hunk.old_start, CONFLICT,
                             f"context changed in {tsym.qualname} ({tsym.where})", patch_line,
                             symbol=name, nearest=near,
                             moved_to=Moved(tsym.file, line, tsym.qualname,
                                            cand.strategy or "similarity"))
        if self._current(hunk.path) is not None:
            upstream = self.present(hunk, hunk.path, None)
            if upstream and base_sym is None:
                return HunkDrift(hunk.path, hunk.old_start, PRESENT_UPSTREAM,
                                 f"{hunk.path} in the target has it already: {upstream}",
                                 patch_line)
            why = why_not or (f"context changed ({reason})" if reason else "context changed")
            near = self.nearest(hunk, hunk.path, None)
            if near is None and base_sym is None:
                gone = self.between_moved(hunk, patch_line)
                if gone is not None:
                    return gone
            if near is None and why_not:  # its symbol left the file: where did its lines go?
                near = self.nearest_anywhere(hunk)
            if near is None and _at_end(hunk):
                near = self.at_end(hunk.path, len(hunk.old_lines))
            return HunkDrift(hunk.path, hunk.old_start, CONFLICT, why, patch_line, symbol=name,
                             nearest=near)
        home = self.home(hunk.path)
        if home is not None and (base_sym is None or cand is None):
            upstream = self.present(hunk, home, None, verbatim=base_sym is None)
            if upstream:
                return HunkDrift(hunk.path, hunk.old_start, PRESENT_UPSTREAM,
                                 f"{home} in the target has it already: {upstream}",
                                 patch_line, symbol=name)
            moved = self.relocate_in_file(hunk, home)
            if moved is not None:
                line, offset, fuzz = moved
                around = self.target.index.enclosing(home, line) \
                    if home in self.target.index.files else None
                return HunkDrift(
                    hunk.path, hunk.old_start, RELOCATED,
                    f"{hunk.path} is {home} in the target (where its symbols went)",
                    patch_line, offset, fuzz, name,
                    Moved(home, line, around.qualname if around else "", "structure"))
        why = f"{hunk.path} is not in the target" + (f"; {why_not}" if why_not else "")
        if base_sym is None:
            why += self.between(hunk)
        near = self.nearest(hunk, home, None) if home else self.nearest_anywhere(hunk)
        if near is not None and home is None:
            moved = self.relocate_at(hunk, near)
            if moved is not None:
                line, offset, fuzz = moved
                around = self.target.index.enclosing(near.file, line) \
                    if near.file in self.target.index.files else None
                return HunkDrift(
                    hunk.path, hunk.old_start, RELOCATED,
                    f"{why}; its lines are at {near.file}:{near.line} now (the file upstream "
                    "shares most of them with), and it lands there", patch_line, offset, fuzz,
                    name, Moved(near.file, line, around.qualname if around else "",
                                "similarity"))
        if near is None and base_sym is None:
            near = self.after_neighbour(hunk)
        return HunkDrift(hunk.path, hunk.old_start, CONFLICT, why, patch_line, symbol=name,
                         nearest=near)

    def between_moved(self, hunk: Hunk, patch_line: int) -> HunkDrift | None:
        """A hunk between two definitions whose lines its file has lost, where upstream moved
        those definitions: both (or the one the base has) found, sure, in one other file and
        still side by side there; the hunk lands between them as GNU patch places it, for
        review (in another file, its linkage and declarations may have to follow)."""
        above, below = self.neighbours(hunk)
        around = [s for s in (above, below) if s is not None]
        found = [self.located(s)[0] for s in around]
        if not found or any(c is None for c in found):
            return None
        moved = [c.symbol for c in found if c is not None]
        rel = moved[0].file
        if rel == hunk.path or any(m.file != rel for m in moved):
            return None
        if len(moved) == 2 and not moved[0].end_line < moved[1].start_line <= \
                moved[0].end_line + _NEAR:
            return None  # not side by side any more: nothing says where between them
        now = self._line_now
        lo, hi = now(rel, moved[0].start_line), now(rel, moved[-1].end_line)
        at = now(rel, moved[0].end_line) - _changed_offset(hunk) + 1
        landed = self._trial(hunk, rel, max(at, 1), {}, (lo - 3, hi + 3))
        if landed is None:
            return None
        line, offset, fuzz = landed
        names = " and ".join(s.qualname for s in around)
        return HunkDrift(
            hunk.path, hunk.old_start, RELOCATED,
            f"the definitions around it ({names}) are in {rel} now, where it lands between "
            "them (in another file: what it defines may need the linkage and declarations "
            "upstream gave them)", patch_line, offset, fuzz, None,
            Moved(rel, line, moved[0].qualname, "structure"))

    def after_neighbour(self, hunk: Hunk) -> Nearest | None:
        """For a hunk between definitions that no lines place: the end of the definition it
        goes after, where the locator found that one in the target."""
        above, _ = self.neighbours(hunk)
        cand = self.located(above)[0] if above is not None else None
        if cand is None:
            return None
        tsym = cand.symbol
        current = self._current(tsym.file)
        if current is None:
            return None
        lines = current.decode("utf-8", errors="surrogateescape").splitlines()
        end = min(self._line_now(tsym.file, tsym.end_line, always=True), len(lines))
        start = max(end - 2, 1)
        return Nearest(tsym.file, start, "\n".join(lines[start - 1:end]))

    def at_end(self, rel: str, span: int) -> Nearest | None:
        """The last `span` lines of the target's file: where a hunk that ends a file goes."""
        current = self._current(rel)
        if not current:
            return None
        lines = current.decode("utf-8", errors="surrogateescape").splitlines()
        start = max(len(lines) - span, 0)
        return Nearest(rel, start + 1, "\n".join(lines[start:][:12]))

    # -- relocation --------------------------------------------------------------------

    def home(self, rel: str) -> str | None:
        """Where a base file that the target lacks went: the file git's rename rule finds
        (portkit.follow.renames), else the target file of the same kind that holds most of
        its classes and functions (by name, through aliases)."""
        if rel in self.homes:
            return self.homes[rel]
        text = self.base.text(rel)
        renamed = self.files.renamed(rel, text.encode("utf-8", "surrogateescape"),
                                     self._current) if text is not None else None
        if renamed is not None:
            self.homes[rel] = renamed
            return renamed
        votes: Counter[str] = Counter()
        suffix = Path(rel).suffix
        if rel in self.base.index.files:
            for sym in self.base.index.symbols:
                if sym.file != rel or sym.kind not in (CLASS, FUNCTION) or "::" in sym.scope:
                    continue
                for cand in find(self.target.index, sym.qualname, (sym.kind,)):
                    if cand.symbol.file.endswith(suffix):
                        votes[cand.symbol.file] += 1
                        break
        self.homes[rel] = votes.most_common(1)[0][0] if votes else None
        return self.homes[rel]

    def relocate_in_file(self, hunk: Hunk, rel: str) -> tuple[int, int, int] | None:
        names = {w: a for w in identifiers(hunk.old_lines) if not self.target.index.find(w)
                 for a in aliases_of(w)[:1] if a != w and self.target.index.find(a)}
        return self._trial(hunk, rel, hunk.old_start, names, None)

    def relocate_at(self, hunk: Hunk, near: Nearest) -> tuple[int, int, int] | None:
        """A hunk whose file is gone, tried at the nearest match of its lines in another
        file (as GNU patch would, with its fuzz): (line, offset, fuzz) where it lands,
        only right there."""
        if near.file == hunk.path or self._current(hunk.path) is not None:
            return None
        at = self._line_now(near.file, near.line)
        return self._trial(hunk, near.file, at, {}, (at - 3, at + len(hunk.old_lines) + 3))

    def renames(self, hunk: Hunk, base_sym: Symbol, tsym: Symbol) -> dict[str, str]:
        """Names of the hunk's context to spell as the target does: the symbol's own and its
        class's, and every name the base defines that the target knows by an alias."""
        out: dict[str, str] = {}
        if base_sym.name != tsym.name:
            out[base_sym.name] = tsym.name
        base_scope, target_scope = base_sym.scope.rsplit("::", 1)[-1], \
            tsym.scope.rsplit("::", 1)[-1]
        if base_scope and target_scope and base_scope != target_scope:
            out[base_scope] = target_scope
        for word in identifiers(hunk.old_lines):
            if word in out or self.target.index.find(word) or not self.base.index.find(word):
                continue
            for alias in aliases_of(word):
                if alias != word and self.target.index.find(alias):
                    out[word] = alias
                    break
        return out

    def relocate(self, hunk: Hunk, base_sym: Symbol,
                 tsym: Symbol) -> tuple[int, int, int] | None:
        """Try the hunk, in the target's spelling, inside `tsym`: (line, offset, fuzz) where it
        lands, or None."""
        into = self.base_start(hunk) + 1 - base_sym.start_line
        now = self._line_now
        return self._trial(hunk, tsym.file, max(1, now(tsym.file, tsym.start_line) + into),
                           self.renames(hunk, base_sym, tsym),
                           (now(tsym.file, tsym.start_line - 3), now(tsym.file, tsym.end_line + 3)))

    def _line_now(self, rel: str, line: int, *, always: bool = False) -> int:
        """A line of the target's file as upstream has it, in the file as the earlier patches
        left it: the same line when not `follow_lines` (drift's own runs, where the index's
        lines stand for both), unless `always`."""
        current = self.current.get(rel) if self.follow_lines or always else None
        upstream = self.target.text(rel) if current is not None else None
        if current is None or upstream is None:
            return line
        if self._blocks.get(rel, (None, []))[0] is not current:
            self._blocks[rel] = (current, line_blocks(
                upstream.encode("utf-8", errors="surrogateescape"), current))
        blocks = self._blocks[rel][1]
        at = bisect_right(blocks, (line - 1, len(current) + 1)) - 1
        a, b = blocks[at] if at >= 0 else (0, 0)
        return line + b - a

    def _trial(self, hunk: Hunk, rel: str, old_start: int, names: dict[str, str],
               span: tuple[int, int] | None, *,
               upstream: bool = False) -> tuple[int, int, int] | None:
        """The hunk with `names` respelled, tried on the target's `rel` (as the earlier
        patches left it, or as `upstream` has it) from `old_start`: (line, offset, fuzz)
        where it lands within `span` lines, or None."""
        text = self.target.text(rel) if upstream else None
        current = text.encode("utf-8", "surrogateescape") if text is not None \
            else None if upstream else self._current(rel)
        if current is None:
            return None
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b") if names else None

        def spell(line: str) -> str:
            return pattern.sub(lambda m: names[m.group(1)], line) if pattern else line

        body = [spell(line) for line in hunk.text.splitlines()[1:]]
        old_len = sum(1 for ln in body if ln[:1] in (" ", "-"))
        new_len = sum(1 for ln in body if ln[:1] in (" ", "+"))
        text = (f"--- a/{rel}\n+++ b/{rel}\n"
                f"@@ -{old_start},{old_len} +{old_start},{new_len} @@\n" + "\n".join(body) + "\n")
        found = self._gnu_trial(rel, current, text)
        if found is not None:
            line, offset, fuzz, after = found
            if span is not None and not span[0] <= line <= span[1]:
                return None  # the context is elsewhere: not inside the symbol it went to
            if not upstream:
                self._landed(hunk, Landing(rel, after, fuzz))
            return line, offset, fuzz
        if span is None or hunk.removed:
            return None
        lines = current.decode("utf-8", errors="surrogateescape").splitlines()
        placed = place_insertion([spell(x) for x in hunk.old_lines], _changed_offset(hunk),
                                 lines, span)
        if placed is None:
            return None
        if not upstream and _one_block(hunk):
            landing = _insert(current, placed, [spell(x) for x in hunk.old_lines],
                              _changed_offset(hunk), [spell(x) for x in hunk.added])
            if landing is not None:
                self._landed(hunk, replace(landing, file=rel))
        return placed + 1, placed + 1 - old_start - _changed_offset(hunk), 0

    def _gnu_trial(self, rel: str, current: bytes,
                   section: str) -> tuple[int, int, int, bytes] | None:
        """GNU patch's run of one hunk (`section`, a one-hunk diff of `rel`) on `current`, as
        the engine runs it, in a scratch folder kept for all trials: (line, offset, fuzz,
        the file after) where it lands, or None. Where it lands is its verdict (text
        first: no reverse trial)."""
        if self._room is None:
            self._room = tempfile.TemporaryDirectory(prefix="portkit-trial-", dir=_fast_tmp())
        root = Path(self._room.name)
        shutil.rmtree(root / "t", ignore_errors=True)
        (root / "t" / rel).parent.mkdir(parents=True)
        (root / "t" / rel).write_bytes(current)
        (root / "s.diff").write_bytes(section.encode("utf-8", errors="surrogateescape"))
        _, out = _gnu(["--force", "--verbose", "-p1", "--no-backup-if-mismatch",
                       "--reject-file=-", f"--fuzz={FUZZ_LIMIT}", "-i", str(root / "s.diff")],
                      root / "t")
        verdict = _verdicts(out).get(1)
        if verdict is None or verdict.word != "succeeded" or not (root / "t" / rel).is_file():
            return None
        return verdict.line, verdict.offset, verdict.fuzz, (root / "t" / rel).read_bytes()

    def _landed(self, hunk: Hunk, landing: Landing) -> None:
        """Keep where a hunk was relocated to; in drift's own run, the later hunks and
        patches see the file with it (the series as carried)."""
        self.landings[_hunk_key(hunk)] = landing
        if not self.follow_lines:
            self.current[landing.file] = landing.data

    # -- already there ----------------------------------------------------------------

    def present(self, hunk: Hunk, rel: str, span: tuple[int, int] | None, *,
                verbatim: bool = True) -> str:
        """Why the target as upstream has it (its file `rel`, within `span` lines) has the
        failed hunk's change already, or "": the first rule of PRESENCE_RULES that holds
        says why (without `verbatim`, the rules that read lines as they are are skipped).
        Only for a hunk that does not apply: none of these overrules one that does."""
        place = self.place(hunk, rel, span)
        if place is None:
            return ""
        for rule in PRESENCE_RULES:
            if verbatim or not rule.verbatim:
                why = rule.holds(place)
                if why:
                    return why
        return ""

    def place(self, hunk: Hunk, rel: str, span: tuple[int, int] | None) -> Place | None:
        """Where the presence rules look for the hunk's change: the target's file `rel` as
        upstream has it, within `span` lines; None when there is no such file."""
        lines = self.target.lines(rel)
        if lines is None:
            return None
        if span is not None:
            lines = lines[max(span[0] - 1, 0):span[1]]
        return Place(self, hunk, rel, span, lines)

    def present_renamed(self, hunk: Hunk, rel: str, span: tuple[int, int] | None,
                        removed: list[str]) -> str:
        """Why the target's file `rel` (within `span` lines) has what the hunk adds under
        other names, or "": the hunk defines a name the target does not have, and every
        meaningful added line is there, in order and close together, once each name the
        target lacks (the hunk's own new names, names upstream renamed) is read as one name
        upstream gained that reads as its rename. A definition at file scope is looked for in
        the whole file. Lines the hunk removes must be gone from there."""
        here = self.target.file_words(rel)
        wild = frozenset(w for w in identifiers(hunk.added)
                         if w not in here and not self.target.index.find(w))
        defining = [line for line in hunk.added if any(_defines(w, [line]) for w in wild)]
        if not defining:
            return ""
        # cheap first: a name the hunk defines must have an akin name new in the file
        new_here = here - self.base.all_words
        if not any(_akin(w, g) for w in wild if _defines(w, defining) for g in new_here):
            return ""
        lo, hi = 0, None
        if span is not None and all(line[:1] in (" ", "\t") for line in defining):
            lo, hi = max(span[0] - 1, 0), span[1]
        ours = [_tokens(line) for line in hunk.added if len(flat(line)) >= _MEANINGFUL]
        if any(_IDENT.fullmatch(t) and t not in here and t not in wild
               for line in ours for t in line):
            return ""  # a name of its own that the file lacks: no line can match it
        raw = (self.target.lines(rel) or [])[lo:hi]
        # A line can match only where its first name of its own is (tokens are read only
        # for the lines that have it).
        keys = [next((t for t in line if _IDENT.fullmatch(t) and t not in wild), "")
                for line in ours]
        reach = len(hunk.added) + _NEAR

        def match(i: int, after: int, mapping: dict[str, str]) -> tuple[dict[str, str],
                                                                        list[int]] | None:
            if i == len(ours):
                return mapping, []
            stop = len(raw) if i == 0 else min(len(raw), after + 1 + reach)
            for j in range(after + 1, stop):
                if keys[i] not in raw[j]:
                    continue
                extended = _unify(ours[i], self.target.tokens_at(rel, lo + j), wild,
                                  new_here, mapping)
                if extended is not None:
                    rest = match(i + 1, j, extended)
                    if rest is not None:
                        return rest[0], [j, *rest[1]]
            return None

        found = match(0, -1, {})
        if found is None or not found[0]:
            return ""
        mapping, at = found
        near = set(self.target.flat_lines(rel)[lo:hi][max(at[0] - 2, 0):at[-1] + 3])
        if any(r in near for r in removed):
            return ""
        return "it has " + ", ".join(f"{a} as {b}" for a, b in mapping.items())

    # -- nearest match -----------------------------------------------------------------

    def nearest(self, hunk: Hunk, rel: str, span: tuple[int, int] | None) -> Nearest | None:
        now = self._now_lines(rel)
        if now is None:
            return None
        lines, flats = now
        lo, hi = (max(span[0] - 1, 0), span[1]) if span else (0, len(lines))
        where: dict[str, list[int]] = defaultdict(list)
        for i in range(lo, min(hi, len(lines))):
            where[flats[i]].append(i)
        old = list(hunk.old_lines)
        voters: dict[int, set[int]] = defaultdict(set)  # a start -> the old lines there
        for pos, line in enumerate(old):
            key = flat(line)
            if len(key) < _MEANINGFUL:
                continue
            for i in where.get(key, ()):
                voters[i - pos].add(pos)
        votes = _clustered(voters)
        if not votes:
            votes = self._alike_votes(old, lines, lo, min(hi, len(lines)))
        if not votes:
            return None
        start, count = max(votes.items(),
                           key=lambda kv: (kv[1], -abs(kv[0] - hunk.old_start + 1)))
        if count < 2:
            return None  # a line or two alike anywhere is no place: better none than a wrong one
        tied = [at for at, n in votes.items() if n == count and abs(at - start) > len(old)]
        if tied:  # as many of its lines at two places: the lines around it in the base decide
            chosen = self._wider(hunk, lines, [start, *tied], lo, min(hi, len(lines)))
            if chosen is None:
                return None  # the text does not say which: better none than a wrong one
            start = chosen
        start = max(start, 0)
        text = "\n".join(lines[start:start + max(len(old), 1)][:12])
        return Nearest(rel, start + 1, text)

    def _wider(self, hunk: Hunk, lines: list[str], starts: list[int], lo: int,
               hi: int) -> int | None:
        """Of places where as many of the hunk's lines are (`starts`, 0-based in `lines`), the
        one where the most of the base's lines around the hunk (WIDER each side) are too, in
        their order around it; None when two places tie again."""
        base = self.base.flat_lines(hunk.path)
        if not base:
            return None
        at = self.base_start(hunk)
        span = len(hunk.old_lines)
        around = [(k - at, base[k]) for k in range(max(at - WIDER, 0),
                                                   min(at + span + WIDER, len(base)))
                  if not at <= k < at + span and len(base[k]) >= _MEANINGFUL]
        here = {i: flat(lines[i]) for i in range(lo, hi)}

        def score(start: int) -> int:
            found = 0
            for rel, key in around:
                window = range(start + rel - WIDER // 2, start + rel + WIDER // 2 + 1)
                found += any(here.get(i) == key for i in window)
            return found

        ranked = sorted(((score(s), s) for s in starts), reverse=True)
        if ranked[0][0] == 0 or ranked[0][0] == ranked[1][0]:
            return None
        return ranked[0][1]

    @staticmethod
    def _alike_votes(old: list[str], lines: list[str], lo: int, hi: int) -> Counter[int]:
        """Where the hunk's old lines are, when none of them is there as it was (upstream
        renamed what they use): each line votes for the lines between `lo` and `hi` that use
        mostly the same names (at least 3 of them, 60% alike)."""
        votes: Counter[int] = Counter()
        words = [frozenset(identifiers([line])) for line in old]
        if not any(len(w) >= 3 for w in words):
            return votes
        theirs = [frozenset(identifiers([lines[i]])) for i in range(lo, hi)]
        for pos, mine in enumerate(words):
            if len(mine) < 3:
                continue
            for i, other in enumerate(theirs):
                if other and len(mine & other) >= 0.6 * len(mine | other):
                    votes[lo + i - pos] += 1
        return votes

    def nearest_anywhere(self, hunk: Hunk) -> Nearest | None:
        """For a hunk whose file or function is gone: the nearest match in the target file
        that shares the most of its meaningful lines (a third of them at least), among the
        indexed files of the same kind and the sources beside the hunk's file (where a file
        that upstream split went)."""
        wanted = set(_meaningful(hunk.old_lines))
        if not wanted:
            return None
        suffix, folder = PurePosixPath(hunk.path).suffix, PurePosixPath(hunk.path).parent
        beside = [rel for files in self.files.by_name().values() for rel in files
                  if PurePosixPath(rel).parent == folder
                  and PurePosixPath(rel).suffix in _SOURCES]
        need = max(2, len(wanted) / 3)
        heads = [_run_heads(w) for w in wanted]
        # Cheap first: how many of its lines a file can have at most (a line whose names the
        # file lacks is not there); files are read most promising first, until none left
        # can have as many as the best so far (of two alike, the first listed wins).
        bounds = []
        for order, rel in enumerate(dict.fromkeys(
                [*(r for r in self.target.index.files if r.endswith(suffix)), *beside])):
            if rel != hunk.path:
                names = self.target.file_words(rel)
                could = sum(all(any(h in names for h in run) for run in line)
                            for line in heads)
                if could >= need:
                    bounds.append((-could, order, rel))
        best: tuple[int, int, str] | None = None  # (lines shared, order, file)
        for could, order, rel in sorted(bounds):
            if best is not None and (-could, -order) <= (best[0], -best[1]):
                break
            here = self._flat_set(rel)
            if here is None:
                continue
            shared = len(wanted & here)
            if shared >= need and (best is None or (shared, -order) > (best[0], -best[1])):
                best = (shared, order, rel)
        return self.nearest(hunk, best[2], None) if best else None

    def _now_lines(self, rel: str) -> tuple[list[str], list[str]] | None:
        """The target's file `rel` as the series is carried: its lines and those lines
        flattened (cached while the file stays the same); None when there is none."""
        carried: object = self.current.get(rel, _ON_DISK)
        kept = self._now.get(rel)
        if kept is None or kept[0] is not carried:
            data = self._current(rel)
            if data is None:
                return None
            lines = data.decode("utf-8", errors="surrogateescape").splitlines()
            kept = self._now[rel] = (carried, lines, flat_all(lines))
        return kept[1], kept[2]

    def _flat_set(self, rel: str) -> frozenset[str] | None:
        """The target's file `rel` as upstream has it, as a set of flattened lines (cached:
        every hunk looked for anywhere reads the same files); None when there is none."""
        if rel not in self._flat_sets:
            self._flat_sets[rel] = self.target.flat_set(rel)
        return self._flat_sets[rel]

    def _words_now(self, rel: str) -> frozenset[str]:
        """The names in the target's file `rel` as the series is carried (its own added
        files and lines included)."""
        data = self._current(rel)
        if data is None:
            return frozenset()
        return frozenset(_IDENT.findall(data.decode("utf-8", errors="replace")))

    def _current(self, rel: str) -> bytes | None:
        """The target's file as the earlier patches of the series left it."""
        if rel in self.current:
            return self.current[rel]
        found = read_entry(self.target.root / rel)
        return found[0] if found else None

    # -- semantic drift ----------------------------------------------------------------

    def semantic(self, patch: Patch) -> list[SemanticChange]:
        """The symbols the patch's added lines use whose definition changed in the target:
        only symbols resolved without doubt (see `meanings`)."""
        added_all = [line for h in patch.hunks for line in h.added]
        defined_here = set(identifiers(added_all)) - self.base.all_words
        out: dict[str, SemanticChange] = {}
        for hunk in patch.hunks:
            receivers: dict[str, set[str]] = defaultdict(set)
            bare: set[str] = set()
            built: set[str] = set()
            typed = self.declared(hunk)
            for line in hunk.added:
                for obj, member in _MEMBER_USE.findall(line):
                    receivers[member].add(typed.get(obj, obj))
                bare.update(_bare_names(line))
                built.update(_CONSTRUCTS.findall(line))
            around = self.base_symbol(hunk)
            home = (around.qualname if around and around.kind in (CLASS, ENUM)
                    else around.scope if around else "")
            for word in identifiers(hunk.added):
                if word in defined_here or word in out:
                    continue
                change = self.changed(word, receivers.get(word, set()), home,
                                      word in bare, word in built)
                if change is not None:
                    out[word] = change
        for change in self.arity_changes(patch, defined_here | set(out)):
            out.setdefault(change.symbol, change)
        return list(out.values())

    def arity_changes(self, patch: Patch, skip: set[str]) -> list[SemanticChange]:
        """The calls the patch's added lines make (tree-sitter's reading of each run of
        added lines) with a number of arguments some overload took in the base and none
        takes in the target: the function is still there, its parameters changed, and the
        call as written no longer compiles. Only where the name is a function and nothing
        else on both sides (no macro, no variable, no class), and the patch does not touch
        the name's own declarations (it may be changing them itself)."""
        touched = {f.path for f in patch.files}
        removed = set(identifiers(line for h in patch.hunks for line in h.removed))
        out: dict[str, SemanticChange] = {}
        for hunk in patch.hunks:
            for block in _added_runs(hunk):
                for name, n in calls(block):
                    word = name.rsplit("::", 1)[-1]
                    if word in skip or word in out or word in removed or "<" in name:
                        continue
                    change = self._arity(name, word, n, touched)
                    if change is not None:
                        out[word] = change
        return list(out.values())

    def _arity(self, name: str, word: str, n: int, touched: set[str]) -> SemanticChange | None:
        fns = (FUNCTION, DECLARATION)
        before, now = self.base.index.find(name), self.target.index.find(name)
        if not before or not now or any(s.kind not in fns for s in (*before, *now)) or any(
                s.file in touched for s in before):
            return None

        def takes(sym: Symbol) -> bool:
            least, most = param_arity(sym.param_list or "()")
            return least <= n and (most is None or n <= most)

        took = [s for s in before if takes(s)]
        if not took or any(takes(s) for s in now):
            return None
        kept = {canonical(s.qualname) for s in now}
        took = [s for s in took if canonical(s.qualname) in kept]
        if not took:
            return None
        was = took[0]
        became = sorted({s.signature() for s in now
                         if canonical(s.qualname) == canonical(was.qualname)})
        return SemanticChange(word, "signature", (
            f"it calls {name} with {n} argument(s), as {was.signature()} took them; no "
            f"{word} in the target does ({'; '.join(became)})"))

    def declared(self, hunk: Hunk) -> dict[str, str]:
        """The objects the hunk's own lines declare as a pointer or reference to a class the
        base defines (`const llama_context * ctx`, a parameter or a local): name -> class.
        A name declared as two classes is left out."""
        seen: dict[str, set[str]] = defaultdict(set)
        for line in (*hunk.old_lines, *hunk.added):
            for cls, name in _DECLARES.findall(code_of(line)):
                if name not in _KEYWORDS and any(
                        s.kind == CLASS for s in self.base.index.find(cls, (CLASS,))):
                    seen[name].add(cls)
        return {name: next(iter(classes)) for name, classes in seen.items()
                if len(classes) == 1}

    def meanings(self, word: str, receivers: set[str], home: str,
                 bare: bool = True, built: bool = True) -> list[Symbol]:
        """What `word` names in the base where the patch uses it, when that is known without
        doubt; else nothing. Used on an object (`hparams.n_rot`), it is a member of the class
        the object is named after (llama_hparams), or of the hunk's own class (`this->`);
        used bare, a member of the class whose method the hunk is in, or else a free
        function, macro, type, enumerator or variable with exactly one definition (a class
        with its constructors) and no member of that name anywhere. A member name alone
        (`dev`, `path`, `second`) never resolves."""
        found = self.base.index.find(word, _USED_KINDS)
        if not found:
            return []

        def scope_of(sym: Symbol) -> str:
            return sym.scope.rsplit("::", 1)[-1]

        chosen: list[Symbol] = []
        if receivers:
            named = {r for r in receivers if len(r) >= 3 and r != "this"}
            chosen = [s for s in found if s.scope and any(
                scope_of(s) == r or scope_of(s).endswith("_" + r) for r in named)]
            if not chosen and "this" in receivers and home:
                chosen = [s for s in found if s.scope == home]
        elif bare:
            if home:
                chosen = [s for s in found if s.scope == home]
            if not chosen:
                free = [s for s in found if not self._member(s) or scope_of(s) == word]
                quals = {canonical(s.qualname) for s in free if scope_of(s) != word}
                if len(free) == len(found) and len(quals) == 1:
                    # a class stands for its constructors only where it builds an object
                    chosen = [s for s in free if built or scope_of(s) != word]
        return sorted(chosen, key=lambda s: (s.kind not in (FUNCTION, DECLARATION, MACRO),
                                             s.kind not in (CLASS, ENUM)))

    def _member(self, sym: Symbol) -> bool:
        """Whether `sym` is a member of a class (not a free symbol of a namespace or an
        unscoped enum's enumerator)."""
        if not sym.scope:
            return False
        owners = self.base.index.by_qualname.get(sym.scope, [])
        return any(o.kind == CLASS for o in owners) or (
            sym.kind != ENUMERATOR and any(o.kind == ENUM for o in owners))

    def renamed_member(self, sym: Symbol) -> Symbol | None:
        """Where a member the target's class lacks went, when that is known without doubt:
        the class is there, and of the members of the same kind it gained (names the base's
        class did not have) exactly one reads as a rename of it (`_akin`)."""
        if not sym.scope or not self._member(sym):
            return None
        scope = canonical(sym.scope)
        had = {s.name for s in _by_scope(self.base.index).get(scope, ())}
        kinds = {sym.kind} | ({FUNCTION, DECLARATION} if sym.kind in (FUNCTION, DECLARATION)
                              else set())
        gained = {s.name: s for s in _by_scope(self.target.index).get(scope, ())
                  if s.kind in kinds and s.name not in had and _akin(sym.name, s.name)}
        return next(iter(gained.values())) if len(gained) == 1 else None

    def heirs(self, sym: Symbol, twin: Symbol) -> list[Symbol]:
        """Where a field or variable went when its name now means something else (a field
        renamed `x_full` and the name kept for an accessor `x(il)`): the symbols of its kind,
        beside the new meaning, whose names extend the old one."""
        data = (FIELD, VARIABLE)
        if (sym.kind in data) == (twin.kind in data):
            return []
        return [s for s in self.target.index.symbols if s.kind == sym.kind
                and s.scope == twin.scope and s.name != sym.name
                and (s.name.startswith(sym.name + "_") or s.name.endswith("_" + sym.name))]

    def changed(self, word: str, receivers: set[str], home: str,
                bare: bool = True, built: bool = True) -> SemanticChange | None:
        """How the symbol(s) `word` names changed in the target, or None when one meaning
        of it is unchanged (no claim then on the others), or when what it names is not
        known without doubt."""
        base_syms = self.meanings(word, receivers, home, bare, built)
        if not base_syms:
            return None
        by_qual = {canonical(s.qualname): s
                   for s in self.target.index.find(word, _USED_KINDS)}
        changes: list[SemanticChange] = []
        missing: list[Symbol] = []
        for sym in base_syms:
            twin = by_qual.get(canonical(sym.qualname))
            if twin is None:
                missing.append(sym)
                continue
            detail = _difference(sym, twin)
            if not detail:
                if sym.kind in (CLASS, ENUM) and (changes or missing):
                    continue  # a class stands for its constructors, which did change
                return None
            heirs = self.heirs(sym, twin)
            if heirs:
                changes.append(SemanticChange(
                    word, "renamed", f"{sym.qualname} is "
                    f"{' or '.join(h.qualname for h in heirs)} now; the name is a {twin.kind} "
                    f"now ({twin.signature()})"))
                continue
            kind = "signature" if sym.kind in (FUNCTION, DECLARATION, MACRO) and \
                twin.kind in (FUNCTION, DECLARATION, MACRO) else "type"
            changes.append(SemanticChange(word, kind, detail))
        if changes:
            return changes[0]
        for sym in missing:
            cand, _ = self.located(sym)
            if cand is not None and cand.symbol.name != word:
                return SemanticChange(word, "renamed", f"{sym.qualname} is "
                                      f"{cand.symbol.qualname} in the target "
                                      f"({cand.symbol.where}, {cand.strategy})")
        for sym in missing:
            heir = self.renamed_member(sym)
            if heir is not None:
                return SemanticChange(word, "renamed", f"{sym.qualname} is {heir.qualname} in "
                                      f"the target ({heir.where}, the one member of its kind "
                                      "the class gained under an akin name)")
        sym = missing[0]
        if self._current(sym.file) is None or word in self._words_now(sym.file):
            # Still in its file: the index missed it (a parse error). Or its whole file is
            # not in the target: a file the fork keeps beside upstream's (its own headers),
            # which says nothing about the name.
            return None
        return SemanticChange(word, "removed", f"{sym.qualname} ({sym.kind} at {sym.where} "
                              f"in the base) is not in the target")


_RUN = re.compile(r"(?<!\w)[A-Za-z_]\w*")


def _it(reason: str) -> str:
    """A landing's reason as a clause: "it applies ..." (a relocated hunk's says where)."""
    return f"it {reason}" if reason.startswith("applies") else reason


def _run_heads(flattened: str) -> list[tuple[str, ...]]:
    """For a flattened line: each run of word characters that starts like a name, as the
    names it may begin with, longest first. A line of a file flattens so only where, for
    each run, one of them is a name the file uses (a run is one name, or names that only
    white space or a comment parted: `int x` is `intx`)."""
    return [tuple(run[:k] for k in range(len(run), 0, -1)) for run in _RUN.findall(flattened)]


_SCOPES: dict[int, tuple[Index, dict[str, list[Symbol]]]] = {}


_SOURCES = (".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".m", ".mm", ".metal")
SHIFT = 2  # lines a hunk's old lines may have drifted apart by (a line added between)


_ON_DISK = object()  # a file of the target as upstream has it (not carried over by the series)


def _added_runs(hunk: Hunk) -> list[str]:
    """A hunk's added lines, each run of them (lines added one after the other) as one
    text."""
    runs: list[list[str]] = []
    after_added = False
    for line in hunk.body.splitlines(keepends=True):
        if line.startswith("\\"):
            continue  # "\ No newline at end of file"
        added = line.startswith("+")
        if added:
            if not after_added:
                runs.append([])
            runs[-1].append(line[1:])
        after_added = added
    return ["".join(run) for run in runs]


def _exact_block(hay: list[str], needle: tuple[str, ...], near: int) -> int | None:
    """The 0-based start of `needle` (lines with their ends) in `hay` (lines without),
    character for character, the match nearest `near`."""
    if not needle:
        return None
    needle = tuple(x[:-2] if x.endswith("\r\n") else x[:-1] if x.endswith("\n") else x
                   for x in needle)
    best, at, n = None, -1, len(needle)
    while True:
        try:
            at = hay.index(needle[0], at + 1)
        except ValueError:
            return best
        if tuple(hay[at:at + n]) == needle and (best is None or abs(at - near) < abs(best - near)):
            best = at


def _clustered(voters: dict[int, set[int]]) -> Counter[int]:
    """Votes for where a hunk starts: at each start, how many of its old lines are there,
    counting those that are there up to SHIFT lines off (upstream added or removed a line
    between them); each start keeps the count of the best start near it only where it is
    that best start itself."""
    votes: Counter[int] = Counter()
    for start in voters:
        near = set().union(*(voters.get(start + d, set()) for d in range(-SHIFT, SHIFT + 1)))
        best = max((len(voters.get(start + d, ())), -abs(d), start + d)
                   for d in range(-SHIFT, SHIFT + 1))
        if best[2] == start:
            votes[start] = len(near)
    return votes


def _at_end(hunk: Hunk) -> bool:
    """Whether the hunk's old side ends its file (its last line has no newline)."""
    return bool(hunk.old_lines) and not hunk.old_lines[-1].endswith("\n")


WIDER = 12  # the base's lines each side of a hunk that break a tie between two places


def _voted_start(hay: list[str], old: list[str], near: int) -> int | None:
    """Where the hunk's old lines start in `hay` (flattened lines) when they are not all
    there: each meaningful line that is votes for the start it implies; the start most of
    them agree on (at least 2, and no other as many), the one nearest `near` among those."""
    where: dict[str, list[int]] = defaultdict(list)
    for i, line in enumerate(hay):
        where[line].append(i)
    votes: Counter[int] = Counter()
    for pos, line in enumerate(old):
        key = flat(line)
        if len(key) >= _MEANINGFUL:
            for i in where.get(key, ()):
                votes[i - pos] += 1
    if not votes:
        return None
    top = max(votes.values())
    best = sorted((at for at, n in votes.items() if n == top), key=lambda at: abs(at - near))
    if top < 2 or abs(best[-1] - best[0]) > len(old):
        return None
    return max(best[0], 0)


def _by_scope(index: Index) -> dict[str, list[Symbol]]:
    """An index's members by their class (today's names), built once per index."""
    kept = _SCOPES.get(id(index))
    if kept is None or kept[0] is not index:
        table: dict[str, list[Symbol]] = defaultdict(list)
        for sym in index.symbols:
            if sym.scope:
                table[canonical(sym.scope)].append(sym)
        if len(_SCOPES) > 8:
            _SCOPES.clear()
        kept = _SCOPES[id(index)] = (index, dict(table))
    return kept[1]


def _spelled(text: str) -> str:
    """A type as C++ reads it: today's names (`canonical`), without the elaborated-type
    keywords C code writes (`struct llama_model &` is `llama_model &`) and spacing."""
    return " ".join(re.sub(r"\b(?:struct|class|union|enum)\s+", "", canonical(text)).split())


def _difference(old: Symbol, new: Symbol) -> str:
    """How a symbol's interface changed ("" when it did not)."""
    if old.kind != new.kind and {old.kind, new.kind} != {FUNCTION, DECLARATION}:
        return f"{old.qualname} was a {old.kind} ({old.signature()}), is a {new.kind} now " \
               f"({new.signature()})"
    if old.kind in (FUNCTION, DECLARATION, MACRO):
        if [_spelled(p) for p in old.params] != [_spelled(p) for p in new.params]:
            return f"{old.signature()} is {new.signature()} now"
        if old.kind != MACRO and _spelled(old.returns) != _spelled(new.returns):
            return f"{old.qualname} returns {new.returns or '?'} now, not {old.returns or '?'}"
    if old.kind in (FIELD, VARIABLE) and _spelled(old.returns) != _spelled(new.returns):
        return f"{old.qualname} is {new.returns} now, not {old.returns}"
    return ""
