"""Counts a patch raises that upstream raised too: `static_assert(GGML_OP_COUNT == 82, ...)`.

A patch that adds an operator raises the count its file asserts (81 -> 82). When upstream
added an operator of its own, the target asserts 82 already: git's merge sees the same
change on both sides and keeps 82, but the tree with the patch has 83 operators. So where a
line the patch changes only by raising its numbers (each by the same k) is an assertion,
and the target has the patch's new line while the base had the old one, the line is the
target's count raised by k - unless the target has the rest of what the patch adds to that
file too (upstream took the patch's own operator, and the count is right as it is).

When upstream changed the count to another number (it removed operators, or added two), git's
merge stops at the line: `raised_block` settles it as the target's count raised by the
patch's k.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from portkit.follow.words import _MEANINGFUL
from portkit.index import flat
from portkit.series import Hunk

_NUMBER = re.compile(r"\b\d+\b")


def _shape(line: str) -> str:
    return _NUMBER.sub("#", line)


def _raised(old: str, new: str) -> int | None:
    """k when `new` is `old` with each of its numbers raised by the same k > 0, else None."""
    if "static_assert" not in old or _shape(old) != _shape(new):
        return None
    a, b = [int(x) for x in _NUMBER.findall(old)], [int(x) for x in _NUMBER.findall(new)]
    steps = {y - x for x, y in zip(a, b, strict=True) if y != x}
    if len(steps) != 1 or not all(y - x in steps or y == x for x, y in zip(a, b, strict=True)):
        return None
    k = steps.pop()
    return k if k > 0 else None


def only_raises(hunk: Hunk) -> bool:
    """Whether every line the hunk adds raises a count one of its removed lines asserts."""
    return bool(hunk.added) and all(any(_raised(old, new) for old in hunk.removed)
                                    for new in hunk.added)


def recount(hunks: Sequence[Hunk], base: bytes, ours: bytes,
            merged: bytes) -> tuple[bytes, list[str]]:
    """`merged` (the file carried by text) with each count the patch raises that upstream
    raised too raised once more; and a note for each line so changed."""
    raises: dict[str, tuple[str, int]] = {}  # the patch's new line -> (its old line, k)
    for hunk in hunks:
        for old in hunk.removed:
            for new in hunk.added:
                k = _raised(old, new)
                if k is not None:
                    raises.setdefault(new, (old, k))
    if not raises:
        return merged, []
    base_lines = set(base.decode("utf-8", "surrogateescape").splitlines(keepends=True))
    ours_lines = set(ours.decode("utf-8", "surrogateescape").splitlines(keepends=True))
    here = {flat(x) for x in ours_lines}
    rest = [flat(x) for h in hunks for x in h.added
            if x not in raises and len(flat(x)) >= _MEANINGFUL]
    if rest and all(x in here for x in rest):
        return merged, []  # upstream has what the patch adds: its count is right
    lines = merged.decode("utf-8", "surrogateescape").splitlines(keepends=True)
    notes: list[str] = []
    for new, (old, k) in raises.items():
        if new not in ours_lines or new in base_lines or old not in base_lines:
            continue
        raised = _raise_changed(old, new, k)
        count = sum(1 for x in lines if x == new)
        lines = [raised if x == new else x for x in lines]
        notes.append(f"upstream raised the count it raises ({new.strip()[:60]}): raised once "
                     f"more ({count}x)")
    return "".join(lines).encode("utf-8", "surrogateescape"), notes


def _raise_changed(old: str, new: str, k: int) -> str:
    """`new` with the numbers that differ from `old` raised by k once more (the two lines
    have one shape, `_raised`)."""
    olds = iter(_NUMBER.findall(old))
    return _NUMBER.sub(lambda m: str(int(m.group()) + k) if m.group() != next(olds)
                       else m.group(), new)


def raised_block(ours: Sequence[bytes], base: Sequence[bytes],
                 theirs: Sequence[bytes]) -> list[bytes] | None:
    """A block git's merge stops at where the patch only raises counts its lines assert
    (each by the same k, `_raised`) and upstream changed those numbers otherwise: the
    target's lines with the same numbers raised by k; None for any other block."""
    if not base or not len(ours) == len(base) == len(theirs):
        return None
    out: list[bytes] = []
    raised = False
    for o, b, t in zip(ours, base, theirs, strict=True):
        if b == t:
            out.append(o)
            continue
        old, new, now = (x.decode("utf-8", "surrogateescape") for x in (b, t, o))
        k = _raised(old, new)
        if k is None or _shape(now) != _shape(old):
            return None
        moved = [x != y for x, y in zip(_NUMBER.findall(old), _NUMBER.findall(new),
                                         strict=True)]
        out.append(_raise_at(now, moved, k).encode("utf-8", "surrogateescape"))
        raised = True
    return out if raised else None


def _raise_at(line: str, moved: list[bool], k: int) -> str:
    """`line` with its n-th number raised by k wherever `moved[n]`."""
    marks = iter(moved)
    return _NUMBER.sub(lambda m: str(int(m.group()) + k) if next(marks) else m.group(), line)
