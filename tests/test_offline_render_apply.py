"""Rendering the rotation series for the fixture trees and applying it: all or nothing, and
back again byte for byte. No network, no real tree."""

from __future__ import annotations

import shutil
import stat
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from portkit import apply as apply_mod
from portkit.cli import cli
from portkit.index import Index
from portkit.render import NOT_APPLICABLE, RENDERED, Rendered, render
from portkit.series import detect_conventions, format_patch_name, read_series
from portkit.tree import detect

from .conftest import FIXTURE_NAMES, FIXTURE_TREES, Fork, git, tree_bytes

pytestmark = pytest.mark.usefixtures("offline_cache")

FEATURE = "kv-rotation"

# The cache files of the old shape and what they are called after the rename.
RENAMED_FILES = {"src/llama-kv-cache-unified.h": "src/llama-kv-cache.h",
                 "src/llama-kv-cache-unified.cpp": "src/llama-kv-cache.cpp"}


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def rendered(name: str) -> Rendered:
    return render(detect(FIXTURE_TREES / name), FEATURE)


def changed(before: dict[str, bytes], after: dict[str, bytes]) -> set[str]:
    return {f for f in before.keys() | after.keys() if before.get(f) != after.get(f)}


def cut_rope_shift(root: Path, name: str) -> None:
    """Delete the definition of the cache's build_rope_shift from the fixture copy."""
    kv = {"old": "llama_kv_cache_unified", "renamed": "llama_kv_cache"}[name]
    path = root / "src" / f"{kv.replace('_', '-')}.cpp"
    text = path.read_text()
    start = text.index(f"ggml_tensor * {kv}::build_rope_shift(")
    end = text.index("\n}\n", start) + 3
    path.write_text(text[:start] + text[end:])


# -- render -------------------------------------------------------------------------------


def test_both_shapes_get_the_same_patches_touching_the_same_files():
    def outline(r: Rendered) -> list[tuple[str, str, list[str]]]:
        return [(o.spec.subject, o.status,
                 [RENAMED_FILES.get(f, f) for f in o.mail.files()] if o.mail else [])
                for o in r.outcomes]

    old, new = rendered("old"), rendered("renamed")
    assert outline(old) == outline(new)
    statuses = [o.status for o in new.outcomes]
    assert statuses == [RENDERED] * 5 + [NOT_APPLICABLE]
    assert new.files() == ["src/llama-graph.cpp", "src/llama-graph.h", "src/llama-kv-cache.cpp",
                           "src/llama-kv-cache.h"]
    assert [RENAMED_FILES.get(f, f) for f in old.files()] == new.files()


def test_series_adapts_to_the_tree_shape():
    old, new = rendered("old"), rendered("renamed")
    assert old.variables["kv_class"] == "llama_kv_cache_unified"
    assert old.variables["head_k_layer"] == "hparams.n_embd_head_k"
    assert new.variables["head_k_layer"] == "hparams.n_embd_head_k(layer.il)"
    assert new.variables["is_mla_expr"] == "hparams.is_mla()"
    old_diff = "".join(o.mail.diff for o in old.patches if o.mail)
    assert "llama_kv_cache_unified_context::build_input_k_rot" in old_diff
    skipped = [s for o in old.outcomes for s in o.skipped_edits]
    assert any("delegates to the attention input" in s for s in skipped)
    assert any(s.startswith("kv-cache.graph-shift-partial-view:") for s in skipped)
    assert [s for o in new.outcomes for s in o.skipped_edits] == []
    new_diff = "".join(o.mail.diff for o in new.patches if o.mail)
    assert "inp_attn->self_k_rot_swa" in new_diff, "the hybrid iSWA inputs exist in this shape"
    assert "inp->k_shift, inp->k_rot," in new_diff


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_rendered_series_is_a_git_am_series_that_applies_in_order(fixture_git_tree, fixture_tree,
                                                                  tmp_path, name):
    out = tmp_path / "series"
    result = invoke("render", "--tree", str(FIXTURE_TREES / name), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "kv-cache-shared-rotation: not applicable" in result.output
    patches = sorted(out.glob("*.patch"))
    assert [p.name[:5] for p in patches] == ["0001-", "0002-", "0003-", "0004-", "0005-"]

    repo = fixture_git_tree(name)
    git(repo, "am", "--quiet", *map(str, patches))
    subjects = git(repo, "log", "--format=%s", "-5").splitlines()
    assert subjects[::-1] == [o.spec.subject for o in rendered(name).patches]

    applied = fixture_tree(name)
    assert invoke("apply", "--force", "--tree", str(applied)).exit_code == 0
    by_apply = tree_bytes(applied)
    assert tree_bytes(repo) == {f: b for f, b in by_apply.items() if not f.startswith(".portkit/")}


# -- apply --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_apply_then_reverse_restores_every_byte(fixture_tree, name):
    root = fixture_tree(name)
    before = tree_bytes(root)
    outcome = apply_mod.apply(detect(root), FEATURE, pin=None)
    assert outcome.status == apply_mod.APPLIED
    after = tree_bytes(root)
    touched = {f for f in changed(before, after) if not f.startswith(".portkit/")}
    assert touched == set(outcome.files) == set(rendered(name).files())

    back = apply_mod.reverse(detect(root), FEATURE, pin=None)
    assert back.status == apply_mod.REVERSED
    assert tree_bytes(root) == before


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_second_apply_says_already_applied_and_changes_nothing(fixture_tree, name):
    root = fixture_tree(name)
    assert invoke("apply", "--force", "--tree", str(root)).exit_code == 0
    after = tree_bytes(root)
    again = invoke("apply", "--force", "--tree", str(root))
    assert again.exit_code == 0
    assert "already applied (5 patches, kept in " in again.output
    assert tree_bytes(root) == after
    assert apply_mod.apply(detect(root), FEATURE, pin=None).status == apply_mod.ALREADY


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_dry_run_shows_the_series_and_changes_nothing(fixture_tree, name):
    root = fixture_tree(name)
    before = tree_bytes(root)
    result = invoke("apply", "--force", "--tree", str(root), "--dry-run")
    assert result.exit_code == 0
    assert result.output.count("Subject: [PATCH ") == 5
    assert "diff --git a/src/llama-graph.cpp b/src/llama-graph.cpp" in result.output
    assert apply_mod.apply(detect(root), FEATURE, pin=None, dry_run=True).status == (
        apply_mod.DRY_RUN)
    assert tree_bytes(root) == before


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_patched_tree_is_still_c_plus_plus_and_rotates_every_kv_write(fixture_tree, name):
    root = fixture_tree(name)
    assert invoke("apply", "--force", "--tree", str(root)).exit_code == 0
    index = Index.build(root, ["src/**/*"])
    assert {rel: f.errors for rel, f in index.files.items() if f.errors} == {}
    graph = (root / "src" / "llama-graph.cpp").read_text()
    assert graph.count("llama_attn_rot_apply(ctx0,") >= 5


def test_a_tree_that_has_the_feature_is_left_alone(fixture_tree, tmp_path):
    patched = fixture_tree("renamed")
    assert invoke("apply", "--force", "--tree", str(patched)).exit_code == 0
    shutil.rmtree(patched / ".portkit")  # as if upstream had written these sources
    before = tree_bytes(patched)
    result = invoke("apply", "--force", "--tree", str(patched))
    assert result.exit_code == 0
    assert "present upstream" in result.output and "nothing applied" in result.output
    assert tree_bytes(patched) == before


def test_git_tree_applies_at_its_pin_and_refuses_another(fixture_git_tree):
    root = fixture_git_tree("renamed")
    head = git(root, "rev-parse", "HEAD").strip()
    before = tree_bytes(root)
    wrong = invoke("apply", "--pin", "7049736b", "--tree", str(root))
    assert wrong.exit_code == 4
    assert wrong.output == (f"portkit: the tree is at {head[:12]} (from git HEAD), not at the pin "
                            f"7049736b; pass --force to apply anyway\n")
    assert tree_bytes(root) == before
    right = invoke("apply", "--pin", head[:8], "--tree", str(root))
    assert right.exit_code == 0, right.output
    assert "applied 5 patch(es)" in right.output


def test_uncommitted_work_in_a_touched_file_is_refused(fixture_git_tree):
    root = fixture_git_tree("old")
    graph = root / "src" / "llama-graph.cpp"
    graph.write_text(graph.read_text() + "// local work in progress\n")
    before = tree_bytes(root)
    result = invoke("apply", "--force", "--tree", str(root))
    assert result.exit_code == 4
    assert result.output == ("portkit: uncommitted changes in src/llama-graph.cpp; "
                             "commit or stash them first\n")
    assert tree_bytes(root) == before


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fork_gets_the_series_after_its_own_patches(fixture_fork: Callable[[str], Fork], name):
    fork = fixture_fork(name)
    before = tree_bytes(fork.root)
    result = invoke("apply", "--pin", fork.base[:8], "--tree", str(fork.root))
    assert result.exit_code == 0, result.output
    series = fork.root / "llama" / "patches"
    names = sorted(p.name for p in series.glob("*.patch"))
    assert names[:2] == fork.own_patches
    ours = names[2:]
    assert [n[:5] for n in ours] == ["0003-", "0004-", "0005-", "0006-", "0007-"]
    # written as the fork writes its own (format-patch --no-signature --no-numbered
    # --zero-commit): a maintainer cannot tell them from the fork's own patches
    own = read_series(series)
    added = [p for p in own.patches if p.name in ours]
    assert [p.subject for p in added] == [p.spec.subject for p in rendered(name).patches]
    assert [p.name for p in added] == [format_patch_name(3 + i, p.subject)
                                       for i, p in enumerate(added)]
    conventions = detect_conventions([p for p in own.patches if p.name in fork.own_patches])
    assert replace(detect_conventions(added), next_number=0) == \
        replace(conventions, next_number=0)
    assert all(p.data.startswith(b"From 0000000000000000000000000000000000000000 ")
               and b"Subject: [PATCH] " in p.data and p.signature is None for p in added)

    # the copies are git-am patches on top of the fork's own: they rebuild the vendored tree
    git(fork.upstream, "am", "--quiet", *(str(series / n) for n in ours))
    vendored = tree_bytes(fork.root / "llama" / "llama.cpp")
    rebuilt = tree_bytes(fork.upstream)
    assert {f: b for f, b in rebuilt.items() if not f.startswith("ggml/")} == vendored

    back = invoke("apply", "--pin", fork.base[:8], "--tree", str(fork.root), "--reverse")
    assert back.exit_code == 0, back.output
    assert tree_bytes(fork.root) == before


# -- faults leave the tree as it was ------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_deleted_anchor_target_fails_cleanly(fixture_tree, name):
    root = fixture_tree(name)
    cut_rope_shift(root, name)
    before = tree_bytes(root)
    result = invoke("apply", "--force", "--tree", str(root))
    assert result.exit_code == 3
    assert result.output.count("\n") == 1
    assert result.output.startswith("portkit: anchor kv-cache.rope-shift: no function named "
                                    "llama_kv_cache::build_rope_shift or an alias")
    assert tree_bytes(root) == before


def test_local_edit_at_an_insertion_point_fails_cleanly(fixture_tree):
    root = fixture_tree("renamed")
    graph = root / "src" / "llama-graph.cpp"
    text = graph.read_text()
    at = text.index("llm_graph_input_attn_kv * inp,")  # the kv overload of build_attn
    graph.write_text(text[:at] + text[at:].replace('cb(cur, "kqv_out", il);',
                                                   'cb(cur, "attn_out_local", il);', 1))
    before = tree_bytes(root)
    result = invoke("apply", "--force", "--tree", str(root))
    assert result.exit_code == 3
    assert "graph.build-attn-kv.rotate-out: no statement" in result.output
    assert result.output.count("\n") == 1
    assert tree_bytes(root) == before


def test_read_only_file_fails_cleanly(fixture_tree):
    root = fixture_tree("old")
    graph = root / "src" / "llama-graph.cpp"
    graph.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    before = tree_bytes(root)
    result = invoke("apply", "--force", "--tree", str(root))
    assert result.exit_code == 4
    assert result.output == f"portkit: cannot write {graph} (read-only)\n"
    assert tree_bytes(root) == before
    assert not (root / ".portkit").exists()
