"""Shared fixtures: real llama.cpp trees from the registry, fetched once per machine."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from portkit import tree as tree_mod

REGISTRY_VERSIONS = ["0.3.16", "0.3.17", "0.3.19", "0.3.20", "0.3.36"]


@pytest.fixture(scope="session")
def registry_tree() -> Callable[[str], Path]:
    """Path of the llama-cpp-python sdist tree of a version (downloaded on first use)."""
    seen: dict[str, Path] = {}

    def get(version: str) -> Path:
        if version not in seen:
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
