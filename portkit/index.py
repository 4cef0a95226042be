"""Stage 2, index: a tree-sitter symbol table of C/C++ sources, cached by file content hash.

Each file yields classes, structs and unions (with their fields and method declarations),
enums (with their enumerators), function and method definitions and declarations (in-class
and out-of-class, static, templates) with qualified names, file-scope variables, and macros,
each with byte and line ranges; parameter and return types, variable and field types and a
normalised fingerprint of each body or value are read from them on demand. Parse errors
(macro-heavy code) are recorded per file and per symbol; they never stop the index.

A cold index costs one tree-sitter parse per file plus a walk that only records names and
spans: what few symbols are ever asked about is derived on demand. Parameter types come from
a tree-sitter parse of the stored parameter list, types are spelled out (`squash`) when read,
and fingerprints and calls are read from the body's text.

The syntax trees an index makes belong to its `ParseCache`: two indexes in one process (a
base tree and a target tree) never share or evict each other's trees, and the trees go with
the index. Only pure functions of text (`param_types`) are memoised for the whole process.
"""


from __future__ import annotations

import hashlib
import marshal
import operator
import os
import re
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, fields, replace
from functools import cache, cached_property, lru_cache
from pathlib import Path

import tree_sitter_cpp
from tree_sitter import Language, Node, Parser, Point, Range, Tree

from portkit.cache import cache_dir
from portkit.errors import TreeError

INDEX_FORMAT = 8

CLASS = "class"
FUNCTION = "function"
DECLARATION = "declaration"
FIELD = "field"
ENUM = "enum"
ENUMERATOR = "enumerator"
VARIABLE = "variable"
MACRO = "macro"

# Members stand for their class or enum in `Index.enclosing`.
_MEMBERS = {FIELD, DECLARATION, ENUMERATOR}
_CONTAINER_KINDS = {CLASS, ENUM}

_SOURCE_SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx"}
_CLASS_NODES = {"class_specifier", "struct_specifier", "union_specifier"}
_TYPE_NODES = _CLASS_NODES | {"enum_specifier"}
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
IDENT = re.compile(r"[A-Za-z_]\w*")  # a name (or keyword) as the follow engine reads words
_CALL = re.compile(r"([A-Za-z_]\w*)\s*(?:<[^<>;{}()]*>\s*)?\(")
_NOT_CALLS = {"if", "for", "while", "switch", "return", "sizeof", "alignof", "decltype",
              "catch", "static_assert", "defined"}


@dataclass
class Symbol:
    kind: str  # class | function | declaration | field | enum | enumerator | variable | macro
    name: str
    qualname: str
    file: str  # relative to the indexed root
    start_byte: int
    end_byte: int
    start_line: int  # 1-based
    end_line: int
    scope: str = ""  # enclosing class or namespace, qualified; an enumerator's: its enum
    # functions and function-like macros: the parameter list as written, "(...)"
    param_list: str = ""
    # functions: the return type; fields and variables: the type; enums: the underlying type
    type_text: str = ""
    is_static: bool = False
    # the body's "{" to its "}" (functions, classes, enums); the value of a macro, an
    # enumerator or a variable's initializer
    body_start: int = -1
    body_end: int = -1
    has_error: bool = False

    @property
    def where(self) -> str:
        return f"{self.file}:{self.start_line}"

    @property
    def params(self) -> list[str]:
        """Parameter types, names and defaults dropped: `["ggml_context *", "int32_t"]`;
        a function-like macro's parameter names: `["x", "..."]`."""
        if not self.param_list:
            return []
        if self.kind == MACRO:
            return [p.strip() for p in self.param_list[1:-1].split(",") if p.strip()]
        return list(param_types(self.param_list))

    @property
    def returns(self) -> str:
        """The return type of a function, the type of a field or variable, the underlying
        type of an enum, in `squash` spelling."""
        return squash(self.type_text)

    def signature(self) -> str:
        if self.kind in {FUNCTION, DECLARATION} or (self.kind == MACRO and self.param_list):
            return f"{self.qualname}({', '.join(self.params)})"
        return self.qualname


@dataclass
class FileIndex:
    path: str
    sha256: str
    symbols: list[Symbol]
    errors: list[int]  # first lines of ERROR nodes, for the report
    words: frozenset[str] | None = None  # the names the file uses (IDENT), when known


def words_of(src: bytes) -> frozenset[str]:
    """The names a file's bytes use: what "is this name new in the file?" reads."""
    return frozenset(IDENT.findall(src.decode("utf-8", errors="replace")))


def normalise(text: str) -> list[str]:
    """C++ tokens of `text` with comments and layout removed: the basis of fingerprints."""
    return _TOKEN.findall(_COMMENT.sub(" ", text))


def uncommented(text: str) -> str:
    """`text` with its comments blanked out (the code that is left: names in a comment are
    not used there)."""
    return _COMMENT.sub(" ", text) if "/" in text else text


def flat(text: str) -> str:
    """`text` without comments and white space: for layout-blind matching and hashing."""
    if "/" in text:
        text = _COMMENT.sub(" ", text)
    return "".join(text.split())


FLAT_FORMAT = 1  # what `flat` keeps of a line: a cache of flattened lines says which

# What str.split() splits on, bar the newline that `flat_all` joins lines with.
_BLANKS = str.maketrans("", "", "".join(c for c in map(chr, range(0x3001))
                                         if c.isspace() and c != "\n"))


def flat_all(lines: list[str]) -> list[str]:
    """`flat` of each of `lines` (lines of `str.splitlines`, so none holds a line break),
    in bulk: one pass over the joined text, `flat` itself only for a line with a "/" (a
    comment is cut line by line)."""
    out = "\n".join(lines).translate(_BLANKS).split("\n") if lines else []
    for i, line in enumerate(lines):
        if "/" in line:
            out[i] = flat(line)
    return out


def fingerprint(text: str) -> str:
    """A hash of `text` that ignores comments and layout."""
    return hashlib.sha1(flat(text).encode()).hexdigest()[:16]


@cache
def _language() -> Language:
    return Language(tree_sitter_cpp.language())


def _text(src: bytes, node: Node | None) -> str:
    return "" if node is None else _text_between(src, node.start_byte, node.end_byte)


def _text_between(src: bytes, start: int, end: int) -> str:
    return src[start:end].decode("utf-8", "replace")


def squash(text: str) -> str:
    """One spelling of a type or name: single spaces, `T *`, `T &`, `T **`, `a<b>`, `a, b`."""
    if "*" in text or "&" in text:
        text = text.replace("*", " * ").replace("&", " & ")
        text = " ".join(text.split()).replace("* *", "**").replace("& &", "&&")
    else:
        text = " ".join(text.split())
    return text.replace("< ", "<").replace(" >", ">").replace(" ,", ",")


class ParseCache:
    """The tree-sitter parser and syntax trees of one index, released with it.

    Keeps the whole-file parses of the `keep` files parsed last: a cold index parses every
    file once and its resolution reuses them; without one, `syntax` parses a range only.
    """

    def __init__(self, keep: int = 32) -> None:
        self.keep = keep
        self._parser = Parser(_language())
        self._trees: dict[str, Tree] = {}

    def parse(self, src: bytes, sha: str) -> Tree:
        """The parse of a whole file's bytes `src` (their sha256 is `sha`), kept."""
        tree = self._trees.pop(sha, None) or self._parser.parse(src)
        self._trees[sha] = tree
        while len(self._trees) > self.keep:
            self._trees.pop(next(iter(self._trees)))
        return tree

    def syntax(self, src: bytes, sha: str, start: int, end: int) -> Node:
        """A syntax tree covering `src[start:end]` in the file's own coordinates: the kept
        parse of the file, or else a parse of that range only."""
        tree = self._trees.get(sha)
        if tree is None:
            tree = _ranged_parser(src, start, end).parse(src)
        return tree.root_node


class _Extractor:
    def __init__(self, src: bytes, rel: str) -> None:
        self.src = src
        self.rel = rel
        self.symbols: list[Symbol] = []

    def walk(self, node: Node, scope: str) -> None:
        for child in node.named_children:
            self.visit(child, scope)

    def visit(self, node: Node, scope: str, *, in_class: bool = False,
              span: Node | None = None) -> None:
        kind = node.type
        if kind == "namespace_definition":
            name = _text(self.src, node.child_by_field_name("name"))
            body = node.child_by_field_name("body")
            if body is not None:
                self.walk(body, f"{scope}::{name}" if scope and name else name or scope)
        elif kind in _CONTAINERS:
            for child in node.named_children:
                self.visit(child, scope, in_class=in_class)
        elif kind == "template_declaration":  # the symbol spans its `template <...>` line
            for child in node.named_children:
                if child.type != "template_parameter_list":
                    self.visit(child, scope, in_class=in_class, span=node)
        elif kind in _CLASS_NODES:
            self.add_class(node, scope, span or node)
        elif kind == "enum_specifier":
            self.add_enum(node, scope, span or node)
        elif kind == "function_definition":
            self.add_function(node, scope, in_class=in_class, span=span or node)
        elif kind in {"declaration", "field_declaration"}:
            self.add_declaration(node, scope, in_class=in_class, span=span or node)
        elif kind == "type_definition":
            self.add_typedef(node, scope, span or node)
        elif kind in {"preproc_def", "preproc_function_def"}:
            self.add_macro(node)

    def add_class(self, node: Node, scope: str, span: Node, name: str = "") -> None:
        body = node.child_by_field_name("body")
        name = _text(self.src, node.child_by_field_name("name")) or name
        if body is None or not name:
            return
        qual = f"{scope}::{name}" if scope else name
        self.symbols.append(self.symbol(CLASS, name, qual, span, scope, body=body))
        self.walk_members(node, qual)

    def walk_members(self, node: Node, scope: str) -> None:
        body = node.child_by_field_name("body")
        for child in body.named_children if body is not None else ():
            self.visit(child, scope, in_class=True)

    def add_enum(self, node: Node, scope: str, span: Node, name: str = "") -> None:
        """An enum and its enumerators; an anonymous enum's are its scope's own members."""
        body = node.child_by_field_name("body")
        name = _text(self.src, node.child_by_field_name("name")) or name
        if body is None:
            return
        qual = scope
        if name:
            qual = f"{scope}::{name}" if scope else name
            sym = self.symbol(ENUM, name, qual, span, scope, body=body)
            sym.type_text = _text(self.src, node.child_by_field_name("base"))
            self.symbols.append(sym)
        # the names of a plain enum live in its enclosing scope, an `enum class`'s in its own
        scoped = any(c.type in {"class", "struct"} for c in node.children)
        outer = qual if scoped else scope
        for item in body.named_children:
            if item.type == "enumerator":
                item_name = _text(self.src, item.child_by_field_name("name"))
                self.symbols.append(self.symbol(
                    ENUMERATOR, item_name, f"{outer}::{item_name}" if outer else item_name,
                    item, qual, body=item.child_by_field_name("value")))

    def add_typedef(self, node: Node, scope: str, span: Node) -> None:
        """`typedef struct {...} name;` and `typedef enum {...} name;` name their body."""
        type_node = node.child_by_field_name("type")
        if type_node is None or type_node.child_by_field_name("body") is None:
            return
        alias = _text(self.src, node.child_by_field_name("declarator"))
        if type_node.type == "enum_specifier":
            self.add_enum(type_node, scope, span, alias)
        elif type_node.type in _CLASS_NODES:
            self.add_class(type_node, scope, span, alias)

    def add_function(self, node: Node, scope: str, *, in_class: bool, span: Node) -> None:
        decl = node.child_by_field_name("declarator")
        fdecl, ptr = _function_declarator(decl)
        if fdecl is None:
            return
        raw, misread = self.function_name(fdecl)
        qual = f"{scope}::{raw}" if scope and (in_class or "::" not in raw) else raw
        sym = self.symbol(FUNCTION, raw.rsplit("::", 1)[-1], qual, span,
                          qual.rpartition("::")[0], body=node.child_by_field_name("body"))
        self.fill_signature(sym, node, fdecl, ptr, decl.start_byte if decl else fdecl.start_byte,
                            misread)
        self.symbols.append(sym)

    def add_declaration(self, node: Node, scope: str, *, in_class: bool, span: Node) -> None:
        type_node = node.child_by_field_name("type")
        declarators = node.children_by_field_name("declarator")
        if type_node is not None and type_node.type in _TYPE_NODES and (
                type_node.child_by_field_name("body") is not None):
            if type_node.type == "enum_specifier":
                self.add_enum(type_node, scope, type_node)
            elif type_node.child_by_field_name("name") is not None:
                self.add_class(type_node, scope, type_node)
            elif in_class and not declarators:  # an anonymous union's members are its class's
                self.walk_members(type_node, scope)
        type_text, is_static = "", False
        for declarator in declarators:
            fdecl, ptr = _function_declarator(declarator)
            if fdecl is not None:
                raw, misread = self.function_name(fdecl)
                qual = f"{scope}::{raw}" if scope else raw
                sym = self.symbol(DECLARATION, raw.rsplit("::", 1)[-1], qual, span,
                                  qual.rpartition("::")[0])
                self.fill_signature(sym, node, fdecl, ptr, declarator.start_byte, misread)
                self.symbols.append(sym)
                continue
            value = None
            if declarator.type == "init_declarator":
                value = declarator.child_by_field_name("value")
                declarator = declarator.child_by_field_name("declarator") or declarator
            name_node = _innermost_name(declarator, qualified=not in_class)
            if name_node is None:
                continue
            name = _text(self.src, name_node)
            if not type_text:
                type_text = _type_prefix(self.src, node, type_node, declarators[0].start_byte)
                is_static = _has_static(self.src, node, type_node)
            if in_class:
                sym = self.symbol(FIELD, name, f"{scope}::{name}", span, scope)
            else:
                name = squash(name)  # `klass :: member` defines a static member
                qual = f"{scope}::{name}" if scope and "::" not in name else name
                sym = self.symbol(VARIABLE, name.rsplit("::", 1)[-1], qual, span,
                                  qual.rpartition("::")[0], body=value)
            sym.type_text = type_text
            if declarator is not name_node:  # the declarator but its name: `*`, `[4]`, `(*)()`
                sym.type_text += " " + _text_between(
                    self.src, declarator.start_byte, name_node.start_byte) + _text_between(
                    self.src, name_node.end_byte, declarator.end_byte)
            sym.is_static = is_static
            self.symbols.append(sym)

    def add_macro(self, node: Node) -> None:
        name = _text(self.src, node.child_by_field_name("name"))
        sym = self.symbol(MACRO, name, name, node, "", body=node.child_by_field_name("value"))
        sym.param_list = _text(self.src, node.child_by_field_name("parameters"))
        if node.end_point[1] == 0:  # its newline ends a #define, but is not part of it
            sym.end_byte -= 1
            sym.end_line -= 1
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

    def function_name(self, fdecl: Node) -> tuple[str, Node | None]:
        """A function's name as written (`klass::name`); and its return type's node when an
        export macro made tree-sitter read `GGML_API T name(...)` as a name `T name`
        qualified by `T` (there is no `::` in it)."""
        inner = fdecl.child_by_field_name("declarator")
        if inner is not None and inner.type == "qualified_identifier" and (
                self.src.find(b"::", inner.start_byte, inner.end_byte) < 0):
            return (_text(self.src, inner.child_by_field_name("name")),
                    inner.child_by_field_name("scope"))
        return squash(_text(self.src, inner)), None

    def fill_signature(self, sym: Symbol, node: Node, fdecl: Node, ptr: str, upto: int,
                       misread: Node | None = None) -> None:
        """Parameters, return type and storage of a function whose declarator is at `upto`
        (`misread`: the return type that tree-sitter took for a qualifier)."""
        sym.param_list = _text(self.src, fdecl.child_by_field_name("parameters"))
        type_text = (_text(self.src, misread) if misread is not None
                     else _type_prefix(self.src, node, node.child_by_field_name("type"), upto))
        sym.type_text = f"{type_text} {ptr}" if ptr and type_text else type_text
        sym.is_static = _has_static(self.src, node, fdecl)


def _type_prefix(src: bytes, node: Node, type_node: Node | None, upto: int) -> str:
    """The type a declaration gives its declarators (which start at byte `upto`), with its
    qualifiers (`const char`), without storage classes and attributes. An export macro
    before the type (`LLAMA_API int32_t f();`) parses as the type followed by an error that
    holds the real one."""
    start = node.start_byte
    if src.find(b"const", start, upto) < 0 and src.find(b"volatile", start, upto) < 0 and (
            not node.has_error):
        return _text(src, type_node)  # the usual case, and the cheap one
    parts: list[str] = []
    type_at = -1
    for child in node.children:
        if child.start_byte >= upto:
            break
        if child.type == "type_qualifier":
            parts.append(_text(src, child))
        elif child == type_node:
            type_at = len(parts)
            parts.append(_text(src, child))
        elif child.type == "ERROR" and type_at >= 0:
            del parts[type_at]
            type_at = -1
            parts.append(_text(src, child))
    return " ".join(parts)


@cache
def _param_parser() -> Parser:
    return Parser(_language())


def _parameter_list(param_list: str) -> tuple[bytes, Node | None]:
    """The source `void f(...);` a parameter list is read in, and tree-sitter's
    parameter_list node of it (None when tree-sitter reads no function declarator)."""
    src = f"void f{param_list};".encode()
    top = _param_parser().parse(src).root_node.named_children
    fdecl, _ = _function_declarator(top[0].child_by_field_name("declarator")) if top \
        else (None, "")
    return src, fdecl.child_by_field_name("parameters") if fdecl is not None else None


@lru_cache(maxsize=4096)
def param_types(param_list: str) -> tuple[str, ...]:
    """The parameter types of a parameter list `(...)` as written, by a tree-sitter parse.

    A pure function of the text, so memoised for the process rather than per index."""
    src, params = _parameter_list(param_list)
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


@lru_cache(maxsize=4096)
def param_arity(param_list: str) -> tuple[int, int | None]:
    """How many arguments a parameter list `(...)` takes, by a tree-sitter parse: at least
    (those without a default), at most (None: any number, `...` or a parameter pack).
    `(void)` takes none."""
    src, params = _parameter_list(param_list)
    if params is None:
        return 0, None  # not a parameter list tree-sitter reads: any number, no claim
    least, most = 0, 0
    for param in params.children:
        if param.type in {"...", "variadic_parameter", "variadic_parameter_declaration"}:
            return least, None
        if param.type == "optional_parameter_declaration":
            most += 1
        elif param.type == "parameter_declaration":
            if (param.child_by_field_name("declarator") is None
                    and _text(src, param.child_by_field_name("type")) == "void"):
                continue  # (void)
            least += 1
            most += 1
    return least, most


def calls(code: str) -> list[tuple[str, int]]:
    """The calls of a free or qualified name in a run of statements (a hunk's added
    lines): (the name as written, `ns::f` or `f`; the number of arguments), each call
    tree-sitter reads without an error. A call on an object (`x.f()`, `p->f()`) is not
    one: what it names depends on the object."""
    src = ("void portkit_calls_() {\n" + code + "\n}\n").encode("utf-8", "surrogateescape")
    out: list[tuple[str, int]] = []
    stack = [_param_parser().parse(src).root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.named_children)
        if node.type != "call_expression" or node.has_error:
            continue
        func, args = node.child_by_field_name("function"), node.child_by_field_name("arguments")
        if func is None or args is None or func.type not in ("identifier",
                                                              "qualified_identifier"):
            continue
        n = sum(1 for a in args.named_children if a.type != "comment")
        out.append((_text(src, func), n))
    return out


def _function_declarator(decl: Node | None) -> tuple[Node | None, str]:
    """The function_declarator inside pointer/reference wrappers, and the wrappers' stars.

    A function pointer (`(*cb)(int)`) declares data, not a function: None; a function that
    returns one (`(*get(int))(void)`) is the function inside."""
    stars = ""
    while decl is not None and decl.type in _DECLARATOR_WRAPPERS:
        if decl.type == "pointer_declarator":
            stars += "*"
        elif decl.type == "reference_declarator":
            stars += "&"
        decl = decl.child_by_field_name("declarator") or (
            decl.named_children[-1] if decl.named_children else None
        )
    if decl is None or decl.type != "function_declarator":
        return None, stars
    inner = decl.child_by_field_name("declarator")
    if inner is not None and inner.type == "parenthesized_declarator":
        nested, more = _function_declarator(inner)
        return nested, stars + more
    return decl, stars


def _innermost_name(decl: Node | None, *, qualified: bool = False) -> Node | None:
    """The name a declarator declares; with `qualified`, a `klass::member` name whole."""
    while decl is not None:
        if decl.type in {"identifier", "field_identifier"} or (
                qualified and decl.type == "qualified_identifier"):
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


def _ranged_parser(src: bytes, start: int, end: int) -> Parser:
    """A parser confined to `src[start:end]`; the nodes it yields keep file coordinates."""
    def point(offset: int) -> Point:
        return Point(src.count(b"\n", 0, offset), offset - src.rfind(b"\n", 0, offset) - 1)

    return Parser(_language(), included_ranges=[Range(point(start), point(end), start, end)])


def parse_source(src: bytes, rel: str, sha: str = "",
                 parses: ParseCache | None = None) -> FileIndex:
    """Index one file's bytes (no cache); `sha` is their sha256 when the caller has it, and
    `parses` keeps the syntax tree for the index that asks."""
    sha = sha or hashlib.sha256(src).hexdigest()
    tree = (parses or ParseCache(keep=0)).parse(src, sha)
    extractor = _Extractor(src, rel)
    extractor.walk(tree.root_node, "")
    errors = _error_lines(tree.root_node) if tree.root_node.has_error else []
    return FileIndex(rel, sha, extractor.symbols, errors)


def _cache_path(sha: str) -> Path:
    return cache_dir("index", f"v{INDEX_FORMAT}.{marshal.version}", sha[:2]) / f"{sha}.marshal"


# A cached entry keeps the symbols' fields but `file` (the same content may sit elsewhere)
# column by column: one list per field, checked a column at a time when read.
_CACHED = tuple(f for f in fields(Symbol) if f.name != "file")
_COLUMNS = tuple(f.name for f in _CACHED)
_KINDS = tuple({"str": str, "int": int, "bool": bool}[str(f.type)] for f in _CACHED)
_FILE_AT = [f.name for f in fields(Symbol)].index("file")


def _believable(data: object, size: int) -> bool:
    """Whether a cached entry is one this code wrote for a file of `size` bytes: every field
    of its type, every span inside the file. The cache is input like any other: a damaged
    or hostile entry is indexed again, never believed."""
    if type(data) is not dict or type(data.get("errors")) is not list \
            or type(data.get("words")) is not list or type(data.get("columns")) is not dict:
        return False
    cols = data["columns"]
    if set(cols) != set(_COLUMNS) or any(type(c) is not list for c in cols.values()):
        return False
    n = len(cols["name"])
    if any(len(cols[name]) != n or not set(map(type, cols[name])) <= {kind}
           for name, kind in zip(_COLUMNS, _KINDS, strict=True)):
        return False
    start, end = cols["start_byte"], cols["end_byte"]
    first, last = cols["start_line"], cols["end_line"]
    body_start, body_end = cols["body_start"], cols["body_end"]
    return (not n or (min(start) >= 0 and max(end) <= size and min(first) >= 1
                      and all(map(operator.le, start, end))
                      and all(map(operator.le, first, last))
                      and all(b == e == -1 or s <= b <= e <= t for s, b, e, t
                              in zip(start, body_start, body_end, end, strict=True)))) \
        and set(map(type, data["errors"])) <= {int} and set(map(type, data["words"])) <= {str}


def index_file(rel: str, src: bytes, parses: ParseCache | None = None,
               sha: str = "") -> FileIndex:
    """Index one file's bytes `src` (`sha`: their sha256, when the caller has it), reusing
    the on-disk entry for identical content."""
    sha = sha or hashlib.sha256(src).hexdigest()
    entry = _cache_path(sha)
    if entry.is_file():
        try:
            data = marshal.loads(entry.read_bytes())
            if _believable(data, len(src)):
                cols = [data["columns"][name] for name in _COLUMNS]
                symbols = [Symbol(*row[:_FILE_AT], rel, *row[_FILE_AT:])  # type: ignore[call-arg]
                           for row in zip(*cols, strict=True)]
                return FileIndex(rel, sha, symbols, data["errors"], frozenset(data["words"]))
        except (OSError, EOFError, ValueError, TypeError):
            pass  # a damaged entry (a full disk, a killed run): index the file again
    result = parse_source(src, rel, sha, parses)
    columns = {name: [getattr(sym, name) for sym in result.symbols] for name in _COLUMNS}
    tmp = entry.with_suffix(f".{os.getpid()}.tmp")  # concurrent runs never share one
    words = words_of(src)
    try:
        tmp.write_bytes(marshal.dumps({"columns": columns, "errors": result.errors,
                                       "words": sorted(words)}))
        tmp.replace(entry)
    except OSError:
        tmp.unlink(missing_ok=True)  # a cache that cannot be written is no cache
    return replace(result, words=words)


def source_files(root: Path, patterns: Iterable[str]) -> list[str]:
    """Relative paths of the C/C++ files under `root` matching any glob pattern."""
    found: set[str] = set()
    inside = root.resolve()
    for pattern in patterns:
        for path in root.glob(pattern):
            if path.is_file() and path.suffix in _SOURCE_SUFFIXES and (
                    not path.is_symlink() or path.resolve().is_relative_to(inside)):
                found.add(path.relative_to(root).as_posix())  # never a link out of the tree
    return sorted(found)


class Index:
    """The symbol table of a set of files under one source root, and their syntax trees."""

    def __init__(self, root: Path, files: Iterable[FileIndex],
                 parses: ParseCache | None = None) -> None:
        self.root = root
        self.parses = parses or ParseCache()
        self.files = {f.path: f for f in files}
        self.symbols = [s for f in self.files.values() for s in f.symbols]
        self.by_qualname: dict[str, list[Symbol]] = defaultdict(list)
        self.by_scope: dict[str, list[Symbol]] = defaultdict(list)
        for sym in self.symbols:
            self.by_qualname[sym.qualname].append(sym)
            self.by_scope[sym.scope].append(sym)
        self._text: dict[str, bytes] = {}

    @classmethod
    def build(cls, root: Path, patterns: Iterable[str], beside: Index | None = None) -> Index:
        """The index of `root`'s files that match `patterns`; a file whose path and content
        are those of one that `beside` (another tree's index) has shares its entry."""
        sources = {rel: (root / rel).read_bytes() for rel in source_files(root, patterns)}
        parses = ParseCache()
        known = beside.files if beside is not None else {}

        def entry(rel: str, src: bytes) -> FileIndex:
            sha = hashlib.sha256(src).hexdigest()
            same = known.get(rel)
            if same is not None and same.sha256 == sha:
                return same  # (a symbol is never changed once indexed: one serves both)
            return index_file(rel, src, parses, sha)

        index = cls(root, (entry(rel, src) for rel, src in sources.items()), parses)
        index._text.update(sources)  # each file is read once
        return index

    @cached_property
    def by_name(self) -> dict[str, list[Symbol]]:
        """Symbols by their unqualified name (built on first use: only lookups need it)."""
        names: dict[str, list[Symbol]] = defaultdict(list)
        for sym in self.symbols:
            names[sym.name].append(sym)
        return names

    def find(self, name: str, kinds: Collection[str] | None = None) -> list[Symbol]:
        """Symbols called `name`, in index order. An unqualified name matches in any scope;
        a qualified one matches that qualified name and any it ends (`kv::f` finds
        `ns::kv::f`). `kinds` keeps those kinds only."""
        found = self.by_name.get(name.rsplit("::", 1)[-1], [])
        if "::" in name:
            found = [s for s in found if s.qualname == name or s.qualname.endswith(f"::{name}")]
        return [s for s in found if kinds is None or s.kind in kinds]

    def enclosing(self, file: str, line: int) -> Symbol | None:
        """The innermost definition whose lines hold `line` (1-based) of `file`.

        A function or method (lambdas and `#if` blocks inside it included), a class, struct,
        union or enum, or a file-scope declaration, variable or macro; a line on a field,
        a method declaration or an enumerator answers with its class or enum (an anonymous
        enum's enumerator at file scope with itself). None for a line between definitions.
        """
        if file not in self.files:
            raise TreeError(f"{file} is not in the index of {self.root}")
        holding = sorted((s for s in self.files[file].symbols
                          if s.start_line <= line <= s.end_line),
                         key=lambda s: s.end_byte - s.start_byte)
        for at, sym in enumerate(holding):
            if sym.kind in _MEMBERS and any(o.kind in _CONTAINER_KINDS
                                            for o in holding[at + 1:]):
                continue
            return sym
        return None

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
        """The members of a class (fields, methods, nested types) or an enum (enumerators)."""
        return [s for s in self.by_scope.get(cls_sym.qualname, ())
                if s.file == cls_sym.file and cls_sym.start_byte <= s.start_byte < cls_sym.end_byte]

    def syntax(self, sym: Symbol) -> Node:
        """A syntax tree that covers `sym`, in the file's own byte and line coordinates.

        The whole file's parse when this index made it (a cold run); otherwise tree-sitter
        parses only the symbol's range of the file, so that a warm run never parses a file.
        """
        return self.parses.syntax(self.source(sym.file), self.files[sym.file].sha256,
                                  sym.start_byte, sym.end_byte)
