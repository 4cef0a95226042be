"""The kv-rotation anchors on five real trees, on an ollama-style fork, and on damaged copies."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from portkit import index as index_mod
from portkit.anchors import AnchorSet, AnchorSpec, Resolver, load_anchor_set
from portkit.cli import cli
from portkit.errors import AnchorError
from portkit.features import load_anchors, resolve_feature
from portkit.index import DECLARATION, FIELD, Index
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
    assert res.runners_up and res.runners_up[0].score < res.confidence - 0.1
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
