"""Stage 3, anchors: declarative specs of where a change belongs, resolved against an index.

A spec names its target by qualified name; resolution tries, in order:

  exact       the qualified name as written;
  alias       every historical name of each qualifier (portkit/data/aliases.toml);
  structure   what the target calls or contains, its parameter and return types, its members;
  similarity  token 4-gram containment of a characteristic snippet (`similar_to`).

Structural predicates also guard the first two strategies: a symbol that has the right name
but no longer does what the spec says is not taken. More than one candidate at any stage is
an error listing them; nothing found is an error naming the nearest candidates, unless the
anchor is optional, in which case it is reported absent with what that absence means.

An anchor can carry named points inside its target: `before`/`after` the innermost statement
(or class member) whose text contains a pattern, optionally `within` an enclosing statement,
or at `body-start` / `body-end`.

Besides resolution, which must settle on one symbol, the same strategies rank candidates
without choosing: `Resolver.candidates` for a spec, `find` for a name, and `locate` for where
a symbol of one tree went in another (drift and rebase compare a base and a target tree).
"""

from __future__ import annotations

import difflib
import fnmatch
import itertools
import re
import tomllib
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from tree_sitter import Node

from portkit.errors import AnchorError, SpecError
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
    flat,
    normalise,
    squash,
)

EXACT, ALIAS, STRUCTURE, SIMILARITY = "exact", "alias", "structure", "similarity"
CONFIDENCE = {EXACT: 1.0, ALIAS: 0.95, STRUCTURE: 0.8}
SIMILARITY_THRESHOLD = 0.6
SIMILARITY_MARGIN = 0.1
UNFIT = 0.5  # a candidate named as the spec says but failing its predicates: half as sure

_KINDS = {"class": {CLASS}, "function": {FUNCTION}, "declaration": {DECLARATION},
          "field": {FIELD}, "member": {DECLARATION, FUNCTION, FIELD}}
_ANCHOR_KEYS = {"id", "what", "name", "files", "optional", "absent", "doc", "params",
                "params_first", "returns", "calls", "contains", "lacks", "has", "static",
                "similar_to", "points"}
_POINT_KEYS = {"before", "after", "after_param", "within", "at", "doc"}
_STATEMENT_PARENTS = {"compound_statement", "field_declaration_list"}
_PASS_THROUGH = {"preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif", "access_specifier"}


# -- aliases ----------------------------------------------------------------------------


@cache
def _alias_groups() -> dict[str, tuple[str, ...]]:
    data = tomllib.loads(resources.files("portkit.data").joinpath("aliases.toml").read_text())
    groups: dict[str, tuple[str, ...]] = {}
    for current, old in data["groups"].items():
        names = (current, *old)
        for name in names:
            groups[name] = names
    return groups


def aliases_of(name: str) -> tuple[str, ...]:
    """Every name of `name`'s rename group, today's first; just `name` if it has none."""
    return _alias_groups().get(name, (name,))


@cache
def _todays() -> dict[str, str]:
    return {name: group[0] for name, group in _alias_groups().items()}


def todays_names(tokens: Sequence[str]) -> tuple[str, ...]:
    """Each token as `aliases_of(token)[0]` reads it (today's name of its rename group), in
    one pass."""
    return tuple(map(_todays().get, tokens, tokens))


@cache
def canonical(text: str) -> str:
    """`text` with every identifier replaced by today's name of its rename group."""
    return re.sub(r"[A-Za-z_]\w*", lambda m: aliases_of(m.group(0))[0], text)


def qualname_variants(qualname: str) -> list[str]:
    """All spellings of a qualified name through the alias groups of each component (a
    destructor's `~name` through those of its name)."""
    parts = [tuple(f"~{a}" for a in aliases_of(p[1:])) if p.startswith("~") else aliases_of(p)
             for p in qualname.split("::")]
    return ["::".join(combo) for combo in itertools.product(*parts)]


@cache
def _longest_word(text: str) -> str:
    """The longest identifier-like word of `text`: a cheap filter before a layout-blind match."""
    return max(re.findall(r"\w+", text), key=len, default="")


# -- specs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PointSpec:
    name: str
    before: str | None = None
    after: str | None = None
    after_param: str | None = None  # a line after the parameter of that name
    within: str | None = None
    at: str | None = None  # body-start | body-end
    doc: str = ""


@dataclass(frozen=True)
class AnchorSpec:
    id: str
    what: str
    name: str
    files: tuple[str, ...] = ()
    optional: bool = False
    absent: str = ""
    doc: str = ""
    params: tuple[str, ...] | None = None
    params_first: str | None = None
    returns: str | None = None
    calls: tuple[str, ...] = ()
    contains: tuple[str, ...] = ()
    lacks: tuple[str, ...] = ()
    has: tuple[str, ...] = ()
    static: bool | None = None
    similar_to: str = ""
    points: tuple[PointSpec, ...] = ()

    @property
    def structural(self) -> bool:
        return bool(self.params is not None or self.params_first or self.returns or self.calls
                    or self.contains or self.has)

    @cached_property
    def needed_words(self) -> tuple[tuple[tuple[bytes, ...], bool], ...]:
        """Per `contains` and `calls` predicate: words of which one must occur in a fitting
        symbol, and whether in its body only (calls) or in its body or text (contains)."""
        needs: list[tuple[tuple[bytes, ...], bool]] = [
            ((_longest_word(c).encode(),), False) for c in self.contains if _longest_word(c)]
        needs += [(tuple(n.encode() for n in aliases_of(canonical(c))), True)
                  for c in self.calls]
        return tuple(needs)


@dataclass(frozen=True)
class AnchorSet:
    feature: str
    files: tuple[str, ...]
    anchors: tuple[AnchorSpec, ...]
    source: Path

    def get(self, anchor_id: str) -> AnchorSpec:
        for spec in self.anchors:
            if spec.id == anchor_id:
                return spec
        raise SpecError(f"{self.source.name}: no anchor named {anchor_id}")

    def patterns(self) -> list[str]:
        return sorted({*self.files, *(f for a in self.anchors for f in a.files)})


def _point(name: str, raw: dict[str, Any], where: str) -> PointSpec:
    unknown = set(raw) - _POINT_KEYS
    if unknown:
        raise SpecError(f"{where}: point {name}: unknown key {sorted(unknown)[0]}")
    spec = PointSpec(name=name, **raw)
    if sum(x is not None for x in (spec.before, spec.after, spec.after_param, spec.at)) != 1:
        raise SpecError(
            f"{where}: point {name}: give exactly one of before, after, after_param, at")
    if spec.at not in (None, "body-start", "body-end"):
        raise SpecError(f"{where}: point {name}: at must be body-start or body-end")
    return spec


def load_anchor_set(path: Path) -> AnchorSet:
    """Read and check an anchors.toml file."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(f"cannot read anchor specs {path}: {exc}") from exc
    feature = data.get("feature", {})
    anchors: list[AnchorSpec] = []
    for raw in data.get("anchor", []):
        where = f"{path.name}: anchor {raw.get('id', '?')}"
        unknown = set(raw) - _ANCHOR_KEYS
        if unknown:
            raise SpecError(f"{where}: unknown key {sorted(unknown)[0]}")
        if raw.get("what") not in _KINDS or not raw.get("id") or not raw.get("name"):
            raise SpecError(f"{where}: needs id, name and what (one of {sorted(_KINDS)})")
        points = tuple(_point(n, p, where) for n, p in raw.pop("points", {}).items())
        tuples = {k: tuple(v) for k, v in raw.items() if isinstance(v, list)}
        anchors.append(AnchorSpec(**{**raw, **tuples, "points": points}))
    ids = [a.id for a in anchors]
    if len(ids) != len(set(ids)):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise SpecError(f"{path.name}: anchor {dup} is defined twice")
    return AnchorSet(feature.get("name", path.parent.name), tuple(feature.get("files", ())),
                     tuple(anchors), path)


# -- resolution -------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    name: str
    offset: int  # byte offset where an insertion goes (start of a line)
    line: int  # 1-based line of that offset
    statement: str  # the first line of the source at the offset
    start: int = -1  # byte range of the statement the point is next to, when it has one
    end: int = -1


@dataclass
class Candidate:
    """A symbol that may be what was asked for: how it was found, how sure that is, and why."""

    symbol: Symbol
    confidence: float  # 0..1
    why: str = ""
    strategy: str = ""  # exact | alias | structure | similarity; "" for a resolution's runner-up

    def as_json(self) -> dict[str, Any]:
        found = {"strategy": self.strategy} if self.strategy else {}
        return {"name": self.symbol.signature(), "where": self.symbol.where, **found,
                "score": round(self.confidence, 3), "why": self.why}


@dataclass
class Resolution:
    spec: AnchorSpec
    status: str  # found | absent | error
    strategy: str = ""
    confidence: float = 0.0
    symbol: Symbol | None = None
    points: dict[str, Point] = field(default_factory=dict)
    runners_up: list[Candidate] = field(default_factory=list)
    note: str = ""

    @property
    def found(self) -> bool:
        return self.status == "found"

    def point(self, name: str) -> Point:
        if name not in self.points:
            raise SpecError(f"anchor {self.spec.id} has no point {name}")
        return self.points[name]

    def as_json(self) -> dict[str, Any]:
        sym = self.symbol
        return {
            "id": self.spec.id, "status": self.status, "strategy": self.strategy,
            "confidence": round(self.confidence, 3),
            "name": sym.signature() if sym else None,
            "file": sym.file if sym else None,
            "lines": [sym.start_line, sym.end_line] if sym else None,
            "points": {n: {"line": p.line, "statement": p.statement}
                       for n, p in self.points.items()},
            "runners_up": [c.as_json() for c in self.runners_up],
            "note": self.note,
        }


def _shingles(tokens: Sequence[str], n: int = 4) -> set[tuple[str, ...]]:
    """Every run of `n` tokens (all of them, as one run, when there are fewer)."""
    if len(tokens) < n:
        return {tuple(tokens)}
    return set(zip(*(tokens[i:] for i in range(n)), strict=False))  # the shortest ends it


class Resolver:
    """Resolves the anchors of one AnchorSet against one Index."""

    def __init__(self, index: Index) -> None:
        self.index = index
        self._trees: dict[tuple[str, int], Node] = {}
        self._file_sets: dict[tuple[str, ...], list[str]] = {}

    # predicates -------------------------------------------------------------------------


    def failures(self, spec: AnchorSpec, sym: Symbol) -> list[str]:
        """The structural predicates of `spec` that `sym` does not satisfy."""
        return list(self._failures(spec, sym))

    def fits(self, spec: AnchorSpec, sym: Symbol) -> bool:
        """Whether `sym` satisfies every structural predicate (stops at the first failure)."""
        return self._may_fit(spec, sym) and next(self._failures(spec, sym), None) is None

    def _may_fit(self, spec: AnchorSpec, sym: Symbol) -> bool:
        """A necessary condition of `fits`, on the file's bytes: the words that `contains` and
        `calls` need all occur in the symbol. Spares scans of a whole pool decoding bodies."""
        src = self.index.source(sym.file)
        body = (sym.body_start, sym.body_end) if sym.body_start >= 0 else None
        text = body or (sym.start_byte, sym.end_byte)
        for words, body_only in spec.needed_words:
            span = body if body_only else text
            if span is None or not any(src.find(w, *span) >= 0 for w in words):
                return False
        return True

    def _failures(self, spec: AnchorSpec, sym: Symbol) -> Iterator[str]:
        if spec.static is not None and sym.is_static != spec.static:
            yield "static" if spec.static else "not static"
        if spec.params is not None and [canonical(p) for p in sym.params] != [
            canonical(squash(p)) for p in spec.params
        ]:
            yield f"params {list(spec.params)}"
        if spec.params_first and (
            not sym.params or canonical(sym.params[0]) != canonical(squash(spec.params_first))
        ):
            yield f"first parameter {spec.params_first!r}"
        if spec.returns and canonical(sym.returns) != canonical(squash(spec.returns)):
            yield f"returns {spec.returns!r}"
        for c in spec.calls:
            if not self.index.calls_any(sym, aliases_of(canonical(c))):
                yield f"calls {c}"
        if spec.contains or spec.lacks:
            raw = self.index.body(sym) or self.index.text(sym)
            body = None
            for c in spec.contains:
                if _longest_word(c) not in raw:
                    yield f"contains {c!r}"
                    continue
                body = body if body is not None else flat(raw)
                if flat(c) not in body:
                    yield f"contains {c!r}"
            for c in spec.lacks:
                if _longest_word(c) in raw:
                    body = body if body is not None else flat(raw)
                    if flat(c) in body:
                        yield f"lacks {c!r}"
        if spec.has:
            members = {canonical(m.name) for m in self.index.members(sym)}
            for m in spec.has:
                if canonical(m) not in members:
                    yield f"has member {m}"

    def _files(self, patterns: tuple[str, ...]) -> list[str]:
        if patterns not in self._file_sets:
            self._file_sets[patterns] = [f for f in self.index.files if not patterns
                                         or any(fnmatch.fnmatchcase(f, p) for p in patterns)]
        return self._file_sets[patterns]

    def _candidates(self, spec: AnchorSpec) -> list[Symbol]:
        kinds = _KINDS[spec.what]
        return [s for f in self._files(spec.files) for s in self.index.files[f].symbols
                if s.kind in kinds]

    def similarity(self, spec: AnchorSpec, sym: Symbol) -> float:
        want = _shingles(normalise(spec.similar_to))
        have = _shingles(normalise(self.index.text(sym)))
        return len(want & have) / len(want) if want else 0.0

    # the strategies, shared by `resolve` and `candidates` ---------------------------------

    @staticmethod
    def _named(spec: AnchorSpec, pool: list[Symbol], strategy: str) -> list[Symbol]:
        """The symbols of `pool` named as the spec says (EXACT) or by an alias (ALIAS)."""
        names = [spec.name] if strategy == EXACT else [
            n for n in qualname_variants(spec.name) if n != spec.name]
        return [s for s in pool if s.qualname in names]

    def _structural(self, spec: AnchorSpec, pool: list[Symbol]) -> list[Symbol]:
        return [s for s in pool if self.fits(spec, s)]

    def _similar(self, spec: AnchorSpec, pool: list[Symbol]) -> list[tuple[float, Symbol]]:
        """Every symbol of `pool` with its similarity to `similar_to`, most similar first."""
        return sorted(((self.similarity(spec, s), s) for s in pool), key=lambda p: -p[0])

    def candidates(self, spec: AnchorSpec, limit: int = 5) -> list[Candidate]:
        """The symbols that may be the target of `spec`, best first: what `resolve` chooses
        from, ranked instead of settled, so never an error.

        A symbol named as the spec says (or by an alias) that fails its predicates stays, at
        half its strategy's confidence, saying what it lacks; structure counts when the spec
        has structural predicates, similarity when it has `similar_to`.
        """
        pool = self._candidates(spec)
        best: dict[int, Candidate] = {}

        def keep(found: Candidate) -> None:
            held = best.get(id(found.symbol))
            if held is None or held.confidence < found.confidence:
                best[id(found.symbol)] = found

        for strategy in (EXACT, ALIAS):
            for sym in self._named(spec, pool, strategy):
                failures = self.failures(spec, sym)
                if failures:
                    keep(Candidate(sym, CONFIDENCE[strategy] * UNFIT,
                                   "lacks " + ", ".join(failures), strategy))
                else:
                    keep(Candidate(sym, CONFIDENCE[strategy], f"named {sym.qualname}", strategy))
        if spec.structural:
            for sym in self._structural(spec, pool):
                keep(Candidate(sym, CONFIDENCE[STRUCTURE], "does what the spec says", STRUCTURE))
        if spec.similar_to:
            for score, sym in self._similar(spec, pool):
                if score > 0:
                    keep(Candidate(sym, score, "resembles the spec's snippet", SIMILARITY))
        return sorted(best.values(), key=lambda c: -c.confidence)[:limit]

    # resolution -------------------------------------------------------------------------

    def resolve(self, spec: AnchorSpec) -> Resolution:
        pool = self._candidates(spec)
        notes: list[str] = []
        for strategy in (EXACT, ALIAS):
            named = self._named(spec, pool, strategy)
            fitting = [s for s in named if self.fits(spec, s)]
            if not fitting:
                notes += [f"{s.qualname} at {s.where} lacks " + ", ".join(self.failures(spec, s))
                          for s in named]
            if len(fitting) > 1:
                self._ambiguous(spec, strategy, fitting)
            if fitting:
                others = [Candidate(s, 0.0, "; ".join(self.failures(spec, s)))
                          for s in named if s not in fitting]
                return self._found(spec, strategy, CONFIDENCE[strategy], fitting[0], others,
                                   "; ".join(notes))
        if spec.structural:
            fitting = self._structural(spec, pool)
            if len(fitting) > 1:
                self._ambiguous(spec, STRUCTURE, fitting)
            if fitting:
                note = f"no symbol named {spec.name}; found by what it does"
                return self._found(spec, STRUCTURE, CONFIDENCE[STRUCTURE], fitting[0], [],
                                   "; ".join([note, *notes]))
        ranked: list[Candidate] = []
        if spec.similar_to:
            ranked = [Candidate(s, score) for score, s in self._similar(spec, pool)[:4]]
            if ranked and ranked[0].confidence >= SIMILARITY_THRESHOLD:
                best, rest = ranked[0], ranked[1:]
                if rest and rest[0].confidence > best.confidence - SIMILARITY_MARGIN:
                    self._ambiguous(spec, SIMILARITY, [
                        c.symbol for c in ranked
                        if c.confidence > best.confidence - SIMILARITY_MARGIN])
                return self._found(spec, SIMILARITY, best.confidence, best.symbol, rest,
                                   f"no symbol named {spec.name}; body resembles the spec's")
        if spec.optional:
            return Resolution(spec, "absent", note=spec.absent or "not in this tree")
        raise AnchorError(f"anchor {spec.id}: {self._miss(spec, pool, ranked, notes)}")

    def _found(self, spec: AnchorSpec, strategy: str, confidence: float, sym: Symbol,
               others: list[Candidate], note: str) -> Resolution:
        res = Resolution(spec, "found", strategy, confidence, sym, runners_up=others, note=note)
        res.points = {p.name: self.resolve_point(spec, sym, p) for p in spec.points}
        return res

    def _ambiguous(self, spec: AnchorSpec, strategy: str, syms: list[Symbol]) -> None:
        listed = ", ".join(f"{s.signature()} at {s.where}" for s in syms[:5])
        raise AnchorError(f"anchor {spec.id}: ambiguous by {strategy}: {len(syms)} candidates: "
                          f"{listed}")

    def _miss(self, spec: AnchorSpec, pool: list[Symbol], ranked: list[Candidate],
              notes: list[str]) -> str:
        if notes:
            return f"no {spec.what} {spec.name} that fits the spec ({notes[0]})"
        if ranked:
            near = [f"{c.symbol.qualname} ({c.confidence:.2f}, {c.symbol.where})"
                    for c in ranked[:3]]
        else:
            names = sorted({s.qualname for s in pool})
            close = difflib.get_close_matches(spec.name, names, n=3, cutoff=0.5)
            near = [f"{n} ({next(s.where for s in pool if s.qualname == n)})" for n in close]
        return (f"no {spec.what} named {spec.name} or an alias, and nothing else fits; "
                f"nearest: {', '.join(near) if near else 'none'}")

    # points -----------------------------------------------------------------------------

    def _syntax(self, sym: Symbol) -> Node:
        key = (sym.file, sym.start_byte)
        if key not in self._trees:
            self._trees[key] = self.index.syntax(sym)
        return self._trees[key]

    def statements(self, sym: Symbol, word: bytes = b"") -> list[Node]:
        """Statements of a function body, members of a class body, at any depth, in order.

        With `word`, only those whose text contains it: the ancestors of its occurrences,
        which spares walking the whole body.
        """
        if sym.body_start < 0:
            return []
        root = self._syntax(sym)
        if not word:
            body = root.descendant_for_byte_range(sym.body_start, sym.body_end)
            found: list[Node] = []
            stack = [body] if body is not None else []
            while stack:
                node = stack.pop()
                for child in node.named_children:
                    if node.type in _STATEMENT_PARENTS and child.type not in _PASS_THROUGH:
                        found.append(child)
                    if child.type != "comment":
                        stack.append(child)
            return sorted(found, key=lambda n: n.start_byte)
        src = self.index.source(sym.file)
        seen: dict[int, Node] = {}
        at = src.find(word, sym.body_start, sym.body_end)
        while at >= 0:
            cur = root.descendant_for_byte_range(at, at + len(word))
            while cur is not None and cur.id not in seen:
                parent = cur.parent
                if parent is None or parent.start_byte < sym.body_start:
                    break
                if parent.type in _STATEMENT_PARENTS and cur.type not in _PASS_THROUGH:
                    seen[cur.id] = cur
                cur = parent
            at = src.find(word, at + 1, sym.body_end)
        return sorted(seen.values(), key=lambda n: n.start_byte)

    def resolve_point(self, spec: AnchorSpec, sym: Symbol, point: PointSpec) -> Point:
        src = self.index.source(sym.file)
        if point.at is not None:
            if sym.body_start < 0:
                raise AnchorError(f"anchor {spec.id}.{point.name}: {sym.qualname} has no body")
            if point.at == "body-start":
                return self._point(point, sym, src, src.index(b"\n", sym.body_start) + 1)
            return self._point(point, sym, src, src.rindex(b"\n", 0, sym.body_end - 1) + 1)
        if point.after_param is not None:
            return self._param_point(spec, sym, point, src)
        target = point.before or point.after or ""
        if sym.kind == CLASS and re.fullmatch(r"\w+", target):
            named = [m for m in self.index.members(sym) if m.name == target]
            if named:
                member = named[-1]
                return self._statement_point(point, sym, src, member.start_byte, member.end_byte)
        pattern = flat(target)
        word = _longest_word(target).encode()
        matching = [n for n in self.statements(sym, word)
                    if pattern in flat(src[n.start_byte : n.end_byte].decode("utf-8", "replace"))]
        inner = [n for n in matching if not any(
            m is not n and n.start_byte <= m.start_byte and m.end_byte <= n.end_byte
            for m in matching)]
        if point.within:
            inner = [n for n in inner if self._inside(n, point.within, src, sym)]
        if len(inner) != 1:
            what = "no statement" if not inner else f"{len(inner)} statements"
            lines = ", ".join(str(n.start_point[0] + 1) for n in inner[:5])
            raise AnchorError(
                f"anchor {spec.id}.{point.name}: {what} in {sym.qualname} ({sym.where}) contain "
                f"{point.before or point.after!r}" + (f" within {point.within!r}" if point.within
                                                      else "") + (f" (lines {lines})" if lines
                                                                  else ""))
        return self._statement_point(point, sym, src, inner[0].start_byte, inner[0].end_byte)

    def _statement_point(self, point: PointSpec, sym: Symbol, src: bytes, start: int,
                         end: int) -> Point:
        if point.before is not None:
            offset = src.rindex(b"\n", 0, start) + 1
            while offset > 1:  # a comment right above a statement belongs to it
                prev = src.rindex(b"\n", 0, offset - 1) + 1 if b"\n" in src[: offset - 1] else 0
                if not src[prev:offset].lstrip().startswith(b"//"):
                    break
                offset = prev
        else:
            eol = src.find(b"\n", end)
            offset = len(src) if eol < 0 else eol + 1
        return self._point(point, sym, src, offset, start, end)

    def _param_point(self, spec: AnchorSpec, sym: Symbol, point: PointSpec, src: bytes) -> Point:
        node = self._syntax(sym).descendant_for_byte_range(sym.start_byte, sym.end_byte)
        stack = [node] if node is not None else []
        while stack:
            cur = stack.pop()
            if cur.type == "parameter_list":
                for param in cur.named_children:
                    tail = src[param.start_byte : param.end_byte].decode("utf-8", "replace")
                    if re.search(rf"\b{re.escape(point.after_param or '')}\s*$", tail):
                        end = src.find(b"\n", param.end_byte)
                        return self._point(point, sym, src, end + 1, param.start_byte,
                                           param.end_byte)
                break
            stack.extend(reversed(cur.named_children))
        raise AnchorError(f"anchor {spec.id}.{point.name}: {sym.qualname} ({sym.where}) has no "
                          f"parameter named {point.after_param}")

    def _inside(self, node: Node, within: str, src: bytes, sym: Symbol) -> bool:
        want = flat(within)
        child, parent = node, node.parent
        while parent is not None and parent.start_byte > sym.body_start:
            in_else = parent.type == "if_statement" and child.type == "else_clause"
            head = src[parent.start_byte : parent.end_byte].split(b"{", 1)[0]
            if not in_else and want in flat(head.decode("utf-8", "replace")):
                return True
            child, parent = parent, parent.parent
        return False

    @staticmethod
    def _point(point: PointSpec, sym: Symbol, src: bytes, offset: int, start: int = -1,
               end: int = -1) -> Point:
        if offset >= sym.start_byte:  # count lines from the symbol's start, not the file's
            line = sym.start_line + src.count(b"\n", sym.start_byte, offset)
        else:
            line = src.count(b"\n", 0, offset) + 1
        shown = start if start >= 0 else offset
        eol = src.find(b"\n", shown)
        first = src[shown : eol if eol >= 0 else len(src)].decode("utf-8", "replace").strip()
        return Point(point.name, offset, line, first, start, end)


def resolve_all(index: Index, anchor_set: AnchorSet,
                only: Iterable[str] | None = None) -> dict[str, Resolution]:
    """Resolve every anchor of the set (or those named in `only`), in spec order.

    An anchor that cannot be resolved is returned with status "error" and the message in
    its note, so that a report can show all of them; `require` turns the first into an error.
    """
    resolver = Resolver(index)
    wanted = set(only) if only is not None else None
    out: dict[str, Resolution] = {}
    for spec in anchor_set.anchors:
        if wanted is not None and spec.id not in wanted:
            continue
        try:
            out[spec.id] = resolver.resolve(spec)
        except AnchorError as exc:
            out[spec.id] = Resolution(spec, "error", note=exc.message)
    return out


def require(resolutions: dict[str, Resolution]) -> dict[str, Resolution]:
    """Raise the first resolution error, if any."""
    for res in resolutions.values():
        if res.status == "error":
            raise AnchorError(res.note)
    return resolutions


# -- lookup across trees ----------------------------------------------------------------


def find(index: Index, name: str, kinds: Collection[str] | None = None) -> list[Candidate]:
    """The symbols of `index` called `name` (qualified or not, as `Index.find` matches), then
    those called by another name of its rename group or of a qualifier's (aliases.toml)."""
    found = [Candidate(s, CONFIDENCE[EXACT], f"named {name}", EXACT)
             for s in index.find(name, kinds)]
    for variant in qualname_variants(name):
        if variant != name:
            found += [Candidate(s, CONFIDENCE[ALIAS], f"{variant} is a name of {name}", ALIAS)
                      for s in index.find(variant, kinds)]
    return found


LOCATE_THRESHOLD = 0.5  # the least body, member or name likeness that makes a candidate
LOCATE_FLOOR = 0.4  # the least confidence of a candidate found by other than its name
MIN_BODY_TOKENS = 12  # a shorter body (a getter, `{}`) tells nothing about who it is
MOVED = 0.98  # the same name in another file: as sure, but a same-file twin ranks first
SIMILARITY_CEILING = 0.85  # the confidence of a body or members 100% alike but not the same
TAKEN = 0.6  # a look-alike whose own name the base tree has too is likely not a rename

# Kinds a symbol may turn into under the same name: a field into an accessor, a macro into
# a constant. Tried only when the name holds nothing of the symbol's own kind.
_RELATED = {FIELD: {DECLARATION, FUNCTION}, DECLARATION: {FIELD, FUNCTION},
            FUNCTION: {DECLARATION}, MACRO: {VARIABLE, ENUMERATOR},
            VARIABLE: {MACRO, ENUMERATOR}, ENUMERATOR: {MACRO, VARIABLE}}


class Locator:
    """Where the symbols of a base tree's index went in a target tree's index.

    `locate` ranks candidates, and never picks silently between near-equal ones:

      exact       the same qualified name, same kind (1.0 when the signature is the same);
      alias       a name of its rename group, or of a qualifier's (0.95 likewise);
      structure   another name, same kind, anywhere in the target, with the same body
                  (functions, variables, macros) or the same members (classes, enums) (0.9);
                  or the same name in the class that its class became (as sure as that);
      similarity  another name with a body or members alike (up to 0.85), or, for what has
                  no body to compare, a close name in the same scope with the same signature.

    A changed signature or kind, a move to another file, and a look-alike whose name the
    base tree also has each lower the confidence; `why` says which applied. Other names are
    searched only when no same-named symbol keeps the signature, and look-alikes below
    LOCATE_FLOOR are dropped.
    """

    def __init__(self, base: Index, target: Index) -> None:
        self.base = base
        self.target = target
        self._tokens: dict[int, tuple[str, ...]] = {}  # by id() of a symbol of either index
        self._shingle_sets: dict[int, set[tuple[str, ...]]] = {}  # likewise
        self._homes: dict[str, list[Candidate]] = {}  # where each base class went
        self._of_kind: dict[str, list[Symbol]] = {}  # the target's symbols by kind

    def locate(self, sym: Symbol, limit: int = 5,
               floor: float = LOCATE_FLOOR) -> list[Candidate]:
        """Candidates for `sym` in the target, best first; those found by other than its name
        only from `floor` confidence up (a caller that needs sure ones saves the search for
        look-alikes that could not be)."""
        named = self._by_name(sym)
        found = list(named)
        if not any(c.symbol.kind == sym.kind and self._same_signature(sym, c.symbol)
                   for c in named):
            best: dict[int, Candidate] = {}
            for cand in self._in_renamed_class(sym) + self._became_method(sym) + \
                    self._look_alikes(sym, floor):
                held = best.get(id(cand.symbol))
                if cand.confidence >= max(floor, LOCATE_FLOOR) and (
                        held is None or held.confidence < cand.confidence):
                    best[id(cand.symbol)] = cand
            seen = {id(c.symbol) for c in named}
            found += [c for c in best.values() if id(c.symbol) not in seen]
        found.sort(key=lambda c: (-c.confidence, c.symbol.file != sym.file, c.symbol.start_byte))
        return found[:limit]

    # by name ----------------------------------------------------------------------------

    def _by_name(self, sym: Symbol) -> list[Candidate]:
        found = []
        for variant in qualname_variants(sym.qualname):
            strategy = EXACT if variant == sym.qualname else ALIAS
            for other in self.target.by_qualname.get(variant, ()):
                if other.kind == sym.kind or other.kind in _RELATED.get(sym.kind, ()):
                    found.append(self._named(sym, other, strategy))
        same_kind = [c for c in found if c.symbol.kind == sym.kind]
        return same_kind or found

    def _named(self, sym: Symbol, other: Symbol, strategy: str) -> Candidate:
        confidence = CONFIDENCE[strategy]
        why = [f"named {other.qualname}" if strategy == EXACT
               else f"{other.qualname} is a name of {sym.qualname}"]
        if other.kind != sym.kind:
            confidence *= 0.8
            why.append(f"was a {sym.kind}, now a {other.kind}")
        if not self._same_signature(sym, other):
            confidence *= 0.75 + 0.2 * self._closeness(sym, other)
            why.append(f"{_shape(sym)} -> {_shape(other)}")
        if other.file != sym.file:
            confidence *= MOVED
            why.append(f"moved from {sym.file}")
        return Candidate(other, confidence, "; ".join(why), strategy)

    # by its class ------------------------------------------------------------------------

    def _in_renamed_class(self, sym: Symbol) -> list[Candidate]:
        """The same name in the class that the class of `sym` became, when that class was
        renamed (not through an alias: then `sym` is found by name)."""
        found = []
        for home in self._homes_of(sym.scope):
            for other in self.target.by_qualname.get(f"{home.symbol.qualname}::{sym.name}", ()):
                if other.kind == sym.kind:
                    same = self._same_signature(sym, other)
                    found.append(Candidate(
                        other, home.confidence * (1.0 if same else 0.9),
                        f"{sym.scope} became {home.symbol.qualname} ({home.why})"
                        + ("" if same else f"; {_shape(sym)} -> {_shape(other)}"), STRUCTURE))
        return found

    def _became_method(self, sym: Symbol) -> list[Candidate]:
        """A free function `<stem>_<rest>` that became the method `<rest>` of a class whose
        name is `<stem>` or starts with `<stem>_` (llama_output_reserve ->
        llama_context::output_reserve: a C API turned into a class's members; an `_impl`
        that the method now is loses that suffix: llama_encode_impl ->
        llama_context::encode). Only a method the base does not have, and only when one
        class has it."""
        if sym.kind != FUNCTION or sym.scope or self.target.by_qualname.get(sym.qualname):
            return []
        parts = sym.name.split("_")
        found: dict[str, Symbol] = {}
        for k in range(1, len(parts)):
            stem, rest = "_".join(parts[:k]), "_".join(parts[k:])
            names = [rest] + ([rest[:-len("_impl")]] if rest.endswith("_impl") else [])
            for other in (o for name in names for o in self.target.by_name.get(name, ())):
                owner = other.scope.rsplit("::", 1)[-1]
                if other.kind == FUNCTION and owner and (owner == stem or owner.startswith(
                        stem + "_")) and not self.base.by_qualname.get(other.qualname):
                    found.setdefault(other.qualname, other)
        if len(found) != 1:
            return []
        (other,) = found.values()
        confidence = CONFIDENCE[STRUCTURE] * (MOVED if other.file != sym.file else 1.0)
        return [Candidate(other, confidence, f"{sym.name} became the method {other.qualname}",
                          STRUCTURE)]

    def _homes_of(self, scope: str) -> list[Candidate]:
        if scope not in self._homes:
            classes = [s for s in self.base.by_qualname.get(scope, ()) if s.kind == CLASS]
            self._homes[scope] = [
                c for c in self._look_alikes(classes[0]) if c.confidence >= LOCATE_FLOOR
            ] if classes and not self._by_name(classes[0]) else []
        return self._homes[scope]

    # by body, members or signature ------------------------------------------------------

    def _look_alikes(self, sym: Symbol, floor: float = LOCATE_FLOOR) -> list[Candidate]:
        if sym.kind not in self._of_kind:
            self._of_kind[sym.kind] = [s for s in self.target.symbols if s.kind == sym.kind]
        pool = self._of_kind[sym.kind]
        if floor > SIMILARITY_CEILING * TAKEN:  # a name the base has too cannot reach it
            pool = [s for s in pool if not self.base.by_qualname.get(s.qualname)]
        if sym.kind in {CLASS, ENUM}:
            mine = self._member_names(self.base, sym)
            if len(mine) < 3:  # two members alike say little
                return []
            scored = [(_jaccard(mine, self._member_names(self.target, s)), s, "members")
                      for s in pool]
        elif len(self._body_tokens(self.base, sym)) >= MIN_BODY_TOKENS:
            size = sym.body_end - sym.body_start
            scored = [(self._body_likeness(sym, s), s, "body") for s in pool
                      if s.body_start >= 0 and size / 2 <= s.body_end - s.body_start <= size * 2]
        else:
            return self._close_names(sym, pool)
        found = []
        for score, other, what in scored:
            if score < LOCATE_THRESHOLD:
                continue
            if score == 1.0:
                strategy, confidence, why = STRUCTURE, 0.9, f"the same {what}"
            else:
                strategy, confidence, why = (SIMILARITY, SIMILARITY_CEILING * score,
                                             f"{what} {score:.0%} alike")
            found.append(self._look_alike(sym, other, strategy, confidence, why))
        return found

    def _close_names(self, sym: Symbol, pool: list[Symbol]) -> list[Candidate]:
        """For what has no telling body: a close name in the same scope, same signature."""
        found = []
        for other in pool:
            if (canonical(other.scope) != canonical(sym.scope)
                    or not self._same_signature(sym, other)
                    or self._body_tokens(self.base, sym) != self._body_tokens(self.target, other)):
                continue
            ratio = _name_likeness(sym.name, other.name)
            if ratio >= LOCATE_THRESHOLD:
                found.append(self._look_alike(sym, other, SIMILARITY, 0.7 * ratio,
                                              f"a name {ratio:.0%} alike, same signature"))
        return found

    def _look_alike(self, sym: Symbol, other: Symbol, strategy: str, confidence: float,
                    why: str) -> Candidate:
        # near-equal look-alikes (ggml's families of kernels) part by how alike their names are
        confidence *= 0.9 + 0.1 * _name_likeness(sym.name, other.name)
        reasons = [f"{other.qualname}: {why}"]
        if self.base.by_qualname.get(other.qualname):
            confidence *= TAKEN
            reasons.append(f"{other.qualname} is in the base tree too")
        return Candidate(other, confidence, "; ".join(reasons), strategy)

    # measures ---------------------------------------------------------------------------

    def _body_tokens(self, index: Index, sym: Symbol) -> tuple[str, ...]:
        """The body's (or value's) tokens, each identifier by today's name of its group."""
        if id(sym) not in self._tokens:
            body = index.body(sym).replace("\\\n", " ")
            self._tokens[id(sym)] = todays_names(normalise(body))
        return self._tokens[id(sym)]

    def _body_likeness(self, sym: Symbol, other: Symbol) -> float:
        mine = self._body_tokens(self.base, sym)
        theirs = self._body_tokens(self.target, other)
        if mine == theirs:
            return 1.0
        return _jaccard(self._body_shingles(self.base, sym),
                        self._body_shingles(self.target, other))

    def _body_shingles(self, index: Index, sym: Symbol) -> set[tuple[str, ...]]:
        if id(sym) not in self._shingle_sets:
            self._shingle_sets[id(sym)] = _shingles(self._body_tokens(index, sym))
        return self._shingle_sets[id(sym)]

    @staticmethod
    def _member_names(index: Index, sym: Symbol) -> set[str]:
        return {canonical(m.name) for m in index.members(sym)}

    def _closeness(self, sym: Symbol, other: Symbol) -> float:
        """How alike two same-named symbols are beyond their signatures: their bodies, or
        else their parameter lists."""
        if sym.body_start >= 0 and other.body_start >= 0:
            return self._body_likeness(sym, other)
        return difflib.SequenceMatcher(None, _canonical_params(sym),
                                       _canonical_params(other)).ratio()

    @staticmethod
    def _same_signature(sym: Symbol, other: Symbol) -> bool:
        return (_canonical_params(sym) == _canonical_params(other)
                and canonical(sym.returns) == canonical(other.returns))


def locate(base_index: Index, base_symbol: Symbol, target_index: Index,
           limit: int = 5) -> list[Candidate]:
    """Where `base_symbol` of `base_index` went in `target_index`, ranked (see `Locator`;
    use one Locator for many symbols of the same two trees)."""
    return Locator(base_index, target_index).locate(base_symbol, limit)


def _numbers_differ(a: str, b: str) -> bool:
    """Both names have numbers, and not the same ones (`LLM_TYPE_47M` and `LLM_TYPE_537M`,
    `q4_0` and `q4_1`: two things, not one renamed)."""
    numbers_a, numbers_b = re.findall(r"\d+", a), re.findall(r"\d+", b)
    return bool(numbers_a and numbers_b and numbers_a != numbers_b)


def _name_likeness(a: str, b: str) -> float:
    """How alike two names are; nothing when both have numbers and those differ."""
    if _numbers_differ(a, b):
        return 0.0
    return difflib.SequenceMatcher(None, a, b).ratio()


AKIN = 0.7  # how alike two names must be for one to read as a rename of the other


@lru_cache(maxsize=1 << 16)
def akin(a: str, b: str) -> bool:
    """Whether `b` reads as a rename of `a`: the one rename-likeness rule (the Locator's
    look-alikes by name and drift's "present upstream under another name" both use it).
    Never when both have numbers and those differ (`q4_0` is not `q4_1`); else the same
    words in another order, or mostly the same letters. (Cached: the follow engine asks
    it of the same names often.)"""
    if 2 * min(len(a), len(b)) < AKIN * (len(a) + len(b)):
        return False  # difflib's real_quick_ratio: the lengths alone rule it out (and the
        # same words in another order are as long)
    if _numbers_differ(a, b):
        return False
    if sorted(a.lower().split("_")) == sorted(b.lower().split("_")):
        return True
    shared = sum(min(a.count(c), b.count(c)) for c in set(a))
    if 2 * shared < AKIN * (len(a) + len(b)):
        return False  # difflib's quick_ratio: the letters, in any order, rule it out
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() >= AKIN


def _canonical_params(sym: Symbol) -> list[str]:
    return [canonical(p) for p in sym.params]


def _shape(sym: Symbol) -> str:
    """A symbol's signature with its type, for saying what changed."""
    return f"{sym.returns} {sym.signature()}".strip() if sym.returns else sym.signature()


def _jaccard(a: set[Any], b: set[Any]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0
