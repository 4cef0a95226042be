"""The series read in order on a target, as a maintainer reads it: GNU patch's verdict
stands where it places a hunk; a patch that fails still lends the later ones what it
creates; a patch partly upstream needs a refresh.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from portkit.cache import lay_down
from portkit.drift.model import (
    ALREADY_APPLIED,
    CLEAN,
    CONFLICT,
    OFFSET,
    PRESENT_UPSTREAM,
    HunkDrift,
)
from portkit.hunks import (
    ALREADY,
    HunkResult,
    PatchResult,
    _copy_in,
    _Run,
    _Verdict,
)
from portkit.hunks import CLEAN as H_CLEAN
from portkit.hunks import OFFSET as H_OFFSET
from portkit.series import FileDiff, Hunk, Patch, Series

FUZZ_LIMIT = 2


@lru_cache(maxsize=1)
def _fast_tmp() -> str | None:
    """Where drift's scratch files go: a memory file system when there is one to write in
    (GNU patch runs hundreds of times on them; a disk makes each run cost a few writes),
    else the system's temporary folder."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


def _has_run(hay: list[str], run: list[str]) -> bool:
    """Whether `run` occurs in `hay` as consecutive items."""
    n = len(run)
    return any(hay[i:i + n] == run for i, line in enumerate(hay) if line == run[0])


def _wholly_there(hunks: list[HunkDrift], blocks: dict[int, str]) -> list[HunkDrift]:
    """A patch the target has all of: the hunks that do not land (or land only with fuzz)
    found there by the presence rules, the ones that land found there as one block each
    (`there_as_block`: landing them would duplicate upstream's lines) is present upstream,
    every hunk of it. Where the rest of the patch is not there, such a block is a note to
    review on a hunk that keeps what text says."""
    if not blocks:
        return hunks
    there = (ALREADY_APPLIED, PRESENT_UPSTREAM)
    if all(h.status in there or i in blocks for i, h in enumerate(hunks)):
        return [replace(h, status=PRESENT_UPSTREAM,
                        reason=f"it {h.reason}, but the target has it already: {blocks[i]} "
                               "(landing it would write them twice), as it has the rest of "
                               "the patch")
                if i in blocks else h for i, h in enumerate(hunks)]
    return [replace(h, reason=f"{h.reason}; to review: {blocks[i]}") if i in blocks else h
            for i, h in enumerate(hunks)]


def _partly_there(hunks: list[HunkDrift]) -> list[HunkDrift]:
    """A patch part of which the target has while the rest still applies is a patch to
    refresh (without the part that is there), not one that fits: each hunk that is there
    needs attention then, saying so. When every hunk is there, or another one is in
    conflict anyway, the hunks keep their statuses."""
    there = (ALREADY_APPLIED, PRESENT_UPSTREAM)
    if not any(h.status in there for h in hunks) or \
            not all(h.status in (*there, CLEAN, OFFSET) for h in hunks) or \
            all(h.status in there for h in hunks):
        return hunks
    return [replace(h, status=CONFLICT, offset=0, fuzz=0,
                    reason=f"the patch is partly upstream: {h.reason}, while the rest of it "
                           "is not; refresh the patch without this hunk",
                    nearest=h.nearest)
            if h.status in there else h for h in hunks]


class _Carry(_Run):
    """Drift's run of a series on a target (GNU patch underneath, as the engine runs it), with
    two differences that make it read real history as a maintainer does:

      - GNU patch's verdict stands as it says it: a hunk it places at an offset, without
        fuzz, is offset (the engine also tries such a hunk reversed, which costs a run of
        GNU patch per hunk and can only turn a hunk that applies into an "already there");
      - a patch that fails still lends the later patches what of it was carried: the hunks
        GNU patch placed, the files it creates, and the hunks drift relocated (`lend`), so
        that one failure does not fail every later patch on the same files.
    """

    @classmethod
    @contextmanager
    def on(cls, series: Series, root: Path) -> Iterator[_Carry]:
        with tempfile.TemporaryDirectory(prefix="portkit-drift-", dir=_fast_tmp()) as tmp:
            tree = Path(tmp) / "tree"
            tree.mkdir()
            modes = {}
            for rel in series.paths:
                mode = _copy_in(root / rel, tree / rel)
                if mode is not None:
                    modes[rel] = mode
            run = cls(tree, Path(tmp) / "try", FUZZ_LIMIT, False, False, modes)
            run._files = {rel: (tree / rel).read_bytes() if (tree / rel).is_file() else None
                          for rel in series.paths}
            yield run

    check_offsets = False  # also try an offset hunk reversed (see patch)
    _files: dict[str, bytes | None]  # the tree's files, as carried so far

    def _landed(self, f: FileDiff, hunk: Hunk, base: HunkResult, verdict: _Verdict,
                at: int) -> HunkResult:
        if verdict.fuzz or self.check_offsets:
            return super()._landed(f, hunk, base, verdict, at)
        return replace(base, status=H_OFFSET if verdict.offset else H_CLEAN,
                       offset=verdict.offset, line=verdict.line)

    def patch(self, patch: Patch) -> PatchResult:
        before = {rel: self._files.get(rel) for rel in patch.paths}
        result = self._patch(patch)
        if any(h.status == ALREADY for h in result.hunks) and \
                any(h.status == H_OFFSET for h in result.hunks):
            # Part of the patch is there already: a hunk placed at an offset may be there
            # too (one that adds a line GNU patch would add a second time elsewhere).
            self.lend(before)
            self.check_offsets = True
            result = self._patch(patch)
            self.check_offsets = False
        if not result.applied and not result.problems:
            created = [f.path for f in patch.files if f.status == "created"]
            self.lend({rel: (self.trial / rel).read_bytes() for rel in created
                       if (self.trial / rel).is_file()})
        return result

    def _patch(self, patch: Patch) -> PatchResult:
        """The engine's run of one patch (_Run.patch), without emptying the try folder
        each time: only the patch's own files are laid there, which is all GNU patch
        reads."""
        self.trial.mkdir(exist_ok=True)
        lay_down(self.trial, {rel: self._files.get(rel) for rel in patch.paths})
        result = PatchResult(patch, [], applied=False)
        self._run_ahead(patch)
        for f in patch.files:
            self._file(patch, f, result)
        self._ahead.clear()
        result.applied = not result.problems and not result.failed
        if result.applied:
            self.lend({rel: (self.trial / rel).read_bytes() if (self.trial / rel).is_file()
                       else None for rel in patch.paths})
        return result

    def lend(self, files: dict[str, bytes | None]) -> None:
        """Later patches see these files so (None: absent)."""
        lay_down(self.tree, files)
        self._files.update(files)

    def files(self) -> dict[str, bytes | None]:
        """Every file the series touches, as carried so far (None: absent)."""
        return dict(self._files)
