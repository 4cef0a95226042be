"""Features live in templates/<name>/: anchors.toml, manifest.toml and C++ fragments."""

from __future__ import annotations

import os
from pathlib import Path

from portkit.anchors import AnchorSet, Resolution, load_anchor_set, resolve_all
from portkit.errors import PortkitError
from portkit.index import Index
from portkit.tree import Tree

DEFAULT_FEATURE = "kv-rotation"


def templates_root() -> Path:
    """$PORTKIT_TEMPLATES, or the templates/ folder of the portkit checkout."""
    env = os.environ.get("PORTKIT_TEMPLATES")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "templates"


def feature_dir(feature: str) -> Path:
    path = templates_root() / feature
    if not (path / "anchors.toml").is_file():
        known = sorted(p.name for p in templates_root().glob("*/anchors.toml") for p in [p.parent])
        raise PortkitError(f"unknown feature {feature!r} (known: {', '.join(known) or 'none'})")
    return path


def load_anchors(feature: str) -> AnchorSet:
    return load_anchor_set(feature_dir(feature) / "anchors.toml")


def resolve_feature(tree: Tree, feature: str) -> tuple[Index, dict[str, Resolution]]:
    """Index the files the feature's anchors look at, and resolve every anchor."""
    anchor_set = load_anchors(feature)
    index = Index.build(tree.llama_root, anchor_set.patterns())
    if not index.files:
        raise PortkitError(f"no source files of feature {feature} under {tree.llama_root}")
    return index, resolve_all(index, anchor_set)
