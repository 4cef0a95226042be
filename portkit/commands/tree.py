"""`portkit tree`: find, fetch and describe llama.cpp source trees."""

from __future__ import annotations

from pathlib import Path

import click

from portkit import tree as tree_mod
from portkit.commands.common import fails_cleanly, open_tree
from portkit.record import applied
from portkit.report import emit_json


@click.group()
def tree() -> None:
    """Find, fetch and describe llama.cpp source trees."""


@tree.command("fetch")
@click.argument("spec")
@click.option("--into", type=click.Path(path_type=Path),
              help="Also copy the tree to this new folder (a tree of your own to patch).")
@fails_cleanly
def tree_fetch(spec: str, into: Path | None) -> None:
    """Put the tree named by SPEC in the cache and print its path.

    \b
    SPEC is one of:
      DIR                          a local tree (copied)
      git:URL@REV                  a git repository at a commit (local path or file:// too)
      pypi:llama-cpp-python==X     the llama.cpp tree vendored in that sdist (checksummed)
    The cache is $PORTKIT_CACHE, or ~/.cache/portkit. Patch a copy (--into), never the
    cached tree itself.
    """
    if Path(spec).is_dir():
        open_tree(Path(spec))  # never copy a half-written tree
    path = tree_mod.fetch(spec)
    click.echo(tree_mod.copy_tree(path, into) if into else path)


@tree.command("info")
@click.argument("path", type=click.Path(path_type=Path), default=Path("."))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
@fails_cleanly
def tree_info(path: Path, fmt: str) -> None:
    """Tell the layout, source roots, patch series and pin of the tree at PATH, and what
    portkit applied to it (where each applied series is kept)."""
    info = open_tree(path)
    records = applied(info)
    if fmt == "json":
        emit_json({**info.as_json(), "applied": [
            {"name": r.feature, "record": str(r.folder), "patches": [n for n, _ in r.series],
             "files": r.files, "series_copies": [c.path for c in r.copies]} for r in records]})
        return
    click.echo(f"layout:      {info.layout}")
    click.echo(f"llama.cpp:   {info.llama_root}")
    click.echo(f"ggml:        {info.ggml_root}")
    click.echo(f"series:      {info.series_dir or '-'}")
    click.echo(f"pin:         {info.pin or 'unknown'}"
               + (f" (from {info.pin_source})" if info.pin_source else ""))
    if not records:
        click.echo("applied:     nothing by portkit")
    for r in records:
        click.echo(f"applied:     {r.feature}: {len(r.series)} patch(es) to {len(r.files)} "
                   f"file(s); series kept in {r.folder}"
                   + (f", copies in {info.series_dir}" if r.copies else ""))
