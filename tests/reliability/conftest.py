"""Trees for the reliability tests: 0.3.17's registry tree, unpatched and patched once
per session (never touched), and a fresh writable copy for each test."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

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
