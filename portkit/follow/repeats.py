"""Labels a carried patch would repeat: a `case X:` a switch has already, an enumerator its enum
has already, a key a map's initializer has already.

A fork's patch adds support for something (a model architecture: an enumerator, a `case` in
each switch over the enum) that upstream later added itself. Where the lines around moved,
git's merge takes the patch's lines as well as upstream's, and the file then has `case
LLM_ARCH_GEMMA3:` twice in one switch, or `LLM_ARCH_GEMMA3` twice in one enum: a program that
does not compile. That is evidence in the text itself, not a guess from names. Where the
patch's repeat has no code of its own (a stub case, `{ } break;`, or only lines upstream's
case has too; an enumerator with no value, or upstream's), it is left out: upstream's stays,
as a maintainer keeps it. Where it has code of its own (the fork's implementation against
upstream's), it stays as text carried it, and the note says the two must become one.

A map's initializer (`static const std::map<llm_arch, ...> LLM_ARCH_NAMES = { { LLM_ARCH_X,
"x" }, ... }`, a table of tables) with a key twice compiles, but the map keeps one value for
the key (the first), so one of the two entries is dead or overrides the other. The patch's
entry with nothing upstream's lacks (every line of it is upstream's: the same name, a subset
of upstream's tensors) is left out; one with a value of its own stays, and the note says the
two must become one. A multimap, which keeps both, is not looked at.

Only a whole label the carry added (every line of the case - its label and its statements -
or the enumerator's line is new against the target) and whose twin was in the target before
is looked at; labels inside a preprocessor conditional are not compared (either branch may be
compiled), and nothing is touched in a file tree-sitter cannot read whole.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import cache

from tree_sitter import Node, Parser

from portkit.index import _language


@cache
def _parser() -> Parser:
    return Parser(_language())


def _new_lines(ours: list[bytes], result: list[bytes]) -> set[int]:
    """Indexes (0-based) of `result`'s lines that are not `ours`' (what the carry added)."""
    new: set[int] = set()
    matcher = SequenceMatcher(None, ours, result, autojunk=False)
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if tag in ("insert", "replace"):
            new.update(range(j1, j2))
    return new


def _squash(text: bytes) -> bytes:
    return b" ".join(text.split())


def _whole_lines(src: bytes, node: Node) -> bool:
    """Whether `node` stands on lines of its own (only blanks, a comma or a comment beside)."""
    start = src.rfind(b"\n", 0, node.start_byte) + 1
    end = src.find(b"\n", node.end_byte)
    end = len(src) if end < 0 else end
    before, after = src[start:node.start_byte], src[node.end_byte:end].strip()
    return not before.strip() and (not after or after == b"," or after.startswith(
        (b"//", b",//", b", //")))


def _groups(root: Node, src: bytes) -> dict[tuple[str, bytes, int], list[Node]]:
    """Each switch's cases and each enum's enumerators, by the container's identity: its
    kind, what it is (the enclosing function and the switch's condition; the enum's name)
    and which of the containers so named it is."""
    found: dict[tuple[str, bytes, int], list[Node]] = {}
    seen: dict[tuple[str, bytes], int] = defaultdict(int)
    stack: list[tuple[Node, bytes]] = [(root, b"")]
    while stack:
        node, where = stack.pop()
        if node.type == "function_definition":
            decl = node.child_by_field_name("declarator")
            where = _squash(src[decl.start_byte:decl.end_byte]) if decl is not None else b""
        members: list[Node] | None = None
        if node.type == "switch_statement":
            body, cond = node.child_by_field_name("body"), node.child_by_field_name("condition")
            if body is not None and cond is not None:
                kind, what = "case", where + b" " + _squash(src[cond.start_byte:cond.end_byte])
                members = [c for c in body.named_children if c.type == "case_statement"]
        elif node.type == "init_declarator" and _a_map(node, src):
            name, value = node.child_by_field_name("declarator"), node.child_by_field_name("value")
            if name is not None and value is not None and value.type == "initializer_list":
                kind, what = "entry", src[name.start_byte:name.end_byte]
                members = [c for c in value.named_children if c.type == "initializer_list"]
        elif node.type == "enumerator_list":
            name = node.parent.child_by_field_name("name") if node.parent is not None else None
            kind, what = "enumerator", b"" if name is None else src[name.start_byte:name.end_byte]
            members = [c for c in node.named_children if c.type == "enumerator"]
        if members is not None:
            found[(kind, what, seen[(kind, what)])] = members
            seen[(kind, what)] += 1
        stack.extend((child, where) for child in reversed(node.named_children))
    return found


# the outermost type a map (std::map<...>, not a multimap nor a list of maps): one value a key
_MAP = re.compile(rb"\s*(?:::\s*)?(?:\w+\s*::\s*)*(?:unordered_)?map\s*<")


def _a_map(node: Node, src: bytes) -> bool:
    """Whether a declarator declares a map (std::map, std::unordered_map), by the outermost
    name of its type."""
    decl = node.parent
    kind = decl.child_by_field_name("type") if decl is not None else None
    return kind is not None and bool(_MAP.match(src[kind.start_byte:kind.end_byte]))


_TRIVIAL = {b"", b"{", b"}", b"break;", b"} break;", b"{ } break;", b","}


def _label(kind: str, node: Node) -> Node | None:
    """What a member is known by: a case's value, an enumerator's name, a map entry's key."""
    if kind == "entry":
        return next((c for c in node.named_children if c.type != "comment"), None)
    return node.child_by_field_name("value" if kind == "case" else "name")


def _after_label(kind: str, node: Node, src: bytes) -> bytes:
    """A case's statements (what follows `case X:`), an enumerator's value (what follows
    its name), a map entry's value (what follows `{ key,`)."""
    field = _label(kind, node)
    rest = src[field.end_byte if field is not None else node.start_byte:node.end_byte]
    return rest if kind == "enumerator" else rest.lstrip()[1:]


def _own_code(kind: str, mine: bytes, upstream: bytes) -> bool:
    """Whether the patch's repeat says something upstream's twin does not: a case with a
    statement upstream's case lacks, an enumerator with a value of its own."""
    if kind == "enumerator":
        return bool(mine.strip()) and _squash(mine) != _squash(upstream)
    theirs = {_squash(line) for line in upstream.splitlines()}
    return any(_squash(line) not in _TRIVIAL and _squash(line) not in theirs
               for line in mine.splitlines())


def _key(kind: str, node: Node, src: bytes) -> bytes | None:
    field = _label(kind, node)
    return None if field is None else _squash(src[field.start_byte:field.end_byte])


_CASE = re.compile(rb"^\s*case\s+([^:]+?)\s*:")
_ENUMERATOR = re.compile(rb"^\s*([A-Za-z_]\w*)\s*(?:=[^,]*)?,?\s*(?://.*)?$")
_ENTRY = re.compile(rb"^\s*\{\s*([A-Za-z_][\w:]*)\s*,")  # `{ LLM_ARCH_X, "x" },`


def _candidates(ours: bytes, added: Iterable[str], once: bool = False) -> bool:
    """Whether a line the patch adds is a case or an enumerator the target has already (a
    cheap test: tree-sitter reads the file only then). With `once`, a label counts only where
    the target has it once in the whole file (cheaper still: a key of a table of tables, in
    every inner table, an argument on a line of its own, a case of two switches over one
    enum are not read for)."""
    def there(pattern: bytes) -> bool:
        if not once:
            return re.search(pattern, ours) is not None
        found = re.finditer(pattern, ours)
        return next(found, None) is not None and next(found, None) is None

    for text in added:
        line = text.rstrip("\r\n").encode("utf-8", "surrogateescape")
        case = _CASE.match(line)
        if case and there(rb"\bcase\s+" + re.escape(case.group(1)) + rb"\s*:"):
            return True
        entry = _ENTRY.match(line)
        if entry and there(rb"\{\s*" + re.escape(entry.group(1)) + rb"\s*,"):
            return True
        enumerator = _ENUMERATOR.match(line)
        if enumerator and there(rb"(?m)^\s*" + re.escape(enumerator.group(1))
                                + rb"\s*[=,}\n]"):
            return True
    return False


_IN = {"case": "in that switch", "enumerator": "in that enum", "entry": "a key of that map"}
_TWICE = {"case": "twice, it does not compile", "enumerator": "twice, it does not compile",
          "entry": "the map keeps only one of them"}
_LANDING = {"case": "the switch would have it twice and not compile",
            "enumerator": "the enum would have it twice and not compile",
            "entry": "the map would have the key twice and keep only one value"}
_ONCE = {"case": "it would not compile", "enumerator": "it would not compile",
         "entry": "the map keeps one of them"}


@dataclass(frozen=True)
class Repeat:
    """A label the carry wrote a second time: a case of a switch, an enumerator of an enum, a
    key of a map, which the target had once already."""

    kind: str  # "case", "enumerator" or "entry"
    label: str  # e.g. "case LLM_ARCH_GEMMA3", "LLM_ARCH_GEMMA3"
    twin: int  # the target's own one: its 0-based row in the result
    rows: frozenset[int]  # the rows (0-based, in the result) of the carry's repeat
    first: bytes  # the carry's repeat's first line, squashed
    text: frozenset[bytes]  # its lines, squashed
    own: bool  # whether the carry's says something upstream's does not

    def what(self) -> str:
        """E.g. "case X is in that switch already"."""
        return f"{self.label} is {_IN[self.kind]} already"

    def consequence(self) -> str:
        """What landing the carry's one as well does to the file."""
        return _TWICE[self.kind] if self.own else _ONCE[self.kind]

    def landing(self) -> str:
        """What landing the carry's one beside the target's makes of the file, a sentence."""
        return _LANDING[self.kind]


def squashed(line: str) -> bytes:
    """A patch's line as a Repeat's lines are kept (bytes, blanks squashed)."""
    return _squash(line.encode("utf-8", "surrogateescape"))


def repeats(ours: bytes, result: bytes, added: Iterable[str], once: bool = False
            ) -> list[Repeat]:
    """The labels that `result` (the target's file `ours` with a patch carried; `added`: the
    lines the patch adds to it) has twice where `ours` had them once, the carry's one being
    a whole label of lines it added. With `once`, only labels `ours` has once in the whole
    file are looked for (see _candidates)."""
    if not _candidates(ours, added, once):
        return []
    tree, before = _parser().parse(result), _parser().parse(ours)
    if tree.root_node.has_error or before.root_node.has_error:
        return []
    had = _groups(before.root_node, ours)
    lines = result.splitlines(keepends=True)
    new: set[int] | None = None  # the lines the carry added, read only when texts tie
    found: list[Repeat] = []
    for ident, members in _groups(tree.root_node, result).items():
        kind = ident[0]
        by_key: dict[bytes, list[Node]] = defaultdict(list)
        for member in members:
            key = _key(kind, member, result)
            if key is not None:
                by_key[key].append(member)
        old = Counter(_squash(ours[m.start_byte:m.end_byte]) for m in had.get(ident, ())
                      if _key(kind, m, ours) is not None)
        for key, twins in by_key.items():
            theirs = [m for m in had.get(ident, ()) if _key(kind, m, ours) == key]
            if len(twins) < 2 or len(theirs) != 1:
                continue  # no repeat, or not one of the target's to keep
            texts = [_squash(result[m.start_byte:m.end_byte]) for m in twins]
            mine = [m for m, text in zip(twins, texts, strict=True) if not old[text]]
            if not mine and len(set(texts)) == 1:  # the same text twice: the line diff says
                if new is None:
                    new = _new_lines(ours.splitlines(keepends=True), lines)
                mine = [m for m in twins if set(range(m.start_point[0],
                                                      m.end_point[0] + 1)) <= new]
            if len(mine) != len(twins) - 1 or not all(_whole_lines(result, m) for m in mine):
                continue
            [target] = [m for m in twins if m not in mine]
            label = f"case {key.decode(errors='replace')}" if kind == "case" \
                else key.decode(errors="replace")
            where = _label(kind, target) or target
            for m in mine:
                found.append(Repeat(
                    kind, label, where.start_point[0],
                    frozenset(range(m.start_point[0], m.end_point[0] + 1)),
                    _squash(lines[m.start_point[0]]),
                    frozenset(_squash(lines[k]) for k in range(m.start_point[0],
                                                               m.end_point[0] + 1)),
                    _own_code(kind, _after_label(kind, m, result),
                              _after_label(kind, target, result))))
    return found


def repeated(ours: bytes, result: bytes, added: Iterable[str]) -> tuple[bytes, list[str]]:
    """`result` (the target's file `ours` with a patch carried; `added`: the lines the patch
    adds to it) without the cases and enumerators the carry added that repeat one the target
    has in the same switch or enum, and a note for each, e.g. "case LLM_ARCH_GEMMA3 is in that
    switch already (line 961)..."."""
    found = repeats(ours, result, added)
    if not found:
        return result, []
    drop = {row for r in found if not r.own for row in r.rows}
    said: dict[tuple[str, int], Repeat] = {}
    for r in found:  # one note a label, "own" if any of the carry's has code of its own
        if (r.label, r.twin) not in said or r.own:
            said[(r.label, r.twin)] = r
    notes = [f"{r.what()} (line {r.twin + 1 - sum(1 for d in drop if d < r.twin)}): " + (
             f"the patch's, in its own form, carried beside it: {r.consequence()} (the two "
             "must become one)" if r.own else
             f"the patch's, a second one, left out ({r.consequence()})")
             for r in said.values()]
    lines = result.splitlines(keepends=True)
    return b"".join(line for k, line in enumerate(lines) if k not in drop), notes
