"""The kv-rotation anchors on the small fixture trees: resolved as on the real trees, and
damaged copies fail the way real ones do. No network, no real tree."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from portkit.anchors import Resolution
from portkit.cli import cli
from portkit.features import load_anchors, resolve_feature
from portkit.index import DECLARATION, FIELD, Index
from portkit.tree import OLLAMA, PLAIN, detect

from .conftest import FIXTURE_NAMES, FIXTURE_TREES, Fork, git

pytestmark = pytest.mark.usefixtures("offline_cache")

# How each anchor resolves on each fixture tree: what 0.3.16 ("old") and 0.3.17/0.3.19
# ("renamed") give. "" is an optional anchor reported absent.
EXPECTED_STRATEGIES = {
    "hparams.head-size-k": ("exact", "exact"),
    "hparams.head-size-v": ("exact", "exact"),
    "hparams.is-mla": ("", "exact"),
    "hparams.head-size-k-mla": ("exact", ""),
    "kv-cache.class": ("alias", "exact"),
    "kv-cache.ctor": ("alias", "exact"),
    "kv-cache.shared-ctor": ("", ""),
    "kv-cache.set-input-pos-bucket": ("alias", "exact"),
    "kv-cache.rope-shift": ("alias", "exact"),
    "kv-cache.rope-shift-decl": ("alias", "exact"),
    "kv-cache.k-shift-input": ("exact", "exact"),
    "kv-cache.k-shift-set-input": ("exact", "exact"),
    "kv-cache.graph-shift": ("alias", "exact"),
    "kv-cache.graph-shift-partial-view": ("", "exact"),
    "kv-ctx.class": ("alias", "exact"),
    "kv-ctx.set-input-pos-bucket": ("alias", "exact"),
    "graph.file-scope": ("exact", "exact"),
    "graph.kq-mask": ("", "alias"),
    "graph.inp-kv.class": ("alias", "exact"),
    "graph.inp-kv.set-input": ("alias", "exact"),
    "graph.inp-kv-iswa.class": ("alias", "exact"),
    "graph.inp-kv-iswa.set-input": ("alias", "exact"),
    "graph.inp-mem-hybrid.set-input": ("", "exact"),
    "graph.inp-mem-hybrid-iswa.set-input": ("", "exact"),
    "graph.inp-mem-hybrid-iswa.build": ("", "exact"),
    "graph.inp-kv-impl": ("alias", "exact"),
    "graph.inp-kv-iswa": ("alias", "exact"),
    "graph.build-attn-kv": ("exact", "exact"),
    "graph.build-attn-iswa": ("structure", "exact"),
}


def resolved(path: Path) -> tuple[Index, dict[str, Resolution]]:
    return resolve_feature(detect(path), "kv-rotation")


def cut_function(path: Path, head: str) -> None:
    """Remove the definition that starts with the line `head` (up to its closing brace)."""
    text = path.read_text()
    start = text.index(head)
    end = text.index("\n}\n", start) + 3
    path.write_text(text[:start] + text[end:])


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


# -- the fixtures are what they claim to be ---------------------------------------------


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_sources_parse_without_errors(name):
    root = FIXTURE_TREES / name
    index = Index.build(root, ["**/*"])
    assert len(index.files) >= 8
    assert {rel: f.errors for rel, f in index.files.items() if f.errors} == {}


def test_plain_copy_has_no_pin(fixture_tree):
    info = detect(fixture_tree("old"))
    assert (info.layout, info.pin, info.series_dir) == (PLAIN, None, None)


def test_git_copy_is_pinned_at_its_head(fixture_git_tree):
    root = fixture_git_tree("renamed")
    info = detect(root)
    assert info.layout == PLAIN
    assert (info.pin, info.pin_source) == (git(root, "rev-parse", "HEAD").strip(), "git HEAD")


def test_fork_layout_is_pinned_at_its_upstream_commit(fixture_fork: Callable[[str], Fork]):
    fork = fixture_fork("renamed")
    info = detect(fork.root)
    assert info.layout == OLLAMA
    assert (info.pin, info.pin_source) == (fork.base, "Makefile.sync FETCH_HEAD")
    assert info.llama_root == fork.root / "llama" / "llama.cpp"
    assert (info.ggml_root / "include" / "ggml.h").is_file()
    assert sorted(p.name for p in info.series_dir.glob("*.patch")) == fork.own_patches
    assert len(fork.own_patches) == 2
    first = (info.series_dir / fork.own_patches[0]).read_text()
    assert first.startswith("From 0000000000000000000000000000000000000000 ")
    assert "Subject: [PATCH] llama: name the fork in the system info" in first
    assert '"FORK = fixture | "' in (info.llama_root / "src" / "llama.cpp").read_text()


# -- resolution -------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_every_anchor_resolves_with_the_strategy_the_real_trees_get(name):
    _, res = resolved(FIXTURE_TREES / name)
    column = FIXTURE_NAMES.index(name)
    got = {k: (r.strategy if r.found else r.status) for k, r in res.items()}
    want = {k: (v[column] or "absent") for k, v in EXPECTED_STRATEGIES.items()}
    assert got == want
    assert set(res) == {a.id for a in load_anchors("kv-rotation").anchors}


def test_old_tree_reaches_the_unified_names_through_aliases():
    _, res = resolved(FIXTURE_TREES / "old")
    cls = res["kv-cache.class"]
    assert (cls.symbol.qualname, cls.symbol.file) == ("llama_kv_cache_unified",
                                                      "src/llama-kv-cache-unified.h")
    assert res["graph.inp-kv.class"].symbol.qualname == "llm_graph_input_attn_kv_unified"
    assert res["graph.inp-kv-impl"].symbol.name == "build_attn_inp_kv_unified_impl"
    assert res["graph.build-attn-iswa"].symbol.name == "build_attn_with_sinks"
    assert "delegates" in res["graph.inp-mem-hybrid.set-input"].note


def test_renamed_tree_has_the_mask_helper_under_its_older_name():
    _, res = resolved(FIXTURE_TREES / "renamed")
    assert res["graph.kq-mask"].symbol.name == "build_kq_mask"
    assert res["kv-cache.class"].symbol.file == "src/llama-kv-cache.h"


@pytest.mark.parametrize("name,kind", [("old", FIELD), ("renamed", DECLARATION)])
def test_head_size_shape_is_visible(name, kind):
    _, res = resolved(FIXTURE_TREES / name)
    assert res["hparams.head-size-k"].symbol.kind == kind
    assert res["hparams.head-size-v"].symbol.kind == kind


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_context_shift_points_are_inside_the_quantized_branch(name):
    index, res = resolved(FIXTURE_TREES / name)
    rope = res["kv-cache.rope-shift"]
    src = index.source(rope.symbol.file)
    branch = src.index(b"ggml_is_quantized", rope.symbol.body_start)
    other = src.index(b"} else {", branch)
    for point in ("unrotate", "rerotate"):
        at = rope.points[point]
        assert branch < at.start < other
        assert src[at.start : at.end].startswith(b"tmp = ggml_rope_ext(")
    assert rope.points["rot-param"].statement == "ggml_tensor * shift,"
    assert "build_rope_shift(" in res["kv-cache.graph-shift"].points["call"].statement


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_anchors_command_reports_every_anchor_as_json(fixture_tree, name):
    result = CliRunner().invoke(cli, ["anchors", "--tree", str(fixture_tree(name)),
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["tree"]["layout"] == PLAIN and data["tree"]["pin"] is None
    assert [a["id"] for a in data["anchors"]] == list(EXPECTED_STRATEGIES)


def test_fork_resolves_like_its_tree(fixture_fork):
    fork = fixture_fork("renamed")
    _, in_fork = resolved(fork.root)
    _, direct = resolved(FIXTURE_TREES / "renamed")
    assert {k: (r.status, r.strategy) for k, r in in_fork.items()} == {
        k: (r.status, r.strategy) for k, r in direct.items()}


# -- damaged trees ------------------------------------------------------------------------


def test_deleted_target_is_a_clear_error(fixture_tree):
    root = fixture_tree("renamed")
    cut_function(root / "src" / "llama-kv-cache.cpp",
                 "ggml_tensor * llama_kv_cache::build_rope_shift(")
    result = CliRunner().invoke(cli, ["anchors", "--tree", str(root)])
    assert result.exit_code == 3
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("portkit: 1 anchor(s) unresolved; first: anchor kv-cache.rope-shift: "
                           "no function named llama_kv_cache::build_rope_shift or an alias")
    assert "nearest:" in last


def test_renamed_target_is_found_by_structure(fixture_tree):
    root = fixture_tree("renamed")
    for name in ("llama-kv-cache.cpp", "llama-kv-cache.h"):
        edit(root / "src" / name, "build_rope_shift", "build_rope_shift_v2")
    _, res = resolved(root)
    rope = res["kv-cache.rope-shift"]
    assert (rope.strategy, rope.symbol.name) == ("structure", "build_rope_shift_v2")
    assert "found by what it does" in rope.note


def test_two_lookalikes_are_ambiguous_never_a_silent_pick(fixture_tree):
    root = fixture_tree("old")
    src = root / "src" / "llama-kv-cache-unified.cpp"
    text = src.read_text()
    start = text.index("ggml_tensor * llama_kv_cache_unified::build_rope_shift(")
    end = text.index("\n}\n", start) + 3
    body = text[start:end]
    twins = (body.replace("build_rope_shift", "rope_shift_a") + "\n"
             + body.replace("build_rope_shift", "rope_shift_b"))
    src.write_text(text[:start] + twins + text[end:])
    _, res = resolved(root)
    rope = res["kv-cache.rope-shift"]
    assert rope.status == "error"
    assert "ambiguous by structure: 2 candidates" in rope.note
    assert "rope_shift_a" in rope.note and "rope_shift_b" in rope.note


def test_right_name_wrong_body_is_not_taken(fixture_tree):
    root = fixture_tree("renamed")
    edit(root / "src" / "llama-kv-cache.cpp", "if (ggml_is_quantized(cur->type)) {",
         "if (false) {")
    _, res = resolved(root)
    rope = res["kv-cache.rope-shift"]
    assert rope.status == "error"
    assert "lacks contains 'ggml_is_quantized'" in rope.note
