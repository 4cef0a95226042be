"""Drift: how each patch of a series fares on other trees, hunk by hunk, and why.

For every target the series is applied in order by the per-hunk engine (portkit.hunks, GNU
patch underneath), each patch on top of the earlier ones that applied. A hunk that lands is
clean, offset or fuzz, as GNU patch says; one that reverse-applies is already-applied. Only
where the whole patch is there already does a hunk that lands become present-upstream: each
such hunk only adds lines the target's file has as one block, new since the base (landing it
would write upstream's lines twice), and every other hunk of the patch is there by the rules
below; elsewhere such a block is a note to review. A hunk that fails is followed into the
target:

  relocated         its enclosing symbol in the base (function, method, class, file-scope
                    declaration) was found in the target by the anchor engine's Locator
                    (exact / alias / structure / similarity), and the hunk, re-expressed
                    with the target's names, lands inside it;
  present-upstream  the target already has the change in another form: every line the
                    hunk adds is there, or every new name it brings is already used at that
                    place in the target, or every line it adds is there under upstream's
                    names (a definition upstream added under a name akin to the hunk's);
  conflict          none of that: the reason (file gone, symbol gone, context changed) and
                    the nearest match in the target.

Semantic drift: the symbols a patch's added lines use (functions, methods, types, fields,
enumerators, macros, variables) are looked up in the base and in the target; each one that
is gone, renamed, or whose signature or type changed is listed, even when the text applies.
"""

from __future__ import annotations

from dataclasses import replace

from portkit.drift.model import (
    DriftReport,
    NotVendored,
    PatchDrift,
)
from portkit.errors import UsageError
from portkit.follow.sides import (
    DriftInput,
    Side,
    _base_root,
    _patterns,
    _upstream,
    feature_of,
    tree_view,
)
from portkit.follow.target import _Target
from portkit.fork import fork_scope
from portkit.tree import Tree


def drift(job: DriftInput, fork: Tree | None = None) -> DriftReport:
    """Run drift for every target; the base is `job.base`, or `fork` with the series out.
    With a fork, its series is checked as the fork vendors llama.cpp: the sections for
    files it does not vendor are left out (and listed once in the report), and every tree
    is seen as the fork would vendor it (portkit.fork)."""
    if job.base is None and fork is None:
        raise UsageError("drift needs the tree the series was written against (--base)")
    if fork is None:
        return _drift(job, None)
    with fork_scope(fork, job.series, [t for _, t in job.targets], job.base) as seen:
        scoped = seen.scoped
        report = _drift(DriftInput(scoped.series, job.series_label, seen.base,
                                   [(label, view) for (label, _), view
                                    in zip(job.targets, seen.trees, strict=True)]), fork)
    order = [p.name for p in job.series.patches]
    untouched = {p.name: p for p in job.series.patches if p.name in scoped.untouched}
    targets = []
    mine = fork.root.resolve()
    for t, (_, tree) in zip(report.targets, job.targets, strict=True):
        rows = {p.file: p for p in t.patches}
        rows.update({name: PatchDrift(name, p.subject, ()) for name, p in untouched.items()})
        targets.append(replace(t, patches=tuple(rows[n] for n in order if n in rows),
                               own=tree.root.resolve() == mine))
    return replace(report, targets=tuple(targets), fork=True, not_vendored=tuple(
        NotVendored(u.patch, u.path) for u in scoped.unvendored))


def _drift(job: DriftInput, fork: Tree | None) -> DriftReport:
    patterns = _patterns(job.series)
    feature = feature_of(job.series)
    with _base_root(job, fork) as (base_root, base_pin):
        base = Side("base", base_root, patterns, base_pin)
        targets = []
        for label, tree in job.targets:
            upstream = _upstream(feature, tree) if feature else {}
            with tree_view(tree) as root:
                targets.append(_Target(job.series, base, Side(label, root, patterns, tree.pin),
                                       upstream).run())
    return DriftReport(job.series_label, tuple(targets))
