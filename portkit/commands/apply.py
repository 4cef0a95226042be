"""`portkit apply`: port a feature (or any series) onto a tree, all or nothing; --reverse."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from portkit import apply as apply_mod
from portkit import tree as tree_mod
from portkit import validate as validate_mod
from portkit.commands.common import FEATURE_OPTION, TREE_OPTION, fails_cleanly, open_tree
from portkit.errors import UsageError
from portkit.features import DEFAULT_FEATURE, Feature
from portkit.record import check_series_name, record_rel
from portkit.render import PRESENT
from portkit.series import read_series


@click.command("apply")
@click.option("--pin", metavar="SHA",
              help="Required (or --force): the llama.cpp commit the tree must be at, e.g. "
                   "7049736b. Read from Makefile.sync FETCH_HEAD, build-info, CHANGELOG or git.")
@TREE_OPTION
@FEATURE_OPTION
@click.option("--series", "series_dir", type=click.Path(path_type=Path, file_okay=False),
              help="Apply this patch series instead of a feature: a folder of format-patch "
                   "mails or plain diffs (any names), or a quilt folder with its `series` "
                   "file. It is recorded under the folder's name (letters, digits, '.', '_', "
                   "'-', starting with a letter or digit: rename the folder otherwise); "
                   "--reverse --series takes it out (only the series recorded under that "
                   "name). In a fork, it may change only files the fork's rsync rules "
                   "vendor.")
@click.option("--dry-run", is_flag=True, help="Change nothing; print the series.")
@click.option("--reverse", is_flag=True, help="Take out a series that portkit applied.")
@click.option("--force", is_flag=True, help="Skip the pin check.")
@click.option("--compile", "compile_check", is_flag=True,
              help="Compile the translation units the series touches (in a fork's vendored "
                   "subset: compile and link libllama and ggml); take it out if they fail.")
@click.option("--validate", "then_validate", is_flag=True,
              help="Then run `portkit validate --quick` on the patched tree (in a fork: the "
                   "vendored subset as the fork has it); about 11 min the first time.")
@fails_cleanly
def apply_cmd(pin: str | None, tree_path: Path, feature: str, series_dir: Path | None,
              dry_run: bool, reverse: bool, force: bool, compile_check: bool,
              then_validate: bool) -> None:
    """Port a feature onto the tree: verify the pin, render, apply all or nothing.

    \b
    portkit apply --pin 7049736b              in the fork's checkout
    portkit apply --pin 7049736b --dry-run    show the series, change nothing
    portkit apply --pin 7049736b --reverse    take it out again, byte for byte
    portkit apply --pin 7049736b --series DIR   any series, all or nothing

    On any failure the tree is left exactly as it was. A second run says "already
    applied"; a tree where upstream already has the feature is left alone. In an
    ollama-style fork the series is also added to llama/patches with the next numbers,
    written the way the fork writes its own (git format-patch mails, a plain diff as git's
    diff with git's configured author), and a later `portkit rebase --fork` carries it
    with the rest. The applied series is kept in <tree>/.portkit/<name>/ (`portkit tree
    info` lists what is applied); a series comes out only from under none applied after
    it to the same files.
    """
    info = open_tree(tree_path)
    if pin is None and not force:
        raise UsageError("give --pin SHA (the llama.cpp commit the tree must be at), or --force")
    name = feature
    if series_dir is not None:
        name = check_series_name(series_dir)
        if then_validate:
            raise UsageError("--validate proves a feature; give --feature, not --series")
    if reverse:
        # the series given must be the one recorded under its name (once it is gone, the
        # record alone says what to take out)
        given = read_series(series_dir) if series_dir is not None and series_dir.is_dir() \
            else None
        outcome = apply_mod.reverse(info, name, pin=pin, force=force, dry_run=dry_run,
                                    series=given, of_series=series_dir is not None)
    elif series_dir is not None:
        outcome = apply_mod.apply_series(info, read_series(series_dir), name, pin=pin,
                                         force=force, dry_run=dry_run,
                                         compile_check=compile_check)
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
        click.echo(f"{name} is {PRESENT} in this tree (llama.cpp {(info.pin or '?')[:12]}): "
                   f"nothing applied")
        return
    record = info.root / record_rel(name)
    if outcome.status == apply_mod.ALREADY:
        click.echo(f"{name} is already applied ({len(outcome.patches)} patches, kept in "
                   f"{record}): nothing changed")
    else:
        verb = "reversed" if reverse else "applied"
        click.echo(f"{verb} {len(outcome.patches)} patch(es) of {name} "
                   f"({len(outcome.files)} files) in {info.llama_root}")
        for patch, _ in outcome.patches:
            click.echo(f"  {patch}")
        for copy in outcome.series_copies:
            click.echo(f"  {'removed from' if reverse else 'added to'} the fork's series: {copy}")
        if outcome.rendered is not None:
            for o in outcome.rendered.outcomes:
                if o.mail is None:
                    click.echo(f"  {o.spec.name}: {o.status} ({o.reason})")
        if outcome.compiled is not None:
            click.echo(f"compiled {', '.join(outcome.compiled.units)} with "
                       f"{outcome.compiled.method}")
        if not reverse:
            show = _reverse_command(pin, force, tree_path, feature, series_dir)
            click.echo(f"the series is kept in {record}; see the change with `git diff` in a "
                       f"git checkout, or `{show}` (without --dry-run: take it out)")
    if then_validate and not reverse:
        port = Feature.load(feature)
        reference = tree_mod.detect(tree_mod.fetch(port.validation.reference)) \
            if port.validation.reference else None
        report = validate_mod.validate(tree_mod.detect(tree_path), port, reference=reference)
        click.echo(report.text())
        if not report.passed:
            raise report.failure()


def _reverse_command(pin: str | None, force: bool, tree_path: Path, feature: str,
                     series_dir: Path | None) -> str:
    """The `portkit apply --reverse --dry-run` that shows what this run applied, as the
    user can paste it: the pin (or --force) it was applied with, the series folder (a
    series is taken out by --series) or a feature other than the default, the tree when it
    is not the current folder."""
    words = ["portkit", "apply", "--reverse", "--dry-run"]
    words += ["--force"] if force or pin is None else ["--pin", pin]
    if series_dir is not None:
        words += ["--series", str(series_dir)]
    elif feature != DEFAULT_FEATURE:
        words += ["--feature", feature]
    if tree_path.resolve() != Path.cwd().resolve():
        words += ["--tree", str(tree_path)]
    return shlex.join(words)
