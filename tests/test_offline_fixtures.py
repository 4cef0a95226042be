"""The fixture trees stand in for real ones: each must resolve and render the rotation as its
real counterpart does. This guard needs the real trees, so it runs in the slow tier."""

from __future__ import annotations

from typing import Any

import pytest

from portkit.render import Rendered, render
from portkit.tree import detect

from .conftest import FIXTURE_TREES

COUNTERPARTS = [("old", "0.3.16"), ("renamed", "0.3.17"), ("renamed", "0.3.19")]


def anchors(rendered: Rendered) -> dict[str, tuple[Any, ...]]:
    """Per anchor: how it resolved, to what kind and name of symbol in which file, which points."""
    out: dict[str, tuple[Any, ...]] = {}
    for anchor_id, res in rendered.resolutions.items():
        sym = res.symbol
        out[anchor_id] = (res.status, res.strategy, sym.kind if sym else None,
                          sym.qualname if sym else None, sym.file if sym else None,
                          sorted(res.points))
    return out


def outline(rendered: Rendered) -> list[tuple[Any, ...]]:
    """Per patch: its status, the files it touches, the anchors of the edits it skipped."""
    return [(o.spec.name, o.status, o.mail.files() if o.mail else [],
             [s.split(":", 1)[0] for s in o.skipped_edits]) for o in rendered.outcomes]


@pytest.mark.parametrize("name,version", COUNTERPARTS)
def test_fixture_resolves_and_renders_like_its_real_tree(registry_tree, name, version):
    fixture = render(detect(FIXTURE_TREES / name), "kv-rotation")
    real = render(detect(registry_tree(version)), "kv-rotation")
    assert anchors(fixture) == anchors(real)
    assert outline(fixture) == outline(real)
    assert fixture.variables == real.variables
