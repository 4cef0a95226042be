"""The words of C++ lines as the follow engine reads them: identifiers (no keywords, no
string contents), definitions, meaningful lines, tokens, and names that read as renames
of each other (anchors.akin, the one rename-likeness rule).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from portkit.anchors import akin
from portkit.index import IDENT, flat

_IDENT = IDENT  # a name, as the follow engine reads words (one rule, in portkit.index)

_KEYWORDS = frozenset({
    "alignas", "alignof", "auto", "bool", "break", "case", "catch", "char", "class", "const",
    "constexpr", "const_cast", "continue", "decltype", "default", "delete", "do", "double",
    "dynamic_cast", "else", "enum", "explicit", "extern", "false", "float", "for", "friend",
    "goto", "if", "inline", "int", "long", "mutable", "namespace", "new", "noexcept",
    "nullptr", "operator", "private", "protected", "public", "register", "reinterpret_cast",
    "return", "short", "signed", "sizeof", "static", "static_assert", "static_cast", "struct",
    "switch", "template", "this", "throw", "true", "try", "typedef", "typeid", "typename",
    "union", "unsigned", "using", "virtual", "void", "volatile", "while", "override", "final",
    "size_t", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t",
    "uint64_t", "std", "NULL", "define", "include", "ifdef", "ifndef", "endif", "elif",
    "pragma", "defined"
})


_MEMBER_USE = re.compile(r"(?=\b([A-Za-z_]\w*)\s*(?:\.|->)\s*([A-Za-z_]\w*))")


# `Name(`, `Name{`, `Name var(` / `Name var{`: an object of the class Name built
_CONSTRUCTS = re.compile(r"\b([A-Za-z_]\w*)(?:\s+[A-Za-z_]\w*)?\s*[({]")


_MEANINGFUL = 4  # a line shorter than this, flattened, says nothing on its own ("}", "});")


_NEAR = 12  # lines within which an insertion's neighbour below may be, upstream having added some


_STRING = re.compile(r'"(?:\\.|[^"\\])*"')


@lru_cache(maxsize=65536)
def code_of(line: str) -> str:
    """A line without its `//` comment and with every string literal emptied (`""`): the
    code whose names count (cached: the engine reads a patch's lines many times)."""
    return _STRING.sub('""', line.split("//", 1)[0])


@lru_cache(maxsize=65536)
def _line_names(line: str) -> tuple[str, ...]:
    return tuple(name for name in _IDENT.findall(code_of(line))
                 if name not in _KEYWORDS and len(name) > 1)


def identifiers(lines: Iterable[str]) -> list[str]:
    """The names in `lines`, in order of first use, without keywords and string contents."""
    seen: dict[str, None] = {}
    for line in lines:
        for name in _line_names(line):
            seen.setdefault(name)
    return list(seen)


# Where a line defines a name, the name at that place (one group each): a function or
# declaration at file scope (`ret name(`), a field or variable (`type name;`, `= `, `{`, `[`),
# a (member) function declaration, a macro, an enumerator.
_DEFINITIONS = tuple(re.compile(p) for p in (
    r"^[A-Za-z_][\w:<>,\s*&]*\b(\w+)\s*\(",
    r"^\s*(?:[\w:<>,*&]+\s+)+[*&]*(\w+)\s*(?:[;={\[]|$)",
    r"^\s*(?:[\w:<>,*&]+\s+)+[*&]*(\w+)\s*\(",
    r"^\s*#\s*define\s+(\w+)",
    r"^\s*(\w+)\s*(?:=[^=]|,|$)"))


@lru_cache(maxsize=65536)
def _defined_names(line: str) -> frozenset[str]:
    """The names `line` defines, read as `_defines` reads them (patterns compiled once, not
    once per name: many names are asked of few lines)."""
    return frozenset(m.group(1) for p in _DEFINITIONS if (m := p.search(line)) is not None)


def _defines(name: str, lines: Iterable[str]) -> bool:
    """Whether `lines` define `name` (a function or declaration at file scope, a field, a
    variable, an enumerator or a macro) rather than only use it."""
    return any(name in line and name in _defined_names(line) for line in lines)


def _meaningful(lines: Iterable[str]) -> list[str]:
    return [f for f in (flat(line) for line in lines) if len(f) >= _MEANINGFUL]


_TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.]*|\S")


def _tokens(line: str) -> list[str]:
    """A line's C++ tokens, roughly: names, numbers, and every other character apart."""
    return _TOKEN.findall(code_of(line))


def _akin(a: str, b: str) -> bool:
    """Whether `b` reads as a rename of `a`: anchors' rule (`akin`), the one for both."""
    return akin(a, b)


def _unify(ours: list[str], theirs: list[str], wild: frozenset[str], gained: frozenset[str],
           mapping: dict[str, str]) -> dict[str, str] | None:
    """`mapping` extended so that `ours` reads as `theirs` when each wild name stands for one
    name upstream gained that reads as its rename (one for one), or None. Every other token
    must be the same, and a
    line that has a wild name must also have two names of its own that match as they are."""
    if len(ours) != len(theirs):
        return None
    out = dict(mapping)
    literal = has_wild = 0
    for a, b in zip(ours, theirs, strict=True):
        if a in wild:
            has_wild = 1
            if out.get(a, b) != b or b not in gained or not _akin(a, b) \
                    or (a not in out and b in out.values()):
                return None
            out[a] = b
        elif a != b:
            return None
        elif _IDENT.fullmatch(a):
            literal += 1
    return out if not has_wild or literal >= 2 else None


_ON_ITS_OWN = re.compile(r"(?<![\w.>:])([A-Za-z_]\w*)")


@lru_cache(maxsize=65536)
def _bare_names(line: str) -> frozenset[str]:
    """The names a line uses on their own: not after `.`, `->` or `::`."""
    code = code_of(line)
    return frozenset(m.group(1) for m in _ON_ITS_OWN.finditer(code)
                     if not code[:m.start()].rstrip().endswith((".", "->", "::")))
