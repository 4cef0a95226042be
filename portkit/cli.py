"""The command line: a thin layer over the pipeline stages, and the one place that turns
every failure into one line on stderr and its exit code (docs/exit-codes.md)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TypeVar

import click
from git.exc import GitCommandNotFound

from portkit import __version__
from portkit import apply as apply_mod
from portkit import tree as tree_mod
from portkit import validate as validate_mod
from portkit.errors import (
    AnchorError,
    GitMissing,
    Interrupted,
    PortkitError,
    UsageError,
)
from portkit.features import DEFAULT_FEATURE, Feature, resolve_feature
from portkit.render import PRESENT, Rendered
from portkit.report import emit_json, emit_table
from portkit.transaction import interrupt_note, publish_folder, recover, recovered_line, settle
from portkit.transaction import tree_lock as lock_tree

F = TypeVar("F", bound=Callable[..., Any])

_STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _raise_interrupted(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Interrupted like Ctrl-C does, so that a transaction that is
    under way rolls back before the process ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise_interrupted) for s in _STOPPING_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def exit_for(exc: BaseException) -> NoReturn:
    """Print the one line a failure deserves and exit with its code; anything that is not a
    PortkitError is a bug in portkit: exit 70 (PORTKIT_DEBUG=1 shows the trace)."""
    if isinstance(exc, KeyboardInterrupt | click.Abort):
        exc = Interrupted(signal.SIGINT)
    elif isinstance(exc, GitCommandNotFound):
        exc = GitMissing("git not found: install git, or put it on PATH")
    if isinstance(exc, Interrupted):
        click.echo(f"portkit: {exc.message}; {interrupt_note()}", err=True)
        sys.exit(exc.exit_code)
    if isinstance(exc, PortkitError):
        click.echo(f"portkit: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    if isinstance(exc, OSError):
        click.echo(f"portkit: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "),
                   err=True)
        sys.exit(1)
    if isinstance(exc, SystemExit | click.exceptions.Exit | click.ClickException):
        raise exc
    if os.environ.get("PORTKIT_DEBUG"):
        raise exc
    click.echo(f"portkit: internal error ({type(exc).__name__}: {exc}); "
               f"rerun with PORTKIT_DEBUG=1 and report it", err=True)
    sys.exit(70)


def fails_cleanly(fn: F) -> F:
    """Turn any failure of a command into one line on stderr and its exit code."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _signals_interrupt():
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:  # Ctrl-C and SIGTERM end in one line too
                exit_for(exc)

    return wrapper  # type: ignore[return-value]


def open_tree(path: Path) -> tree_mod.Tree:
    """Detect the tree at `path`, having rolled back what a killed portkit left half done."""
    info = tree_mod.detect(path)
    line = settle(info.root, writer=False)
    if line:
        click.echo(f"portkit: {line}", err=True)
    return info


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
    """Tell the layout, source roots, patch series and pin of the tree at PATH."""
    info = open_tree(path)
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
    info = open_tree(tree_path)
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
        sys.exit(AnchorError.exit_code)


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
    patches whose anchor does not exist in this tree ("not applicable"). OUT is made at
    once, all patches or none; an OUT that exists must be empty (or hold this very
    series already).
    """
    info = open_tree(tree_path)
    rendered = apply_mod.render_checked(info, feature)
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
    info = open_tree(tree_path)
    if pin is None and not force:
        raise UsageError("give --pin SHA (the llama.cpp commit the tree must be at), or --force")
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
    info = open_tree(tree_path)
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


@cli.command("recover")
@TREE_OPTION
@fails_cleanly
def recover_cmd(tree_path: Path) -> None:
    """Roll back what an interrupted portkit left half done in the tree.

    Every portkit command does this first anyway; this one does only that, and waits
    for a portkit still working on the tree (PORTKIT_LOCK_WAIT seconds) to finish.
    """
    root = tree_mod.detect(tree_path).root
    journal = None
    if (root / ".portkit").exists() or (root / ".portkit").is_symlink():
        with lock_tree(root):
            journal = recover(root)
    click.echo(recovered_line(root, journal) if journal else f"nothing to recover in {root}")


def main() -> None:
    """The `portkit` program: click's own failures (usage, Ctrl-C) in portkit's format too."""
    try:
        with _signals_interrupt():
            code = cli.main(prog_name="portkit", standalone_mode=False)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "portkit"
        click.echo(f"portkit: {exc.format_message().rstrip('.')} (see {where} --help)", err=True)
        sys.exit(UsageError.exit_code)
    except click.ClickException as exc:
        click.echo(f"portkit: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except BaseException as exc:  # Ctrl-C outside a command too
        exit_for(exc)
    sys.exit(code if isinstance(code, int) else 0)
