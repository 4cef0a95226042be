"""Columns: the lines a patch adds keep the alignment of the lines they were written beside.

Upstream often realigns a table or a block of declarations when it adds a longer entry: every
row gets wider columns, whitespace only (llama-arch.cpp's name tables, ggml-backend.h's
`GGML_API size_t               name(...)` rows). A patch's row, written in the old columns,
then stands out in the merged file; maintainers realign it as upstream did its neighbours.

`realign` does that, from the text alone: an added line is realigned only beside a line of
the target (a few lines up or down, in the same run of non-blank lines) that upstream changed
in its whitespace only, that the base has in one form, and whose old columns the added line
shares where that line was column-aligned (more than one space before the field). Fields of
the added line that sat in those columns move to upstream's new columns; the rest keeps its
own spacing. Nothing is realigned with tabs about, where the indentation changed, or where a
field would no longer fit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_FIELD = re.compile(rb"\S+")
REACH = 3  # how many lines of the target up or down an added line looks for a realigned one


def _fields(line: bytes) -> list[tuple[int, int]]:
    """Where each field (a run of non-blank characters) of `line` starts and ends."""
    return [m.span() for m in _FIELD.finditer(line)]


def repad(added: bytes, was: bytes, now: bytes) -> bytes | None:
    """`added` (one line, its end of line aside) with the fields it had in the columns of
    `was` moved to the columns `now` has them in (`now` is `was` respaced); None where
    nothing moves or a field would not fit."""
    if b"\t" in added + was + now:
        return None
    fa, fw, fn = _fields(added), _fields(was), _fields(now)
    if len(fw) != len(fn) or len(fa) < 2 or not fw or fw[0][0] != fn[0][0] \
            or fa[0][0] != fw[0][0]:
        return None
    columns = {}  # a column of `was` where it is aligned -> that column in `now`
    for k in range(1, len(fw)):
        if fw[k][0] != fn[k][0] and (fw[k][0] - fw[k - 1][1] > 1 or fn[k][0] - fn[k - 1][1] > 1):
            columns[fw[k][0]] = fn[k][0]
    out = bytearray(added[:fa[0][1]])
    moved = False
    for k in range(1, len(fa)):
        start, end = fa[k]
        gap = start - fa[k - 1][1]
        if start in columns:
            gap = columns[start] - len(out)
            if gap < 1:
                return None
            moved = True
        out += b" " * gap + added[start:end]
    return bytes(out) if moved else None


def _ending(line: bytes) -> tuple[bytes, bytes]:
    body = line.rstrip(b"\r\n")
    return body, line[len(body):]


def realign(ours: bytes, base: bytes, result: bytes, added: Iterable[str]) -> tuple[bytes, int]:
    """`result` (the target's file `ours` with a patch carried into it) with the lines the
    patch adds (`added`) that sit beside lines upstream realigned (from `base`) realigned the
    same way; and how many were."""
    wanted = {line.rstrip("\r\n").encode("utf-8", "surrogateescape") for line in added
              if line.strip()}
    lines = result.splitlines(keepends=True)
    had = {_ending(x)[0] for x in ours.splitlines(keepends=True)}
    candidates = [i for i, x in enumerate(lines) if _ending(x)[0] in wanted
                  and _ending(x)[0] not in had]
    if not candidates:
        return result, 0
    old_forms: dict[tuple[bytes, ...], set[bytes]] = {}
    for x in base.splitlines():
        old_forms.setdefault(tuple(x.split()), set()).add(x)
    mine = set(candidates)
    count = 0
    for i in candidates:
        body, end = _ending(lines[i])
        for was, now in _beside(lines, i, mine, old_forms):
            new = repad(body, was, now)
            if new is not None:
                lines[i] = new + end
                count += 1
                break
    return (b"".join(lines), count) if count else (result, 0)


def _beside(lines: Sequence[bytes], i: int, mine: set[int],
            old_forms: dict[tuple[bytes, ...], set[bytes]]) -> Iterable[tuple[bytes, bytes]]:
    """The lines of the target near line `i` (up, then down; not past a blank line) that
    upstream respaced, each with its one form in the base: (as the base has it, as now)."""
    for step in (-1, 1):
        j, seen = i + step, 0
        while 0 <= j < len(lines) and seen < REACH:
            now = _ending(lines[j])[0]
            if not now.strip():
                break
            if j not in mine:
                seen += 1
                forms = old_forms.get(tuple(now.split()), set())
                if len(forms) == 1 and now not in forms:
                    yield next(iter(forms)), now
            j += step
