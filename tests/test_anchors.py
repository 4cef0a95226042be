"""The kv-rotation anchors on five real trees, on an ollama-style fork, and on damaged copies."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from portkit import index as index_mod
from portkit.anchors import (
    ALIAS,
    EXACT,
    SIMILARITY,
    STRUCTURE,
    AnchorSet,
    AnchorSpec,
    Candidate,
    Locator,
    Resolver,
    _shingles,
    aliases_of,
    find,
    load_anchor_set,
    locate,
    todays_names,
)
from portkit.cli import cli
from portkit.errors import AnchorError
from portkit.features import load_anchors, resolve_feature
from portkit.index import (
    CLASS,
    DECLARATION,
    ENUMERATOR,
    FIELD,
    FUNCTION,
    MACRO,
    VARIABLE,
    Index,
    parse_source,
)
from portkit.report import PIPE_WIDTH, emit_table, fit_widths
from portkit.tree import detect

from .conftest import REGISTRY_VERSIONS, rope_shift_span
from .test_tree import make_ollama_fork


def resolved(path: Path):
    index, res = resolve_feature(detect(path), "kv-rotation")
    return index, res


def line_of(index: Index, rel: str, offset: int) -> str:
    src = index.source(rel)
    start = src.rindex(b"\n", 0, offset) + 1 if offset else 0
    return src[start : src.find(b"\n", offset)].decode()


@pytest.mark.parametrize("version", REGISTRY_VERSIONS)
def test_every_rotation_anchor_resolves_to_the_right_code(registry_tree, version):
    index, res = resolved(registry_tree(version))
    errors = {k: r.note for k, r in res.items() if r.status == "error"}
    assert errors == {}

    rope = res["kv-cache.rope-shift"]
    body = index.body(rope.symbol)
    assert "ggml_is_quantized" in body and "ggml_rope_ext" in body
    src = index.source(rope.symbol.file)
    branch = src.index(b"ggml_is_quantized", rope.symbol.body_start)
    other = src.index(b"} else {", branch)
    for name, call in (("unrotate", b"ggml_rope_ext"), ("rerotate", b"ggml_rope_ext")):
        point = rope.points[name]
        assert branch < point.start < other, f"{name} is inside the quantized branch"
        assert call in src[point.start : point.end]
    assert rope.points["rot-param"].statement.startswith("ggml_tensor * ")

    for overload, first in (("graph.build-attn-kv", "llm_graph_input_attn_kv"),
                            ("graph.build-attn-iswa", "llm_graph_input_attn_kv_iswa")):
        sym = res[overload].symbol
        assert re.sub(r"_unified", "", sym.params[0]) == f"{first} *"
        assert "cpy_k" in index.body(sym) and "cpy_v" in index.body(sym)
        out = res[overload].points["rotate-out"]
        assert '"kqv_out"' in index.source(sym.file)[out.start : out.end].decode()

    ctor = res["kv-cache.ctor"]
    assert "getenv" in line_of(index, ctor.symbol.file, ctor.points["decide"].offset)
    assert res["graph.inp-kv-impl"].points["inputs"].statement == "return inp;"
    shift = res["kv-cache.graph-shift"]
    assert "build_rope_shift(" in shift.points["call"].statement


def test_warm_resolution_parses_no_whole_file_and_lands_where_cold_did(registry_tree, tmp_path,
                                                                       monkeypatch):
    """A warm run parses only the definitions whose statements it needs, in file coordinates."""
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path))
    tree = detect(registry_tree("0.3.17"))
    _, cold = resolve_feature(tree, "kv-rotation")
    whole_file_parses = []
    real = index_mod.ParseCache.parse
    monkeypatch.setattr(index_mod.ParseCache, "parse",
                        lambda self, *a: whole_file_parses.append(a) or real(self, *a))
    _, warm = resolve_feature(tree, "kv-rotation")  # a new index: only the disk cache is warm
    assert whole_file_parses == []
    statement_points = [p for r in cold.values() for p in r.points.values() if p.start >= 0]
    assert len(statement_points) > 10
    assert {k: r.points for k, r in warm.items()} == {k: r.points for k, r in cold.items()}


def test_old_tree_reaches_the_unified_names_through_aliases(registry_tree):
    _, res = resolved(registry_tree("0.3.16"))
    cls = res["kv-cache.class"]
    assert (cls.strategy, cls.symbol.qualname) == ("alias", "llama_kv_cache_unified")
    assert cls.symbol.file == "src/llama-kv-cache-unified.h"
    assert res["graph.inp-kv.class"].symbol.qualname == "llm_graph_input_attn_kv_unified"
    iswa = res["graph.build-attn-iswa"]
    assert iswa.strategy == "structure", "the iSWA work is done in build_attn_with_sinks there"
    assert iswa.symbol.name == "build_attn_with_sinks"
    assert res["graph.inp-mem-hybrid.set-input"].status == "absent"


@pytest.mark.parametrize("version,expected", [
    ("0.3.16", None), ("0.3.17", "build_kq_mask"), ("0.3.19", "build_kq_mask"),
    ("0.3.20", "build_attn_inp_kq_mask"), ("0.3.36", "build_attn_inp_kq_mask"),
])
def test_mask_neighbourhood_is_reported_as_it_is(registry_tree, version, expected):
    _, res = resolved(registry_tree(version))
    mask = res["graph.kq-mask"]
    if expected is None:
        assert mask.status == "absent" and "inline" in mask.note
    else:
        assert mask.symbol.name == expected
        assert mask.strategy == ("exact" if expected == "build_attn_inp_kq_mask" else "alias")


@pytest.mark.parametrize("version", REGISTRY_VERSIONS)
def test_shared_cache_path_only_in_recent_upstream(registry_tree, version):
    index, res = resolved(registry_tree(version))
    shared = res["kv-cache.shared-ctor"]
    if version == "0.3.36":
        assert shared.found and "other->layers" in index.body(shared.symbol)
    else:
        assert shared.status == "absent" and "not applicable" in shared.note


@pytest.mark.parametrize("version,kind", [("0.3.16", FIELD), ("0.3.17", DECLARATION)])
def test_head_size_shape_is_visible(registry_tree, version, kind):
    _, res = resolved(registry_tree(version))
    assert res["hparams.head-size-k"].symbol.kind == kind


def test_ollama_fork_resolves_like_its_tree(registry_tree, tmp_path):
    fork = make_ollama_fork(registry_tree("0.3.17"), tmp_path / "fork", "49bfddec")
    runner = CliRunner()
    out = runner.invoke(cli, ["anchors", "--tree", str(fork), "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["tree"]["layout"] == "ollama" and data["tree"]["pin"] == "49bfddec"
    assert data["tree"]["pin_source"] == "Makefile.sync FETCH_HEAD"
    by_id = {a["id"]: a for a in data["anchors"]}
    _, direct = resolved(registry_tree("0.3.17"))
    for anchor_id, res in direct.items():
        assert by_id[anchor_id]["status"] == res.status
        if res.found:
            assert by_id[anchor_id]["lines"] == [res.symbol.start_line, res.symbol.end_line]


# -- damaged trees ------------------------------------------------------------------------


def edit(path: Path, old: str, new: str, count: int = -1) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, count))


def test_deleted_target_is_a_clear_error(small_tree):
    root = small_tree("0.3.17")
    src = root / "src" / "llama-kv-cache.cpp"
    text = src.read_text()
    start, end = rope_shift_span(text)
    src.write_text(text[:start] + text[end:])
    result = CliRunner().invoke(cli, ["anchors", "--tree", str(root)])
    assert result.exit_code == 3
    err = result.output.strip().splitlines()[-1]
    assert err.startswith("portkit: 1 anchor(s) unresolved; first: anchor kv-cache.rope-shift:")
    assert "nearest:" in err


def test_renamed_target_is_found_by_structure(small_tree):
    root = small_tree("0.3.17")
    for name in ("llama-kv-cache.cpp", "llama-kv-cache.h"):
        edit(root / "src" / name, "build_rope_shift", "build_rope_shift_v2")
    _, res = resolved(root)
    rope = res["kv-cache.rope-shift"]
    assert (rope.strategy, rope.symbol.name) == ("structure", "build_rope_shift_v2")
    assert rope.confidence < 1.0 and "found by what it does" in rope.note


def test_renamed_class_is_found_through_its_alias(small_tree):
    root = small_tree("0.3.17")
    for name in ("llama-kv-cache.cpp", "llama-kv-cache.h", "llama-graph.cpp", "llama-graph.h"):
        text = (root / "src" / name).read_text()
        (root / "src" / name).write_text(
            re.sub(r"\bllama_kv_cache_context\b", "llama_kv_cache_unified_context", text))
    _, res = resolved(root)
    assert res["kv-ctx.class"].strategy == "alias"
    assert res["kv-ctx.class"].symbol.qualname == "llama_kv_cache_unified_context"


def test_two_lookalikes_are_ambiguous_never_a_silent_pick(small_tree):
    root = small_tree("0.3.17")
    src = root / "src" / "llama-kv-cache.cpp"
    text = src.read_text()
    start, end = rope_shift_span(text)
    body = text[start:end]
    twins = body.replace("build_rope_shift", "rope_shift_a") + "\n" + body.replace(
        "build_rope_shift", "rope_shift_b")
    src.write_text(text[:start] + twins + text[end:])
    _, res = resolved(root)
    rope = res["kv-cache.rope-shift"]
    assert rope.status == "error"
    assert "ambiguous by structure: 2 candidates" in rope.note
    assert "rope_shift_a" in rope.note and "rope_shift_b" in rope.note


def test_right_name_wrong_body_is_not_taken(small_tree):
    root = small_tree("0.3.17")
    edit(root / "src" / "llama-kv-cache.cpp", "if (ggml_is_quantized(cur->type)) {",
         "if (false) {")
    _, res = resolved(root)
    rope = res["kv-cache.rope-shift"]
    assert rope.status == "error"
    assert "lacks contains 'ggml_is_quantized'" in rope.note


def test_similarity_is_the_last_resort(registry_tree, tmp_path):
    root = registry_tree("0.3.17") / "vendor" / "llama.cpp"
    index = Index.build(root, ["src/llama-kv-cache.cpp"])
    spec = AnchorSpec(
        id="shift", what="function", name="kv::rope_shift_renamed",
        similar_to="""
            if (ggml_is_quantized(cur->type)) {
                tmp = ggml_cast(ctx, cur, GGML_TYPE_F32);
                tmp = ggml_rope_ext(ctx, tmp, shift, factors, n_rot, rope_type, n_ctx_orig,
                        freq_base, freq_scale, yarn_ext_factor, yarn_attn_factor,
                        yarn_beta_fast, yarn_beta_slow);
                tmp = ggml_cpy(ctx, tmp, cur);
            }""")
    res = Resolver(index).resolve(spec)
    assert res.strategy == "similarity" and res.symbol.name == "build_rope_shift"
    assert res.confidence >= 0.6
    assert res.runners_up and res.runners_up[0].confidence < res.confidence - 0.1
    strict = AnchorSpec(id="none", what="function", name="kv::nothing_like_it",
                        similar_to="for (;;) { launch_rockets(); }")
    with pytest.raises(AnchorError, match="nearest:"):
        Resolver(index).resolve(strict)


def test_spec_files_are_checked(tmp_path):
    bad = tmp_path / "anchors.toml"
    bad.write_text('[[anchor]]\nid = "x"\nwhat = "function"\nname = "f"\ncolour = "red"\n')
    with pytest.raises(Exception, match="unknown key colour"):
        load_anchor_set(bad)
    bad.write_text('[[anchor]]\nid = "x"\nwhat = "function"\nname = "f"\n'
                   '[anchor.points.p]\nbefore = "a"\nafter = "b"\n')
    with pytest.raises(Exception, match="exactly one of"):
        load_anchor_set(bad)


def test_shipped_anchor_set_covers_every_component():
    anchors: AnchorSet = load_anchors("kv-rotation")
    ids = {a.id for a in anchors.anchors}
    for needed in ("kv-cache.ctor", "kv-cache.rope-shift", "kv-cache.graph-shift",
                   "kv-cache.k-shift-input", "kv-ctx.class", "graph.build-attn-kv",
                   "graph.build-attn-iswa", "graph.inp-kv-iswa", "kv-cache.shared-ctor"):
        assert needed in ids


# -- ranked candidates, lookup and locate on synthetic trees --------------------------------


def snippet_index(files: dict[str, str]) -> Index:
    ix = Index(Path("."), [parse_source(text.encode(), rel) for rel, text in files.items()])
    ix._text.update({rel: text.encode() for rel, text in files.items()})
    return ix


SHIFT_BODY = """{
    ggml_tensor * tmp = ggml_cast(ctx, cur, GGML_TYPE_F32);
    tmp = ggml_rope_ext(ctx, tmp, shift, factors, n_rot, rope_type, n_ctx_orig);
    return ggml_cpy(ctx, tmp, cur);
}
"""

KV_TREE = {
    "kv.cpp": f"""
ggml_tensor * llama_kv_cache::build_rope_shift(ggml_context * ctx, ggml_tensor * cur) const
{SHIFT_BODY}
ggml_tensor * llama_kv_cache_unified::build_rope_shift(ggml_context * ctx, ggml_tensor * cur) const
{SHIFT_BODY}
ggml_tensor * llama_kv_cache::shift_copy(ggml_context * ctx, ggml_tensor * cur) const
{SHIFT_BODY}
ggml_tensor * llama_kv_cache::shift_other(ggml_context * ctx, ggml_tensor * cur) const {{
    return ggml_rope_ext(ctx, cur, nullptr);
}}
""",
}


def test_candidates_rank_every_strategy_without_settling():
    ix = snippet_index(KV_TREE)
    spec = AnchorSpec(id="shift", what="function", name="llama_kv_cache::build_rope_shift",
                      calls=("ggml_cast", "ggml_cpy"))
    ranked = Resolver(ix).candidates(spec)
    assert [(c.symbol.qualname, c.strategy, c.confidence) for c in ranked] == [
        ("llama_kv_cache::build_rope_shift", EXACT, 1.0),
        ("llama_kv_cache_unified::build_rope_shift", ALIAS, 0.95),
        ("llama_kv_cache::shift_copy", STRUCTURE, 0.8),
    ]
    assert Resolver(ix).resolve(spec).symbol is ranked[0].symbol  # what resolve settles on
    assert len(Resolver(ix).candidates(spec, limit=2)) == 2


def test_candidates_keep_what_resolve_calls_ambiguous_and_the_misfits():
    ix = snippet_index(KV_TREE)
    spec = AnchorSpec(id="shift", what="function", name="llama_kv_cache::shift_other",
                      calls=("ggml_cast",))
    with pytest.raises(AnchorError, match="ambiguous by structure: 3 candidates"):
        Resolver(ix).resolve(spec)
    ranked = Resolver(ix).candidates(spec)
    assert [c.strategy for c in ranked] == [STRUCTURE, STRUCTURE, STRUCTURE, EXACT]
    assert len({c.confidence for c in ranked[:3]}) == 1, "near-equals stay equal, all listed"
    misfit = ranked[-1]
    assert misfit.symbol.name == "shift_other" and misfit.confidence == 0.5
    assert misfit.why == "lacks calls ggml_cast"


def test_candidates_by_similarity_carry_their_scores():
    ix = snippet_index(KV_TREE)
    spec = AnchorSpec(id="s", what="function", name="kv::gone",
                      similar_to="tmp = ggml_rope_ext(ctx, tmp, shift, factors, n_rot);")
    ranked = Resolver(ix).candidates(spec)
    assert {c.strategy for c in ranked} == {SIMILARITY}
    assert ranked[0].confidence == Resolver(ix).similarity(spec, ranked[0].symbol) > 0.5
    assert ranked == sorted(ranked, key=lambda c: -c.confidence)


def test_runner_up_json_is_unchanged_and_ranked_candidates_say_how():
    sym = snippet_index(KV_TREE).symbols[0]
    assert Candidate(sym, 0.0, "lacks x").as_json() == {
        "name": sym.signature(), "where": sym.where, "score": 0.0, "why": "lacks x"}
    assert Candidate(sym, 0.95, "y", ALIAS).as_json()["strategy"] == ALIAS


def test_find_by_name_and_through_aliases():
    ix = snippet_index(KV_TREE | {"h.h": "#define build_rope_shift(x) x\nenum e { E_A };\n"})
    found = find(ix, "llama_kv_cache::build_rope_shift")
    assert [(c.symbol.qualname, c.strategy) for c in found] == [
        ("llama_kv_cache::build_rope_shift", EXACT),
        ("llama_kv_cache_unified::build_rope_shift", ALIAS)]
    assert [c.symbol.kind for c in find(ix, "build_rope_shift")] == [FUNCTION] * 2 + [MACRO]
    assert [c.symbol.kind for c in find(ix, "build_rope_shift", {MACRO})] == [MACRO]
    assert [c.symbol.where for c in find(ix, "E_A", {ENUMERATOR})] == ["h.h:2"]
    assert find(ix, "E_B") == []


BASE = {
    "graph.h": """
struct llama_hparams {
    uint32_t n_embd_head_k;
    uint32_t n_layer;
};
#define GGML_PAD(x, n) (((x) + (n) - 1) & ~((n) - 1))
static const char * LLM_NAMES[] = { "llama" };
float scale(float x);
float scale(int x);
""",
    "graph.cpp": f"""
ggml_tensor * build_kq_mask(ggml_context * ctx, ggml_tensor * cur)
{SHIFT_BODY}
struct kv_cells_old {{
    void reset() {{ used = 0; }}
    uint32_t size() const {{ return n; }}
    uint32_t used;
    uint32_t n;
}};
static ggml_tensor * rope_helper(ggml_context * ctx, ggml_tensor * cur)
{SHIFT_BODY.replace("GGML_TYPE_F32", "GGML_TYPE_F16")}
""",
}

TARGET = {
    "graph.h": """
struct llama_hparams {
    uint32_t n_embd_head_k(uint32_t il = 0) const;
    uint32_t n_layer;
};
#define GGML_PAD(x, n, m) (((x) + (n) - 1) & ~((n) - 1))
static const std::array<const char *, 1> LLM_NAMES = { "llama" };
float scale(double x);
float scale(int x);
""",
    "graph.cpp": f"""
ggml_tensor * build_attn_inp_kq_mask(ggml_context * ctx, ggml_tensor * cur)
{SHIFT_BODY}
struct kv_cells {{
    void reset() {{ used = 0; pos = 0; }}
    uint32_t size() const {{ return n; }}
    uint32_t used;
    uint32_t n;
}};
""",
    "helpers.cpp": f"""
static ggml_tensor * rope_helper_f16(ggml_context * ctx, ggml_tensor * cur)
{SHIFT_BODY.replace("GGML_TYPE_F32", "GGML_TYPE_F16")}
static ggml_tensor * rope_helper_bf16(ggml_context * ctx, ggml_tensor * cur)
{SHIFT_BODY.replace("GGML_TYPE_F32", "GGML_TYPE_BF16")}
""",
}


def located(name: str, kind: str) -> list[Candidate]:
    base, target = snippet_index(BASE), snippet_index(TARGET)
    (sym,) = base.find(name, {kind})
    return locate(base, sym, target)


def test_locate_by_alias_with_the_signature_kept():
    (found,) = located("build_kq_mask", FUNCTION)
    assert (found.strategy, found.confidence, found.symbol.name) == (
        ALIAS, 0.95, "build_attn_inp_kq_mask")


def test_locate_a_field_that_became_an_accessor():
    (found,) = located("llama_hparams::n_embd_head_k", FIELD)
    assert (found.strategy, found.symbol.kind) == (EXACT, DECLARATION)
    assert found.confidence < 0.8 and "was a field, now a declaration" in found.why


def test_locate_says_what_changed_in_a_macro_and_a_variable():
    (pad,) = located("GGML_PAD", MACRO)
    assert pad.strategy == EXACT and pad.confidence < 1.0
    assert "GGML_PAD(x, n) -> GGML_PAD(x, n, m)" in pad.why
    assert pad.symbol.params == ["x", "n", "m"]
    (names,) = located("LLM_NAMES", VARIABLE)
    assert names.strategy == EXACT and names.confidence < 1.0
    assert "const char * [] LLM_NAMES -> const std::array<const char *, 1> LLM_NAMES" in names.why


def test_locate_ranks_overloads_by_signature_never_picking_silently():
    base, target = snippet_index(BASE), snippet_index(TARGET)
    by_int, by_float = sorted(base.find("scale"), key=lambda s: s.params != ["int"])
    (same,) = [c for c in locate(base, by_int, target) if c.confidence == 1.0]
    assert same.symbol.params == ["int"]
    changed = locate(base, by_float, target)  # scale(float) is gone: both overloads, even
    assert [c.symbol.params for c in changed] == [["double"], ["int"]]
    assert {(c.strategy, c.confidence) for c in changed} == {(EXACT, 0.75)}
    assert "float scale(float) -> float scale(double)" in changed[0].why


def test_locate_a_renamed_class_by_members_and_its_methods_through_it():
    base, target = snippet_index(BASE), snippet_index(TARGET)
    locator = Locator(base, target)
    (cls,) = base.find("kv_cells_old", {CLASS})
    (home,) = locator.locate(cls)
    assert (home.strategy, home.symbol.qualname) == (STRUCTURE, "kv_cells")
    (reset,) = base.find("kv_cells_old::reset")
    found = locator.locate(reset)
    assert found[0].symbol.qualname == "kv_cells::reset" and found[0].strategy == STRUCTURE
    assert "kv_cells_old became kv_cells" in found[0].why


def test_locate_a_function_moved_and_renamed_returns_near_equal_look_alikes_ranked():
    found = located("rope_helper", FUNCTION)
    same, *alike = found
    assert (same.symbol.name, same.strategy, same.symbol.file) == (
        "rope_helper_f16", STRUCTURE, "helpers.cpp")
    # a body one token apart, twice: both listed, the closer name first
    assert [(c.symbol.name, c.strategy) for c in alike] == [
        ("rope_helper_bf16", SIMILARITY), ("build_attn_inp_kq_mask", SIMILARITY)]
    assert same.confidence > alike[0].confidence > alike[1].confidence > 0.5


def test_locate_finds_nothing_for_what_is_gone():
    base = snippet_index(BASE)
    target = snippet_index({"graph.cpp": "int unrelated(int a) { return a * 2; }\n"})
    (sym,) = base.find("build_kq_mask")
    assert locate(base, sym, target) == []


def test_locate_a_free_function_that_became_a_method_of_its_class():
    """The C API moved into classes: llama_output_reserve became
    llama_context::output_reserve, and llama_encode_impl (the implementation of
    llama_encode) became llama_context::encode. A method the base had already, or one that
    two classes have, is no such move."""
    base = snippet_index({"ctx.cpp": (
        "int llama_output_reserve(struct llama_context & lctx, int n) {\n    return n;\n}\n"
        "int llama_encode_impl(struct llama_context & lctx, int n) {\n    return n + 1;\n}\n"
        "int llama_state_size(struct llama_context & lctx) {\n    return 0;\n}\n"
        "int llama_kv_clear(struct llama_context & lctx) {\n    return 0;\n}\n"
        "struct llama_model { int state_size(); };\n")})
    target = snippet_index({"ctx.cpp": (
        "struct llama_context { int output_reserve(int n); int encode(int n); };\n"
        "int llama_context::output_reserve(int n) {\n    return n * 2;\n}\n"
        "int llama_context::encode(int n) {\n    return n + 2;\n}\n"
        "int llama_model::state_size() {\n    return 1;\n}\n"
        "struct llama_kv_a { int clear(); };\nstruct llama_kv_b { int clear(); };\n"
        "int llama_kv_a::clear() {\n    return 1;\n}\nint llama_kv_b::clear() {\n"
        "    return 2;\n}\n")})
    locator = Locator(base, target)
    for name, method in (("llama_output_reserve", "llama_context::output_reserve"),
                         ("llama_encode_impl", "llama_context::encode")):
        (sym,) = base.find(name, {FUNCTION})
        found = [c for c in locator.locate(sym) if c.confidence >= 0.6]
        assert found and found[0].symbol.qualname == method, found
        assert f"{name} became the method {method}" in found[0].why
    for name in ("llama_state_size", "llama_kv_clear"):  # the base has it; two classes do
        (sym,) = base.find(name, {FUNCTION})
        assert not [c for c in locator.locate(sym) if "became the method" in c.why]


# -- locate on real trees ---------------------------------------------------------------------


def llama_index(registry_tree, version: str, patterns: list[str]) -> Index:
    return Index.build(registry_tree(version) / "vendor" / "llama.cpp", patterns)


def test_locate_the_unified_cache_method_in_the_renamed_class(registry_tree):
    base = llama_index(registry_tree, "0.3.16", ["src/llama-kv-cache*"])
    target = llama_index(registry_tree, "0.3.17", ["src/llama-kv-cache*"])
    (cpy_k,) = base.find("llama_kv_cache_unified::cpy_k", {FUNCTION})
    inside = base.enclosing(cpy_k.file, cpy_k.start_line + 3)
    assert inside is cpy_k
    found = locate(base, inside, target)
    assert found[0].symbol.qualname == "llama_kv_cache::cpy_k"
    assert found[0].symbol.kind == FUNCTION and found[0].strategy == ALIAS
    assert found[0].symbol.file == "src/llama-kv-cache.cpp" and "moved from" in found[0].why


def test_locate_the_renamed_mask_builder(registry_tree):
    base = llama_index(registry_tree, "0.3.19", ["src/llama-graph.*"])
    target = llama_index(registry_tree, "0.3.20", ["src/llama-graph.*"])
    (mask,) = base.find("build_kq_mask", {FUNCTION})
    found = locate(base, mask, target)
    assert found[0].symbol.name == "build_attn_inp_kq_mask"
    assert found[0].strategy in {ALIAS, STRUCTURE}


def test_locate_a_class_renamed_outside_the_aliases(registry_tree):
    """llama_kv_cells_unified became llama_kv_cells; aliases.toml does not say so."""
    base = llama_index(registry_tree, "0.3.16", ["src/llama-kv-cells.h"])
    target = llama_index(registry_tree, "0.3.17", ["src/llama-kv-cells.h"])
    locator = Locator(base, target)
    (cells,) = base.find("llama_kv_cells_unified", {CLASS})
    assert locator.locate(cells)[0].symbol.qualname == "llama_kv_cells"
    (size,) = base.find("llama_kv_cells_unified::size", {FUNCTION})
    assert locator.locate(size)[0].symbol.qualname == "llama_kv_cells::size"


# -- the anchors table fits the terminal ------------------------------------------------------


def test_table_cuts_the_widest_columns_first_with_an_ellipsis(capsys):
    emit_table(["id", "status", "note"], [["a.b", "found", "x" * 80], ["c", "absent", "short"]],
               width=40)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["id", "status", "note"]
    assert max(len(line) for line in lines) <= 40
    assert lines[2].startswith("a.b  found   x") and lines[2].endswith("…")
    assert lines[3].rstrip().endswith("short")


def test_table_narrow_enough_is_left_alone(capsys):
    emit_table(["id", "note"], [["a", "b" * 10]], width=200)
    assert capsys.readouterr().out.splitlines() == ["id  note", "--  ----------",
                                                    "a   bbbbbbbbbb"]


def test_fit_widths_keep_headers_and_narrow_columns():
    assert fit_widths([10, 50, 90], [4, 6, 4], 60) == [10, 23, 23]
    assert fit_widths([3, 200], [3, 6], 10) == [3, 6], "never below a column's least"


def test_anchors_table_fits_a_pipe_and_json_keeps_full_text(registry_tree):
    tree = str(registry_tree("0.3.16"))
    table = CliRunner().invoke(cli, ["anchors", "--tree", tree])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert max(len(line) for line in lines) <= PIPE_WIDTH < 200
    assert any(line.endswith("…") for line in lines)
    data = json.loads(CliRunner().invoke(cli, ["anchors", "--tree", tree, "--format", "json"])
                      .output)
    notes = [a["note"] for a in data["anchors"] if a["note"]]
    assert max(len(n) for n in notes) > PIPE_WIDTH and not any("…" in n for n in notes)


def test_shingles_are_every_run_of_four_tokens_or_all_of_fewer():
    tokens = ["a", "b", "c", "d", "e", "b", "c", "d", "e"]
    assert _shingles(tokens) == {("a", "b", "c", "d"), ("b", "c", "d", "e"),
                                 ("c", "d", "e", "b"), ("d", "e", "b", "c"),
                                 ("e", "b", "c", "d")}
    assert _shingles(["x", "y"]) == {("x", "y")} and _shingles([]) == {()}
    assert _shingles(tuple(tokens), 8) == {tuple(tokens[:8]), tuple(tokens[1:])}


def test_todays_names_read_each_token_through_its_rename_group():
    tokens = ["build_kq_mask", "(", "llama_kv_cache_unified", "x", ")"]
    assert todays_names(tokens) == tuple(aliases_of(t)[0] for t in tokens)
    assert todays_names(tokens)[0] == "build_attn_inp_kq_mask" and todays_names([]) == ()


def test_akin_rules_out_by_length_and_letters_before_the_full_comparison():
    """The cheap tests (lengths, letters in any order) only rule out what the full
    comparison would: the same answers as difflib's three ratios, in order."""
    import difflib

    from portkit.anchors import AKIN, _numbers_differ, akin

    def by_difflib(a: str, b: str) -> bool:
        if _numbers_differ(a, b):
            return False
        if sorted(a.lower().split("_")) == sorted(b.lower().split("_")):
            return True
        m = difflib.SequenceMatcher(None, a, b, autojunk=False)
        return m.real_quick_ratio() >= AKIN and m.quick_ratio() >= AKIN and m.ratio() >= AKIN

    names = ["llama_n_ctx_per_seq", "llama_n_ctx_seq", "kv_cache_unified", "unified_kv_cache",
             "q4_0", "q4_1", "build_attn", "attn_build_x", "n", "seq_n", "abcdef", "fedcba",
             "kv_self", "kv", "llama_batch_limit", ""]
    for a in names:
        for b in names:
            assert akin(a, b) == by_difflib(a, b), (a, b)
    assert akin("abcdef", "fedcba") is False and akin("kv_cache_unified", "unified_kv_cache")
