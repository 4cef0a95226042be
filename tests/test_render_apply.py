"""Rendering the rotation series and applying it to real trees: all or nothing, and back."""

from __future__ import annotations

import hashlib
import re
import shutil
import stat
import subprocess
from pathlib import Path

import git
import pytest
from click.testing import CliRunner

from portkit import apply as apply_mod
from portkit.cli import cli
from portkit.errors import BuildError, TreeError
from portkit.render import NOT_APPLICABLE, PRESENT, RENDERED, render
from portkit.tree import detect

from .conftest import copy_sources, rope_shift_span
from .test_tree import make_ollama_fork

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_CONFIG_SYSTEM": "/dev/null"}


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with its content hash and mode: the tree, byte for byte."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            + oct(p.stat().st_mode) for p in sorted(root.rglob("*")) if p.is_file()}


def sdist_copy(registry_tree, version: str, dest: Path, full: bool = False) -> Path:
    """A writable llama-cpp-python-like tree: CHANGELOG.md + vendor/llama.cpp."""
    src = registry_tree(version)
    dest.mkdir(parents=True)
    shutil.copy2(src / "CHANGELOG.md", dest / "CHANGELOG.md")
    if full:
        shutil.copytree(src / "vendor" / "llama.cpp", dest / "vendor" / "llama.cpp", symlinks=True)
    else:
        copy_sources(src, dest / "vendor" / "llama.cpp")
    return dest


def pin_of(path: Path) -> str:
    pin = detect(path).pin
    assert pin is not None
    return pin[:8]


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


# -- render ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.3.16", "0.3.17", "0.3.19"])
def test_series_is_a_git_am_series_that_applies_in_order(registry_tree, tmp_path, version):
    out = tmp_path / "series"
    result = invoke("render", "--tree", str(registry_tree(version)), "--out", str(out))
    assert result.exit_code == 0, result.output
    patches = sorted(out.glob("*.patch"))
    assert [p.name[:5] for p in patches] == ["0001-", "0002-", "0003-", "0004-", "0005-"]
    assert "kv-cache-shared-rotation: not applicable" in result.output

    work = copy_sources(registry_tree(version), tmp_path / "work")
    repo = git.Repo.init(work)
    with repo.git.custom_environment(**GIT_ENV):
        repo.git.add("-A")
        repo.git.commit("-qm", "vendored tree")
        repo.git.am(*[str(p) for p in patches])
        log = repo.git.log("--format=%s%n%b", "-5")
    first = patches[0].read_text()
    assert re.match(r"From [0-9a-f]{40} Mon Sep 17 00:00:00 2001\nFrom: portkit", first)
    assert "Subject: [PATCH 1/5] kv-cache: Hadamard generator" in first
    assert f"for llama.cpp {detect(registry_tree(version)).pin[:12]}" in log
    assert "Part of the port of ggml-org/llama.cpp#21038" in log
    text = "".join((work / "src" / f).read_text() for f in ("llama-graph.cpp",))
    assert text.count("llama_attn_rot_apply(ctx0,") >= 5


def test_series_adapts_to_the_tree_shape(registry_tree):
    old = render(detect(registry_tree("0.3.16")), "kv-rotation")
    new = render(detect(registry_tree("0.3.17")), "kv-rotation")
    assert old.variables["kv_class"] == "llama_kv_cache_unified"
    assert old.variables["head_k_layer"] == "hparams.n_embd_head_k"
    assert new.variables["head_k_layer"] == "hparams.n_embd_head_k(layer.il)"
    old_diff = "".join(o.mail.diff for o in old.patches if o.mail)
    assert "llama_kv_cache_unified_context::build_input_k_rot" in old_diff
    assert "src/llama-kv-cache-unified.cpp" in old_diff
    skipped = [s for o in old.outcomes for s in o.skipped_edits]
    assert any("delegates to the attention input" in s for s in skipped)
    new_diff = "".join(o.mail.diff for o in new.patches if o.mail)
    assert "inp_attn->self_k_rot_swa" in new_diff, "hybrid iSWA inputs exist at 0.3.17"


@pytest.mark.parametrize("version", ["0.3.20", "0.3.36"])
def test_upstream_rotation_is_recognised(registry_tree, version):
    rendered = render(detect(registry_tree(version)), "kv-rotation")
    assert rendered.present_upstream and rendered.patches == []
    statuses = {o.spec.name: o.status for o in rendered.outcomes}
    assert statuses["kv-cache-rotation-state"] == PRESENT
    expected = PRESENT if version == "0.3.36" else NOT_APPLICABLE
    assert statuses["kv-cache-shared-rotation"] == expected


def test_committed_series_match_a_fresh_render(registry_tree, tmp_path):
    """portkit's drift check on its own templates: patches/ must be what render makes now."""
    committed = Path(__file__).parent.parent / "patches" / "kv-rotation"
    folders = sorted(p for p in committed.iterdir() if p.is_dir())
    assert len(folders) == 3
    versions = {detect(registry_tree(v)).pin: v for v in ("0.3.16", "0.3.17", "0.3.19")}
    for folder in folders:
        version = versions[folder.name]
        out = tmp_path / folder.name
        assert invoke("render", "--tree", str(registry_tree(version)), "--out",
                      str(out)).exit_code == 0
        fresh = {p.name: p.read_text() for p in out.glob("*.patch")}
        kept = {p.name: p.read_text() for p in folder.glob("*.patch")}
        assert fresh == kept, f"patches/kv-rotation/{folder.name} is stale: re-render it"


# -- apply ----------------------------------------------------------------------------------


def test_apply_twice_then_reverse_restores_every_byte(registry_tree, tmp_path):
    tree = sdist_copy(registry_tree, "0.3.17", tmp_path / "t")
    before = snapshot(tree)
    pin = pin_of(tree)
    first = invoke("apply", "--pin", pin, "--tree", str(tree))
    assert first.exit_code == 0, first.output
    assert "applied 5 patch(es)" in first.output
    after = snapshot(tree)
    assert after != before
    again = invoke("apply", "--pin", pin, "--tree", str(tree))
    assert again.exit_code == 0 and "already applied" in again.output
    assert snapshot(tree) == after
    back = invoke("apply", "--pin", pin, "--tree", str(tree), "--reverse")
    assert back.exit_code == 0, back.output
    assert snapshot(tree) == before


def test_dry_run_shows_the_series_and_changes_nothing(registry_tree, tmp_path):
    tree = sdist_copy(registry_tree, "0.3.19", tmp_path / "t")
    before = snapshot(tree)
    result = invoke("apply", "--pin", pin_of(tree), "--tree", str(tree), "--dry-run")
    assert result.exit_code == 0
    assert result.output.count("Subject: [PATCH ") == 5
    assert "diff --git a/src/llama-graph.cpp b/src/llama-graph.cpp" in result.output
    assert snapshot(tree) == before


def test_wrong_pin_names_both_commits(registry_tree, tmp_path):
    tree = sdist_copy(registry_tree, "0.3.17", tmp_path / "t")
    before = snapshot(tree)
    result = invoke("apply", "--pin", "7049736b", "--tree", str(tree))
    assert result.exit_code == TreeError.exit_code == 4
    assert result.output.strip() == ("portkit: the tree is at 49bfddeca18e (from CHANGELOG.md), "
                                     "not at the pin 7049736b; pass --force to apply anyway")
    assert snapshot(tree) == before
    forced = invoke("apply", "--pin", "7049736b", "--tree", str(tree), "--force")
    assert forced.exit_code == 0 and snapshot(tree) != before


def test_present_upstream_changes_nothing(registry_tree, tmp_path):
    tree = sdist_copy(registry_tree, "0.3.20", tmp_path / "t")
    before = snapshot(tree)
    result = invoke("apply", "--pin", pin_of(tree), "--tree", str(tree))
    assert result.exit_code == 0
    assert "present upstream" in result.output and "nothing applied" in result.output
    assert snapshot(tree) == before


def test_reverse_of_a_tree_never_patched_is_an_error(registry_tree, tmp_path):
    tree = sdist_copy(registry_tree, "0.3.17", tmp_path / "t")
    result = invoke("apply", "--pin", pin_of(tree), "--tree", str(tree), "--reverse")
    assert result.exit_code == TreeError.exit_code
    assert "is not applied to this tree" in result.output


def test_ollama_fork_gets_the_series_in_llama_patches(registry_tree, tmp_path):
    fork = make_ollama_fork(registry_tree("0.3.17"), tmp_path / "fork", "49bfddec")
    before = snapshot(fork)
    result = invoke("apply", "--pin", "49bfddec", "--tree", str(fork))
    assert result.exit_code == 0, result.output
    added = sorted(p.name for p in (fork / "llama" / "patches").glob("*.patch"))
    assert added[0] == "0001-fork-local-change.patch"
    assert [a[:5] for a in added[1:]] == ["0002-", "0003-", "0004-", "0005-", "0006-"]
    text = (fork / "llama" / "patches" / added[1]).read_text()
    assert text.startswith("From ") and "diff --git a/src/llama-kv-cache.cpp" in text
    assert "attn_rot_k" in (fork / "llama" / "llama.cpp" / "src" / "llama-kv-cache.h").read_text()
    back = invoke("apply", "--pin", "49bfddec", "--tree", str(fork), "--reverse")
    assert back.exit_code == 0, back.output
    assert snapshot(fork) == before


# -- faults leave the tree as it was -------------------------------------------------------


def test_deleted_anchor_fails_cleanly(registry_tree, tmp_path):
    tree = sdist_copy(registry_tree, "0.3.17", tmp_path / "t")
    src = tree / "vendor" / "llama.cpp" / "src" / "llama-kv-cache.cpp"
    text = src.read_text()
    start, end = rope_shift_span(text)
    src.write_text(text[:start] + text[end:])
    before = snapshot(tree)
    result = invoke("apply", "--pin", pin_of(tree), "--tree", str(tree))
    assert result.exit_code == 3
    assert result.output.count("\n") == 1
    assert result.output.startswith("portkit: anchor kv-cache.rope-shift: no function named")
    assert snapshot(tree) == before


def test_read_only_file_fails_cleanly(registry_tree, tmp_path):
    tree = sdist_copy(registry_tree, "0.3.17", tmp_path / "t")
    graph = tree / "vendor" / "llama.cpp" / "src" / "llama-graph.cpp"
    graph.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    before = snapshot(tree)
    result = invoke("apply", "--pin", pin_of(tree), "--tree", str(tree))
    assert result.exit_code == TreeError.exit_code
    assert result.output == f"portkit: cannot write {graph} (read-only)\n"
    assert snapshot(tree) == before


def test_local_edit_at_an_insertion_point_fails_cleanly(registry_tree, tmp_path):
    tree = sdist_copy(registry_tree, "0.3.17", tmp_path / "t")
    graph = tree / "vendor" / "llama.cpp" / "src" / "llama-graph.cpp"
    text = graph.read_text()
    at = text.index("llm_graph_input_attn_kv * inp,")  # the kv overload of build_attn
    graph.write_text(text[:at] + text[at:].replace('cb(cur, "kqv_out", il);',
                                                   'cb(cur, "attn_out_local", il);', 1))
    before = snapshot(tree)
    result = invoke("apply", "--pin", pin_of(tree), "--tree", str(tree))
    assert result.exit_code == 3
    assert "graph.build-attn-kv.rotate-out: no statement" in result.output
    assert result.output.count("\n") == 1
    assert snapshot(tree) == before


def test_dirty_git_checkout_is_refused(registry_tree, tmp_path):
    work = copy_sources(registry_tree("0.3.17"), tmp_path / "work")
    repo = git.Repo.init(work)
    with repo.git.custom_environment(**GIT_ENV):
        repo.git.add("-A")
        repo.git.commit("-qm", "vendored")
    (work / "src" / "llama-graph.cpp").write_text(
        (work / "src" / "llama-graph.cpp").read_text() + "// local work in progress\n")
    before = snapshot(work)
    result = invoke("apply", "--pin", repo.head.commit.hexsha[:8], "--tree", str(work))
    assert result.exit_code == TreeError.exit_code
    assert result.output == ("portkit: uncommitted changes in src/llama-graph.cpp; "
                             "commit or stash them first\n")
    assert snapshot(work) == before


def test_failure_after_writing_rolls_everything_back(registry_tree, tmp_path, monkeypatch):
    fork = make_ollama_fork(registry_tree("0.3.19"), tmp_path / "fork", "c0159f9c")
    before = snapshot(fork)

    def broken(tree, files):
        raise BuildError("src/llama-graph.cpp does not compile: error: injected")

    monkeypatch.setattr(apply_mod, "compile_units", broken)
    result = invoke("apply", "--pin", "c0159f9c", "--tree", str(fork), "--compile")
    assert result.exit_code == BuildError.exit_code == 10 and "injected" in result.output
    assert snapshot(fork) == before


# -- the patched trees compile ---------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.3.16", "0.3.17", "0.3.19"])
def test_patched_registry_tree_compiles(registry_tree, tmp_path, version):
    tree = sdist_copy(registry_tree, version, tmp_path / "t", full=True)
    result = invoke("apply", "--pin", pin_of(tree), "--tree", str(tree), "--compile")
    assert result.exit_code == 0, result.output
    assert re.search(r"compiled src/llama-graph\.cpp, src/llama-kv-cache(-unified)?\.cpp with "
                     r"the tree's CMake project", result.output)


def test_patched_ollama_fork_compiles(registry_tree, tmp_path):
    fork = make_ollama_fork(registry_tree("0.3.17"), tmp_path / "fork", "49bfddec")
    result = invoke("apply", "--pin", "49bfddec", "--tree", str(fork), "--compile")
    assert result.exit_code == 0, result.output
    # a fork vendors a subset with no root CMake project: portkit builds it with its own,
    # so the touched units are really compiled, and libllama linked
    assert "portkit's CMake project for the vendored subset, libllama and ggml compiled and " \
           "linked" in result.output


def remove_inheritance(path: Path) -> None:
    """0.3.36's constructor with its shared-cache inheritance block taken out: seed 001's bug."""
    text = path.read_text()
    start = text.index("    if (other) {\n        n_embd_head_k_all = other->n_embd_head_k_all;")
    end = text.index("} else {\n", start) + len("} else {\n")
    path.write_text(text[:start] + "    {\n" + text[end:])


def test_missing_inheritance_is_detected_rendered_and_compiles(registry_tree, tmp_path):
    tree = sdist_copy(registry_tree, "0.3.36", tmp_path / "t", full=True)
    kv = tree / "vendor" / "llama.cpp" / "src" / "llama-kv-cache.cpp"
    remove_inheritance(kv)
    assert "attn_rot_k = other->attn_rot_k" not in kv.read_text()
    rendered = render(detect(tree), "kv-rotation")
    statuses = {o.spec.name: o.status for o in rendered.outcomes}
    assert statuses.pop("kv-cache-shared-rotation") == RENDERED
    assert set(statuses.values()) == {PRESENT}
    result = invoke("apply", "--pin", pin_of(tree), "--tree", str(tree), "--compile")
    assert result.exit_code == 0, result.output
    assert "applied 1 patch(es)" in result.output
    assert "attn_rot_k        = other->attn_rot_k;" in kv.read_text()
    assert "compiled src/llama-kv-cache.cpp" in result.output


def test_git_am_of_the_ollama_series_reproduces_the_vendored_change(registry_tree, tmp_path):
    """The copies in llama/patches are real git-am patches against the vendored tree."""
    fork = make_ollama_fork(registry_tree("0.3.19"), tmp_path / "fork", "c0159f9c")
    base = copy_sources(registry_tree("0.3.19"), tmp_path / "base")
    assert invoke("apply", "--pin", "c0159f9c", "--tree", str(fork)).exit_code == 0
    repo = git.Repo.init(base)
    with repo.git.custom_environment(**GIT_ENV):
        repo.git.add("-A")
        repo.git.commit("-qm", "base")
        ours = sorted((fork / "llama" / "patches").glob("000[2-9]-*.patch"))
        repo.git.am(*[str(p) for p in ours])
    vendored = fork / "llama" / "llama.cpp" / "src"
    diff = subprocess.run(["diff", "-r", str(base / "src"), str(vendored)],
                          capture_output=True, text=True)
    assert diff.returncode == 0, diff.stdout[:2000]
