"""`portkit rebase`: carry a patch series onto a newer llama.cpp, and say what is left."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from portkit import rebase as rebase_mod
from portkit import tree as tree_mod
from portkit.commands.common import fails_cleanly, open_tree, refuse_input
from portkit.errors import UsageError
from portkit.series import read_series
from portkit.transaction import note_complete
from portkit.tree import Tree


def _tree(spec: str) -> Tree:
    """A tree as `tree fetch` names it; a local folder is read where it is, not copied."""
    if Path(spec).is_dir():
        return open_tree(Path(spec))
    return tree_mod.detect(tree_mod.fetch(spec))


@click.command("rebase")
@click.option("--onto", required=True, metavar="TARGET",
              help="The newer tree, as `portkit tree fetch` takes it (DIR, git:URL@REV, "
                   "pypi:llama-cpp-python==X).")
@click.option("--series", "series_dir", type=click.Path(path_type=Path, file_okay=False),
              help="The series to carry. Without it: the fork in --fork is moved.")
@click.option("--out", type=click.Path(path_type=Path),
              help="With --series: a new (or empty) folder for the carried series and, under "
                   "needs-human/, each patch a human must carry, with both sides.")
@click.option("--base", metavar="TREE",
              help="The tree the series was written against (a tree spec, or a commit of "
                   "the repository when --onto is a local git checkout). Default in a fork: "
                   "its vendored tree with the series taken out.")
@click.option("--fork", "fork_path", type=click.Path(path_type=Path), default=Path("."),
              show_default=True, help="The ollama-style fork to move (without --series).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]),
              default="table", show_default=True)
@click.option("--compile", "compile_check", is_flag=True,
              help="Compile the target's translation units the series touches, with and "
                   "without it; a patch whose lines fail to compile needs review.")
@click.option("--dry-run", is_flag=True, help="Show the report (in a fork: the plan), write "
              "nothing; with --series, --out is then optional.")
@fails_cleanly
def rebase_cmd(onto: str, series_dir: Path | None, out: Path | None, base: str | None,
               fork_path: Path, fmt: str, compile_check: bool, dry_run: bool) -> None:
    """Carry every patch of a series onto a newer tree, and say exactly what is left.

    \b
    portkit rebase --series llama/patches --base DIR --onto pypi:llama-cpp-python==0.3.19 --out new
    portkit rebase --onto pypi:llama-cpp-python==0.3.19 --dry-run     in a fork: the plan
    portkit rebase --onto pypi:llama-cpp-python==0.3.19               in a fork: move it

    \b
    Each patch, in order, on top of those carried: unchanged (applies, line numbers
    refreshed), merged (a 3-way merge gives a clean result), relocated (its code moved or was
    renamed: re-expressed there), dropped (upstream has it: says where), needs-human (no safe
    carry: left out, or carried only in the files later patches need, the rest in a side file
    needs-human/<patch>.conflict; a patch that cannot be read is kept as it was),
    needs-review (carried, but a symbol it uses changed, a guess placed it, or it does not
    compile). The carried series keeps each patch's mail and the series' own format, and
    applies with plain `git apply`. The source series and trees are never
    modified; --out is written only when the run is done. In a fork, the new pin, the
    vendored files (by the fork's .rsync-filter rules) and the carried series are written in
    one transaction, and not at all while a patch needs a human. Exits 20 when a patch needs
    a human or a review, 0 when none does.
    """
    if series_dir is not None:
        if (out is None and not dry_run) or base is None:
            raise UsageError("with --series, give --out DIR (where the carried series goes) "
                             "and --base TREE (what the series was written against)")
        if out is not None:  # before the run: fail fast
            refuse_input("--out", out, [p for p in (series_dir, Path(base), Path(onto))
                                        if p.exists()], "this rebase")
            rebase_mod.check_out(out)
    target = _tree(onto)
    if series_dir is not None:
        assert base is not None
        rebased = rebase_mod.rebase(
            read_series(series_dir, lenient=True), target,
            base=_tree(rebase_mod.base_spec(base, Path(onto) if Path(onto).is_dir() else None)),
            series_label=str(series_dir), target_label=onto, base_label=base)
        if compile_check:
            rebased = rebase_mod.compile_check(rebased, target)
        if out is not None and not dry_run:
            rebase_mod.write_rebased(rebased, out)
            note_complete()  # --out is there: an interrupt from now on says so
        click.echo(rebase_mod.render(rebased.report, fmt), nl=False)
        sys.exit(rebased.report.exit_code)
    if out is not None:
        raise UsageError("--out goes with --series; in a fork the carried series is written "
                         "to its llama/patches")
    fork = open_tree(fork_path)
    move = rebase_mod.plan_fork(fork, target, base=_tree(base) if base else None,
                                target_label=onto)
    if compile_check:
        move.rebased, move.compiled = rebase_mod.compile_check(move.rebased, target), True
    if dry_run or move.blocked:
        click.echo(rebase_mod.render(move.rebased.report, fmt), nl=False)
        click.echo(move.describe(), nl=False, err=True)
        if move.blocked and not dry_run:
            click.echo(f"portkit: {len(move.blocked)} patch(es) need a human: the fork is not "
                       f"moved", err=True)
        sys.exit(move.rebased.report.exit_code)
    # The fork is checked again under its lock: moved or changed meanwhile, it is planned
    # again there, and the report is the one of the move that was made.
    move, said = rebase_mod.move_fork(move)
    click.echo(rebase_mod.render(move.rebased.report, fmt), nl=False)
    if said:
        click.echo(f"portkit: {said}", err=True)
    if move.blocked:
        click.echo(move.describe(), nl=False, err=True)
        click.echo(f"portkit: {len(move.blocked)} patch(es) need a human: the fork is not "
                   f"moved", err=True)
    else:
        click.echo(f"moved {fork.root} to llama.cpp {move.pin[:12]}", err=True)
    sys.exit(move.rebased.report.exit_code)
