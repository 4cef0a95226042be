"""Renames, copies, deletions, mode changes, executables and symbolic links: read as git
writes them, carried by apply (through the transaction, the record and --reverse) and by
the per-hunk engine, with the result `git apply` gives."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from portkit.cli import cli
from portkit.hunks import CLEAN, apply_hunks
from portkit.series import EXECUTABLE, REGULAR, SYMLINK, read_series

from .test_series import GIT_ENV, GitRepo

GRAPH = "src/llama-graph.cpp"
MODEL = "src/llama-model.cpp"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def state(root: Path) -> dict[str, tuple[str, bytes, int]]:
    """Every file under `root` but .portkit: its kind, bytes (a link's target) and mode."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.split("/")[0] in (".portkit", ".git"):
            continue
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(path).encode(), 0)
        elif stat.S_ISREG(st.st_mode):
            out[rel] = ("file", path.read_bytes(), stat.S_IMODE(st.st_mode))
    return out


def edit(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert data.count(old) >= 1, old
    path.write_bytes(data.replace(old, new, 1))


@pytest.fixture
def kinds(fixture_tree, tmp_path) -> tuple[Path, Path, GitRepo]:
    """(tree, series, repository): a fixture tree, and a series git format-patch made of six
    commits on it: a rename with a change, a copy with a change, a mode change alone, a new
    executable, a new symbolic link, a deletion."""
    tree = fixture_tree("old")
    repo = GitRepo(tmp_path / "repo")
    shutil.copytree(tree, repo.root)
    repo.git("init", "-q", "-b", "main", ".")
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "base")
    repo.git("tag", "base")
    root = repo.root
    repo.git("mv", "src/llama-hparams.h", "src/llama-hparams-moved.h")
    edit(root / "src/llama-hparams-moved.h", b"#pragma once", b"#pragma once // moved")
    repo.commit("rename with a change", {"src/llama-hparams-moved.h":
                                         (root / "src/llama-hparams-moved.h").read_bytes()})
    copied = (root / GRAPH).read_bytes().replace(b"#include", b"#include /* copy */", 1)
    repo.commit("copy with a change", {"src/llama-graph-copy.cpp": copied})
    (root / MODEL).chmod(0o755)
    repo.git("add", MODEL)
    repo.commit("mode change", {})
    (root / "tools").mkdir()
    (root / "tools/run.sh").write_bytes(b"#!/bin/sh\necho portkit\n")
    (root / "tools/run.sh").chmod(0o755)
    repo.git("add", "tools/run.sh")
    repo.commit("an executable", {})
    (root / "src/graph-link.cpp").symlink_to("llama-graph.cpp")
    repo.git("add", "src/graph-link.cpp")
    repo.commit("a symbolic link", {})
    repo.commit("a deletion", {"src/llama-kv-cache-unified.h": None})
    series = tmp_path / "kinds"
    repo.git("format-patch", "-q", "-M", "-C", "-C", "--no-signature", "--zero-commit",
             "-o", str(series), "base..HEAD")
    return tree, series, repo


def test_the_model_says_what_git_wrote(kinds):
    _, folder, _ = kinds
    files = [p.files[0] for p in read_series(folder).patches]
    rename, copy, mode, executable, link, deletion = files
    assert (rename.status, rename.rename_from, rename.rename_to) == (
        "renamed", "src/llama-hparams.h", "src/llama-hparams-moved.h")
    assert copy.is_copy and copy.rename_from == GRAPH and len(copy.hunks) == 1
    assert mode.text_free and mode.mode_changed and (mode.old_mode, mode.new_mode) == (
        REGULAR, EXECUTABLE)
    assert executable.new_mode == EXECUTABLE and executable.status == "created"
    assert link.is_symlink and link.new_mode == SYMLINK and link.link_target == "llama-graph.cpp"
    assert deletion.status == "deleted" and deletion.new_mode is None


def test_the_engine_gives_what_git_apply_gives(kinds, tmp_path):
    tree, folder, repo = kinds
    with apply_hunks(read_series(folder), tree) as result:
        assert all(p.applied and not p.problems for p in result.patches)
        assert all(h.status == CLEAN for h in result.hunks)
        assert result.modes[MODEL] == EXECUTABLE
        assert result.modes["tools/run.sh"] == EXECUTABLE
        assert result.modes["src/graph-link.cpp"] == SYMLINK
        assert result.files["src/graph-link.cpp"] == b"llama-graph.cpp"
        assert result.files["src/llama-hparams.h"] is None
        assert result.files["src/llama-kv-cache-unified.h"] is None
        for rel, data in result.files.items():
            if data is not None and result.modes[rel] != SYMLINK:
                assert data == (repo.root / rel).read_bytes(), rel


def test_apply_and_reverse_carry_every_kind_of_change(kinds):
    tree, folder, repo = kinds
    before = state(tree)
    applied = invoke("apply", "--force", "--tree", str(tree), "--series", str(folder))
    assert applied.exit_code == 0, applied.output
    after = state(tree)
    # what git apply gives: the repository's own work tree at HEAD
    want = state(repo.root)
    assert after == want
    assert after["src/graph-link.cpp"] == ("link", b"llama-graph.cpp", 0)
    assert after["tools/run.sh"][2] & 0o111 and after[MODEL][2] & 0o111
    assert "src/llama-hparams.h" not in after and "src/llama-graph-copy.cpp" in after
    record = json.loads((tree / ".portkit" / "kinds" / "state.json").read_text())
    assert len(record["patches"]) == 6
    back = invoke("apply", "--force", "--tree", str(tree), "--series", str(folder), "--reverse")
    assert back.exit_code == 0, back.output
    assert state(tree) == before
    assert not (tree / ".portkit").exists()


def test_git_apply_agrees_on_the_same_series(kinds, tmp_path):
    """The reference the tests above compare with: git apply of the series on the tree."""
    tree, folder, repo = kinds
    copy = tmp_path / "by-git"
    shutil.copytree(tree, copy, symlinks=True)
    env = {**os.environ, **GIT_ENV}
    for patch in sorted(folder.glob("*.patch")):
        subprocess.run(["git", "apply", str(patch)], cwd=copy, env=env, check=True)
    assert state(copy) == state(repo.root)


def test_drift_calls_text_free_changes_clean(kinds, tmp_path):
    tree, folder, _ = kinds
    out = tmp_path / "drift.json"
    result = invoke("drift", "--series", str(folder), "--tree", str(tree), "--base", str(tree),
                    "--format", "json", "--output", str(out))
    patches = json.loads(out.read_text())["targets"][0]["patches"]
    assert [p["status"] for p in patches] == ["clean"] * 6, patches
    assert result.exit_code == 0, result.output


def test_rebase_carries_every_kind_of_change_as_git_apply_does(kinds, tmp_path):
    """Onto a target that drifted (lines added to every touched text), rebase writes a
    series that `git apply` takes and that gives what `git apply` of the original gives:
    the rename with its change, the copy, the mode change, the executable, the symbolic
    link and the deletion, each as such (no empty new file, no lost mode)."""
    tree, folder, _ = kinds
    target = tmp_path / "target"
    shutil.copytree(tree, target, symlinks=True)
    for rel in ("src/llama-hparams.h", GRAPH, MODEL):
        path = target / rel
        path.write_bytes(path.read_bytes() + b"// upstream moved on\n" * 3)
    want = tmp_path / "want"
    shutil.copytree(target, want, symlinks=True)
    env = {**os.environ, **GIT_ENV}
    for patch in sorted(folder.glob("*.patch")):
        subprocess.run(["git", "apply", str(patch)], cwd=want, env=env, check=True)
    out = tmp_path / "carried"
    result = invoke("rebase", "--series", str(folder), "--base", str(tree), "--onto",
                    str(target), "--out", str(out), "--format", "json")
    report = json.loads(result.output)
    assert [p["status"] for p in report["patches"]] == ["unchanged"] * 6, \
        [p["reason"] for p in report["patches"]]
    got = tmp_path / "got"
    shutil.copytree(target, got, symlinks=True)
    carried = sorted(out.glob("*.patch"))
    assert [p.name for p in carried] == sorted(p.name for p in folder.glob("*.patch"))
    for patch in carried:
        subprocess.run(["git", "apply", str(patch)], cwd=got, env=env, check=True)
    assert state(got) == state(want)
    texts = [p.read_text() for p in carried]
    assert "rename from src/llama-hparams.h\nrename to src/llama-hparams-moved.h" in texts[0]
    assert "old mode 100644\nnew mode 100755" in texts[2]
    assert "new file mode 100755" in texts[3] and "new file mode 120000" in texts[4]
