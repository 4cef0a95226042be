"""Calls adapted as upstream adapted its own.

Where upstream changed a function's parameters, a call the patch adds no longer fits any
overload (drift's semantic check says so). Upstream's own calls of that function, in the
same file before and after, show how upstream adapted them: the same edit of the argument
list at each (an argument dropped, `gf`; one inserted, a `nullptr` for a new parameter;
one replaced). `learn` reads that edit off upstream's calls, `adapt` makes it on the calls
the patch brings, and only where it is sure:

  - at least two of upstream's calls of the patch's arity were edited so, and no other
    edit is anywhere near as common (three in four alike);
  - an argument the edit drops or replaces is, in the patch's call, the very one upstream
    dropped or replaced (the same text);
  - the call so edited fits a declaration the target has.

It is a guess all the same, read off examples: the caller reports it for review.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from difflib import SequenceMatcher

from tree_sitter import Node

from portkit.index import _param_parser

# One edit of an argument list, in the order of its positions: ("delete", i, old, ""),
# ("insert", i, "", new) - before the old list's argument i -, ("replace", i, old, new).
Edit = tuple[tuple[str, int, str, str], ...]
AT_LEAST = 2  # upstream's calls edited alike, at the least
ALIKE = 0.75  # the share of upstream's calls of that arity edited alike
PAIRED = 0.5  # how alike a call before and one after must be to be the same call


@dataclass(frozen=True)
class Call:
    """A call of the function in a file: its arguments' byte spans and their text."""

    spans: tuple[tuple[int, int], ...]
    args: tuple[str, ...]  # each argument's text, its whitespace squashed
    open_at: int  # the byte after the opening parenthesis
    close_at: int  # the byte of the closing parenthesis


def calls_of(src: bytes, word: str) -> list[Call]:
    """The calls of `word` (as `word(...)` or `ns::word(...)`, not on an object) in `src`,
    as tree-sitter reads them without an error."""
    if word.encode() not in src:
        return []
    out: list[Call] = []
    stack: list[Node] = [_param_parser().parse(src).root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.named_children)
        if node.type != "call_expression" or node.has_error:
            continue
        func, args = node.child_by_field_name("function"), node.child_by_field_name("arguments")
        if func is None or args is None or func.type not in ("identifier",
                                                              "qualified_identifier"):
            continue
        name = src[func.start_byte:func.end_byte].decode("utf-8", "replace")
        if name.rsplit("::", 1)[-1] != word:
            continue
        kids = [a for a in args.named_children if a.type != "comment"]
        out.append(Call(tuple((a.start_byte, a.end_byte) for a in kids),
                        tuple(" ".join(src[a.start_byte:a.end_byte].decode(
                            "utf-8", "replace").split()) for a in kids),
                        args.start_byte + 1, args.end_byte - 1))
    return sorted(out, key=lambda c: c.open_at)


def _edit(old: tuple[str, ...], new: tuple[str, ...]) -> Edit:
    ops: list[tuple[str, int, str, str]] = []
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if tag == "replace" and i2 - i1 == j2 - j1:
            ops += [("replace", i1 + k, old[i1 + k], new[j1 + k]) for k in range(i2 - i1)]
            continue
        ops += [("delete", i, old[i], "") for i in range(i1, i2)]
        ops += [("insert", i2, "", new[j]) for j in range(j1, j2)]
    return tuple(ops)


def learn(base: bytes, target: bytes, word: str, arity: int,
          fits: Callable[[int], bool]) -> tuple[Edit, int] | None:
    """The edit upstream made to its own calls of `word` that took `arity` arguments in
    `base`, as `target` has them (calls that fit), and how many it was made to; None when
    upstream's calls do not agree on one."""
    before = [c for c in calls_of(base, word) if len(c.args) == arity]
    after = [c for c in calls_of(target, word) if fits(len(c.args))]
    if len(before) < AT_LEAST or not after:
        return None
    edits: Counter[Edit] = Counter()
    for call in before:
        best, score = None, PAIRED
        for other in after:
            ratio = SequenceMatcher(None, call.args, other.args, autojunk=False).ratio()
            if ratio > score:
                best, score = other, ratio
        if best is not None:
            edits[_edit(call.args, best.args)] += 1
    if not edits:
        return None
    edit, n = edits.most_common(1)[0]
    if not edit or n < AT_LEAST or n < ALIKE * sum(edits.values()):
        return None
    return edit, n


def adapt(src: bytes, word: str, arity: int, edit: Edit,
          fits: Callable[[int], bool]) -> tuple[bytes, int]:
    """`src` with `edit` made on each call of `word` with `arity` arguments that does not fit
    (the patch's: upstream's own all fit), where it applies as upstream made it; and how
    many calls were adapted."""
    grows = sum(1 for op in edit if op[0] == "insert") - sum(1 for op in edit
                                                             if op[0] == "delete")
    if not fits(arity + grows):
        return src, 0
    out, done = src, 0
    for call in reversed(calls_of(src, word)):  # from the end: earlier offsets stay
        if len(call.args) != arity or fits(arity):
            continue
        if any(op[0] in ("delete", "replace") and call.args[op[1]] != op[2] for op in edit):
            continue
        out = _edited(out, call, edit)
        done += 1
    return out, done


def _edited(src: bytes, call: Call, edit: Edit) -> bytes:
    """The call's arguments edited: a dropped argument goes with the separator before it,
    an inserted one comes with its own (`, new`), so the call's line breaks stay."""
    spans = call.spans
    pieces: list[tuple[int, int, bytes]] = []  # (from, to, bytes) replaced, in src
    for op, i, _, new in edit:
        text = new.encode("utf-8", "surrogateescape")
        if op == "replace":
            pieces.append((spans[i][0], spans[i][1], text))
        elif op == "delete":
            if i > 0:
                pieces.append((spans[i - 1][1], spans[i][1], b""))
            elif len(spans) > 1:
                pieces.append((spans[0][0], spans[1][0], b""))
            else:
                pieces.append((spans[0][0], spans[0][1], b""))
        elif i > 0:
            at = spans[i - 1][1]
            pieces.append((at, at, b", " + text))
        elif spans:
            pieces.append((spans[0][0], spans[0][0], text + b", "))
        else:
            pieces.append((call.open_at, call.open_at, text))
    joined: dict[tuple[int, int], bytes] = {}  # inserts at one place, in their order
    for start, end, text in pieces:
        joined[(start, end)] = joined.get((start, end), b"") + text
    out = src
    for (start, end), text in sorted(joined.items(), reverse=True):
        out = out[:start] + text + out[end:]
    return out
