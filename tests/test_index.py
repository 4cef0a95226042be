"""The tree-sitter index: symbols, signatures, errors contained, and the content-hash cache."""

from __future__ import annotations

import errno
import gc
import marshal
import weakref
from pathlib import Path

import pytest

from portkit import index as index_mod
from portkit.errors import PortkitError
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
    ParseCache,
    Symbol,
    calls,
    flat,
    flat_all,
    param_arity,
    parse_source,
)

SNIPPET = b"""
namespace outer {
struct cache : public base {
    int n_swa = 0;
    ggml_tensor * k_shift; // I32
    ggml_tensor * get_k(ggml_context * ctx, int32_t il) const;
    void reset() { clear(true); }
    template<typename T> T pick(T t);
    static int counter;
};
}

ggml_tensor * outer::cache::get_k(ggml_context * ctx, int32_t il) const {
    return ggml_view_4d(ctx, layers[il].k, 1, 2, 3, 4);
}

static std::unique_ptr<inp_kv> build_impl(ggml_context * ctx0, const llama_ubatch & ubatch = {}) {
    auto inp = std::make_unique<inp_kv>();
    inp->mask = ggml_new_tensor_4d(ctx0, GGML_TYPE_F32, 1, 2, 3, 4);
    return inp;
}

template <typename T>
T twice(T x) { return helper::twice(x); }
"""


def by_qual(symbols, qualname, kind):
    return [s for s in symbols if s.qualname == qualname and s.kind == kind]


def test_classes_fields_and_method_declarations():
    syms = parse_source(SNIPPET, "a.cpp").symbols
    (cls,) = by_qual(syms, "outer::cache", CLASS)
    assert cls.start_line == 3 and cls.body_start > cls.start_byte
    (field,) = by_qual(syms, "outer::cache::k_shift", FIELD)
    assert field.returns == "ggml_tensor *" and field.scope == "outer::cache"
    (static_field,) = by_qual(syms, "outer::cache::counter", FIELD)
    assert static_field.is_static
    (decl,) = by_qual(syms, "outer::cache::get_k", DECLARATION)
    assert decl.params == ["ggml_context *", "int32_t"] and decl.returns == "ggml_tensor *"
    assert by_qual(syms, "outer::cache::pick", DECLARATION)


def test_function_definitions_in_class_out_of_class_static_and_template():
    syms = parse_source(SNIPPET, "a.cpp").symbols
    (inline,) = by_qual(syms, "outer::cache::reset", FUNCTION)
    (out,) = by_qual(syms, "outer::cache::get_k", FUNCTION)
    assert out.start_line == 13 and out.end_line == 15
    (impl,) = by_qual(syms, "build_impl", FUNCTION)
    assert impl.is_static and impl.returns == "std::unique_ptr<inp_kv>"
    assert impl.params == ["ggml_context *", "const llama_ubatch &"]
    (tmpl,) = by_qual(syms, "twice", FUNCTION)
    ix = Index(Path("."), [parse_source(SNIPPET, "a.cpp")])
    ix._text["a.cpp"] = SNIPPET
    assert ix.calls(inline) == {"clear"}
    assert ix.calls(out) == {"ggml_view_4d"}
    assert ix.calls(impl) == {"ggml_new_tensor_4d", "make_unique"}
    assert ix.calls(tmpl) == {"twice"}
    assert ix.calls_any(impl, ["make_unique", "nowhere"])
    assert not ix.calls_any(impl, ["mask"])  # a member, not a call


def test_params_and_types_are_read_on_demand_from_what_is_stored():
    syms = parse_source(SNIPPET, "a.cpp").symbols
    (impl,) = by_qual(syms, "build_impl", FUNCTION)
    assert impl.param_list == "(ggml_context * ctx0, const llama_ubatch & ubatch = {})"
    assert impl.params == ["ggml_context *", "const llama_ubatch &"]
    # names, defaults and the ellipsis go; the types keep the index's one spelling
    assert index_mod.param_types("(int (*cb)(int), float = 1.0f, ...)") == (
        index_mod.squash("int (*)(int)"), "float")


def test_fingerprint_ignores_layout_and_comments_but_not_code():
    a = index_mod.fingerprint("{ int x = 1; // one\n return x; }")
    b = index_mod.fingerprint("{\n    int x=1;\n    /* c */ return x;\n}")
    c = index_mod.fingerprint("{ int x = 2; return x; }")
    assert a == b != c
    src = b"int f() { int x = 1; return x; }\nint g() {\n  int x=1; // same\n  return x;\n}\n"
    ix = Index(Path("."), [parse_source(src, "f.cpp")])
    ix._text["f.cpp"] = src
    f, g = ix.symbols
    assert ix.fingerprint(f) == ix.fingerprint(g) == index_mod.fingerprint(ix.body(f))


def test_parse_errors_are_contained_and_reported():
    src = b"""
#define DECL(x) int x
DECL(a) DECL(b) @@@ ;
int fine(int v) { return v + 1; }
struct s { int ok; };
"""
    result = parse_source(src, "m.cpp")
    assert result.errors, "the broken macro line is reported"
    assert by_qual(result.symbols, "fine", FUNCTION)
    assert by_qual(result.symbols, "s::ok", FIELD)


def test_warm_index_parses_nothing(registry_tree, tmp_path, monkeypatch):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path))
    root = registry_tree("0.3.17") / "vendor" / "llama.cpp"
    patterns = ["src/llama-kv-cache.*", "src/llama-graph.*"]
    cold = Index.build(root, patterns)
    calls = []
    real = index_mod.parse_source
    monkeypatch.setattr(index_mod, "parse_source", lambda *a: calls.append(a) or real(*a))
    warm = Index.build(root, patterns)
    assert calls == []
    assert warm.symbols == cold.symbols  # every field survives the cache
    assert len(cold.symbols) > 300


def test_changed_file_is_reparsed(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "t" / "src"
    src.mkdir(parents=True)
    (src / "a.cpp").write_text("int f() { return 1; }\n")
    assert [s.name for s in Index.build(tmp_path / "t", ["src/*.cpp"]).symbols] == ["f"]
    (src / "a.cpp").write_text("int g() { return 1; }\n")
    assert [s.name for s in Index.build(tmp_path / "t", ["src/*.cpp"]).symbols] == ["g"]


def _cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
            ) -> tuple[list[Symbol], Path]:
    """One file `a.cpp` holding `text`, indexed with a cache of its own: its symbols and
    its cache entry."""
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.cpp").write_text(text)
    symbols = Index.build(tmp_path / "t", ["*.cpp"]).symbols
    [entry] = (tmp_path / "cache" / "index").rglob("*.marshal")
    return symbols, entry


def test_damaged_cache_entry_is_indexed_again(tmp_path, monkeypatch):
    first, entry = _cached(tmp_path, monkeypatch,
                           "struct s { int n; };\nint f(s x) { return x.n; }\n")
    entry.write_bytes(entry.read_bytes()[:20])  # as a killed run or a full disk leaves it
    assert Index.build(tmp_path / "t", ["*.cpp"]).symbols == first
    assert len(marshal.loads(entry.read_bytes())["columns"]["name"]) == len(first)  # whole again


def _hostile(data: dict) -> None:
    """Entries a hostile hand (or a bug of another version) could leave, each well formed
    marshal: a field of the wrong type, a span outside the file, columns that disagree."""
    cols = data["columns"]
    yield {**data, "columns": {**cols, "start_line": [str(n) for n in cols["start_line"]]}}
    yield {**data, "columns": {**cols, "end_byte": [n + 10_000 for n in cols["end_byte"]]}}
    yield {**data, "columns": {**cols, "start_line": [0 for _ in cols["start_line"]]}}
    yield {**data, "columns": {**cols, "body_start": [n + 1 for n in cols["body_end"]]}}
    yield {**data, "columns": {**cols, "name": cols["name"][:-1]}}
    yield {**data, "columns": {k: v for k, v in cols.items() if k != "kind"}}
    yield {**data, "columns": {**cols, "is_static": [1 for _ in cols["is_static"]]}}
    yield {**data, "errors": ["3"]}
    yield {**data, "words": [b"n"]}
    yield [data]


def test_a_cached_entry_that_is_not_believable_is_indexed_again(tmp_path, monkeypatch):
    """The index cache is input like any other: an entry whose fields have other types, or
    whose spans fall outside the file, is not believed (no wrong symbol, no traceback later);
    the file is indexed again and the entry written whole."""
    first, entry = _cached(tmp_path, monkeypatch, "struct s { int n; };\nenum e { A = 1 };\n"
                           "#define M(x) (x)\nint f(s x) { return x.n; }\n")
    good = marshal.loads(entry.read_bytes())
    assert index_mod._believable(good, (tmp_path / "t" / "a.cpp").stat().st_size)
    for bad in _hostile(good):
        entry.write_bytes(marshal.dumps(bad))
        assert Index.build(tmp_path / "t", ["*.cpp"]).symbols == first
        assert marshal.loads(entry.read_bytes()) == good  # written whole again


def test_a_full_disk_under_the_cache_indexes_all_the_same(tmp_path, monkeypatch):
    fresh, entry = _cached(tmp_path, monkeypatch, "int f() { return 1; }\n")
    entry.unlink()
    write = Path.write_bytes

    def full(path: Path, data: bytes) -> int:
        if path.suffix == ".tmp":
            write(path, data[:3])
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(path, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    assert Index.build(tmp_path / "t", ["*.cpp"]).symbols == fresh
    assert not list(entry.parent.iterdir())  # no entry, and no half-written one left


def test_the_names_a_file_uses_come_from_the_cache_as_they_were_read(tmp_path, monkeypatch):
    """The follow engine asks of every indexed file which names it uses: the cached entry
    keeps them (no reading of the text again), the same as reading the file gives; an
    entry without them (hostile, or damaged) is indexed again."""
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "t").mkdir()
    text = "struct s { int n; };\n// a_comment_word\nint f(s x) { return x.n; }\n"
    (tmp_path / "t" / "a.cpp").write_text(text)
    cold = Index.build(tmp_path / "t", ["*.cpp"]).files["a.cpp"].words
    assert cold == index_mod.words_of(text.encode())
    assert {"struct", "s", "n", "a_comment_word", "f", "x", "return"} <= cold
    warm = Index.build(tmp_path / "t", ["*.cpp"]).files["a.cpp"].words
    assert warm == cold
    [entry] = (tmp_path / "cache" / "index").rglob("*.marshal")
    data = marshal.loads(entry.read_bytes())
    del data["words"]
    entry.write_bytes(marshal.dumps(data))
    assert Index.build(tmp_path / "t", ["*.cpp"]).files["a.cpp"].words == cold
    assert "words" in marshal.loads(entry.read_bytes())  # whole again


@pytest.mark.parametrize("version", ["0.3.16", "0.3.36"])
def test_real_tree_bodies_are_sliced_exactly(registry_tree, version):
    root = registry_tree(version) / "vendor" / "llama.cpp"
    ix = Index.build(root, ["src/llama-graph.cpp"])
    fns = [s for s in ix.symbols if s.kind == FUNCTION]
    assert len(fns) > 50
    for sym in fns:
        assert ix.body(sym).startswith("{") and ix.body(sym).endswith("}")
        assert Path(sym.file) == Path("src/llama-graph.cpp")


# -- enums, variables, macros -------------------------------------------------------------

C_SNIPPET = b"""\
#define GGML_MAX_DIMS 4
#define GGML_ASSERT(x, ...) \\
    do {                     \\
        if (!(x)) abort();   \\
    } while (0)
#define EMPTY

enum llm_arch {
    LLM_ARCH_LLAMA,
    LLM_ARCH_QWEN2 = 5,
};

typedef enum { GGML_STATUS_OK, GGML_STATUS_FAILED } ggml_status;

static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {
    { LLM_ARCH_LLAMA, "llama" },
};

static const char * names[] = { "a", "b" };
int counter, * counter_ptr = nullptr;

LLAMA_API const char * llama_name(void);

namespace ns {
struct kv_cache {
    enum class mode : uint8_t { fast, slow };
    int n = 0;
    void (*callback)(void * data);
    union { int u1; float u2; };
    int size() const { return n; }
    void grow(int by);
    template <typename T>
    T pick(T a) {
        return a;
    }
};
}

void ns::kv_cache::grow(int by) {
    auto step = [&](int k) {
        n += k;
    };
#ifdef GGML_USE_FAST
    step(by * 2);
#else
    step(by);
#endif
}

#ifdef __cplusplus
extern "C" {
#endif
static int helper(int x) {
    return x + 1;
}
#ifdef __cplusplus
}
#endif

typedef struct {
    float d;
    uint8_t qs[32];
} block_q4_0;

const int ns::kv_cache_limit = 3;
"""


def snippet_index(src: bytes = C_SNIPPET, rel: str = "a.cpp") -> Index:
    ix = Index(Path("."), [parse_source(src, rel)])
    ix._text[rel] = src
    return ix


def line_of(src: bytes, text: bytes) -> int:
    return src[: src.index(text)].count(b"\n") + 1


def test_enums_and_their_enumerators():
    ix = snippet_index()
    (arch,) = ix.find("llm_arch", {ENUM})
    assert (arch.start_line, arch.end_line) == (8, 11)
    assert [m.name for m in ix.members(arch)] == ["LLM_ARCH_LLAMA", "LLM_ARCH_QWEN2"]
    (qwen,) = ix.find("LLM_ARCH_QWEN2")
    # a plain enum's enumerators live in its enclosing scope
    assert (qwen.kind, qwen.qualname, qwen.scope) == (ENUMERATOR, "LLM_ARCH_QWEN2", "llm_arch")
    assert ix.body(qwen) == "5" and ix.body(ix.find("LLM_ARCH_LLAMA")[0]) == ""
    (status,) = ix.find("ggml_status")  # a typedef names its anonymous enum
    assert status.kind == ENUM and ix.text(status).startswith("typedef enum {")
    assert {m.qualname for m in ix.members(status)} == {"GGML_STATUS_OK", "GGML_STATUS_FAILED"}
    (mode,) = ix.find("kv_cache::mode")
    assert (mode.kind, mode.qualname, mode.returns) == (ENUM, "ns::kv_cache::mode", "uint8_t")
    assert [m.qualname for m in ix.members(mode)] == ["ns::kv_cache::mode::fast",
                                                     "ns::kv_cache::mode::slow"]


def test_anonymous_enums_give_their_names_to_their_scope():
    src = b"""\
struct cpt_flags {
    enum {
        NUMBER = 0x0002,
        LETTER = 0x0004,
    };
    uint16_t is_number : 1;
};
enum { GGML_MAX_NAME = 64 };
"""
    ix = snippet_index(src)
    (flags,) = ix.find("cpt_flags")
    assert [m.name for m in ix.members(flags)] == ["NUMBER", "LETTER", "is_number"]
    assert ix.find("cpt_flags::LETTER")[0].kind == ENUMERATOR
    assert ix.enclosing("a.cpp", 4).qualname == "cpt_flags"
    (max_name,) = ix.find("GGML_MAX_NAME")
    assert (max_name.qualname, ix.body(max_name)) == ("GGML_MAX_NAME", "64")
    assert ix.enclosing("a.cpp", 8) is max_name  # no enum to stand for


def test_file_scope_variables_with_their_types_and_initialisers():
    ix = snippet_index()
    (names_map,) = ix.find("LLM_ARCH_NAMES")
    assert names_map.kind == VARIABLE and names_map.is_static
    assert names_map.returns == "const std::map<llm_arch, const char *>"
    assert (names_map.start_line, names_map.end_line) == (15, 17)
    assert ix.body(names_map).startswith("{") and "LLM_ARCH_LLAMA" in ix.body(names_map)
    (names,) = ix.find("names", {VARIABLE})
    assert names.returns == "const char * []"
    counter, counter_ptr = ix.find("counter") + ix.find("counter_ptr")
    assert (counter.returns, counter_ptr.returns) == ("int", "int *")
    assert not counter.is_static and ix.body(counter_ptr) == "nullptr"
    (limit,) = ix.find("kv_cache_limit")  # a member defined out of its class
    assert (limit.kind, limit.qualname, limit.returns) == (VARIABLE, "ns::kv_cache_limit",
                                                          "const int")
    assert not ix.find("step"), "a lambda inside a function is part of the function"


def test_macros_object_like_and_function_like():
    ix = snippet_index()
    (dims,) = ix.find("GGML_MAX_DIMS")
    assert (dims.kind, dims.params, ix.body(dims), dims.signature()) == (
        MACRO, [], "4", "GGML_MAX_DIMS")
    (assert_,) = ix.find("GGML_ASSERT")
    assert assert_.params == ["x", "..."] and assert_.signature() == "GGML_ASSERT(x, ...)"
    assert (assert_.start_line, assert_.end_line) == (2, 5), "continuation lines, no newline"
    assert ix.text(assert_).endswith("while (0)")
    (empty,) = ix.find("EMPTY")
    assert empty.end_line == 6 and ix.body(empty) == ""


def test_types_keep_qualifiers_arrays_and_see_past_export_macros():
    ix = snippet_index()
    (name,) = ix.find("llama_name")
    assert (name.kind, name.returns, name.params) == (DECLARATION, "const char *", ["void"])
    exported = parse_source(b"GGML_BACKEND_API ggml_backend_t ggml_backend_cpu_init(void);",
                            "b.h").symbols
    assert [(s.qualname, s.returns) for s in exported] == [("ggml_backend_cpu_init",
                                                            "ggml_backend_t")]
    (qs,) = ix.find("block_q4_0::qs")
    assert (qs.kind, qs.returns) == (FIELD, "uint8_t [32]")
    (block,) = ix.find("block_q4_0", {CLASS})  # a typedef names its anonymous struct
    assert [m.name for m in ix.members(block)] == ["d", "qs"]
    (callback,) = ix.find("callback")  # a function pointer is data, not a method
    assert callback.kind == FIELD
    assert callback.returns == index_mod.squash("void (*)(void * data)")
    assert {m.name for m in ix.members(ix.find("kv_cache", {CLASS})[0])} >= {"u1", "u2", "mode"}


def test_find_by_unqualified_qualified_and_partly_qualified_name():
    ix = snippet_index()
    assert [s.kind for s in ix.find("grow")] == [DECLARATION, FUNCTION]
    assert [s.kind for s in ix.find("ns::kv_cache::grow", {FUNCTION})] == [FUNCTION]
    assert [s.qualname for s in ix.find("kv_cache::grow")] == ["ns::kv_cache::grow"] * 2
    assert ix.find("other::grow") == [] and ix.find("nowhere") == []


@pytest.mark.parametrize("text,expected", [
    (b"#define GGML_ASSERT", ("macro", "GGML_ASSERT")),
    (b"        if (!(x)) abort();", ("macro", "GGML_ASSERT")),
    (b"    LLM_ARCH_QWEN2 = 5,", ("enum", "llm_arch")),
    (b"    { LLM_ARCH_LLAMA, \"llama\" },", ("variable", "LLM_ARCH_NAMES")),
    (b"int counter,", ("variable", "counter")),
    (b"LLAMA_API const char", ("declaration", "llama_name")),
    (b"    enum class mode", ("enum", "ns::kv_cache::mode")),
    (b"    int n = 0;", ("class", "ns::kv_cache")),  # a field stands for its class
    (b"    void grow(int by);", ("class", "ns::kv_cache")),  # and a method declaration
    (b"    union {", ("class", "ns::kv_cache")),
    (b"    int size() const", ("function", "ns::kv_cache::size")),  # in-class inline method
    (b"    template <typename T>", ("function", "ns::kv_cache::pick")),
    (b"        return a;", ("function", "ns::kv_cache::pick")),
    (b"void ns::kv_cache::grow", ("function", "ns::kv_cache::grow")),  # out of class
    (b"        n += k;", ("function", "ns::kv_cache::grow")),  # in a lambda
    (b"#ifdef GGML_USE_FAST", ("function", "ns::kv_cache::grow")),
    (b"    step(by);", ("function", "ns::kv_cache::grow")),  # in an #else branch
    (b"    return x + 1;", ("function", "helper")),  # static, in extern "C" under #ifdef
    (b"    float d;", ("class", "block_q4_0")),
    (b"} block_q4_0;", ("class", "block_q4_0")),
    (b"const int ns::kv_cache_limit", ("variable", "ns::kv_cache_limit")),
])
def test_enclosing_is_the_innermost_definition(text, expected):
    ix = snippet_index()
    found = ix.enclosing("a.cpp", line_of(C_SNIPPET, text))
    assert found is not None and (found.kind, found.qualname) == expected


@pytest.mark.parametrize("line", [b"", b"namespace ns {", b"}", b"#ifdef __cplusplus",
                                  b'extern "C" {'])
def test_enclosing_between_definitions_is_none(line):
    ix = snippet_index()
    number = C_SNIPPET.split(b"\n").index(line) + 1  # its first occurrence
    assert ix.enclosing("a.cpp", number) is None


def test_enclosing_of_a_file_not_indexed_is_an_error():
    with pytest.raises(PortkitError, match="not in the index"):
        snippet_index().enclosing("b.cpp", 1)


# -- the parse cache is the index's own --------------------------------------------------


def write_tree(root: Path, files: int, body: str) -> None:
    (root / "src").mkdir(parents=True)
    for n in range(files):
        (root / "src" / f"f{n}.cpp").write_text(f"int f{n}() {{ {body} }}\n")


def test_two_indexes_keep_their_own_parses(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path / "cache"))
    write_tree(tmp_path / "base", 2, "return 1;")
    write_tree(tmp_path / "target", 40, "return 2;")  # more files than a cache keeps
    base = Index.build(tmp_path / "base", ["src/*.cpp"])
    target = Index.build(tmp_path / "target", ["src/*.cpp"])
    assert base.parses is not target.parses
    ranged = []
    real = index_mod._ranged_parser
    monkeypatch.setattr(index_mod, "_ranged_parser", lambda *a: ranged.append(a) or real(*a))
    for sym in base.symbols:  # the target's parses evicted none of the base's
        node = base.syntax(sym)
        assert base.source(sym.file)[node.start_byte : node.end_byte].startswith(b"int f")
    assert ranged == []
    evicted = target.symbols[0]  # the target's own cache keeps its last 32 files
    assert "return 2" in target.body(evicted)
    target.syntax(evicted)
    assert len(ranged) == 1


def test_parse_cache_goes_with_its_index(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path / "cache"))
    write_tree(tmp_path / "t", 3, "return 1;")
    index = Index.build(tmp_path / "t", ["src/*.cpp"])
    cache = weakref.ref(index.parses)
    del index
    gc.collect()
    assert cache() is None


def test_a_parse_cache_keeps_the_last_files_it_parsed():
    cache = ParseCache(keep=2)
    for n in range(3):
        cache.parse(f"int x{n};".encode(), f"sha{n}")
    src = b"int x0;"
    node = cache.syntax(src, "sha0", 0, len(src))  # forgotten: parsed again, by range
    assert node.type == "translation_unit"
    assert cache.parse(b"int x2;", "sha2") is cache.parse(b"int x2;", "sha2")


# -- real trees ----------------------------------------------------------------------------


def test_enclosing_on_a_real_out_of_class_method(registry_tree):
    root = registry_tree("0.3.16") / "vendor" / "llama.cpp"
    ix = Index.build(root, ["src/llama-kv-cache-unified.*"])
    (cpy_k,) = ix.find("llama_kv_cache_unified::cpy_k", {FUNCTION})
    src = ix.source(cpy_k.file)
    inside = line_of(src[cpy_k.body_start :], b"ggml_view_") + src.count(
        b"\n", 0, cpy_k.body_start)
    assert cpy_k.start_line < inside < cpy_k.end_line
    assert ix.enclosing(cpy_k.file, inside) is cpy_k
    assert ix.enclosing(cpy_k.file, cpy_k.end_line + 1) is None
    (decl,) = ix.find("llama_kv_cache_unified::cpy_k", {DECLARATION})
    assert ix.enclosing(decl.file, decl.start_line).qualname == "llama_kv_cache_unified"


@pytest.mark.parametrize("files", [["ggml/src/ggml.c", "ggml/src/ggml-cpu/ggml-cpu.c"],
                                   ["src/llama-kv-cache.cpp", "src/llama-model.cpp"]])
def test_every_definition_encloses_its_own_lines(registry_tree, files):
    root = registry_tree("0.3.36") / "vendor" / "llama.cpp"
    ix = Index.build(root, files)
    defined = [s for s in ix.symbols if s.kind in {FUNCTION, CLASS, ENUM}]
    assert len(defined) > 150
    for sym in defined:
        found = ix.enclosing(sym.file, (sym.start_line + sym.end_line) // 2)
        assert found is not None
        assert sym.start_byte <= found.start_byte and found.end_byte <= sym.end_byte, sym.where


def test_real_enumerators_and_macros(registry_tree):
    root = registry_tree("0.3.17") / "vendor" / "llama.cpp"
    ix = Index.build(root, ["src/llama-arch.*", "ggml/include/ggml.h"])
    (qwen2,) = ix.find("LLM_ARCH_QWEN2")
    assert (qwen2.kind, qwen2.file, qwen2.scope) == (ENUMERATOR, "src/llama-arch.h", "llm_arch")
    (assert_,) = ix.find("GGML_ASSERT")
    assert (assert_.kind, assert_.file, assert_.params) == (MACRO, "ggml/include/ggml.h", ["x"])
    (names,) = ix.find("LLM_ARCH_NAMES")
    assert names.kind == VARIABLE and names.returns == "const std::map<llm_arch, const char *>"
    assert '"qwen2"' in ix.body(names)
    (add,) = ix.find("ggml_add", {DECLARATION})
    assert add.returns == "struct ggml_tensor *", "GGML_API is not the return type"


@pytest.mark.parametrize(("params", "arity"), [
    ("(void)", (0, 0)),
    ("()", (0, 0)),
    ("(int a, float b = 1.0f)", (1, 2)),
    ("(const std::map<int, int> & m, int n = 0, ...)", (1, None)),
    ("(Args &&... args)", (0, None)),
    ("((((", (0, None)),  # not a list tree-sitter reads: no claim
])
def test_param_arity_counts_what_a_call_may_pass(params, arity):
    assert param_arity(params) == arity


def test_calls_are_free_or_qualified_names_with_their_argument_count():
    code = ("cur = build_attn(inp, gf,\n    q, f(x, y), {1, 2}, 1.0f/sqrtf(n), il);\n"
            "ctx->run(1, 2);\nggml::init();\ncb(x, \"a, b\");\n")
    assert sorted(calls(code)) == sorted([("build_attn", 7), ("f", 2), ("sqrtf", 1),
                                          ("ggml::init", 0), ("cb", 2)])


def test_flat_all_flattens_each_line_as_flat_does():
    text = ("int  x = 1; // one\n\tfoo( a,\u00a0b );\n/* a */ y /* b */ = 2;\n/* open\n"
            "  still */ z;\n\u3000w\u2003v\x1c\n\n   \n#define A(x)  (x)\n")
    lines = text.splitlines()
    assert flat_all(lines) == [flat(line) for line in lines]
    assert flat_all(lines)[:3] == ["intx=1;", "foo(a,b);", "y=2;"]
    assert flat_all([]) == []


def test_an_index_built_beside_another_shares_the_files_both_trees_have_alike(tmp_path,
                                                                             monkeypatch):
    """Index.build(..., beside): a file with the same path and content as in the other tree
    takes the other's entry; a changed or new file is indexed on its own; the symbols are
    those of the index built alone."""
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path / "cache"))
    old, new = tmp_path / "old", tmp_path / "new"
    for root, b_text in ((old, "int g() { return 2; }\n"), (new, "int h() { return 3; }\n")):
        (root / "src").mkdir(parents=True)
        (root / "src" / "a.cpp").write_text("int f() { return 1; }\n")
        (root / "src" / "b.cpp").write_text(b_text)
    (new / "src" / "c.cpp").write_text("struct c_only { int n; };\n")
    base = Index.build(old, ["src/*.cpp"])
    beside = Index.build(new, ["src/*.cpp"], base)
    alone = Index.build(new, ["src/*.cpp"])
    assert beside.files["src/a.cpp"] is base.files["src/a.cpp"]
    assert beside.files["src/b.cpp"] is not base.files["src/b.cpp"]
    assert beside.symbols == alone.symbols
    assert [s.name for s in beside.symbols] == ["f", "h", "c_only", "n"]
