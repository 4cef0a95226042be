"""Shared fixtures, in two tiers.

slow:    real llama.cpp trees from the registry (`registry_tree`, `small_tree`), fetched once
         per machine. Every test that uses one is marked `slow` at collection.
offline: the small fixture trees under tests/fixtures/trees (`fixture_tree`, `fixture_git_tree`,
         `fixture_fork`): `pytest -m "not slow"` runs only these, without network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from portkit import tree as tree_mod
from portkit.cache import cache_root

REGISTRY_VERSIONS = ["0.3.16", "0.3.17", "0.3.19", "0.3.20", "0.3.36"]

REAL_TREE_FIXTURES = {"registry_tree", "small_tree"}

FIXTURE_TREES = Path(__file__).parent / "fixtures" / "trees"
FIXTURE_NAMES = ["old", "renamed"]

# git sealed from the user's configuration, with fixed identities and dates: the same fixture
# gives the same commit ids on every machine
GIT_ENV = {
    "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "fixture", "GIT_AUTHOR_EMAIL": "fixture@example.invalid",
    "GIT_COMMITTER_NAME": "fixture", "GIT_COMMITTER_EMAIL": "fixture@example.invalid",
    "GIT_AUTHOR_DATE": "2025-10-13T12:00:00+00:00",
    "GIT_COMMITTER_DATE": "2025-10-13T12:00:00+00:00",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if REAL_TREE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


# -- slow tier: real trees ----------------------------------------------------------------


@contextmanager
def _cache_at(root: Path) -> Iterator[None]:
    """PORTKIT_CACHE set to `root` for a while (a test may have pointed it elsewhere)."""
    saved = os.environ.get("PORTKIT_CACHE")
    os.environ["PORTKIT_CACHE"] = str(root)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["PORTKIT_CACHE"]
        else:
            os.environ["PORTKIT_CACHE"] = saved


@pytest.fixture(scope="session")
def registry_tree() -> Callable[[str], Path]:
    """Path of the llama-cpp-python sdist tree of a version (downloaded on first use), always
    from the cache the session started with."""
    seen: dict[str, Path] = {}
    cache = cache_root()

    def get(version: str) -> Path:
        if version not in seen:
            with _cache_at(cache):
                seen[version] = tree_mod.fetch(f"pypi:llama-cpp-python=={version}")
        return seen[version]

    return get


def copy_sources(tree: Path, dest: Path) -> Path:
    """A plain llama.cpp tree holding just src/ and include/ of `tree` (cheap to mutate)."""
    llama = tree_mod.detect(tree).llama_root
    for part in ("src", "include"):
        shutil.copytree(llama / part, dest / part)
    return dest


@pytest.fixture
def small_tree(registry_tree: Callable[[str], Path], tmp_path: Path) -> Callable[[str], Path]:
    """A throw-away plain copy of a registry tree's sources, to mutate in a test."""

    def make(version: str) -> Path:
        return copy_sources(registry_tree(version), tmp_path / f"llama-{version}")

    return make


def rope_shift_span(text: str) -> tuple[int, int]:
    """Byte span of the definition of llama_kv_cache::build_rope_shift in llama-kv-cache.cpp."""
    start = text.index("ggml_tensor * llama_kv_cache::build_rope_shift(")
    return start, text.index("\n}\n", start) + 3


# -- offline tier: fixture trees ----------------------------------------------------------


def git(cwd: Path, *args: str) -> str:
    """Run git in `cwd`, sealed from the user's configuration; its stdout."""
    done = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, check=True,
                          capture_output=True, text=True)
    return done.stdout


def commit_all(root: Path, message: str) -> str:
    """Commit everything under `root` (a repository is made if there is none); the new HEAD."""
    if not (root / ".git").exists():
        git(root, "init", "--quiet", "--initial-branch=main")
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "--no-verify", "--message", message)
    return git(root, "rev-parse", "HEAD").strip()


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under `root` but git's own, by relative path: the tree, byte for byte."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(root).parts}


def _fresh(tmp_path: Path, stem: str) -> Path:
    """A path under tmp_path that does not exist yet, named after `stem`."""
    dest, n = tmp_path / stem, 1
    while dest.exists():
        n += 1
        dest = tmp_path / f"{stem}-{n}"
    return dest


def copy_fixture(name: str, dest: Path) -> Path:
    if name not in FIXTURE_NAMES:
        raise ValueError(f"no fixture tree {name!r} (have {', '.join(FIXTURE_NAMES)})")
    shutil.copytree(FIXTURE_TREES / name, dest)
    return dest


@dataclass(frozen=True)
class ForkPatch:
    """One of the fork's own changes: `lines` go right after the line `after` of `file`."""

    subject: str
    file: str  # relative to the llama.cpp root
    after: str
    lines: str


# The fork's own series: small, and away from every anchor of the rotation, as a real fork's
# patches mostly are (one of them shares llama-graph.cpp with the rotation).
FORK_PATCHES = [
    ForkPatch("llama: name the fork in the system info", "src/llama.cpp",
              '    s += " | ";\n', '    s += "FORK = fixture | ";\n'),
    ForkPatch("graph: log each input a graph gets", "src/llama-graph.cpp",
              "    inputs.emplace_back(std::move(input));\n",
              '    LLAMA_LOG_DEBUG("%s: graph input %zu\\n", __func__, inputs.size());\n'),
]


@dataclass(frozen=True)
class Fork:
    root: Path  # the fork: llama/llama.cpp, ml/backend/ggml/ggml, Makefile.sync, llama/patches
    upstream: Path  # a git repository of the fixture tree: main at `base`, branch fork on top
    base: str  # the upstream commit the fork is at (Makefile.sync FETCH_HEAD)
    own_patches: list[str]  # file names of the fork's own series in llama/patches


def lay_out_fork(name: str, dest: Path, upstream: Path) -> Fork:
    """An ollama-style fork of fixture `name` at `dest`, with FORK_PATCHES as its own series
    (made by git format-patch in `upstream`, a repository of the fixture) and applied to its
    vendored copy. The fork itself is a git repository with everything committed."""
    copy_fixture(name, upstream)
    base = commit_all(upstream, f"llama.cpp fixture tree {name}")
    git(upstream, "checkout", "--quiet", "-b", "fork")
    for patch in FORK_PATCHES:
        path = upstream / patch.file
        text = path.read_text()
        if text.count(patch.after) != 1:
            raise ValueError(f"{patch.file} of fixture {name}: want {patch.after!r} once")
        path.write_text(text.replace(patch.after, patch.after + patch.lines))
        git(upstream, "commit", "--quiet", "--all", "--message", patch.subject)

    series = vendor_as_fork(upstream, base, dest, pin=base)
    return Fork(dest, upstream, base, sorted(p.name for p in series.glob("*.patch")))


def vendor_as_fork(upstream: Path, base: str, dest: Path, *, pin: str) -> Path:
    """Lay out `dest` as an ollama-style fork of `upstream`, a repository whose branch `fork`
    holds the fork's own commits on `base`: those commits as the fork's series (git
    format-patch --no-signature --no-numbered --zero-commit) in llama/patches, the branch's
    tree vendored (llama/llama.cpp, ml/backend/ggml/ggml), Makefile.sync and build-info.cpp
    naming `pin`; everything committed. The series folder."""
    series = dest / "llama" / "patches"
    series.mkdir(parents=True)
    git(upstream, "format-patch", "--quiet", "--no-signature", "--no-numbered", "--zero-commit",
        "--output-directory", str(series), f"{base}..fork")
    shutil.copytree(upstream, dest / "llama" / "llama.cpp",
                    ignore=shutil.ignore_patterns(".git", "ggml"))
    shutil.copytree(upstream / "ggml", dest / "ml" / "backend" / "ggml" / "ggml")
    (dest / "Makefile.sync").write_text(
        f"UPSTREAM=https://github.com/ggml-org/llama.cpp.git\nWORKDIR=llama/vendor\n"
        f"FETCH_HEAD={pin}\n")
    (dest / "llama" / "build-info.cpp").write_text(
        f'int LLAMA_BUILD_NUMBER = 0;\nchar const *LLAMA_COMMIT = "{pin}";\n')
    commit_all(dest, f"vendor llama.cpp {pin[:12]} with the fork's patches")
    return series


@pytest.fixture(scope="session")
def _offline_cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("portkit-cache")


@pytest.fixture
def offline_cache(_offline_cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A portkit cache of this test session's own (index entries, git scratch), not the user's."""
    monkeypatch.setenv("PORTKIT_CACHE", str(_offline_cache_root))
    return _offline_cache_root


@pytest.fixture
def fixture_tree(tmp_path: Path, offline_cache: Path) -> Callable[[str], Path]:
    """A fresh plain copy of a fixture tree ("old" or "renamed"); its pin is unknown."""

    def make(name: str) -> Path:
        return copy_fixture(name, _fresh(tmp_path, name))

    return make


@pytest.fixture
def fixture_git_tree(tmp_path: Path, offline_cache: Path) -> Callable[[str], Path]:
    """A fresh copy of a fixture tree committed to a git repository: its pin is git HEAD."""

    def make(name: str) -> Path:
        root = copy_fixture(name, _fresh(tmp_path, name))
        commit_all(root, f"llama.cpp fixture tree {name}")
        return root

    return make


@pytest.fixture
def fixture_fork(tmp_path: Path, offline_cache: Path) -> Callable[[str], Fork]:
    """An ollama-style fork of a fixture tree, pinned to its upstream commit (see lay_out_fork)."""

    def make(name: str) -> Fork:
        return lay_out_fork(name, _fresh(tmp_path, f"fork-{name}"),
                            _fresh(tmp_path, f"upstream-{name}"))

    return make


# -- a fork laid out as ollama lays out its own: series applied upstream, then rsync ---------
#
# Its series touches files the fork does not vendor (other backends, CMake files), its
# vendored folders come from real rsync under .rsync-filter rules like a real fork's (merged by
# a Makefile.sync rsync line, with LICENSE sent by name), and it keeps files of its own there
# (protected Go files).

LLAMA_FILTER = """\
protect .rsync-filter
protect *.go
include /include/
include /include/llama.*
include /src/
include /src/llama.*
include /src/llama-*.*
hide *
"""
GGML_FILTER = """\
protect .rsync-filter
protect *.go
protect ollama-*
hide /CMakeLists.txt
include /include/
include /src/
include /src/ggml-cpu/
include CMakeLists.txt
include *.[ch]
include *.cpp
hide *
"""


def sync_makefile(pin: str) -> str:
    """A Makefile.sync of the fork (its pin and its two rsync lines, as ollama writes them)."""
    return (f"UPSTREAM=https://github.com/ggml-org/llama.cpp.git\nWORKDIR=llama/vendor\n"
            f"FETCH_HEAD={pin}\n\n"
            ".PHONY: llama/llama.cpp\nllama/llama.cpp: llama/vendor\n"
            '\trsync -arvzc --delete -f "include LICENSE" -f "merge $@/.rsync-filter" '
            "$(addprefix $<,/LICENSE /) $@\n\n"
            ".PHONY: ml/backend/ggml/ggml\nml/backend/ggml/ggml: llama/vendor\n"
            '\trsync -arvzc --delete -f "include LICENSE" -f "merge $@/.rsync-filter" '
            "$(addprefix $<,/LICENSE /ggml/) $@\n")


def rsync_vendor(checkout: Path, fork: Path) -> None:
    """Vendor a full llama.cpp `checkout` into `fork` with real rsync, as Makefile.sync does."""
    for folder, source in (("llama/llama.cpp", "/"), ("ml/backend/ggml/ggml", "/ggml/")):
        dest = fork / folder
        subprocess.run(["rsync", "-rlc", "--delete", "-f", "include LICENSE", "-f",
                        f"merge {dest / '.rsync-filter'}", f"{checkout}/LICENSE",
                        f"{checkout}{source}", f"{dest}/"], check=True, capture_output=True)


# Files of the upstream tree beside the fixture's: vendored (ggml-cpu, ggml's src CMake file)
# and not (other backends, the top CMake files, docs).
REAL_LAYOUT_FILES = {
    "LICENSE": "MIT License (fixture)\n",
    "CMakeLists.txt": "project(llama)\nadd_subdirectory(ggml)\nadd_subdirectory(src)\n",
    "src/CMakeLists.txt": "add_library(llama\n    llama.cpp\n    llama-graph.cpp\n)\n",
    "docs/build.md": "# Build\n",
    "ggml/CMakeLists.txt": "project(ggml)\noption(GGML_CPU \"cpu\" ON)\nadd_subdirectory(src)\n",
    "ggml/src/CMakeLists.txt": "add_library(ggml\n    ggml-cpu/ggml-cpu.cpp\n)\n",
    "ggml/src/ggml-cpu/ggml-cpu.cpp": (
        "#include <cstdlib>\n\nvoid * ggml_cpu_alloc(size_t n) {\n    return malloc(n);\n}\n\n"
        "int ggml_cpu_threads(void) {\n    return 1;\n}\n"),
    "ggml/src/ggml-cann/ggml-cann.cpp": (
        "#include <cstdlib>\n\nvoid ggml_cann_release(void * p) {\n    free(p);\n}\n"),
    "ggml/src/ggml-sycl/ggml-sycl.cpp": (
        "#include <cstdlib>\n\nvoid ggml_sycl_release(void * p) {\n    free(p);\n}\n"),
}
HELPER = "\nint ggml_cpu_helper(void) {\n    return 4;\n}\n"
# The fork's series: (subject, {file: (text, replacement)}), each a commit on upstream.
REAL_LAYOUT_SERIES = [
    ("ggml: free memory with the compiler that allocated it", {
        "ggml/src/ggml-cpu/ggml-cpu.cpp": ("int ggml_cpu_threads",
                                           "void ggml_cpu_free(void * p) {\n    free(p);\n}\n\n"
                                           "int ggml_cpu_threads"),
        "ggml/src/ggml-cann/ggml-cann.cpp": ("    free(p);\n", "    ggml_cpu_free(p);\n"),
        "ggml/src/ggml-sycl/ggml-sycl.cpp": ("    free(p);\n", "    ggml_cpu_free(p);\n"),
    }),
    ("llama: name the fork in the system info", {
        "src/llama.cpp": ('    s += " | ";\n', '    s += " | ";\n    s += "FORK = fixture | ";\n'),
        "src/CMakeLists.txt": ("    llama-graph.cpp\n", "    llama-graph.cpp\n    fork.cpp\n"),
    }),
    ("cann: say when memory is released", {
        "ggml/src/ggml-cann/ggml-cann.cpp": ("void ggml_cann_release(void * p) {\n",
                                             "void ggml_cann_release(void * p) {\n"
                                             "    // released by the fork\n"),
    }),
    ("ggml: a helper upstream adds later", {
        "ggml/src/ggml-cpu/ggml-cpu.cpp": ("int ggml_cpu_threads(void) {\n    return 1;\n}\n",
                                           "int ggml_cpu_threads(void) {\n    return 1;\n}\n"
                                           + HELPER),
    }),
]


@dataclass(frozen=True)
class RealFork:
    root: Path  # the fork, laid out as ollama's
    upstream: Path  # the upstream repository: main at `base`, branch fork with the series
    base: str
    target: Path  # a newer upstream (the renamed fixture), a git repository with the helper


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def lay_out_real_fork(dest: Path, upstream: Path, target: Path) -> RealFork:
    """The fixture fork in ollama's real layout (see REAL_LAYOUT_SERIES), and its target."""
    copy_fixture("old", upstream)
    _write(upstream, REAL_LAYOUT_FILES)
    base = commit_all(upstream, "llama.cpp fixture tree, full layout")
    git(upstream, "checkout", "--quiet", "-b", "fork")
    for subject, edits in REAL_LAYOUT_SERIES:
        for rel, (old, new) in edits.items():
            text = (upstream / rel).read_text()
            assert text.count(old) == 1, (rel, old)
            (upstream / rel).write_text(text.replace(old, new))
        git(upstream, "commit", "--quiet", "--all", "--message", subject)
    series = dest / "llama" / "patches"
    series.mkdir(parents=True)
    git(upstream, "format-patch", "--quiet", "--no-signature", "--no-numbered", "--zero-commit",
        "--output-directory", str(series), f"{base}..fork")
    for folder, rules in (("llama/llama.cpp", LLAMA_FILTER), ("ml/backend/ggml/ggml", GGML_FILTER)):
        (dest / folder).mkdir(parents=True)
        (dest / folder / ".rsync-filter").write_text(rules)
    (dest / "llama" / "llama.cpp" / "llama.go").write_text("package llama\n")
    (dest / "ml" / "backend" / "ggml" / "ggml" / "ggml.go").write_text("package ggml\n")
    rsync_vendor(upstream, dest)
    (dest / "Makefile.sync").write_text(sync_makefile(base))
    (dest / "llama" / "build-info.cpp").write_text(
        f'int LLAMA_BUILD_NUMBER = 0;\nchar const *LLAMA_COMMIT = "{base}";\n')
    commit_all(dest, f"vendor llama.cpp {base[:12]} with the fork's patches")
    git(upstream, "checkout", "--quiet", "main")
    copy_fixture("renamed", target)
    files = dict(REAL_LAYOUT_FILES)
    files["ggml/src/ggml-cpu/ggml-cpu.cpp"] += HELPER
    _write(target, files)
    commit_all(target, "a newer llama.cpp fixture tree, full layout")
    return RealFork(dest, upstream, base, target)


@pytest.fixture
def real_fork(tmp_path: Path, offline_cache: Path) -> RealFork:
    return lay_out_real_fork(tmp_path / "fork", tmp_path / "upstream", tmp_path / "target")
