"""The portkit command line: a thin layer over the pipeline stages."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from portkit import __version__
from portkit import tree as tree_mod
from portkit.errors import PortkitError
from portkit.features import DEFAULT_FEATURE, resolve_feature
from portkit.report import emit_json, emit_table

F = TypeVar("F", bound=Callable[..., Any])


def fails_cleanly(fn: F) -> F:
    """Turn a PortkitError into `portkit: message` on stderr and its exit code."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PortkitError as exc:
            click.echo(f"portkit: {exc.message}", err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


TREE_OPTION = click.option(
    "--tree", "tree_path", type=click.Path(path_type=Path), default=Path("."), show_default=True,
    help="The tree: a llama.cpp checkout, an ollama-style fork or a llama-cpp-python sdist.",
)
FORMAT_TABLE_JSON = click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="portkit")
def cli() -> None:
    """Port features and patch series across drifting vendored llama.cpp trees.

    \b
    The pipeline:  tree -> index -> anchors -> render -> apply -> validate
    Start with:    portkit tree info .        (what portkit sees in your checkout)
                   portkit anchors --tree .   (where each part of a feature belongs)
    """


@cli.group()
def tree() -> None:
    """Find, fetch and describe llama.cpp source trees."""


@tree.command("fetch")
@click.argument("spec")
@fails_cleanly
def tree_fetch(spec: str) -> None:
    """Put the tree named by SPEC in the cache and print its path.

    \b
    SPEC is one of:
      DIR                          a local tree (copied)
      git:URL@REV                  a git repository at a commit (local path or file:// too)
      pypi:llama-cpp-python==X     the llama.cpp tree vendored in that sdist (checksummed)
    The cache is $PORTKIT_CACHE, or ~/.cache/portkit.
    """
    click.echo(tree_mod.fetch(spec))


@tree.command("info")
@click.argument("path", type=click.Path(path_type=Path), default=Path("."))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
@fails_cleanly
def tree_info(path: Path, fmt: str) -> None:
    """Tell the layout, source roots, patch series and pin of the tree at PATH."""
    info = tree_mod.detect(path)
    if fmt == "json":
        emit_json(info.as_json())
        return
    click.echo(f"layout:      {info.layout}")
    click.echo(f"llama.cpp:   {info.llama_root}")
    click.echo(f"ggml:        {info.ggml_root}")
    click.echo(f"series:      {info.series_dir or '-'}")
    click.echo(f"pin:         {info.pin or 'unknown'}"
               + (f" (from {info.pin_source})" if info.pin_source else ""))


@cli.command("anchors")
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
    info = tree_mod.detect(tree_path)
    _, resolutions = resolve_feature(info, feature)
    if fmt == "json":
        emit_json({"tree": info.as_json(), "feature": feature,
                   "anchors": [r.as_json() for r in resolutions.values()]})
    else:
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
    errors = [r for r in resolutions.values() if r.status == "error"]
    if errors:
        click.echo(f"portkit: {len(errors)} anchor(s) unresolved; first: {errors[0].note}",
                   err=True)
        sys.exit(3)


def main() -> None:
    cli()
