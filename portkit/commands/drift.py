"""`portkit drift`: for each patch of a series and each target tree, whether it still applies,
and if not, where its code went and why (docs/drift-ci.md)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import click

from portkit import tree as tree_mod
from portkit.commands.common import fails_cleanly, open_tree, refuse_input
from portkit.drift import formats as drift_formats
from portkit.drift import model as dm
from portkit.drift.classify import drift
from portkit.errors import InputError, UsageError
from portkit.follow import DriftInput
from portkit.series import Series, read_series
from portkit.tree import OLLAMA, Tree


def _target(spec: str) -> Tree:
    """A tree as `tree fetch` names it; a local folder is read where it is, not copied."""
    if Path(spec).is_dir():
        return open_tree(Path(spec))
    return tree_mod.detect(tree_mod.fetch(spec))


@click.command("drift")
@click.option("--series", "series_dir", type=click.Path(path_type=Path),
              help="The patch series (a folder of format-patch mails, or a quilt folder). "
                   "Default: the series of the fork in --fork.")
@click.option("--tree", "targets", multiple=True, metavar="TARGET",
              help="A tree to check the series against, as `portkit tree fetch` takes it "
                   "(DIR, git:URL@REV, pypi:llama-cpp-python==X); repeatable, oldest first. "
                   "Default in a fork: its own vendored tree (the series against its pin).")
@click.option("--base", metavar="TREE",
              help="The tree the series was written against. Default in a fork: its vendored "
                   "tree with the series taken out.")
@click.option("--fork", "fork_path", type=click.Path(path_type=Path), default=Path("."),
              show_default=True, help="The fork checkout whose series and tree are the "
                                      "defaults (an ollama-style layout).")
@click.option("--format", "fmt", type=click.Choice(drift_formats.FORMATS), default="table",
              show_default=True)
@click.option("--output", type=click.Path(path_type=Path),
              help="Write the report here instead of standard output.")
@click.option("--fail-on", "fail_on", multiple=True,
              type=click.Choice([str(c) for c in dm.FAIL_ON_CHOICES]),
              help="Which patches make the exit code 20 (repeatable; default: conflict and "
                   "semantic). relocated and fuzz include what is worse.")
@click.option("--from-json", "saved", type=click.Path(path_type=Path, dir_okay=False),
              help="Render a report saved with --format json again, without analysing.")
@fails_cleanly
def drift_cmd(series_dir: Path | None, targets: tuple[str, ...], base: str | None,
              fork_path: Path, fmt: str, output: Path | None, fail_on: tuple[str, ...],
              saved: Path | None) -> None:
    """Report, per patch and hunk, how a patch series fares on other trees.

    \b
    portkit drift --series llama/patches --tree pypi:llama-cpp-python==0.3.19 --base DIR
    portkit drift --tree pypi:llama-cpp-python==0.3.19     in a fork: its series and base
    portkit drift --format markdown --fail-on fuzz ...      for a CI job summary

    \b
    Statuses, best to worst: clean, offset, fuzz (as GNU patch applies it), relocated (its
    function or file moved or was renamed: found by the anchor engine, and the hunk lands
    there), conflict (with the reason and the nearest match); already-applied (it
    reverse-applies) and present-upstream (upstream has the change in its own form). Semantic
    drift lists the symbols a patch uses whose definition changed, even when it applies.
    Exits 20 when a patch needs attention (--fail-on), 0 when none does; other codes are
    failures (docs/exit-codes.md). The trees are only read.
    """
    chosen = dm.parse_fail_on(fail_on)
    inputs: list[Path] = [saved] if saved is not None else []
    if saved is not None:
        if series_dir or targets or base:
            raise UsageError("--from-json renders a saved report: give no --series, --tree "
                             "or --base with it")
        try:
            text = saved.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{saved} is not a JSON drift report (not UTF-8)") from exc
        except OSError as exc:
            raise InputError(f"--from-json {saved} cannot be read: "
                             f"{exc.strerror or exc}") from exc
        report = dm.DriftReport.from_json(text)
    else:
        job, fork = _job(series_dir, targets, base, fork_path)
        inputs += [job.series.folder, *(t.root for _, t in job.targets)]
        inputs += [job.base.root] if job.base is not None else []
        if output is not None:
            refuse_input("--output", output, inputs, "this report")  # before the analysis
        report = _with_unreadable(drift(job, fork), job.series)
    rendered = drift_formats.render(report, fmt, chosen)
    if output is not None:
        refuse_input("--output", output, inputs, "this report")
        _write_atomically(output, rendered if rendered.endswith("\n") else rendered + "\n")
    else:
        click.echo(rendered, nl=not rendered.endswith("\n"))
    sys.exit(dm.exit_code(report, chosen))


def _write_atomically(output: Path, text: str) -> None:
    """The report written beside `output`, synced, then renamed onto it: a reader (or a
    crash) sees the old file or the whole new one."""
    folder = output.resolve().parent
    if not folder.is_dir():
        raise UsageError(f"--output {output}: folder {output.parent} does not exist")
    if output.is_dir():
        raise UsageError(f"--output {output} is a folder")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{output.name}.", suffix=".portkit-tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8", "surrogateescape"))
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, output.resolve())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _with_unreadable(report: dm.DriftReport, series: Series) -> dm.DriftReport:
    """A patch portkit cannot read is that patch's verdict (a conflict saying why), in its
    place in the series, on every target. A cover letter has no hunks: it has no row."""
    unreadable = [bad for bad in series.unreadable if not bad.cover]
    if not unreadable:
        return report
    order = [p.name for p in series.in_order()]
    targets = []
    for target in report.targets:
        rows = {p.file: p for p in target.patches}
        for bad in unreadable:
            rows[bad.name] = dm.PatchDrift(bad.name, bad.name, (dm.HunkDrift(
                bad.name, 0, dm.CONFLICT, f"portkit cannot read this patch: {bad.reason}",
                1),))
        targets.append(replace(target, patches=tuple(
            rows[name] for name in order if name in rows)))
    return replace(report, targets=tuple(targets))


def _job(series_dir: Path | None, targets: tuple[str, ...], base: str | None,
         fork_path: Path) -> tuple[DriftInput, Tree | None]:
    fork: Tree | None = None
    if series_dir is None or (base is None) or not targets:
        try:
            candidate: Tree | None = open_tree(fork_path)
        except InputError:  # not a tree: the options must say everything then
            candidate = None  # (a tree that cannot be read as it is, EditedSince, says so)
        if candidate is not None and candidate.layout == OLLAMA:
            fork = candidate
    if series_dir is None:
        if fork is None or fork.series_dir is None:
            raise UsageError("give --series DIR (or run in an ollama-style fork checkout, "
                             "whose llama/patches is the default)")
        series_dir = fork.series_dir
    series = read_series(series_dir, lenient=True)
    trees = [(spec, _target(spec)) for spec in targets]
    if not trees:
        if fork is None:
            raise UsageError("give --tree TARGET (a tree to check the series against)")
        trees = [(str(fork.root), fork)]
    if base is None and fork is None:
        raise UsageError("give --base TREE (the tree the series was written against); in a "
                         "fork checkout it is the vendored tree with the series taken out")
    base_tree = _target(base) if base is not None else None
    return DriftInput(series, str(series_dir), base_tree, trees), fork
