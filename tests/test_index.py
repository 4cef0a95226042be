"""The tree-sitter index: symbols, signatures, errors contained, and the content-hash cache."""

from __future__ import annotations

import marshal
from pathlib import Path

import pytest

from portkit import index as index_mod
from portkit.index import CLASS, DECLARATION, FIELD, FUNCTION, Index, parse_source

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


def test_damaged_cache_entry_is_indexed_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.cpp").write_text("struct s { int n; };\nint f(s x) { return x.n; }\n")
    first = Index.build(tmp_path / "t", ["*.cpp"]).symbols
    [entry] = (tmp_path / "cache" / "index").rglob("*.marshal")
    entry.write_bytes(entry.read_bytes()[:20])  # as a killed run or a full disk leaves it
    assert Index.build(tmp_path / "t", ["*.cpp"]).symbols == first
    assert len(marshal.loads(entry.read_bytes())["symbols"]) == len(first)  # whole again


@pytest.mark.parametrize("version", ["0.3.16", "0.3.36"])
def test_real_tree_bodies_are_sliced_exactly(registry_tree, version):
    root = registry_tree(version) / "vendor" / "llama.cpp"
    ix = Index.build(root, ["src/llama-graph.cpp"])
    fns = [s for s in ix.symbols if s.kind == FUNCTION]
    assert len(fns) > 50
    for sym in fns:
        assert ix.body(sym).startswith("{") and ix.body(sym).endswith("}")
        assert Path(sym.file) == Path("src/llama-graph.cpp")
