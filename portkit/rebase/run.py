"""The whole series carried (`rebase`): patch after patch, each written back in its own
style with git's diff of what it does on the target, and written to --out all at once
(`write_rebased`).
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

from portkit.cache import scratch, sweep
from portkit.errors import UnreadablePatch, UsageError
from portkit.follow import follow
from portkit.fork import (
    Scoped,
    fork_scope,
    put_back,
)
from portkit.proc import git
from portkit.rebase.carry import _HEADING, _Carrier, _style, side_file
from portkit.rebase.report import (
    CONFLICTS,
    DROPPED,
    NEEDS_HUMAN,
    UNCHANGED,
    Rebased,
    RebasedPatch,
    RebaseReport,
)
from portkit.series import (
    Patch,
    Series,
    Unreadable,
    git_diff,
    heading_drivers,
)
from portkit.tree import Tree


def _written(patch: Patch, diff: str) -> Patch:
    """The patch with `diff` for its diff, written as the patch itself is written: the same
    mail or preamble byte for byte, its diffstat made again where it has one, `index` lines
    only where it has them, the same signature and line ends (Patch.with_diff)."""
    return patch.with_diff(diff)


def base_spec(spec: str, target: Path | None = None) -> str:
    """--base as `portkit tree fetch` takes it; or, when the target is a local git checkout
    and `spec` names no tree, a commit of that repository (as git:REPO@COMMIT)."""
    if target is None or Path(spec).is_dir() or spec.startswith(("pypi:", "git:")) \
            or not (target / ".git").exists():
        return spec
    found = git(["rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}"], cwd=target,
                check=False)
    return f"git:{target.resolve()}@{found.stdout.strip()}" if found.returncode == 0 else spec


def _side_names(names: list[str]) -> dict[str, str]:
    """Each patch's side file, needs-human/<its stem>.conflict; where two patches share a
    stem (a/fix.diff and b/fix.diff, 0005-x.patch and 0005-x.diff), each by its whole name
    (a--fix.diff.conflict): no side file stands for two patches."""
    stems = Counter(Path(name).stem for name in names)
    return {name: f"{CONFLICTS}/{Path(name).stem}.conflict" if stems[Path(name).stem] == 1
            else f"{CONFLICTS}/{name.replace('/', '--')}.conflict" for name in names}


def rebase(series: Series, target: Tree, *, base: Tree | None = None, fork: Tree | None = None,
           series_label: str = "series", target_label: str = "target",
           base_label: str | None = None) -> Rebased:
    """Carry `series` (written against `base`, or against `fork` with the series taken out)
    onto `target`. Nothing is written: see write_rebased. With `fork`, the series is
    carried as the fork vendors llama.cpp (portkit.fork): the sections for files it does not
    vendor are not checked and go back into each carried patch unchanged, every tree is seen
    as the fork would vendor it, and a dropped patch needs attention."""
    abbrev, headings = _style(series)
    drivers = heading_drivers(series.patches)
    with ExitStack() as stack:
        scoped: Scoped | None = None
        if fork is not None:
            seen = stack.enter_context(fork_scope(fork, series, [target], base))
            scoped, (view,), base_view = seen.scoped, seen.trees, seen.base
        lead = stack.enter_context(follow(
            scoped.series if scoped else series, base_view if scoped else base,
            view if scoped else target, target_label, fork))
        tmp = stack.enter_context(_scratch("portkit-rebase-"))
        carrier = _Carrier(lead, tmp)
        rows: list[RebasedPatch] = []
        carried: list[Patch] = []
        side: dict[str, bytes] = {}
        kept: dict[str, bytes] = {}
        mine = {p.name: p for p in scoped.series.patches} if scoped else {}
        # the files the patches after each one change (what a patch carried in part serves)
        later = {p.name: frozenset(rel for q in series.patches[k + 1:] for rel in q.paths)
                 for k, p in enumerate(series.patches)}
        side_names = _side_names([p.name for p in series.in_order()])
        for patch in series.in_order():
            if isinstance(patch, Unreadable):  # its own verdict; kept for the human as it is
                if patch.absent:  # a link to nothing, a folder: there is nothing to keep
                    rows.append(RebasedPatch(patch.name, patch.name, NEEDS_HUMAN,
                                             f"it cannot be read: {patch.reason} (nothing of "
                                             "it is written to the output)", None))
                    continue
                kept[patch.name] = patch.data
                if patch.cover:
                    rows.append(RebasedPatch(patch.name, patch.name, UNCHANGED,
                                             "a cover letter, kept as it is (its shortlog "
                                             "and diffstat are the old series')", patch.name))
                else:
                    rows.append(RebasedPatch(patch.name, patch.name, NEEDS_HUMAN,
                                             f"it cannot be read: {patch.reason}", patch.name))
                continue
            original, away = patch, scoped.left_out.get(patch.name, []) if scoped else []
            if scoped is not None and patch.name in scoped.untouched:
                carried.append(patch)  # nothing of it is vendored: kept as it is
                rows.append(RebasedPatch(patch.name, patch.subject, UNCHANGED,
                                         "it touches only files this fork does not vendor: "
                                         "not checked, kept as it is", patch.name))
                continue
            patch = mine.get(patch.name, patch)
            had = dict(carrier.work.files)
            had_modes = dict(carrier.work.modes)
            outcome = carrier.carry(patch, later=later[original.name])
            if outcome.status == DROPPED or (outcome.status == NEEDS_HUMAN
                                             and not outcome.after):
                name = side_names[patch.name] \
                    if outcome.status == NEEDS_HUMAN else None
                if name is not None:
                    side[name] = outcome.conflict.encode("utf-8", "surrogateescape")
                rows.append(RebasedPatch(patch.name, patch.subject, outcome.status,
                                         outcome.reason, None, name))
                continue
            before = {rel: had[rel] if rel in had else carrier.work.original(rel)
                      for rel in outcome.after}
            before_modes = {rel: had_modes[rel] if rel in had_modes
                            else carrier.work.original_mode(rel) for rel in outcome.after}
            after_modes = {rel: outcome.modes.get(rel, before_modes[rel])
                           for rel in outcome.after}
            diff = git_diff(before, outcome.after, abbrev=patch.conventions.abbrev or abbrev,
                            prefix=patch.strip != 0, modes=(before_modes, after_modes),
                            renames=any(f.rename_from for f in patch.files), drivers=drivers)
            if not headings:
                diff = _HEADING.sub(r"\1", diff)
            if not diff:
                rows.append(RebasedPatch(patch.name, patch.subject, DROPPED,
                                         f"it changes nothing on the target ({outcome.reason})",
                                         None))
                continue
            if away:  # the sections for files the fork does not vendor, as they were
                diff = put_back(diff, original, away)
            try:
                written = _written(original, diff)
            except UnreadablePatch as exc:  # never the whole run's refusal: this patch's
                for rel in outcome.after:
                    carrier.work.put(rel, before[rel], before_modes[rel])
                name = side_names[patch.name]
                reason = (f"carried, it cannot be written back as a patch ({exc.message}); "
                          "left for a human")
                side[name] = side_file(patch, reason, diff).encode("utf-8", "surrogateescape")
                rows.append(RebasedPatch(patch.name, patch.subject, NEEDS_HUMAN, reason, None,
                                         name))
                continue
            carried.append(written)
            name = None
            if outcome.status == NEEDS_HUMAN:  # carried in part: the rest in its side file
                name = side_names[patch.name]
                side[name] = outcome.conflict.encode("utf-8", "surrogateescape")
            rows.append(RebasedPatch(patch.name, patch.subject, outcome.status, outcome.reason,
                                     patch.name, name))
        changed = {rel: data for rel, data in carrier.work.files.items()
                   if data != carrier.work.original(rel)}
    report = RebaseReport(series_label, base.pin if base else fork.pin if fork else None,
                          target_label, target.pin, tuple(rows), fork=fork is not None,
                          not_vendored=tuple((u.patch, u.path) for u in scoped.unvendored)
                          if scoped else (), base_tree=base_label)
    names = _renumbered(series, {r.file for r in rows if r.status == DROPPED})
    if names:
        carried = [replace(p, name=names.get(p.name, p.name)) for p in carried]
        kept = {names.get(name, name): data for name, data in kept.items()}
        # a side file is named as its patch is now: the human's patch takes its place
        order = list(side_names)
        again = _side_names([names.get(name, name) for name in order])
        moved = {side_names[name]: again[names.get(name, name)] for name in order}
        side = {moved.get(rel, rel): data for rel, data in side.items()}
        rows = [replace(r, output=names.get(r.output, r.output) if r.output else None,
                        conflict=moved.get(r.conflict, r.conflict) if r.conflict else None)
                for r in rows]
        report = replace(report, patches=tuple(rows))
    out = Series(series.folder, series.kind, tuple(carried), series.conventions,
                 series.series_file, series.unreadable)
    return Rebased(report, out, {**kept, **side}, changed)


_NUMBERED = re.compile(r"(\d{4})-(.+)")


def _renumbered(series: Series, dropped: set[str]) -> dict[str, str]:
    """The new file names of a series numbered without gaps (NNNN-, from its first number,
    as `git format-patch` numbers a series made again) once patches drop out of it: the
    ones after a gap numbered again, each keeping the rest of its name. A patch left for a
    human is numbered as the others (its side file is named by its new name: the human's
    patch, saved under it, comes back in its place). A series that
    had gaps of its own, is quilt's, or numbers its subjects ([PATCH n/m]) keeps its names."""
    order = [p.name for p in series.in_order() if not getattr(p, "cover", False)]
    found = [_NUMBERED.fullmatch(name) for name in order]
    if series.kind == "quilt" or series.conventions.numbered or not order or None in found:
        return {}
    numbers = [int(m.group(1)) for m in found if m]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        return {}
    names, number = {}, numbers[0]
    for name, m in zip(order, found, strict=True):
        if name not in dropped and m:
            names[name] = f"{number:04d}-{m.group(2)}"
            number += 1
    return {old: new for old, new in names.items() if old != new}


@contextmanager
def _scratch(prefix: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


def check_out(out: Path) -> None:
    """--out must be absent or an empty folder (checked before a run, and again at its end)."""
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        raise UsageError(f"--out {out} exists and is not an empty folder")
    if out.resolve() == Path.cwd().resolve():
        raise UsageError(f"--out {out} is the current folder: name a folder to create")


def write_rebased(rebased: Rebased, out: Path) -> None:
    """Write the carried series and the side files to `out` (absent or empty) all at once:
    they are made in a hidden sibling and renamed into place, with the mode a folder made
    there gets (an empty `out` keeps its own)."""
    check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = out.stat().st_mode & 0o7777 if out.exists() else None
    hidden = f".{out.name}.portkit-"
    sweep(out.parent, older_than=60.0, prefixes=(hidden,))  # what a killed run left
    # a fresh hidden sibling, made as any folder there is (the umask applies), locked while
    # it is being filled
    with scratch(out.parent, hidden) as tmp:
        if kept is not None:
            os.chmod(tmp, kept)
        for rel, data in rebased.files().items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        try:  # another run given the same --out may have filled it meanwhile: it won
            if out.exists():
                out.rmdir()
            os.rename(tmp, out)
        except FileNotFoundError:  # its empty `out` went just now: ours goes there
            os.rename(tmp, out)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            raise UsageError(f"--out {out} exists and is not an empty folder") from exc
