"""Trees for the reliability tests: 0.3.17's registry tree, unpatched and patched once
per session (never touched), and a fresh writable copy for each test; offline, the fixture
fork with two newer trees to move it onto and a series to apply (`arena`)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from portkit import rebase as rb

from ..conftest import Fork, commit_all
from ..test_rebase import GGML_RULES, LLAMA_RULES
from .harness import APPLY, portkit, sdist_like, snapshot


@dataclass(frozen=True)
class Trees:
    before: Path  # unpatched
    after: Path  # patched by a clean `portkit apply`, with its record
    states: dict[str, dict[str, str]]  # "before"/"after" -> snapshot


@pytest.fixture(scope="session")
def trees(registry_tree: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Trees:
    base = tmp_path_factory.mktemp("pristine")
    before = sdist_like(registry_tree("0.3.17"), base / "before")
    after = base / "after"
    shutil.copytree(before, after)
    run = portkit(APPLY, after)
    assert run.returncode == 0, run.stderr
    return Trees(before, after, {"before": snapshot(before), "after": snapshot(after)})


@pytest.fixture
def tree(trees: Trees, tmp_path: Path) -> Path:
    """A writable copy of the unpatched tree at tmp_path/t, beside files it must not touch."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("not portkit's\n")
    (outside / "llama-graph.cpp").write_text("// someone else's file\n")
    return Path(shutil.copytree(trees.before, tmp_path / "t"))


@pytest.fixture
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for the harness's own files (checkpoint traces), apart from the tree."""
    return tmp_path_factory.mktemp("work")


@pytest.fixture
def patched(trees: Trees, tree: Path) -> Path:
    """The same copy, patched (as a clean apply leaves it)."""
    shutil.rmtree(tree)
    return Path(shutil.copytree(trees.after, tree))


# -- offline: an ollama-style fork, two newer trees and a series of the fork's own ------------

GRAPH = "src/llama-graph.h"
NOTE = "// graph inputs are filled by the host\n"


@dataclass(frozen=True)
class Arena:
    fork: Path  # the fork, as the test starts it (committed)
    pristine: Path  # a copy of it, never touched
    pin: str  # the fork's pin
    targets: list[Path]  # two newer trees (git repositories), different commits
    series: Path  # a series of the fork's own (one patch on src/llama-graph.h)


def _patch_for(llama: Path, work: Path) -> bytes:
    """A git patch adding NOTE to src/llama-graph.h of the llama.cpp tree at `llama`."""
    a, b = work / "a", work / "b"
    for side in (a, b):
        (side / "src").mkdir(parents=True)
        shutil.copy(llama / GRAPH, side / GRAPH)
    text = (b / GRAPH).read_text()
    (b / GRAPH).write_text(text.replace("struct ggml_cgraph;\n", "struct ggml_cgraph;\n" + NOTE))
    diff = subprocess.run(["git", "diff", "--no-index", "--no-prefix",
                           "a/" + GRAPH, "b/" + GRAPH], cwd=work,
                          capture_output=True, text=True).stdout
    return ("From: t <t@t>\nDate: Mon, 2 Mar 2026 10:00:00 +0000\n"
            "Subject: [PATCH] graph: say who fills the inputs\n\n---\n"
            + diff).encode()


@pytest.fixture
def arena(fixture_fork: Callable[[str], Fork], fixture_git_tree: Callable[[str], Path],
          tmp_path: Path) -> Arena:
    fork = fixture_fork("old")
    (fork.root / "llama" / "llama.cpp" / rb.FILTER).write_text(LLAMA_RULES)
    (fork.root / "ml" / "backend" / "ggml" / "ggml" / rb.FILTER).write_text(GGML_RULES)
    commit_all(fork.root, "vendoring rules")
    targets = []
    for n in (1, 2):
        target = fixture_git_tree("renamed")
        with (target / "src" / "llama.cpp").open("a") as fh:
            fh.write(f"// upstream release {n}\n")
        commit_all(target, f"release {n}")
        targets.append(target)
    series = tmp_path / "graph-note"
    series.mkdir()
    (series / "0001-graph-say-who-fills-the-inputs.patch").write_bytes(
        _patch_for(fork.root / "llama" / "llama.cpp", tmp_path / "patch-work"))
    pristine = tmp_path / "pristine"
    shutil.copytree(fork.root, pristine, symlinks=True)
    return Arena(fork.root, pristine, fork.base, targets, series)
