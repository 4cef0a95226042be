"""Translate: a hunk whose code upstream moved and rewrote in its own words, written there in
those words.

Upstream often moves a function and renames what it touches on the way (llm_load_vocab's
`vocab.type_pre = ...` became llama_vocab::impl::load's `pre_type = ...`, in another file).
The patch's hunk then matches nowhere as text, though every line it keeps or deletes is still
there, one for one, in upstream's words. `translate` finds that run of lines near where drift
found the hunk's nearest match, learns upstream's rewording from the line pairs (each old line
against the line it became, word by word: `vocab . type_pre` -> `pre_type`), and writes the
patch's lines there with the same rewording.

It is strict, as a guess must be: every line the hunk keeps or deletes has exactly one
counterpart, in order and without gaps, each alike and short ones equal; only one such run in
reach; at least one rename (a phrase with a name in it became one with a name in it, and
the old phrase is nowhere in the target's file any more; a qualifier dropped, `vocab.`, or a
number changed vouches for nothing), and one rewording per old phrase; the indentation
shifted by one amount; and no line it writes uses a name of the old code that the target's
file does not have (a rewording not learned). Otherwise it is None, and a human decides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from difflib import SequenceMatcher

from portkit.index import flat
from portkit.series import Hunk

REACH = 60  # how many lines around the nearest match a run is looked for
ALIKE = 0.6  # how alike a line and its counterpart must be (difflib's ratio, flattened)
SHORT = 8  # a flattened line shorter than this must be equal to its counterpart

_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+|->|::|\S")
_IDENT = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class Translated:
    """The target's file with the hunk written in upstream's words: its bytes, the 1-based
    line the hunk's run starts at, and the rewordings used (old phrase, new phrase)."""

    data: bytes
    line: int
    rewordings: tuple[tuple[str, str], ...]
    left_out: int = 0  # context lines at its edges left out (upstream rewrote them)


def _marked(hunk: Hunk) -> list[tuple[str, str]] | None:
    """The hunk's lines after its @@ header, each (mark, text without its end); None where
    one has no newline at the end of the file (that is not a run of lines to translate)."""
    out = []
    for line in hunk.text.splitlines()[1:]:
        if line.startswith("\\"):
            return None
        if line[:1] in (" ", "-", "+"):
            out.append((line[:1], line[1:]))
        elif not line:
            out.append((" ", ""))
    return out


def _alike(old: str, new: str) -> bool:
    a, b = flat(old), flat(new)
    if a == b:
        return True
    if len(a) < SHORT or len(b) < SHORT:
        return False
    return SequenceMatcher(None, a, b, autojunk=False).ratio() >= ALIKE


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _rewordings(pairs: list[tuple[str, str]]) -> dict[tuple[str, ...], str] | None:
    """What upstream reworded in each (old, new) pair: an old run of tokens -> the text it
    became (deletions too, as ""); None where one old run became two different things."""
    out: dict[tuple[str, ...], str] = {}
    for old, new in pairs:
        if flat(old) == flat(new):
            continue
        a = [(m.group(), m.span()) for m in _TOKEN.finditer(old)]
        b = [(m.group(), m.span()) for m in _TOKEN.finditer(new)]
        ops = SequenceMatcher(None, [t for t, _ in a], [t for t, _ in b],
                              autojunk=False).get_opcodes()
        for op, i1, i2, j1, j2 in ops:
            if op == "equal" or i1 == i2:
                continue  # an insertion has no old run to find in the patch's lines
            key = tuple(t for t, _ in a[i1:i2])
            text = new[b[j1][1][0]:b[j2 - 1][1][1]] if j1 < j2 else ""
            if out.setdefault(key, text) != text:
                return None
    return out


def _joined(tokens: tuple[str, ...]) -> str:
    """Tokens written as code: a space only between two words."""
    out = tokens[0]
    for a, b in zip(tokens, tokens[1:], strict=False):
        out += (" " if _IDENT.fullmatch(a) and _IDENT.fullmatch(b) else "") + b
    return out


def _still_there(key: tuple[str, ...], text: str) -> bool:
    """Whether the old run of tokens `key` is in `text` still (whatever the spacing): then
    upstream did not reword it, and the line pair that says so is two different lines."""
    edge = (r"\b" if _IDENT.fullmatch(key[0]) else "", r"\b" if _IDENT.fullmatch(key[-1]) else "")
    return re.search(edge[0] + r"\s*".join(map(re.escape, key)) + edge[1], text) is not None


def _reword(line: str, rewordings: dict[tuple[str, ...], str]) -> tuple[str, set[int]]:
    """`line` with each old run of tokens it has (the longest first, left to right) written
    as upstream rewrote it; and which rewordings it used (their index)."""
    tokens = [(m.group(), m.span()) for m in _TOKEN.finditer(line)]
    keys = sorted(rewordings, key=len, reverse=True)
    out, at, i, used = [], 0, 0, set()
    while i < len(tokens):
        key = next((k for k in keys if tuple(t for t, _ in tokens[i:i + len(k)]) == k), None)
        if key is None:
            i += 1
            continue
        start, end = tokens[i][1][0], tokens[i + len(key) - 1][1][1]
        text = rewordings[key]
        if not text and end < len(line) and line[end:end + 1] == " " and \
                (start == 0 or line[start - 1] == " "):
            end += 1  # a deleted word takes one space with it
        out.append(line[at:start] + text)
        at = end
        used.add(keys.index(key))
        i += len(key)
    out.append(line[at:])
    return "".join(out), used


def _trimmed(marked: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The hunk's lines, then (where it deletes lines) with fewer and fewer of its context
    lines at the edges: upstream may have rewritten the lines around a deletion."""
    lead = next(i for i, (m, _) in enumerate(marked) if m != " ")
    tail = next(i for i, (m, _) in enumerate(reversed(marked)) if m != " ")
    if not any(m == "-" for m, _ in marked):
        return [marked]
    return [marked[a:len(marked) - (total - a)] for total in range(lead + tail + 1)
            for a in range(max(total - tail, 0), min(lead, total) + 1)]


def _deleted_there(marked: list[tuple[str, str]], pairs: list[tuple[str, str]],
                   text: list[str]) -> bool:
    """Whether the lines the hunk deletes say by themselves where it goes: two or more that
    say something, each there as it was (layout aside), and as a run only once in the
    file (`text`, flattened)."""
    gone = [o for (m, _), (o, _) in zip((x for x in marked if x[0] != "+"), pairs,
                                        strict=True) if m == "-"]
    if sum(len(flat(g)) >= SHORT for g in gone) < 2 or any(
            flat(o) != flat(n) for (m, _), (o, n) in zip(
                (x for x in marked if x[0] != "+"), pairs, strict=True) if m == "-"):
        return False
    want = [flat(g) for g in gone]
    return sum(text[i:i + len(want)] == want for i in range(len(text) - len(want) + 1)) == 1


def translate(hunk: Hunk, data: bytes, near: int) -> Translated | None:
    """The hunk written into `data` (a target file) at the one run of lines near line `near`
    (1-based) that is the hunk's kept and deleted lines in upstream's words; None unless
    that run is sure and every word the hunk's lines need is learned. Where the hunk
    deletes lines, its context at the edges may be left out (fewest first), when the lines
    it deletes are there as they were and only there."""
    marked = _marked(hunk)
    if not marked or not any(m != " " for m, _ in marked):
        return None
    text = data.decode("utf-8", errors="surrogateescape")
    lines = text.splitlines(keepends=True)
    bodies = [x.rstrip("\r\n") for x in lines]
    flats: list[str] | None = None
    for part in _trimmed(marked):
        old = [t for mark, t in part if mark != "+"]
        if not any(flat(x) for x in old):
            return None
        lo, hi = max(near - 1 - REACH, 0), min(near - 1 + REACH, len(lines) - len(old) + 1)
        runs = [s for s in range(lo, max(hi, lo))
                if all(_alike(o, bodies[s + k]) for k, o in enumerate(old))]
        if len(runs) > 1:
            return None
        if not runs:
            continue
        pairs = [(o, bodies[runs[0] + k]) for k, o in enumerate(old)]
        rewordings = _rewordings(pairs)
        if rewordings is None:
            return None
        renames = [key for key, new in rewordings.items()
                   if _IDENT.search(new) and any(_IDENT.fullmatch(t) for t in key)]
        if any(_still_there(key, text) for key in renames):
            return None  # a "rename" that is none: the pairs are two different lines
        if flats is None:
            flats = [flat(x) for x in bodies]
        if (not renames or len(part) < len(marked)) and not _deleted_there(part, pairs, flats):
            return None  # nothing says the code is this (context left out: only the deletion)
        done = _written(part, lines, runs[0], pairs, rewordings, text)
        return replace(done, left_out=len(marked) - len(part)) if done is not None else None
    return None


def _written(marked: list[tuple[str, str]], lines: list[str], start: int,
             pairs: list[tuple[str, str]], rewordings: dict[tuple[str, ...], str],
             text: str) -> Translated | None:
    """The hunk's lines `marked` written over the run at `start` of `lines` (the pairs: each
    old line and its counterpart) with `rewordings`; None where that cannot be sure."""
    shifts = {_indent(n) - _indent(o) for o, n in pairs if o.strip() and n.strip()}
    if len(shifts) != 1 or any("\t" in o[:_indent(o) + 1] or "\t" in n[:_indent(n) + 1]
                               for o, n in pairs):
        return None
    shift = shifts.pop()
    keys = sorted(rewordings, key=len, reverse=True)
    here = set(_IDENT.findall(text))
    olds = {w for o, _ in pairs for w in _IDENT.findall(o)}
    out: list[str] = []
    used: set[int] = set()
    ending = "\r\n" if lines[start].endswith("\r\n") else "\n"
    k = start
    for mark, line in marked:
        if mark == " ":
            out.append(lines[k])
            k += 1
        elif mark == "-":
            k += 1
        else:
            written, took = _reword(line, rewordings)
            used |= took
            if written.strip():
                written = " " * shift + written if shift >= 0 else \
                    written[min(-shift, _indent(written)):]
            if any(w in olds and w not in here for w in _IDENT.findall(written)):
                return None  # a name of the old code the target's file does not have
            out.append(written + ending)
    said = tuple((_joined(keys[i]), rewordings[keys[i]]) for i in sorted(used))
    result = "".join(lines[:start] + out + lines[k:])
    return Translated(result.encode("utf-8", errors="surrogateescape"), start + 1, said)
