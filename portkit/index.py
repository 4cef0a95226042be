"""Stage 2, index: a tree-sitter symbol table of C/C++ sources, cached by file content hash.

Each file yields classes and structs (with their fields and method declarations), function
and method definitions and declarations (in-class and out-of-class, static, templates) with
qualified names, parameter types, return types, byte and line ranges, and a normalised
fingerprint of each body. Parse errors (macro-heavy code) are recorded per file and per
symbol; they never stop the index.

A cold index costs one tree-sitter parse per file plus a walk that only records names and
spans: what few symbols are ever asked about is derived on demand. Parameter types come from
a tree-sitter parse of the stored parameter list, types are spelled out (`squash`) when read,
and fingerprints and calls are read from the body's text.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, fields
from functools import cache, lru_cache
from operator import attrgetter
from pathlib import Path

import tree_sitter_cpp
from tree_sitter import Language, Node, Parser, Point, Range, Tree

from portkit.cache import cache_dir

INDEX_FORMAT = 5

CLASS = "class"
FUNCTION = "function"
DECLARATION = "declaration"
FIELD = "field"

_SOURCE_SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx"}
_CLASS_NODES = {"class_specifier", "struct_specifier", "union_specifier"}
_CONTAINERS = {
    "preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif", "preproc_elifdef",
    "declaration_list", "linkage_specification",
}
_DECLARATOR_WRAPPERS = {
    "pointer_declarator", "reference_declarator", "attributed_declarator",
    "parenthesized_declarator",
}
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.]*|->|::|<<=|>>=|[-+*/%&|^!=<>]=|&&|\|\||<<|>>|\S")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_CALL = re.compile(r"([A-Za-z_]\w*)\s*(?:<[^<>;{}()]*>\s*)?\(")
_NOT_CALLS = {"if", "for", "while", "switch", "return", "sizeof", "alignof", "decltype",
              "catch", "static_assert", "defined"}


@dataclass
class Symbol:
    kind: str  # class | function | declaration | field
    name: str
    qualname: str
    file: str  # relative to the indexed root
    start_byte: int
    end_byte: int
    start_line: int  # 1-based
    end_line: int
    scope: str = ""  # enclosing class or namespace, qualified
    param_list: str = ""  # functions: the parameter list as written, "(...)"
    type_text: str = ""  # functions: the return type; fields: the type, as written
    is_static: bool = False
    body_start: int = -1  # byte offset of the body's "{" (functions, classes)
    body_end: int = -1
    has_error: bool = False

    @property
    def where(self) -> str:
        return f"{self.file}:{self.start_line}"

    @property
    def params(self) -> list[str]:
        """Parameter types, names and defaults dropped: `["ggml_context *", "int32_t"]`."""
        return list(param_types(self.param_list)) if self.param_list else []

    @property
    def returns(self) -> str:
        """The return type of a function, the type of a field, in `squash` spelling."""
        return squash(self.type_text)

    def signature(self) -> str:
        if self.kind in {FUNCTION, DECLARATION}:
            return f"{self.qualname}({', '.join(self.params)})"
        return self.qualname


@dataclass
class FileIndex:
    path: str
    sha256: str
    symbols: list[Symbol]
    errors: list[int]  # first lines of ERROR nodes, for the report


def normalise(text: str) -> list[str]:
    """C++ tokens of `text` with comments and layout removed: the basis of fingerprints."""
    return _TOKEN.findall(_COMMENT.sub(" ", text))


def flat(text: str) -> str:
    """`text` without comments and white space: for layout-blind matching and hashing."""
    if "/" in text:
        text = _COMMENT.sub(" ", text)
    return "".join(text.split())


def fingerprint(text: str) -> str:
    """A hash of `text` that ignores comments and layout."""
    return hashlib.sha1(flat(text).encode()).hexdigest()[:16]


@cache
def _language() -> Language:
    return Language(tree_sitter_cpp.language())


@cache
def _parser() -> Parser:
    return Parser(_language())



def _text(src: bytes, node: Node | None) -> str:
    return "" if node is None else _text_between(src, node.start_byte, node.end_byte)


def _text_between(src: bytes, start: int, end: int) -> str:
    return src[start:end].decode("utf-8", "replace")


def squash(text: str) -> str:
    """One spelling of a type or name: single spaces, `T *`, `T &`, `T **`, `a<b>`."""
    if "*" in text or "&" in text:
        text = text.replace("*", " * ").replace("&", " & ")
        text = " ".join(text.split()).replace("* *", "**").replace("& &", "&&")
    else:
        text = " ".join(text.split())
    return text.replace("< ", "<").replace(" >", ">")


class _Extractor:
    def __init__(self, src: bytes, rel: str) -> None:
        self.src = src
        self.rel = rel
        self.symbols: list[Symbol] = []

    def walk(self, node: Node, scope: str) -> None:
        for child in node.named_children:
            self.visit(child, scope)

    def visit(self, node: Node, scope: str, *, in_class: bool = False) -> None:
        kind = node.type
        if kind == "namespace_definition":
            name = _text(self.src, node.child_by_field_name("name"))
            body = node.child_by_field_name("body")
            if body is not None:
                self.walk(body, f"{scope}::{name}" if scope and name else name or scope)
        elif kind in _CONTAINERS:
            for child in node.named_children:
                self.visit(child, scope, in_class=in_class)
        elif kind == "template_declaration":
            for child in node.named_children:
                if child.type != "template_parameter_list":
                    self.visit(child, scope, in_class=in_class)
        elif kind in _CLASS_NODES:
            self.add_class(node, scope)
        elif kind == "function_definition":
            self.add_function(node, scope, in_class=in_class)
        elif kind in {"declaration", "field_declaration"}:
            self.add_declaration(node, scope, in_class=in_class)

    def add_class(self, node: Node, scope: str) -> None:
        body = node.child_by_field_name("body")
        name = _text(self.src, node.child_by_field_name("name"))
        if body is None or not name:
            return
        qual = f"{scope}::{name}" if scope else name
        self.symbols.append(self.symbol(CLASS, name, qual, node, scope, body=body))
        for child in body.named_children:
            self.visit(child, qual, in_class=True)

    def add_function(self, node: Node, scope: str, *, in_class: bool) -> None:
        decl = node.child_by_field_name("declarator")
        fdecl, ptr = _function_declarator(decl)
        if fdecl is None:
            return
        raw = squash(_text(self.src, fdecl.child_by_field_name("declarator")))
        qual = f"{scope}::{raw}" if scope and (in_class or "::" not in raw) else raw
        sym = self.symbol(FUNCTION, raw.rsplit("::", 1)[-1], qual, node, qual.rpartition("::")[0],
                          body=node.child_by_field_name("body"))
        self.fill_signature(sym, node, fdecl, ptr)
        self.symbols.append(sym)

    def add_declaration(self, node: Node, scope: str, *, in_class: bool) -> None:
        decl = node.child_by_field_name("declarator")
        fdecl, ptr = _function_declarator(decl)
        if fdecl is not None:
            raw = squash(_text(self.src, fdecl.child_by_field_name("declarator")))
            qual = f"{scope}::{raw}" if scope else raw
            sym = self.symbol(DECLARATION, raw.rsplit("::", 1)[-1], qual, node,
                              qual.rpartition("::")[0])
            self.fill_signature(sym, node, fdecl, ptr)
            self.symbols.append(sym)
            return
        if not in_class:
            return
        type_node = node.child_by_field_name("type")
        type_text = _text(self.src, type_node)
        is_static = _has_static(self.src, node, type_node)
        for declarator in node.children_by_field_name("declarator"):
            name_node = _innermost_name(declarator)
            if name_node is None:
                continue
            name = _text(self.src, name_node)
            sym = self.symbol(FIELD, name, f"{scope}::{name}", node, scope)
            stars = _text_between(self.src, declarator.start_byte, name_node.start_byte)
            sym.type_text = f"{type_text} {stars}" if stars else type_text
            sym.is_static = is_static
            self.symbols.append(sym)

    def symbol(self, kind: str, name: str, qual: str, node: Node, scope: str,
               body: Node | None = None) -> Symbol:
        start, end = node.start_point, node.end_point
        return Symbol(
            kind, name, qual, self.rel, node.start_byte, node.end_byte, start[0] + 1, end[0] + 1,
            scope,
            body_start=body.start_byte if body is not None else -1,
            body_end=body.end_byte if body is not None else -1,
            has_error=node.has_error,
        )

    def fill_signature(self, sym: Symbol, node: Node, fdecl: Node, ptr: str) -> None:
        sym.param_list = _text(self.src, fdecl.child_by_field_name("parameters"))
        type_node = node.child_by_field_name("type")
        if type_node is not None:
            sym.type_text = f"{_text(self.src, type_node)} {ptr}" if ptr else _text(self.src,
                                                                                   type_node)
        sym.is_static = _has_static(self.src, node, fdecl)


@lru_cache(maxsize=4096)
def param_types(param_list: str) -> tuple[str, ...]:
    """The parameter types of a parameter list `(...)` as written, by a tree-sitter parse."""
    src = f"void f{param_list};".encode()
    fdecl, _ = _function_declarator(
        _parser().parse(src).root_node.named_children[0].child_by_field_name("declarator"))
    params = fdecl.child_by_field_name("parameters") if fdecl is not None else None
    if params is None:
        return ()
    types = []
    for param in params.named_children:
        if param.type not in {"parameter_declaration", "optional_parameter_declaration"}:
            continue
        end = param.end_byte
        default = param.child_by_field_name("default_value")
        if default is not None:
            end = src.rindex(b"=", param.start_byte, default.start_byte)
        text = src[param.start_byte : end]
        decl = param.child_by_field_name("declarator")
        name = _innermost_name(decl) if decl is not None else None
        if name is not None:
            text = src[param.start_byte : name.start_byte] + src[name.end_byte : end]
        types.append(squash(text.decode("utf-8", "replace")))
    return tuple(types)


def _function_declarator(decl: Node | None) -> tuple[Node | None, str]:
    """The function_declarator inside pointer/reference wrappers, and the wrappers' stars."""
    stars = ""
    while decl is not None and decl.type in _DECLARATOR_WRAPPERS:
        if decl.type == "pointer_declarator":
            stars += "*"
        elif decl.type == "reference_declarator":
            stars += "&"
        decl = decl.child_by_field_name("declarator") or (
            decl.named_children[-1] if decl.named_children else None
        )
    if decl is not None and decl.type == "function_declarator":
        return decl, stars
    return None, stars


def _innermost_name(decl: Node | None) -> Node | None:
    while decl is not None:
        if decl.type in {"identifier", "field_identifier"}:
            return decl
        nxt = decl.child_by_field_name("declarator")
        if nxt is None:
            named = [c for c in decl.named_children if c.type not in {"type_qualifier"}]
            nxt = named[0] if decl.type in _DECLARATOR_WRAPPERS and named else None
        decl = nxt
    return None


def _has_static(src: bytes, node: Node, upto: Node | None) -> bool:
    """Whether `node`'s specifiers before `upto` include `static`."""
    if upto is not None and b"static" not in src[node.start_byte : upto.start_byte]:
        return False
    return any(c.type == "storage_class_specifier" and _text(src, c) == "static"
               for c in node.children)


def _error_lines(root: Node, limit: int = 20) -> list[int]:
    lines: list[int] = []
    stack = [root]
    while stack and len(lines) < limit:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            lines.append(node.start_point[0] + 1)
            continue
        if node.has_error:
            stack.extend(reversed(node.children))
    return sorted(lines)


_recent_trees: dict[str, Tree] = {}


def _ranged_parser(src: bytes, start: int, end: int) -> Parser:
    """A parser confined to `src[start:end]`; the nodes it yields keep file coordinates."""
    def point(offset: int) -> Point:
        return Point(src.count(b"\n", 0, offset), offset - src.rfind(b"\n", 0, offset) - 1)

    return Parser(_language(), included_ranges=[Range(point(start), point(end), start, end)])


def parse_tree(src: bytes, sha: str = "") -> Tree:
    """The tree-sitter parse of `src`, reusing the parse of a file indexed in this process."""
    sha = sha or hashlib.sha256(src).hexdigest()
    tree = _recent_trees.pop(sha, None) or _parser().parse(src)
    _recent_trees[sha] = tree
    while len(_recent_trees) > 32:
        _recent_trees.pop(next(iter(_recent_trees)))
    return tree


def parse_source(src: bytes, rel: str, sha: str = "") -> FileIndex:
    """Index one file's bytes (no cache); `sha` is their sha256 when the caller has it."""
    sha = sha or hashlib.sha256(src).hexdigest()
    tree = parse_tree(src, sha)
    extractor = _Extractor(src, rel)
    extractor.walk(tree.root_node, "")
    errors = _error_lines(tree.root_node) if tree.root_node.has_error else []
    return FileIndex(rel, sha, extractor.symbols, errors)


def _cache_path(sha: str) -> Path:
    return cache_dir("index", f"v{INDEX_FORMAT}.{marshal.version}", sha[:2]) / f"{sha}.marshal"


# A cached symbol is the row of its fields but `file`: the same content may sit elsewhere.
_ROW = attrgetter(*(f.name for f in fields(Symbol) if f.name != "file"))
_FILE_AT = [f.name for f in fields(Symbol)].index("file")


def index_file(rel: str, src: bytes) -> FileIndex:
    """Index one file's bytes `src`, reusing the on-disk entry for identical content."""
    sha = hashlib.sha256(src).hexdigest()
    entry = _cache_path(sha)
    if entry.is_file():
        try:
            data = marshal.loads(entry.read_bytes())
            symbols = [Symbol(*row[:_FILE_AT], rel, *row[_FILE_AT:])  # type: ignore[call-arg]
                       for row in data["symbols"]]
            return FileIndex(rel, sha, symbols, data["errors"])
        except (EOFError, ValueError, TypeError, KeyError):
            pass  # a damaged entry (a full disk, a killed run): index the file again
    result = parse_source(src, rel, sha)
    rows = [_ROW(sym) for sym in result.symbols]
    tmp = entry.with_suffix(f".{os.getpid()}.tmp")  # concurrent runs never share one
    tmp.write_bytes(marshal.dumps({"symbols": rows, "errors": result.errors}))
    tmp.replace(entry)
    return result


def source_files(root: Path, patterns: Iterable[str]) -> list[str]:
    """Relative paths of the C/C++ files under `root` matching any glob pattern."""
    found: set[str] = set()
    for pattern in patterns:
        for path in root.glob(pattern):
            if path.is_file() and path.suffix in _SOURCE_SUFFIXES:
                found.add(path.relative_to(root).as_posix())
    return sorted(found)


class Index:
    """The symbol table of a set of files under one source root."""

    def __init__(self, root: Path, files: Iterable[FileIndex]) -> None:
        self.root = root
        self.files = {f.path: f for f in files}
        self.symbols = [s for f in self.files.values() for s in f.symbols]
        self.by_qualname: dict[str, list[Symbol]] = defaultdict(list)
        self.by_scope: dict[str, list[Symbol]] = defaultdict(list)
        for sym in self.symbols:
            self.by_qualname[sym.qualname].append(sym)
            self.by_scope[sym.scope].append(sym)
        self._text: dict[str, bytes] = {}

    @classmethod
    def build(cls, root: Path, patterns: Iterable[str]) -> Index:
        sources = {rel: (root / rel).read_bytes() for rel in source_files(root, patterns)}
        index = cls(root, (index_file(rel, src) for rel, src in sources.items()))
        index._text.update(sources)  # each file is read once
        return index

    def source(self, rel: str) -> bytes:
        if rel not in self._text:
            self._text[rel] = (self.root / rel).read_bytes()
        return self._text[rel]

    def text(self, sym: Symbol) -> str:
        return self.source(sym.file)[sym.start_byte : sym.end_byte].decode("utf-8", "replace")

    def body(self, sym: Symbol) -> str:
        if sym.body_start < 0:
            return ""
        return self.source(sym.file)[sym.body_start : sym.body_end].decode("utf-8", "replace")

    def fingerprint(self, sym: Symbol) -> str:
        """The body's `fingerprint`: equal for bodies that differ only in layout and comments."""
        return fingerprint(self.body(sym)) if sym.body_start >= 0 else ""

    def calls(self, sym: Symbol) -> set[str]:
        """Names the body of `sym` calls (functions, methods, constructors-by-call)."""
        body = _COMMENT.sub(" ", self.body(sym))
        return {m for m in _CALL.findall(body) if m not in _NOT_CALLS}

    def calls_any(self, sym: Symbol, names: Iterable[str]) -> bool:
        """Whether the body of `sym` calls one of `names` (a cheap test before the parse)."""
        body = self.body(sym)
        present = [n for n in names if n in body]
        if not present:
            return False
        alternatives = "|".join(re.escape(n) for n in present)
        return re.search(rf"\b(?:{alternatives})\s*(?:<[^<>;{{}}()]*>\s*)?\(",
                         _COMMENT.sub(" ", body)) is not None

    def members(self, cls_sym: Symbol) -> list[Symbol]:
        return [s for s in self.by_scope.get(cls_sym.qualname, ())
                if s.file == cls_sym.file and cls_sym.start_byte <= s.start_byte < cls_sym.end_byte]

    def syntax(self, sym: Symbol) -> Node:
        """A syntax tree that covers `sym`, in the file's own byte and line coordinates.

        The whole file's parse when this process made it (a cold run); otherwise tree-sitter
        parses only the symbol's range of the file, so that a warm run never parses a file.
        """
        src = self.source(sym.file)
        tree = _recent_trees.get(self.files[sym.file].sha256)
        if tree is None:
            tree = _ranged_parser(src, sym.start_byte, sym.end_byte).parse(src)
        return tree.root_node
