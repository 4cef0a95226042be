"""A feature's manifest (templates/<feature>/manifest.toml): patches, edits and variables."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from portkit.errors import SpecError

SYMBOL_PLACES = ("before-symbol", "after-symbol")


@dataclass(frozen=True)
class VarChoice:
    value: str
    anchor: str | None = None
    kind: str | None = None


@dataclass(frozen=True)
class Condition:
    anchor: str
    has: str | None = None
    contains: str | None = None


@dataclass(frozen=True)
class EditSpec:
    anchor: str
    where: str
    fragment: str | None = None
    text: str | None = None
    replace: dict[str, str] | None = None
    vars: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PatchSpec:
    name: str
    subject: str
    body: str
    edits: tuple[EditSpec, ...]
    present_when: tuple[Condition, ...] = ()
    requires: str | None = None


@dataclass(frozen=True)
class Validation:
    """How `portkit validate` proves a feature (paths relative to the feature's folder)."""

    checks: str  # a module of portkit.checks
    harness: str | None = None
    reference: str | None = None  # a `tree fetch` spec of a tree with the feature upstream
    published: str | None = None  # upstream's published figures (TOML)
    broken_blank: tuple[str, ...] = ()  # fragments blanked for the deliberately broken port


@dataclass(frozen=True)
class Manifest:
    feature: str
    title: str
    upstream: str
    author: str
    date: str
    variables: dict[str, tuple[VarChoice, ...]]
    patches: tuple[PatchSpec, ...]
    folder: Path
    validation: Validation | None = None

    def fragment(self, name: str) -> Path:
        return self.folder / "fragments" / name


def _edit(raw: dict[str, Any], where: str) -> EditSpec:
    unknown = set(raw) - {"anchor", "where", "fragment", "text", "replace", "vars"}
    if unknown:
        raise SpecError(f"{where}: unknown key {sorted(unknown)[0]}")
    edit = EditSpec(**raw)
    if sum(x is not None for x in (edit.fragment, edit.text, edit.replace)) != 1:
        raise SpecError(f"{where}: give exactly one of fragment, text, replace")
    if edit.replace is not None and set(edit.replace) != {"old", "new"}:
        raise SpecError(f"{where}: replace needs old and new")
    return edit


def load_manifest(folder: Path) -> Manifest:
    path = folder / "manifest.toml"
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(f"cannot read {path}: {exc}") from exc
    feature = data.get("feature", {})
    variables = {
        name: tuple(VarChoice(**c) for c in spec.get("choose", []))
        for name, spec in data.get("vars", {}).items()
    }
    patches = []
    for i, raw in enumerate(data.get("patch", []), 1):
        where = f"{path.name}: patch {i} ({raw.get('name', '?')})"
        edits = tuple(_edit(e, f"{where}, edit {j}") for j, e in enumerate(raw.get("edit", []), 1))
        conditions = tuple(Condition(**c) for c in raw.get("present_when", []))
        patches.append(PatchSpec(raw["name"], raw["subject"], raw["body"].strip(), edits,
                                 conditions, raw.get("requires")))
        for edit in edits:
            if edit.fragment and not (folder / "fragments" / edit.fragment).is_file():
                raise SpecError(f"{where}: no fragment {edit.fragment}")
    return Manifest(
        feature.get("name", folder.name), feature.get("title", folder.name),
        feature.get("upstream", ""), feature.get("author", "portkit <portkit@localhost>"),
        feature.get("date", "Thu, 1 Jan 1970 00:00:00 +0000"), variables, tuple(patches), folder,
        _validation(data.get("validation"), folder, path.name))


def _validation(raw: Any, folder: Path, where: str) -> Validation | None:
    if raw is None:
        return None
    known = {"checks", "harness", "reference", "published", "broken_blank"}
    if not isinstance(raw, dict) or not isinstance(raw.get("checks"), str) or set(raw) - known:
        raise SpecError(f"{where}: [validation] needs `checks` and takes only "
                           f"{', '.join(sorted(known))}")
    validation = Validation(raw["checks"], raw.get("harness"), raw.get("reference"),
                            raw.get("published"), tuple(raw.get("broken_blank", ())))
    for name in filter(None, (validation.harness, validation.published)):
        if not (folder / name).is_file():
            raise SpecError(f"{where}: [validation] names {name}, which is not in {folder}")
    for name in validation.broken_blank:
        if not (folder / "fragments" / name).is_file():
            raise SpecError(f"{where}: [validation] broken_blank names no fragment {name}")
    return validation
