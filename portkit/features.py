"""A feature is an object: its manifest, anchor set, fragments, and how it is validated.

Features live in templates/<name>/: anchors.toml (where each part belongs), manifest.toml
(the patch series and its [validation]), fragments/ (the C++ templates), and whatever the
validation names (a harness, upstream's published figures).
"""

from __future__ import annotations

import os
import shutil
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from portkit.anchors import AnchorSet, Resolution, load_anchor_set, resolve_all
from portkit.errors import SpecError, TreeError
from portkit.index import Index
from portkit.manifest import Manifest, Validation, load_manifest
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
        raise SpecError(f"unknown feature {feature!r} (known: {', '.join(known) or 'none'})")
    return path


@dataclass(frozen=True)
class Resolved:
    """A feature's anchors resolved in one tree, with the index they were resolved on."""

    tree: Tree
    index: Index
    anchors: dict[str, Resolution]


@dataclass(frozen=True)
class Feature:
    name: str
    folder: Path
    manifest: Manifest
    anchor_set: AnchorSet

    @classmethod
    def load(cls, name: str, templates: Path | None = None) -> Feature:
        folder = feature_dir(name, templates)
        return cls(name, folder, load_manifest(folder), load_anchor_set(folder / "anchors.toml"))

    @property
    def validation(self) -> Validation:
        if self.manifest.validation is None:
            raise SpecError(f"feature {self.name} says nothing about how to validate it "
                               f"(no [validation] in {self.folder / 'manifest.toml'})")
        return self.manifest.validation

    def resolve(self, tree: Tree) -> Resolved:
        """Index the files the feature's anchors look at, and resolve every anchor."""
        index = Index.build(tree.llama_root, self.anchor_set.patterns())
        if not index.files:
            raise TreeError(f"no source files of feature {self.name} under {tree.llama_root}")
        return Resolved(tree, index, resolve_all(index, self.anchor_set))

    def harness(self) -> Path | None:
        name = self.validation.harness
        return self.folder / name if name else None

    def published(self) -> dict[str, Any]:
        """Upstream's published figures, by model and cache configuration."""
        name = self.validation.published
        if not name:
            return {}
        return tomllib.loads((self.folder / name).read_text())

    def broken(self, into: Path) -> Feature:
        """This feature with the validation's `broken_blank` fragments emptied: the port a
        careless hand would write, which validation must catch. Written under `into`."""
        copy = into / self.name
        if copy.exists():
            shutil.rmtree(copy)
        shutil.copytree(self.folder, copy)
        for name in self.validation.broken_blank:
            (copy / "fragments" / name).write_text("")
        return Feature.load(self.name, into)


def load_anchors(feature: str, templates: Path | None = None) -> AnchorSet:
    return load_anchor_set(feature_dir(feature, templates) / "anchors.toml")


def resolve_feature(tree: Tree, feature: str,
                    templates: Path | None = None) -> tuple[Index, dict[str, Resolution]]:
    """Index the files the feature's anchors look at, and resolve every anchor."""
    resolved = Feature.load(feature, templates).resolve(tree)
    return resolved.index, resolved.anchors
