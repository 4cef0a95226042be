"""Tree layouts, pins and fetching, on real registry trees."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import git
import pytest
from click.testing import CliRunner

from portkit import tree as tree_mod
from portkit.cli import cli
from portkit.errors import ChecksumError, InputError, SpecError

from .conftest import copy_sources


def make_ollama_fork(src_tree: Path, dest: Path, fetch_head: str) -> Path:
    """Lay out an ollama-style fork from a registry tree (as docs/fixtures.md describes)."""
    llama = tree_mod.detect(src_tree).llama_root
    copy_sources(src_tree, dest / "llama" / "llama.cpp")
    shutil.copytree(llama / "ggml", dest / "ml" / "backend" / "ggml" / "ggml")
    (dest / "Makefile.sync").write_text(
        f"UPSTREAM=https://example.invalid/llama.cpp.git\nWORKDIR=llama/vendor\n"
        f"FETCH_HEAD={fetch_head}\n")
    (dest / "llama" / "build-info.cpp").write_text(
        f'int LLAMA_BUILD_NUMBER = 0;\nchar const *LLAMA_COMMIT = "{fetch_head}";\n')
    patches = dest / "llama" / "patches"
    patches.mkdir()
    (patches / "0001-fork-local-change.patch").write_text("From: fork\nSubject: [PATCH] x\n")
    return dest


def test_sdist_layout_and_pin_from_changelog(registry_tree):
    info = tree_mod.detect(registry_tree("0.3.17"))
    assert info.layout == tree_mod.SDIST
    assert info.llama_root == info.root / "vendor" / "llama.cpp"
    assert (info.llama_root / "src" / "llama-kv-cache.cpp").is_file()
    assert info.ggml_root == info.llama_root / "ggml"
    assert info.pin is not None and info.pin.startswith("49bfddec")
    assert info.pin_source == "CHANGELOG.md"


def test_pypi_fetch_is_cached_and_checksummed(registry_tree, tmp_path, monkeypatch):
    path = registry_tree("0.3.16")
    assert tree_mod.fetch("pypi:llama-cpp-python==0.3.16") == path
    sdist = next((path.parent.parent / "sdists").glob("llama_cpp_python-0.3.16.tar.gz"))
    assert (sdist.parent / (sdist.name + ".sha256")).read_text().strip() == (
        "34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6")


def test_corrupt_download_is_refused_and_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path))
    bad = tmp_path / "sdists" / "llama_cpp_python-0.3.17.tar.gz"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not the real sdist")
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        tree_mod.fetch("pypi:llama-cpp-python==0.3.17")
    assert not bad.exists()


def test_ollama_fork_layout_pin_from_makefile_sync(registry_tree, tmp_path):
    fork = make_ollama_fork(registry_tree("0.3.17"), tmp_path / "fork", "7049736b")
    info = tree_mod.detect(fork)
    assert info.layout == tree_mod.OLLAMA
    assert info.llama_root == fork / "llama" / "llama.cpp"
    assert info.ggml_root == fork / "ml" / "backend" / "ggml" / "ggml"
    assert info.series_dir == fork / "llama" / "patches"
    assert (info.pin, info.pin_source) == ("7049736b", "Makefile.sync FETCH_HEAD")
    (fork / "Makefile.sync").unlink()
    info = tree_mod.detect(fork)
    assert (info.pin, info.pin_source) == ("7049736b", "llama/build-info.cpp LLAMA_COMMIT")


def test_plain_git_checkout_pin_is_head(registry_tree, tmp_path):
    plain = copy_sources(registry_tree("0.3.19"), tmp_path / "plain")
    repo = git.Repo.init(plain)
    repo.git.add("-A")
    repo.git.commit("-qm", "snapshot", "--author", "t <t@t>")
    info = tree_mod.detect(plain)
    assert info.layout == tree_mod.PLAIN and info.pin == repo.head.commit.hexsha
    assert info.pin_source == "git HEAD"


def test_git_fetch_from_a_local_remote_at_a_revision(registry_tree, tmp_path, monkeypatch):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path / "cache"))
    upstream = copy_sources(registry_tree("0.3.17"), tmp_path / "upstream")
    repo = git.Repo.init(upstream)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    with repo.git.custom_environment(**env):
        repo.git.add("-A")
        repo.git.commit("-qm", "first")
        first = repo.head.commit.hexsha
        (upstream / "src" / "llama.cpp").write_text("// changed\n")
        repo.git.commit("-qam", "second")
    fetched = tree_mod.fetch(f"git:file://{upstream}@{first[:10]}")
    info = tree_mod.detect(fetched)
    assert info.pin == first
    assert (fetched / "src" / "llama.cpp").read_text() != "// changed\n"
    by_path = tree_mod.fetch(f"git:{upstream}@HEAD")
    assert tree_mod.detect(by_path).pin == repo.head.commit.hexsha


def test_local_directory_fetch_copies_into_the_cache(registry_tree, tmp_path, monkeypatch):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path / "cache"))
    plain = copy_sources(registry_tree("0.3.19"), tmp_path / "plain")
    fetched = tree_mod.fetch(str(plain))
    assert fetched.is_relative_to(tmp_path / "cache")
    assert (fetched / "src" / "llama-graph.cpp").read_bytes() == (
        plain / "src" / "llama-graph.cpp").read_bytes()


def test_tree_info_json_and_clean_errors(registry_tree, tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["tree", "info", str(registry_tree("0.3.20")), "--format", "json"])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["layout"] == "llama-cpp-python" and data["pin"].startswith("f49e9178")
    result = runner.invoke(cli, ["tree", "info", str(tmp_path)])
    assert result.exit_code == InputError.exit_code == 12
    assert result.output.strip().count("\n") == 0
    assert result.output.startswith("portkit: not a llama.cpp tree")
    result = runner.invoke(cli, ["tree", "fetch", "pypi:llama-cpp-python"])
    assert result.exit_code == SpecError.exit_code == 9 and "must pin a version" in result.output
