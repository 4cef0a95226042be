"""Drift on a fork-style series, side by side with the loops maintainers use today.

    .venv/bin/python benchmarks/drift.py [--target 0.3.17] [--rounds 5]

The 40-patch series of tests/data/fork-series (written against llama-cpp-python 0.3.16's
llama.cpp) is checked against a newer registry tree three ways, in one run:

  portkit     `portkit drift` (warm: its index cache is filled by a first run)
  git apply   a `git apply --check` loop: each patch on top of those that applied before
              (applied for real in a scratch copy), `-R --check` for "already applied"
  GNU patch   a `patch --dry-run --fuzz=2` loop, likewise, reading offset/fuzz/reversed

Each is timed (median of --rounds), and its verdict per patch is compared with the status
established by hand (expected.toml): how many patches it classifies right, how many it calls
fine (clean or offset) that need attention, how many it calls upstream when only part is,
and, for portkit, how many of the hunks that moved it locates (right file and symbol).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from portkit import tree as tree_mod
from portkit.drift import model as dm
from portkit.drift.classify import drift
from portkit.follow import DriftInput
from portkit.series import Patch, read_series

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "fork-series"
FINE = {dm.CLEAN, dm.OFFSET}
THERE = {dm.ALREADY_APPLIED, dm.PRESENT_UPSTREAM}
ATTENTION = {dm.FUZZ, dm.RELOCATED, dm.CONFLICT}
GIT_ENV = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "LC_ALL": "C"}


def _run(args: list[str], cwd: Path, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(args, cwd=cwd, input=stdin, capture_output=True, env=GIT_ENV,
                          check=False)


def _scratch(root: Path, paths: list[str], into: Path) -> Path:
    for rel in paths:
        if (root / rel).is_file():
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / rel, into / rel)
    return into


def git_loop(patches: list[Patch], root: Path, paths: list[str]) -> list[str]:
    """git apply's verdict per patch: fine (clean or offset), already-applied or conflict."""
    verdicts = []
    with tempfile.TemporaryDirectory() as tmp:
        work = _scratch(root, paths, Path(tmp))
        for patch in patches:
            base = ["git", "apply", "--whitespace=nowarn"]
            if _run([*base, "--check"], work, patch.data).returncode == 0:
                _run(base, work, patch.data)
                verdicts.append(dm.OFFSET)
            elif _run([*base, "-R", "--check"], work, patch.data).returncode == 0:
                verdicts.append(dm.ALREADY_APPLIED)
            else:
                verdicts.append(dm.CONFLICT)
    return verdicts


def patch_loop(patches: list[Patch], root: Path, paths: list[str]) -> list[str]:
    """GNU patch's verdict per patch: clean, offset, fuzz, already-applied or conflict."""
    verdicts = []
    with tempfile.TemporaryDirectory() as tmp:
        work = _scratch(root, paths, Path(tmp))
        for patch in patches:
            args = ["patch", "-p1", "--forward", "--batch", "--fuzz=2", "--dry-run"]
            out = _run(args, work, patch.data)
            text = out.stdout.decode(errors="replace")
            if "Reversed (or previously applied)" in text:
                verdicts.append(dm.ALREADY_APPLIED)
            elif out.returncode != 0:
                verdicts.append(dm.CONFLICT)
            else:
                _run(args[:-1], work, patch.data)
                verdicts.append(dm.FUZZ if "with fuzz" in text
                                else dm.OFFSET if "offset" in text else dm.CLEAN)
    return verdicts


def right(verdict: str, expected: str, coarse: bool) -> bool:
    """git apply cannot tell clean from offset: "fine" counts right for either."""
    if coarse and verdict == dm.OFFSET:
        return expected in FINE
    return verdict == expected


def timed(rounds: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="0.3.17", help="llama-cpp-python version (default 0.3.17)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    expected = tomllib.loads((DATA / "expected.toml").read_text())["patches"]
    base = tree_mod.detect(tree_mod.fetch("pypi:llama-cpp-python==0.3.16"))
    target = tree_mod.detect(tree_mod.fetch(f"pypi:llama-cpp-python=={args.target}"))
    series = read_series(DATA / "series")
    patches = list(series.patches)
    paths = list(series.paths)
    job = DriftInput(series, str(DATA / "series"), base, [(args.target, target)])
    drift(job)  # fills the index cache: what follows is warm

    report: dm.DriftReport | None = None

    def run_portkit() -> None:
        nonlocal report
        report = drift(job)

    t_portkit = timed(args.rounds, run_portkit)
    git_verdicts: list[str] = []
    patch_verdicts: list[str] = []

    def run_git() -> None:
        git_verdicts[:] = git_loop(patches, target.llama_root, paths)

    def run_patch() -> None:
        patch_verdicts[:] = patch_loop(patches, target.llama_root, paths)

    t_git = timed(args.rounds, run_git)
    t_patch = timed(args.rounds, run_patch)
    assert report is not None
    ours = [p.status for p in report.targets[0].patches]
    hand = [dm.worst(h["status"] for h in expected[p.name][args.target]["hunks"])
            for p in patches]
    partial = [bool(set(h["status"] for h in expected[p.name][args.target]["hunks"]) & THERE
                    and set(h["status"] for h in expected[p.name][args.target]["hunks"]) - THERE)
               for p in patches]

    print(f"{len(patches)} patches against llama-cpp-python {args.target} "
          f"(llama.cpp {(target.pin or '?')[:12]}); {args.rounds} rounds, median")
    print(f"{'':12} {'time':>9} {'right':>7} {'fine but needs attention':>25} "
          f"{'upstream but only part':>23}")
    for name, verdicts, seconds, coarse in (("portkit", ours, t_portkit, False),
                                            ("git apply", git_verdicts, t_git, True),
                                            ("GNU patch", patch_verdicts, t_patch, False)):
        good = sum(right(v, e, coarse) for v, e in zip(verdicts, hand, strict=True))
        missed = sum(v in FINE and e in ATTENTION for v, e in zip(verdicts, hand, strict=True))
        overclaim = sum(v in THERE and p for v, p in zip(verdicts, partial, strict=True))
        print(f"{name:12} {seconds:8.3f}s {good:4d}/{len(patches)} {missed:25d} {overclaim:23d}")
    print(f"portkit time / git apply loop: {t_portkit / t_git:.2f}x; "
          f"/ GNU patch loop: {t_portkit / t_patch:.2f}x")

    moved = located = 0
    for patch in report.targets[0].patches:
        for ours_h, hand_h in zip(patch.hunks, expected[patch.file][args.target]["hunks"],
                                  strict=True):
            if hand_h["status"] != dm.RELOCATED:
                continue
            moved += 1
            if ours_h.moved_to is not None and ours_h.moved_to.file == hand_h.get(
                    "moved_to_file") and ours_h.moved_to.symbol.endswith(
                    hand_h.get("moved_to_symbol", "").rsplit("::", 1)[-1]):
                located += 1
    print(f"hunks that moved (by hand): {moved}; located by portkit in the right file and "
          f"symbol: {located}")


if __name__ == "__main__":
    sys.exit(main())
