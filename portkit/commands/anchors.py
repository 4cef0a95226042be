"""`portkit anchors`: where every anchor of a feature resolves in a tree, and how."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from portkit import apply as apply_mod
from portkit.anchors import Resolution
from portkit.commands.common import FORMAT_TABLE_JSON, TREE_OPTION, fails_cleanly, open_tree
from portkit.errors import AnchorError
from portkit.features import DEFAULT_FEATURE, load_anchors, resolve_feature
from portkit.report import emit_json, emit_table
from portkit.tree import Tree


@click.command("anchors")
@TREE_OPTION
@click.option("--feature", default=DEFAULT_FEATURE, show_default=True,
              help="A feature under templates/.")
@FORMAT_TABLE_JSON
@fails_cleanly
def anchors_cmd(tree_path: Path, feature: str, fmt: str) -> None:
    """Show where every anchor of a feature resolves in a tree, and how it was found.

    Strategies, most to least sure: exact (the name), alias (an older name of it),
    structure (what it calls and contains), similarity (its body resembles the spec's).
    Exits 3 when an anchor is ambiguous or missing.
    """
    info = open_tree(tree_path)
    with apply_mod.unpatched_view(info, feature, load_anchors(feature).patterns()) as view:
        if view is not info:
            click.echo(f"portkit: {feature} is applied by portkit (see portkit tree info); "
                       f"the anchors are those of the tree without it", err=True)
        _, resolutions = resolve_feature(view, feature)
        _show(info, feature, resolutions, fmt)
    errors = [r for r in resolutions.values() if r.status == "error"]
    if errors:
        click.echo(f"portkit: {len(errors)} anchor(s) unresolved; first: {errors[0].note}",
                   err=True)
        sys.exit(AnchorError.exit_code)


def _show(info: Tree, feature: str, resolutions: dict[str, Resolution], fmt: str) -> None:
    if fmt == "json":
        emit_json({"tree": info.as_json(), "feature": feature,
                   "anchors": [r.as_json() for r in resolutions.values()]})
        return
    rows = []
    for res in resolutions.values():
        sym = res.symbol
        where = f"{sym.file}:{sym.start_line}" if sym else "-"
        rows.append([res.spec.id, res.status, res.strategy or "-",
                     f"{res.confidence:.2f}" if res.found else "-",
                     sym.signature()[:60] if sym else "-", where, res.note[:90]])
        rows += [[f"  .{p.name}", "", "", "", p.statement[:60], f"line {p.line}", ""]
                 for p in res.points.values()]
    emit_table(["anchor", "status", "how", "conf", "target", "where", "note"], rows)

