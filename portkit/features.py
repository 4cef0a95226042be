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


def feature_dir(feature: str, templates: Path | None = None) -> Path:
    root = templates or templates_root()
    path = root / feature
    if not (path / "anchors.toml").is_file():
        known = sorted(p.parent.name for p in root.glob("*/anchors.toml"))
        raise PortkitError(f"unknown feature {feature!r} (known: {', '.join(known) or 'none'})")
    return path


def load_anchors(feature: str, templates: Path | None = None) -> AnchorSet:
    return load_anchor_set(feature_dir(feature, templates) / "anchors.toml")


def resolve_feature(tree: Tree, feature: str,
                    templates: Path | None = None) -> tuple[Index, dict[str, Resolution]]:
    """Index the files the feature's anchors look at, and resolve every anchor."""
    anchor_set = load_anchors(feature, templates)
    index = Index.build(tree.llama_root, anchor_set.patterns())
    if not index.files:
        raise PortkitError(f"no source files of feature {feature} under {tree.llama_root}")
    return index, resolve_all(index, anchor_set)
