"""Features live in templates/<name>/: anchors.toml, manifest.toml and C++ fragments."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from portkit.anchors import AnchorSet, Resolution, load_anchor_set, resolve_all
from portkit.errors import PortkitError
from portkit.index import Index
from portkit.tree import Tree

DEFAULT_FEATURE = "kv-rotation"


def templates_root() -> Path:
    """$PORTKIT_TEMPLATES; else the templates an installed portkit ships (portkit/templates);
    else the checkout's top-level templates/, for an editable install (whose import finder
    cannot map a subpackage onto another folder) or a run from the source tree."""
    env = os.environ.get("PORTKIT_TEMPLATES")
    if env:
        return Path(env)
    package = Path(str(resources.files("portkit")))
    shipped = package / "templates"
    return shipped if shipped.is_dir() else package.parent / "templates"


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
