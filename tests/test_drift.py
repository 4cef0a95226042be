"""`portkit drift` on real material: the rotation series rendered for 0.3.16, followed across the
`llama_kv_cache_unified` rename (0.3.17, 0.3.19) to upstream's own rotation (0.3.20, 0.3.36);
and, offline, the same series rendered on the fixture tree shaped like 0.3.16, followed into
the one shaped like 0.3.17."""

from __future__ import annotations

import shutil
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from portkit.cli import cli
from portkit.drift import model as dm
from portkit.drift.classify import drift
from portkit.errors import InputError
from portkit.follow import DriftInput, identifiers
from portkit.render import render, write_series
from portkit.series import read_series
from portkit.tree import detect

from .conftest import tree_bytes

REPO = Path(__file__).resolve().parent.parent
ROTATION_0_3_16 = REPO / "patches" / "kv-rotation" / "4227c9be4268ac844921b90f31595f81236bd317"
OLD_FILES = {"src/llama-kv-cache-unified.cpp", "src/llama-kv-cache-unified.h"}
NEW_FILES = {"src/llama-kv-cache.cpp", "src/llama-kv-cache.h"}


def _report(base: Path, targets: dict[str, Path], series: Path) -> dm.DriftReport:
    job = DriftInput(read_series(series), str(series), detect(base),
                     [(label, detect(path)) for label, path in targets.items()])
    return drift(job)


@pytest.fixture(scope="module")
def rotation_report(registry_tree) -> dm.DriftReport:
    targets = {v: registry_tree(v) for v in ("0.3.17", "0.3.19", "0.3.20", "0.3.36")}
    return _report(registry_tree("0.3.16"), targets, ROTATION_0_3_16)


def _target(report: dm.DriftReport, label: str) -> dm.TargetDrift:
    return next(t for t in report.targets if t.target == label)


@pytest.mark.parametrize("version", ["0.3.17", "0.3.19"])
def test_rotation_series_is_followed_across_the_unified_rename(rotation_report, version):
    target = _target(rotation_report, version)
    hunks = [h for p in target.patches for h in p.hunks]
    renamed = [h for h in hunks if h.file in OLD_FILES]
    # The files are gone; nothing in them can apply where it was.
    assert renamed and not [h for h in renamed if h.status in (dm.CLEAN, dm.OFFSET, dm.FUZZ)]
    relocated = [h for h in renamed if h.status == dm.RELOCATED]
    assert all(h.moved_to is not None and h.moved_to.file in NEW_FILES for h in relocated)
    # The class went by its alias; the constructor with it.
    ctor = next(h for h in relocated
                if h.symbol == "llama_kv_cache_unified::llama_kv_cache_unified")
    assert ctor.moved_to is not None
    assert (ctor.moved_to.symbol, ctor.moved_to.how) == ("llama_kv_cache::llama_kv_cache", "alias")
    # Patch 2 adds context methods between set_input_pos_bucket and get_padding, which is gone
    # from the newer trees: a conflict, and the reason says what is where.
    padding = next(h for h in target.patches[1].hunks if h.old_start == 2491)
    assert padding.status == dm.CONFLICT
    assert "after llama_kv_cache_unified_context::set_input_pos_bucket, which is " \
           "llama_kv_cache_context::set_input_pos_bucket" in padding.reason
    assert "before llama_kv_cache_unified::get_padding, which is not in the target" \
        in padding.reason
    # No two of its context lines are left together; its nearest match is the end of the method
    # it goes after, where that one went.
    assert padding.nearest is not None and padding.nearest.file == "src/llama-kv-cache.cpp"
    assert padding.nearest.text.startswith(
        "void llama_kv_cache_context::set_input_pos_bucket(") and \
        padding.nearest.text.endswith("    kv->set_input_pos_bucket(dst, ubatch);\n}")
    # The iSWA input builder lost its suffix: found by alias in the same file.
    iswa = next(h for h in hunks
                if h.symbol == "llm_graph_context::build_attn_inp_kv_unified_iswa")
    assert iswa.status == dm.RELOCATED and iswa.moved_to is not None
    assert iswa.moved_to.symbol == "llm_graph_context::build_attn_inp_kv_iswa"
    # Head sizes became methods: the patches that read them as fields drift semantically.
    first = target.patches[0]
    changes = {s.symbol: s for s in first.semantic}
    assert changes["n_embd_head_k"].change == "renamed"
    assert "llama_hparams::n_embd_head_k_full" in changes["n_embd_head_k"].detail
    assert "the name is a declaration now" in changes["n_embd_head_k"].detail
    # Nothing is called upstream that is not.
    assert not [h for h in hunks if h.status == dm.PRESENT_UPSTREAM]


@pytest.mark.parametrize("version", ["0.3.20", "0.3.36"])
def test_rotation_series_is_present_upstream_where_upstream_has_it(rotation_report, version):
    target = _target(rotation_report, version)
    assert [p.status for p in target.patches] == [dm.PRESENT_UPSTREAM] * 5
    assert all(not p.semantic for p in target.patches)
    assert dm.exit_code(rotation_report.__class__(rotation_report.series, (target,))) == 0


def test_report_reads_back_from_its_json(rotation_report):
    assert dm.DriftReport.from_json(rotation_report.to_json()) == rotation_report


def test_identifiers_skip_keywords_strings_and_comments():
    assert identifiers(['    if (ctx->n_rot > 0) { log("n_rot stays"); } // n_ignored\n']) == \
        ["ctx", "n_rot", "log"]


# -- offline: the fixture trees -----------------------------------------------------------------


def test_fixture_series_relocates_across_the_rename(fixture_tree, tmp_path):
    old = fixture_tree("old")
    series = tmp_path / "series"
    write_series(render(detect(old), "kv-rotation"), series)
    report = _report(old, {"renamed": fixture_tree("renamed")}, series)
    (target,) = report.targets
    statuses = Counter(h.status for p in target.patches for h in p.hunks)
    assert statuses[dm.RELOCATED] > 0 and statuses[dm.PRESENT_UPSTREAM] == 0
    for hunk in (h for p in target.patches for h in p.hunks if h.status == dm.RELOCATED):
        assert hunk.moved_to is not None and hunk.moved_to.how in dm.MOVE_HOWS
        assert hunk.reason
    conflicts = [h for p in target.patches for h in p.hunks if h.status == dm.CONFLICT]
    assert all(h.reason for h in conflicts)


def test_fixture_series_is_already_applied_to_the_tree_it_patched(fixture_tree, tmp_path):
    old = fixture_tree("old")
    series = tmp_path / "series"
    rendered = render(detect(old), "kv-rotation")
    write_series(rendered, series)
    patched = fixture_tree("old")
    from portkit.hunks import apply_hunks
    with apply_hunks(read_series(series), patched) as result:
        assert result.ok
        for rel, data in result.files.items():
            assert data is not None
            (patched / rel).write_bytes(data)
    report = _report(old, {"patched": patched}, series)
    assert {p.status for p in report.targets[0].patches} == {dm.ALREADY_APPLIED}


# -- the fork-style series, against expectations established by hand ---------------------------

FORK_SERIES = REPO / "tests" / "data" / "fork-series"
# Where drift's answer differs from the hand-made one, and why; anything else is a failure.
KNOWN_MISSES: dict[str, str] = {}
ATTENTION = {dm.FUZZ, dm.RELOCATED, dm.CONFLICT}


def _expected() -> dict[str, Any]:
    return tomllib.loads((FORK_SERIES / "expected.toml").read_text())["patches"]


@pytest.fixture(scope="module")
def fork_report(registry_tree) -> dm.DriftReport:
    return _report(registry_tree("0.3.16"),
                   {v: registry_tree(v) for v in ("0.3.17", "0.3.19")}, FORK_SERIES / "series")


@pytest.mark.parametrize("version", ["0.3.17", "0.3.19"])
def test_fork_series_statuses_match_the_hand_made_ones(fork_report, version):
    expected = _expected()
    target = _target(fork_report, version)
    assert [p.file for p in target.patches] == sorted(expected)
    wrong = {}
    for patch in target.patches:
        hand = expected[patch.file][version]
        # a hunk's `drift`, where the hand gave one, is what drift's text-first rules report
        # instead of the hand's status, and its `note` says why
        hand_hunks = [h.get("drift", h["status"]) for h in hand["hunks"]]
        got = [h.status for h in patch.hunks]
        if got != hand_hunks or patch.status != dm.worst(hand_hunks):
            wrong[patch.file] = (hand_hunks, got)
        for ours, theirs in zip(patch.hunks, hand["hunks"], strict=True):
            if ours.status == dm.RELOCATED and "moved_to_file" in theirs:
                assert ours.moved_to is not None
                assert ours.moved_to.file == theirs["moved_to_file"], patch.file
    assert set(wrong) == set(KNOWN_MISSES), wrong


@pytest.mark.parametrize("version", ["0.3.17", "0.3.19"])
def test_a_function_upstream_added_under_another_name_is_found_under_that_name(fork_report,
                                                                              version):
    """0012 adds llama_n_ctx_per_seq() calling llama_context::n_ctx_per_seq(); upstream
    added the same function as llama_n_ctx_seq() calling the method it renamed n_ctx_seq().
    The llama.h hunk fails and is there under upstream's names; GNU patch lands the
    llama-context.cpp one with fuzz 1, which text first reports (a call to a method that is
    gone), with the names to review and the method's rename as semantic drift."""
    patch = next(p for p in _target(fork_report, version).patches
                 if p.file.startswith("0012-"))
    assert [h.status for h in patch.hunks] == [dm.PRESENT_UPSTREAM, dm.FUZZ]
    assert "llama_n_ctx_per_seq as llama_n_ctx_seq" in patch.hunks[0].reason
    assert patch.hunks[1].fuzz == 1
    assert "to review: upstream may have it already (it has llama_n_ctx_per_seq as " \
        "llama_n_ctx_seq, n_ctx_per_seq as n_ctx_seq)" in patch.hunks[1].reason
    (rename,) = patch.semantic
    assert (rename.symbol, rename.change) == ("n_ctx_per_seq", "renamed")
    assert "llama_context::n_ctx_per_seq is llama_context::n_ctx_seq" in rename.detail
    assert dm.exit_code(dm.DriftReport("s", (dm.TargetDrift("t", None, (patch,)),))) == 20


@pytest.mark.parametrize("version", ["0.3.17", "0.3.19"])
def test_fork_series_never_calls_a_patch_fine_that_needs_attention(fork_report, version):
    expected = _expected()
    for patch in _target(fork_report, version).patches:
        hand = [h["status"] for h in expected[patch.file][version]["hunks"]]
        if dm.worst(hand) in ATTENTION:
            assert patch.status in ATTENTION, patch.file
        partly_upstream = {dm.PRESENT_UPSTREAM, dm.ALREADY_APPLIED} & set(hand) and \
            set(hand) - {dm.PRESENT_UPSTREAM, dm.ALREADY_APPLIED}
        if partly_upstream:
            assert patch.status not in (dm.PRESENT_UPSTREAM, dm.ALREADY_APPLIED), patch.file


@pytest.mark.parametrize("version", ["0.3.17", "0.3.19"])
def test_fork_series_semantic_drift_is_found(fork_report, version):
    """Every symbol the hand found changed under a patch that is still carried (and whose
    change breaks it) is reported, with the kind of change; nothing else is reported."""
    expected = _expected()
    for patch in _target(fork_report, version).patches:
        hand = expected[patch.file][version]
        if patch.status in (dm.PRESENT_UPSTREAM, dm.ALREADY_APPLIED) or \
                patch.file in KNOWN_MISSES:
            continue
        wanted = {s["symbol"].rsplit("::", 1)[-1]: s["change"]
                  for s in hand.get("semantic", []) if s.get("breaks", True)}
        harmless = {s["symbol"].rsplit("::", 1)[-1]
                    for s in hand.get("semantic", []) if not s.get("breaks", True)}
        found = {s.symbol: s.change for s in patch.semantic}
        assert {k: v for k, v in found.items() if k not in harmless} == wanted, patch.file


# -- in a fork: the series and the base come from the checkout -----------------------------


def _drift_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["drift", *args])
    return result.exit_code, result.stdout


def test_fork_drift_uses_its_own_series_and_derives_the_base(fixture_fork, fixture_tree):
    fork = fixture_fork("old")
    before = tree_bytes(fork.root)
    # Against the fork's own tree: its series is exactly what the vendored tree carries.
    code, out = _drift_cli("--fork", str(fork.root), "--format", "json")
    report = dm.DriftReport.from_json(out)
    assert code == 0
    (own,) = report.targets
    assert [p.file for p in own.patches] == fork.own_patches
    assert {p.status for p in own.patches} == {dm.ALREADY_APPLIED}
    # Against the renamed tree: the base is the vendored tree with the series taken out, so
    # the patch into llama-graph.cpp lands and the one into llama.cpp too.
    code, out = _drift_cli("--fork", str(fork.root), "--tree", str(fixture_tree("renamed")),
                           "--format", "json")
    (renamed,) = dm.DriftReport.from_json(out).targets
    assert code == 0
    assert all(p.status in (dm.CLEAN, dm.OFFSET) for p in renamed.patches), renamed
    assert tree_bytes(fork.root) == before  # drift only reads


def test_drift_without_a_base_outside_a_fork_says_what_to_give(fixture_tree, tmp_path):
    series = tmp_path / "series"
    old = fixture_tree("old")
    write_series(render(detect(old), "kv-rotation"), series)
    result = CliRunner().invoke(cli, ["drift", "--series", str(series), "--tree", str(old),
                                      "--fork", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("portkit: give --base TREE")
    assert result.stderr.count("\n") == 1


def test_saved_report_renders_again_with_the_same_exit_code(fixture_tree, tmp_path):
    old = fixture_tree("old")
    series = tmp_path / "series"
    write_series(render(detect(old), "kv-rotation"), series)
    code, out = _drift_cli("--series", str(series), "--base", str(old), "--tree",
                           str(fixture_tree("renamed")), "--format", "json")
    saved = tmp_path / "drift.json"
    saved.write_text(out)
    again, markdown = _drift_cli("--from-json", str(saved), "--format", "markdown")
    assert again == code == dm.ATTENTION_EXIT  # the renamed tree has conflicts
    assert markdown.startswith("#") and "conflict" in markdown


@pytest.mark.parametrize("fail_on", ["fuzz", "relocated", "conflict", "semantic", "dropped"])
def test_fail_on_takes_the_values_help_and_the_docs_name(fixture_tree, tmp_path, fail_on):
    """`--fail-on fuzz` as --help's example and docs/drift-ci.md write it (lowercase, the
    statuses' own words), and --help lists those words."""
    old = fixture_tree("old")
    series = tmp_path / "series"
    write_series(render(detect(old), "kv-rotation"), series)
    code, out = _drift_cli("--series", str(series), "--base", str(old), "--tree",
                           str(fixture_tree("renamed")), "--format", "json", "--fail-on",
                           fail_on)
    assert code in (0, dm.ATTENTION_EXIT), out
    assert dm.DriftReport.from_json(out).targets
    shown = CliRunner().invoke(cli, ["drift", "--help"]).stdout
    assert "[conflict|semantic|relocated|fuzz|dropped|never]" in " ".join(shown.split())


# -- present upstream under another name (synthetic trees) ---------------------------------

PER_SEQ = """\
--- a/src/llama.cpp
+++ b/src/llama.cpp
@@ -18,3 +18,7 @@ const char * llama_print_system_info(void) {
 int32_t llama_n_ctx(const llama_context * ctx) {
     return ctx->n_ctx();
 }
+
+int32_t llama_n_ctx_per_seq(const llama_context * ctx) {
+    return ctx->n_ctx() / ctx->n_seq_max();
+}
"""


@pytest.mark.parametrize(("upstream_adds", "status"), [
    # the same function under a name that reads as its rename: the fork's is a duplicate,
    # but the hunk applies as text, and text comes first: offset, with a note to review
    ("int32_t llama_n_ctx_seq(const llama_context * ctx) {\n"
     "    return ctx->n_ctx() / ctx->n_seq_max();\n}\n", dm.OFFSET),
    # the same shape under an unrelated name is another function
    ("int32_t llama_batch_limit(const llama_context * ctx) {\n"
     "    return ctx->n_ctx() / ctx->n_seq_max();\n}\n", dm.OFFSET),
    # a rename whose body differs is not the same change
    ("int32_t llama_n_ctx_seq(const llama_context * ctx) {\n"
     "    return ctx->n_ctx() / ctx->n_seq_max() + 1;\n}\n", dm.OFFSET),
])
def test_a_definition_upstream_has_under_another_name(fixture_tree, tmp_path, upstream_adds,
                                                       status):
    base, target = fixture_tree("old"), tmp_path / "target"
    shutil.copytree(base, target)
    source = target / "src" / "llama.cpp"  # upstream's function goes before llama_n_ctx
    text = source.read_text()
    at = text.index("int32_t llama_n_ctx(")
    source.write_text(text[:at] + upstream_adds + "\n" + text[at:])
    series = tmp_path / "series"
    series.mkdir()
    (series / "0001-per-seq.patch").write_text(PER_SEQ)
    hunk = _report(base, {"t": target}, series).targets[0].patches[0].hunks[0]
    assert hunk.status == status, hunk.reason
    noted = "to review: upstream may have it already (it has llama_n_ctx_per_seq as " \
            "llama_n_ctx_seq)"
    assert (noted in hunk.reason) == ("llama_n_ctx_seq(" in upstream_adds
                                      and "+ 1" not in upstream_adds)


def test_a_saved_report_that_is_not_utf8_is_malformed_input(tmp_path):
    saved = tmp_path / "drift.json"
    saved.write_bytes(b"\xff\xfe{}")
    result = CliRunner().invoke(cli, ["drift", "--from-json", str(saved)])
    assert result.exit_code == InputError.exit_code
    assert result.stderr == f"portkit: {saved} is not a JSON drift report (not UTF-8)\n"
