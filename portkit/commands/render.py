"""`portkit render`: a feature as a numbered git-am series for a tree."""

from __future__ import annotations

from pathlib import Path

import click

from portkit import apply as apply_mod
from portkit.commands.common import FEATURE_OPTION, TREE_OPTION, fails_cleanly, open_tree
from portkit.errors import UsageError
from portkit.features import load_anchors
from portkit.render import PRESENT, Rendered
from portkit.transaction import publish_folder


def _explain(rendered: Rendered) -> None:
    """What render decided for each patch of the feature, one line each."""
    for outcome in rendered.outcomes:
        if outcome.mail is not None:
            added = sum(1 for ln in outcome.mail.diff.splitlines() if ln.startswith("+") and not
                        ln.startswith("+++"))
            click.echo(f"  {outcome.number + 1}. {outcome.spec.name}: {len(outcome.mail.files())} "
                       f"file(s), +{added} lines")
            for skipped in outcome.skipped_edits:
                click.echo(f"       skipped {skipped}")
        else:
            click.echo(f"  {outcome.number + 1}. {outcome.spec.name}: {outcome.status}"
                       + (f" ({outcome.reason})" if outcome.reason else ""))


@click.command("render")
@TREE_OPTION
@FEATURE_OPTION
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Folder for the numbered git-am series (created).")
@fails_cleanly
def render_cmd(tree_path: Path, feature: str, out: Path) -> None:
    """Render a feature as a numbered git-am patch series for a tree.

    The tree is only read. Patches already present upstream are left out, and so are
    patches whose anchor does not exist in this tree ("not applicable"). OUT is made at
    once, all patches or none; an OUT that exists must be empty (or hold this very
    series already).
    """
    info = open_tree(tree_path)
    with apply_mod.unpatched_view(info, feature, load_anchors(feature).patterns()) as view:
        if view is not info:
            click.echo(f"portkit: {feature} is applied by portkit (see portkit tree info); "
                       f"rendering it for the tree without it", err=True)
        rendered = apply_mod.render_checked(view, feature)
    if rendered.present_upstream:
        click.echo(f"{feature} is {PRESENT} in this tree (llama.cpp {info.pin or '?'}): "
                   f"nothing rendered")
        _explain(rendered)
        return
    series = {name: text.encode() for name, text in rendered.mails()}
    if out.is_dir() and any(out.iterdir()):
        held = {p.name: p.read_bytes() if p.is_file() and not p.is_symlink() else None
                for p in out.iterdir()}
        if held != series:
            raise UsageError(f"{out} is not empty and does not hold this series: give a new "
                             f"or empty folder")
    elif out.exists() and not out.is_dir():
        raise UsageError(f"{out} is not a folder")
    else:
        publish_folder(out, series)
    click.echo(f"rendered {len(series)} patch(es) of {feature} for llama.cpp "
               f"{(info.pin or '?')[:12]} into {out}:")
    _explain(rendered)
