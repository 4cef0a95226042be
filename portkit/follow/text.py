"""The line merge: git's three-way merge of one file, and what it leaves that text can settle.

`merge3` is `git merge-file` (the merge `git am -3` makes, sealed from the user's
configuration). git calls two changes a conflict when they touch, even when they do not
overlap: a line the patch inserts right next to lines upstream rewrote. `settle` resolves
only those blocks where the order is given by the text itself:

  beside   one side only inserts, at the very start or the very end of the region the
           other side rewrote: the insertion goes on that side of the rewrite, as the
           inserting side wrote it (its lines stay next to the line they followed, or
           before the line they preceded);
  same-point  both sides only insert, at the same place: upstream's lines stay where
           upstream put them, right after the line they follow, and the patch's come after
           them (a fork's entries at the end of the run upstream extended); the patch's go
           first only where that, and not the other order, keeps the lines around in order
           (a sorted list: LLM_TYPE_20B, the patch's 22B, upstream's 27B, 30B), or where
           upstream's lines open the paragraph of the line after them (a guard right before
           the statement it guards) and the patch's are a paragraph of their own, ended by
           a blank line: before the guard, not between it and its statement. The order
           is a choice, so the caller reports it for review.
  already  the lines the patch inserts are in the target's side of the block already: the
           target's side stands.
  deleted  one side only deletes lines at the very start or the very end of the region,
           the other rewrote the rest and kept those lines as they were: they are deleted
           (a deletion beside a rewrite, as `beside` is an insertion beside one).
  edited   the patch deletes lines at the start or the end of the region and upstream
           edited each of them, keeping it alike (most characters in common), and rewrote
           the rest: they are deleted as upstream has them. Deleting an edited line is a
           choice, so the caller reports it for review. (Upstream deleting lines the patch
           edited stays a conflict: the patch's change would be lost.)
  apart    both sides changed lines of the block, but not the same lines and not at the
           same place: each change touches the other only at its edge (git's merge stops
           where a change ends right where the other's begins). Each is made as its side
           made it; reported for review, as the changes are next to each other.
  words    both sides changed the same lines, but not the same words of them (a name the
           patch renames in a line upstream reindented or extended): git's merge of the
           block's words, one word to a line. Reported for review.
  layout   upstream re-spaced lines of the block (columns widened, a list re-indented)
           and the patch changed others: git's merge of the block with blanks ignored, as
           `git merge -Xignore-all-space` makes it. Upstream's lines stay as upstream spaced
           them; the patch's own lines come as the patch wrote them (portkit.follow.columns
           then gives them upstream's columns). Reported for review.
  count    the patch raises a count its line asserts (GGML_OP_COUNT == 83 -> 84) and
           upstream changed that count too (to 81): the target's count raised as the patch
           raises it (82), portkit.follow.counts. Reported for review.

Every other conflict stays a conflict: structure (portkit.drift) or a human decides it.
"""

from __future__ import annotations

import itertools
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from enum import StrEnum
from pathlib import Path

from portkit.errors import ToolFailed
from portkit.follow.counts import raised_block
from portkit.proc import git

LABELS = ("target", "base", "series")
_OURS, _BASE, _SEP, _THEIRS = (b"<<<<<<< " + LABELS[0].encode(), b"||||||| " +
                               LABELS[1].encode(), b"=======", b">>>>>>> " + LABELS[2].encode())

class Settled(StrEnum):
    """How the line merge settled one block git's merge stopped at (see the module's text)."""

    BESIDE = "beside"
    SAME_POINT = "same-point"
    ALREADY = "already"
    DELETED = "deleted"
    EDITED = "edited"
    APART = "apart"
    WORDS = "words"
    LAYOUT = "layout"
    COUNT = "count"


BESIDE, SAME_POINT, ALREADY, DELETED, EDITED, APART, WORDS, LAYOUT, COUNT = Settled
ALIKE_LINE = 0.8  # how alike a line upstream edited is to the one a patch deletes


def binary(*sides: bytes) -> bool:
    """Whether any of the files is binary as git tells (a NUL in its first 8000 bytes):
    git merges no binary file."""
    return any(b"\0" in side[:8000] for side in sides)


def merge3(ours: bytes, base: bytes, theirs: bytes, *, room: Path | None = None,
           labels: tuple[str, str, str] = LABELS) -> tuple[bytes, int]:
    """`git merge-file` of `ours` and `theirs` against `base`: the result (with conflict
    markers, diff3 style, where they conflict) and how many conflicts there are. `room` is a
    folder to work in (a temporary one by default)."""
    if room is None:
        with tempfile.TemporaryDirectory(prefix="portkit-merge-") as tmp:
            return merge3(ours, base, theirs, room=Path(tmp), labels=labels)
    for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
        (room / name).write_bytes(data)
    done = git(["merge-file", "--diff3", "-L", labels[0], "-L", labels[1], "-L", labels[2],
                "ours", "base", "theirs"], cwd=room, check=False, ceiling=room)
    if done.returncode < 0 or done.returncode > 127:
        raise ToolFailed("git could not merge a file three ways "
                           f"({done.stderr.strip() or f'exit {done.returncode}'})")
    return (room / "ours").read_bytes(), done.returncode


@dataclass(frozen=True)
class Merged:
    """A three-way merge of one file: its bytes, the conflicts left and those settled."""

    data: bytes
    conflicts: int
    settled: tuple[Settled, ...] = ()  # how each settled block was settled


def _insertion(base: Sequence[bytes], side: Sequence[bytes]) -> int | None:
    """Where `side` is `base` with lines inserted at one place and nothing else changed:
    that place (0 = before everything, len(base) = after everything), else None."""
    extra = len(side) - len(base)
    if extra <= 0:
        return None
    head = 0
    while head < len(base) and base[head] == side[head]:
        head += 1
    return head if list(side[head + extra:]) == list(base[head:]) else None


def _within(needle: Sequence[bytes], hay: Sequence[bytes]) -> bool:
    """Whether `needle` is a run of lines of `hay`."""
    n = len(needle)
    return any(list(hay[i:i + n]) == list(needle) for i in range(len(hay) - n + 1))


def _settle_block(ours: list[bytes], base: list[bytes], theirs: list[bytes],
                  around: tuple[list[bytes], list[bytes]] = ([], [])
                  ) -> tuple[list[bytes], Settled] | None:
    """One conflict block resolved when the text orders it, else None. `around`: the
    lines just before and just after the block."""
    counted = raised_block(ours, base, theirs)
    if counted is not None:
        return counted, COUNT
    mine = _insertion(base, theirs)  # the series (theirs) only inserts
    upstream = _insertion(base, ours)  # the target (ours) only inserts
    if mine is not None and _within(theirs[mine:mine + len(theirs) - len(base)], ours):
        return ours, ALREADY  # what the patch inserts is there: nothing to order
    if not base and mine is not None and upstream is not None:
        before, after = around
        if _in_order(before + theirs + ours + after) and \
                not _in_order(before + ours + theirs + after):
            return theirs + ours, SAME_POINT  # the patch's first keeps a sorted run sorted
        if _blank(theirs[-1]) and _leads_into(ours, before, after):
            # upstream's lines stay with the line they lead to; one blank line between
            return theirs + (ours[1:] if _blank(ours[0]) else ours), SAME_POINT
        return ours + theirs, SAME_POINT
    if mine is not None and upstream is None:
        return _beside(theirs, mine, len(base), ours) or _by_layout(ours, base, theirs)
    if upstream is not None and mine is None:
        return _beside(ours, upstream, len(base), theirs) or _by_layout(ours, base, theirs)
    return (_deleted_beside(ours, base, theirs) or _apart(ours, base, theirs)
            or _by_words(ours, base, theirs) or _by_layout(ours, base, theirs))


_NUMBER = re.compile(rb"(\d+)")
AROUND = 2  # lines on each side of a same-point block that its order is read against


def _blank(line: bytes) -> bool:
    return not line.strip()


def _leads_into(inserted: list[bytes], before: list[bytes], after: list[bytes]) -> bool:
    """Whether inserted lines open the paragraph of the line after them: a blank line (or
    the start) above them, none between them and that line (a guard before the statement
    it guards)."""
    opens = not before or _blank(before[-1]) or _blank(inserted[0])
    return opens and bool(after) and not _blank(inserted[-1]) and not _blank(after[0])


def _in_order(lines: Sequence[bytes]) -> bool:
    """Whether the lines (blank ones aside, at least four) are in natural order, numbers
    by value: a sorted run, as of enumerators or table rows."""
    keys = [[(0, int(p), b"") if k % 2 else (1, 0, p)
             for k, p in enumerate(_NUMBER.split(line.strip()))]
            for line in lines if line.strip()]
    return len(keys) >= 4 and all(a <= b for a, b in itertools.pairwise(keys))


def _end_deletion(base: Sequence[bytes], side: Sequence[bytes]) -> tuple[int, bool] | None:
    """Where `side` is `base` with a run of lines deleted at its very start or very end and
    nothing else changed: how many, and whether at the start; else None."""
    n = len(base) - len(side)
    if n <= 0:
        return None
    if list(base[n:]) == list(side):
        return n, True
    if list(base[:len(side)]) == list(side):
        return n, False
    return None


def _deleted_beside(ours: list[bytes], base: list[bytes],
                    theirs: list[bytes]) -> tuple[list[bytes], Settled] | None:
    """One side only deletes lines at the start or the end of the block, the other rewrote
    the rest: the deletion applies to those lines where the rewriting side still has them at
    that end, as they were (DELETED), or, when the patch deletes, each edited by upstream but
    alike (EDITED)."""
    for deleting, other in ((theirs, ours), (ours, theirs)):
        patch_deletes = deleting is theirs
        found = _end_deletion(base, deleting)
        if found is None or _end_deletion(base, other) is not None:
            continue
        n, at_start = found
        gone, kept = (base[:n], other[:n]) if at_start else (base[-n:], other[-n:])
        if len(other) < n or (len(other) == n and other != gone):
            continue
        rest = other[n:] if at_start else other[:len(other) - n]
        if kept == gone:
            return rest, DELETED
        if patch_deletes and all(_alike(a, b) for a, b in zip(gone, kept, strict=True)):
            return rest, EDITED
    return None


def _changes(base: list[bytes], side: list[bytes]) -> list[tuple[int, int, int, int]]:
    """What `side` changed of `base`: (base from, base to, side from, side to) for each
    run of lines it replaced, deleted or inserted (difflib's alignment)."""
    return [(i1, i2, j1, j2) for op, i1, i2, j1, j2 in
            SequenceMatcher(None, base, side, autojunk=False).get_opcodes() if op != "equal"]


def _apart(ours: list[bytes], base: list[bytes],
           theirs: list[bytes]) -> tuple[list[bytes], Settled] | None:
    """Both sides changed the block, each its own lines of it: no change of one overlaps
    one of the other, and neither inserts at the edge of a change of the other (where the
    order of the two would be a choice). Both made, on the base's lines."""
    mine, upstream = _changes(base, theirs), _changes(base, ours)
    if not mine or not upstream:
        return None
    for a1, a2, _, _ in mine:
        for b1, b2, _, _ in upstream:
            if max(a1, b1) < min(a2, b2):
                return None  # the same lines
            if (a1 == a2 and b1 <= a1 <= b2) or (b1 == b2 and a1 <= b1 <= a2):
                return None  # an insertion at the edge of the other's change
    edits = sorted([(i1, i2, theirs[j1:j2]) for i1, i2, j1, j2 in mine]
                   + [(i1, i2, ours[j1:j2]) for i1, i2, j1, j2 in upstream])
    out: list[bytes] = []
    at = 0
    for i1, i2, lines in edits:
        out += base[at:i1] + lines
        at = i2
    return out + base[at:], APART


_WORD = re.compile(rb"\w+|[ \t]+|\r?\n|[^\w\s]|\s")


def _by_words(ours: list[bytes], base: list[bytes],
              theirs: list[bytes]) -> tuple[list[bytes], Settled] | None:
    """Both sides changed the same lines: git's merge of the block's words (names, numbers,
    each other character, runs of blanks, line ends), when the words they changed do not
    touch."""
    if not base or not ours or not theirs:
        return None

    def words(block: list[bytes]) -> bytes:  # one word per line, as hex: git merges lines
        return b"".join(w.hex().encode() + b"\n" for w in _WORD.findall(b"".join(block)))

    data, conflicts = merge3(words(ours), words(base), words(theirs))
    if conflicts:
        return None
    merged = b"".join(bytes.fromhex(w.decode()) for w in data.splitlines() if w)
    return merged.splitlines(keepends=True), WORDS


_BLANKS = re.compile(rb"\s+")


def _by_layout(ours: list[bytes], base: list[bytes],
               theirs: list[bytes]) -> tuple[list[bytes], Settled] | None:
    """The block merged with blanks ignored: git's merge of its lines with every run of
    blanks taken out, when that is clean and upstream's side differs from the base in
    layout somewhere (else blanks are not what stopped git). Each line of the result is
    upstream's where upstream's side has it, else the patch's own line."""
    def bare(block: list[bytes]) -> list[bytes]:
        return [_BLANKS.sub(b"", line) + b"\n" for line in block]

    o, b, t = bare(ours), bare(base), bare(theirs)
    kept, was = set(base), set(b)
    if not any(line not in kept and key in was and key.strip()
               for line, key in zip(ours, o, strict=True)):
        return None  # upstream re-spaced none of the base's lines
    data, conflicts = merge3(b"".join(o), b"".join(b), b"".join(t))
    if conflicts:
        return None
    merged = data.splitlines(keepends=True)
    mine = [j for op, _, _, j1, j2 in SequenceMatcher(None, b, t, autojunk=False).get_opcodes()
            if op != "equal" for j in range(j1, j2)]  # the patch's own lines, in its order
    out: list[bytes] = []
    for op, i1, i2, j1, j2 in SequenceMatcher(None, o, merged, autojunk=False).get_opcodes():
        if op == "equal":
            out += ours[i1:i2]
            continue
        for line in merged[j1:j2]:  # not upstream's: the patch's own, as the patch wrote it
            k = next((k for k, j in enumerate(mine) if t[j] == line), None)
            if k is None:
                return None
            out.append(theirs[mine[k]])
            del mine[:k + 1]
    return out, LAYOUT


def _alike(a: bytes, b: bytes) -> bool:
    """Two lines that are one edited into the other: most of their characters in common."""
    return SequenceMatcher(None, a.strip(), b.strip(), autojunk=False).ratio() >= ALIKE_LINE


def _beside(inserting: list[bytes], at: int, base: int,
            rewritten: list[bytes]) -> tuple[list[bytes], Settled] | None:
    """One side inserted lines at `at` of the block's `base` lines, the other rewrote them:
    the insertion on its side of the rewrite, when it is at the start or the end."""
    added = inserting[at:at + len(inserting) - base]
    if at == 0:
        return added + rewritten, BESIDE
    if at == base:
        return rewritten + added, BESIDE
    return None


def settle(merged: bytes) -> Merged:
    """The conflict blocks of `merged` (merge3's diff3 output) that the text orders,
    resolved; the others left as they are."""
    lines = merged.splitlines(keepends=True)
    out: list[bytes] = []
    settled: list[Settled] = []
    left = 0
    i = 0
    while i < len(lines):
        if lines[i].rstrip(b"\r\n") != _OURS:
            out.append(lines[i])
            i += 1
            continue
        marks = _block(lines, i)
        if marks is None:  # not a block merge-file wrote: leave the rest alone
            out += lines[i:]
            left += 1
            break
        b, s, t = marks
        ours, base, theirs = lines[i + 1:b], lines[b + 1:s], lines[s + 1:t]
        follows = _unmarked(lines[t + 1:t + 1 + AROUND])
        done = _settle_block(ours, base, theirs, (out[-AROUND:], follows))
        if done is None:
            out += lines[i:t + 1]
            left += 1
        else:
            out += done[0]
            settled.append(done[1])
        i = t + 1
    return Merged(b"".join(out), left, tuple(settled))


def _unmarked(lines: list[bytes]) -> list[bytes]:
    """The lines up to the first of another conflict block."""
    for k, line in enumerate(lines):
        if line.rstrip(b"\r\n") == _OURS:
            return lines[:k]
    return lines


def _block(lines: list[bytes], start: int) -> tuple[int, int, int] | None:
    """The base, separator and end marker lines of the block opening at `start`."""
    want = [_BASE, _SEP, _THEIRS]
    found: list[int] = []
    for k in range(start + 1, len(lines)):
        line = lines[k].rstrip(b"\r\n")
        if line == want[len(found)]:
            found.append(k)
            if len(found) == 3:
                return found[0], found[1], found[2]
        elif line in (_OURS, *want):
            return None
    return None


_RANGE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", re.M)


def line_blocks(old: bytes, new: bytes) -> list[tuple[int, int]]:
    """Where the runs of lines `old` and `new` share start (0-based line in each), in order,
    as git's diff aligns the two: a line in such a run is `line - a + b` in `new`."""
    if old == new:
        return [(0, 0)]
    with tempfile.TemporaryDirectory(prefix="portkit-lines-") as tmp:
        room = Path(tmp)
        (room / "old").write_bytes(old)
        (room / "new").write_bytes(new)
        done = git(["diff", "--no-index", "--no-color", "--no-ext-diff", "-U0", "old", "new"],
                   cwd=room, check=False, ceiling=room)
    if done.returncode not in (0, 1):
        raise ToolFailed("git could not compare two versions of a file "
                         f"({done.stderr.strip() or f'exit {done.returncode}'})")
    blocks = [(0, 0)]
    for m in _RANGE.finditer(done.stdout):
        a, b = int(m.group(1)), int(m.group(3))
        la = 1 if m.group(2) is None else int(m.group(2))
        lb = 1 if m.group(4) is None else int(m.group(4))
        blocks.append((a - 1 + la if la else a, b - 1 + lb if lb else b))
    return blocks


def merge(ours: bytes, base: bytes, theirs: bytes, *, room: Path | None = None) -> Merged:
    """The line merge of one file: git's, with the blocks the text orders settled."""
    data, conflicts = merge3(ours, base, theirs, room=room)
    if not conflicts:
        return Merged(data, 0)
    return settle(data)
