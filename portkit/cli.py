"""The portkit command line: a thin layer over the pipeline stages."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from portkit import __version__
from portkit import apply as apply_mod
from portkit import tree as tree_mod
from portkit import validate as validate_mod
from portkit.errors import PortkitError
from portkit.features import DEFAULT_FEATURE, Feature, resolve_feature
from portkit.render import PRESENT, Rendered, render, write_series
from portkit.report import emit_json, emit_table

F = TypeVar("F", bound=Callable[..., Any])


def fails_cleanly(fn: F) -> F:
    """Turn any failure into one line on stderr and a non-zero exit code.

    PortkitError carries its own message and code; an OSError (a permission, a full disk)
    exits 1; anything else is a bug in portkit: exit 70 (PORTKIT_DEBUG=1 shows the trace).
    """

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PortkitError as exc:
            click.echo(f"portkit: {exc.message}", err=True)
            sys.exit(exc.exit_code)
        except OSError as exc:
            click.echo(f"portkit: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "),
                       err=True)
            sys.exit(1)
        except Exception as exc:
            if os.environ.get("PORTKIT_DEBUG"):
                raise
            click.echo(f"portkit: internal error ({type(exc).__name__}: {exc}); "
                       f"rerun with PORTKIT_DEBUG=1 and report it", err=True)
            sys.exit(70)

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
    path = tree_mod.fetch(spec)
    click.echo(tree_mod.copy_tree(path, into) if into else path)


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


FEATURE_OPTION = click.option("--feature", default=DEFAULT_FEATURE, show_default=True,
                              help="A feature under templates/.")


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


@cli.command("render")
@TREE_OPTION
@FEATURE_OPTION
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Folder for the numbered git-am series (created).")
@fails_cleanly
def render_cmd(tree_path: Path, feature: str, out: Path) -> None:
    """Render a feature as a numbered git-am patch series for a tree.

    The tree is only read. Patches already present upstream are left out, and so are
    patches whose anchor does not exist in this tree ("not applicable").
    """
    info = tree_mod.detect(tree_path)
    rendered = render(info, feature)
    if rendered.present_upstream:
        click.echo(f"{feature} is {PRESENT} in this tree (llama.cpp {info.pin or '?'}): "
                   f"nothing rendered")
        _explain(rendered)
        return
    written = write_series(rendered, out)
    click.echo(f"rendered {len(written)} patch(es) of {feature} for llama.cpp "
               f"{(info.pin or '?')[:12]} into {out}:")
    _explain(rendered)


@cli.command("apply")
@click.option("--pin", help="The llama.cpp commit the tree must be at (e.g. 7049736b).")
@TREE_OPTION
@FEATURE_OPTION
@click.option("--dry-run", is_flag=True, help="Change nothing; print the series.")
@click.option("--reverse", is_flag=True, help="Take out a series that portkit applied.")
@click.option("--force", is_flag=True, help="Skip the pin check.")
@click.option("--compile", "compile_check", is_flag=True,
              help="Compile the translation units the series touches; take it out if they fail.")
@click.option("--validate", "then_validate", is_flag=True,
              help="Then run `portkit validate --quick` on the patched tree.")
@fails_cleanly
def apply_cmd(pin: str | None, tree_path: Path, feature: str, dry_run: bool, reverse: bool,
              force: bool, compile_check: bool, then_validate: bool) -> None:
    """Port a feature onto the tree: verify the pin, render, apply all or nothing.

    \b
    portkit apply --pin 7049736b              in the fork's checkout
    portkit apply --pin 7049736b --dry-run    show the series, change nothing
    portkit apply --pin 7049736b --reverse    take it out again, byte for byte

    On any failure the tree is left exactly as it was. A second run says "already
    applied"; a tree where upstream already has the feature is left alone. In an
    ollama-style fork the series is also added to llama/patches with the next numbers.
    """
    info = tree_mod.detect(tree_path)
    if pin is None and not force:
        raise PortkitError("give --pin SHA (the llama.cpp commit the tree must be at), or --force")
    if reverse:
        outcome = apply_mod.reverse(info, feature, pin=pin, force=force, dry_run=dry_run)
    else:
        outcome = apply_mod.apply(info, feature, pin=pin, force=force, dry_run=dry_run,
                                  compile_check=compile_check)
    if outcome.status == apply_mod.DRY_RUN:
        for _, text in outcome.patches:
            click.echo(text, nl=False)
        click.echo(f"dry run: {len(outcome.patches)} patch(es) would be "
                   f"{'reversed' if reverse else 'applied'} to {len(outcome.files)} file(s); "
                   f"nothing changed", err=True)
        return
    if outcome.status == apply_mod.PRESENT:
        click.echo(f"{feature} is {PRESENT} in this tree (llama.cpp {(info.pin or '?')[:12]}): "
                   f"nothing applied")
        return
    if outcome.status == apply_mod.ALREADY:
        click.echo(f"{feature} is already applied ({len(outcome.patches)} patches): "
                   f"nothing changed")
        return
    verb = "reversed" if reverse else "applied"
    click.echo(f"{verb} {len(outcome.patches)} patch(es) of {feature} "
               f"({len(outcome.files)} files) in {info.llama_root}")
    for name, _ in outcome.patches:
        click.echo(f"  {name}")
    for copy in outcome.series_copies:
        click.echo(f"  series copy: {copy}")
    if outcome.rendered is not None:
        for o in outcome.rendered.outcomes:
            if o.mail is None:
                click.echo(f"  {o.spec.name}: {o.status} ({o.reason})")
    if outcome.compiled is not None:
        click.echo(f"compiled {', '.join(outcome.compiled.units)} with {outcome.compiled.method}")
    if then_validate and not reverse and outcome.status in (apply_mod.APPLIED, apply_mod.ALREADY):
        port = Feature.load(feature)
        reference = tree_mod.detect(tree_mod.fetch(port.validation.reference)) \
            if port.validation.reference else None
        report = validate_mod.validate(tree_mod.detect(tree_path), port, reference=reference)
        click.echo(report.text())
        if not report.passed:
            sys.exit(1)


@cli.command("validate")
@TREE_OPTION
@FEATURE_OPTION
@click.option("--quick", "mode", flag_value="quick", default=True,
              help="SmolLM2-135M, q8_0/q8_0 and q4_0/q4_0 caches (default).")
@click.option("--full", "mode", flag_value="full",
              help="Also Qwen2.5-Coder-0.5B (qwen2) and the q8_0/q4_0, f16/q4_0 caches.")
@click.option("--model", "models", multiple=True,
              help="smollm2, qwen2.5-coder-0.5b, or a .gguf file (repeatable).")
@click.option("--reference",
              help="A tree with the feature upstream (a path or a `tree fetch` spec), built and "
                   "run side by side as the live reference. Default: the feature's own "
                   "(kv-rotation: pypi:llama-cpp-python==0.3.20, upstream's first rotation).")
@click.option("--published", is_flag=True,
              help="Compare with the figures upstream published instead of a live reference "
                   "run (they reproduce exactly on an AVX-512 CPU; other SIMD paths differ "
                   "by a few percent).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]),
              default="text", show_default=True)
@fails_cleanly
def validate_cmd(tree_path: Path, feature: str, mode: str, models: tuple[str, ...],
                 reference: str | None, published: bool, fmt: str) -> None:
    """Build the unpatched and the patched tree, run real models, and prove the port.

    \b
    a  rotation off is a no-op (bit-identical logits)
    b  rotation on gives upstream's KLD and top-1 against the f16 cache
    c  the log reports attn_rot_k / attn_rot_v as configured
    d  a context shift of a rotated cache is right (and a broken port is caught)
    e  what a saved session does across rotation settings
    Builds, models and run logs are cached: validating an unchanged tree again is quick.
    Exits 1 when a check fails.
    """
    info = tree_mod.detect(tree_path)
    port = Feature.load(feature)
    spec = reference or port.validation.reference
    ref = None if published or spec is None else tree_mod.detect(tree_mod.fetch(spec))
    report = validate_mod.validate(info, port, full=mode == "full",
                                   models=list(models) or None, reference=ref)
    if fmt == "json":
        click.echo(validate_mod.report_json(report))
    elif fmt == "markdown":
        click.echo(report.markdown(), nl=False)
    else:
        click.echo(report.text())
    if not report.passed:
        sys.exit(1)


def main() -> None:
    cli()
