"""Putting a hunk where its code went: where an insertion goes among the target's lines
(`place_insertion`), the hunk's text written into a target file (`_insert`), and what a
relocation leaves (`Landing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher

from portkit.follow.words import _MEANINGFUL, _NEAR
from portkit.index import (
    flat,
)
from portkit.series import Hunk, Patch

SURE = 0.6  # a located symbol below this confidence is not followed
MARGIN = 0.05  # ... nor one the runner-up comes this close to

PLACE_SIMILARITY = 0.85  # how alike a line must be to the neighbour an insertion follows


def _patch_lines(patch: Patch) -> dict[int, int]:
    """The line (1-based) of each hunk's @@ header in the patch file, by hunk index."""
    lines = patch.text.splitlines()
    out: dict[int, int] = {}
    at = 0
    for hunk in patch.hunks:
        head = hunk.text.splitlines()[0]
        while at < len(lines) and lines[at] != head:
            at += 1
        out[hunk.patch_index] = at + 1 if at < len(lines) else 1
        at += 1
    return out


def _changed_offset(hunk: Hunk) -> int:
    """Lines from the hunk's start to its first removed or added line (old side)."""
    count = 0
    for line in hunk.text.splitlines()[1:]:
        if line.startswith((" ",)):
            count += 1
        elif line.startswith(("-", "+")):
            return count
    return 0


def place_insertion(old_lines: list[str], at: int, target: list[str],
                    span: tuple[int, int]) -> int | None:
    """Where a pure insertion goes in `target` (0-based index of the line it goes before),
    within `span` (1-based lines): after the line most like its last neighbour above (and
    before one like its first neighbour below), when that place is clearly the best one.
    `old_lines` are the hunk's context lines, the insertion after the first `at` of them."""
    above = [flat(x) for x in old_lines[:at] if len(flat(x)) >= _MEANINGFUL]
    below = [flat(x) for x in old_lines[at:] if len(flat(x)) >= _MEANINGFUL]
    if not above:
        return None
    lo, hi = max(span[0] - 1, 0), min(span[1], len(target))
    flat_target = [flat(x) for x in target]
    scored: list[tuple[float, int]] = []
    for i in range(lo, hi):
        if len(flat_target[i]) < _MEANINGFUL:
            continue
        alike = SequenceMatcher(None, above[-1], flat_target[i])
        # the cheap upper bounds first: most lines are nowhere near alike
        if alike.real_quick_ratio() < PLACE_SIMILARITY or alike.quick_ratio() < PLACE_SIMILARITY:
            continue
        score = alike.ratio()
        if score < PLACE_SIMILARITY:
            continue
        rest = [x for x in flat_target[i + 1:min(i + 4, hi)] if len(x) >= _MEANINGFUL]
        if below and rest:
            score += 0.5 * SequenceMatcher(None, below[0], rest[0]).ratio()
        scored.append((score, i))
    scored.sort(reverse=True)
    if not scored or (len(scored) > 1 and scored[0][0] - scored[1][0] < MARGIN):
        return None
    return scored[0][1] + 1


@dataclass(frozen=True)
class Landing:
    """A hunk carried into the target by relocation: the file it lands in, that file's bytes
    (as the earlier patches left it) with this hunk alone applied, the fuzz it took, and why
    its place is only a guess, if it is."""

    file: str
    data: bytes
    fuzz: int
    guess: str = ""  # why its place is not sure ("" when it is)


def _hunk_key(hunk: Hunk) -> tuple[str, int, int, str]:
    return hunk.path, hunk.patch_index, hunk.old_start, hunk.text


def _one_block(hunk: Hunk) -> bool:
    """Whether the hunk adds its lines in one run (so that they go in at one place)."""
    marks = "".join(line[:1] for line in hunk.text.splitlines()[1:] if line[:1] in " -+")
    return marks.strip(" ").count("+") == len(marks.strip(" ")) > 0


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" \t"))]


def _insert(data: bytes, placed: int, old_lines: list[str], cut: int,
            added: list[str]) -> Landing | None:
    """`data` with `added` (lines with their ends) inserted where place_insertion put them:
    after its line `placed` (1-based; the one like the hunk's last meaningful line above the
    insertion, which is after the hunk's first `cut` old lines) and the short lines that
    follow that one in the hunk, which must follow it in the target too (else None);
    indented as the target indents that line. When the target has other lines before the
    one the insertion went before, it goes right before that one (after code upstream put at
    the top, a guard say) if it is near, and the landing says that its place is a guess.
    `file` is left for the caller."""
    lines = data.decode("utf-8", errors="surrogateescape").splitlines(keepends=True)
    above = max(i for i in range(cut) if len(flat(old_lines[i])) >= _MEANINGFUL)
    tail = [flat(x) for x in old_lines[above + 1:cut]]
    if [flat(x) for x in lines[placed:placed + len(tail)]] != tail:
        return None
    here, there = _indent(old_lines[above]), _indent(lines[placed - 1])
    if here != there and set(here + there) <= {" "}:
        shift = len(there) - len(here)
        added = [(" " * shift + line if shift > 0 else line[min(-shift, len(_indent(line))):])
                 if line.strip() else line for line in added]
    at, guess = placed + len(tail), ""
    below = next((i for i in range(cut, len(old_lines))
                  if len(flat(old_lines[i])) >= _MEANINGFUL), None)
    if below is not None and at < len(lines):
        # the short lines between the insertion and that line, blank lines aside
        head = [f for f in (flat(x) for x in old_lines[cut:below]) if f]
        want = flat(old_lines[below])
        k = next((k for k in range(at, min(at + _NEAR, len(lines)))
                  if flat(lines[k]) == want), None)
        between = [f for f in (flat(x) for x in lines[at:k]) if f] if k is not None else []
        what = old_lines[below].strip()
        if k is None or between[len(between) - len(head):] != head:
            guess = f"the line it goes before ({what!r}) does not follow in the target"
        elif len(between) > len(head):
            start, count = k, len(head)
            while count:
                start -= 1
                count -= bool(flat(lines[start]))
            guess = (f"upstream has {len(between) - len(head)} lines between the lines it goes "
                     f"after and before ({what!r}); it was put right before that one")
            at = start
    if not lines[at - 1].endswith("\n"):
        lines[at - 1] += "\n"
    if added and not added[-1].endswith("\n") and at < len(lines):
        added[-1] += "\n"
    return Landing("", "".join(lines[:at] + added + lines[at:]).encode(
        "utf-8", errors="surrogateescape"), 0, guess)


def _find_block(hay: list[str], needle: list[str], near: int) -> int | None:
    """The 0-based start of `needle` in `hay` (flattened lines; layout-blind), the match
    nearest `near`."""
    want = [flat(x) for x in needle]
    if not want:
        return None
    starts = [i for i, line in enumerate(hay[:len(hay) - len(want) + 1])
              if line == want[0] and hay[i:i + len(want)] == want]
    return min(starts, key=lambda i: abs(i - near)) if starts else None
