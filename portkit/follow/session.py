"""The engine one patch at a time, for rebase (`follow` -> `Follow`): each patch
classified as drift classifies it, on the files as the caller's earlier patches left
them, and each hunk it relocates with its landing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from portkit.drift.model import (
    PatchDrift,
    SemanticChange,
)
from portkit.errors import UsageError
from portkit.follow.relocate import Landing, _hunk_key
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
from portkit.hunks import (
    PatchResult,
)
from portkit.series import Hunk, Patch, Series
from portkit.tree import Tree


class Follow:
    """Drift one patch at a time on a target whose patched files the caller keeps (how
    rebase carries a series): each patch classified as drift classifies it, on the files as
    the caller's earlier patches left them, and each hunk it relocates with its landing."""

    def __init__(self, target: _Target) -> None:
        self._target = target
        target.follow_lines = True

    @property
    def base(self) -> Side:
        return self._target.base

    @property
    def target(self) -> Side:
        return self._target.target

    def patch(self, presult: PatchResult, current: dict[str, bytes | None]) -> PatchDrift:
        """Drift of the patch the engine ran as `presult` on `current` (the caller's files
        by path; a file not in it is the target's own)."""
        self._target.current = current
        self._target.landings.clear()
        return self._target.patch(presult)

    def semantic(self, patch: Patch) -> list[SemanticChange]:
        """The symbols the patch's added lines use that changed between base and target."""
        return self._target.semantic(patch)

    def look_at(self, current: dict[str, bytes | None]) -> None:
        """Take `current` (the caller's files by path) as the target's files from now on."""
        self._target.current = current

    def landing(self, hunk: Hunk) -> Landing | None:
        """Where the last patch's hunk went, when drift relocated it."""
        return self._target.landings.get(_hunk_key(hunk))

    def home(self, hunk: Hunk) -> tuple[str, int, int, str] | None:
        """Where what the hunk's symbol in the base became is, in the target's file as the
        earlier patches left it: (file, first line, last line, qualified name); None when
        the hunk is between definitions or its symbol was not found."""
        t = self._target
        sym = t.base_symbol(hunk)
        cand = t.located(sym)[0] if sym is not None else None
        if cand is None:
            return None
        ts = cand.symbol
        return ts.file, t._line_now(ts.file, ts.start_line), t._line_now(ts.file, ts.end_line), \
            ts.qualname

    def relocate(self, hunk: Hunk) -> Landing | None:
        """The hunk carried into what its symbol in the base became, as drift relocates a
        hunk whose context is gone (when it can)."""
        t = self._target
        sym = t.base_symbol(hunk)
        cand = t.located(sym)[0] if sym is not None else None
        if sym is None or cand is None or t.relocate(hunk, sym, cand.symbol) is None:
            return None
        return t.landings.get(_hunk_key(hunk))


@contextmanager
def follow(series: Series, base: Tree | None, target: Tree, label: str,
           fork: Tree | None = None) -> Iterator[Follow]:
    """A Follow of `series` on `target`; the base is `base`, or `fork` with the series out."""
    if base is None and fork is None:
        raise UsageError("the tree the series was written against is needed (--base)")
    patterns = _patterns(series)
    feature = feature_of(series)
    upstream = _upstream(feature, target) if feature else {}
    with _base_root(DriftInput(series, label, base), fork) as (base_root, base_pin), \
            tree_view(target) as root:
        yield Follow(_Target(series, Side("base", base_root, patterns, base_pin),
                             Side(label, root, patterns, target.pin), upstream))
