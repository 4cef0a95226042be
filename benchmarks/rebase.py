"""Rebase on a fork-style series, side by side with the tools maintainers use today.

    .venv/bin/python benchmarks/rebase.py [--target 0.3.17 --target 0.3.19]

The 40-patch series of tests/data/fork-series (written against llama-cpp-python 0.3.16's
llama.cpp) is carried onto each newer registry tree by four tools, in one run:

  portkit     `portkit rebase` (portkit.rebase.rebase), then each carried patch applied with
              plain `git apply`; needs-human and needs-review are its flags
  git am -3   in a throw-away repository holding the base, the base with the series (so
              that every blob the patches name is there) and the target: `git am -3` of the
              patch; a failure (then `git am --abort`) is its flag
  patch       GNU `patch -p1 --forward --fuzz=2`; a non-zero exit is its flag
  wiggle      `wiggle --merge --replace -p1` of the patch; a non-zero exit (conflicts) is
              its flag

Every tool gets each patch on the same tree: the target with the earlier patches redone by
hand (tests/data/fork-series/expected/<target>), the state the expectations were made in.
A patch is carried correctly when the tree it leaves equals that tree with the hand-made
patch applied (or unchanged, where the hand carries nothing: dropped, or left to a human);
otherwise it is flagged, if the tool said something was wrong, or wrong without a flag.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from portkit import rebase as rb
from portkit import tree as tree_mod
from portkit.cache import lay_down
from portkit.series import Patch, read_series

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "fork-series"
GIT_ENV = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "LC_ALL": "C", "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid"}
Files = dict[str, bytes | None]


def run(args: list[str], cwd: Path,
        stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(args, cwd=cwd, input=stdin, capture_output=True, env=GIT_ENV,
                          check=False)


def lay_out(files: Files, root: Path) -> Path:
    """`root` holding exactly `files` (absent ones removed); git's own folder kept."""
    lay_down(root, files)
    return root


def read_back(root: Path, paths: list[str]) -> Files:
    return {rel: (root / rel).read_bytes() if (root / rel).is_file() else None for rel in paths}


def apply_with_git(files: Files, patch: Patch, paths: list[str]) -> Files | None:
    with tempfile.TemporaryDirectory() as tmp:
        root = lay_out(files, Path(tmp))
        if run(["git", "apply", "-"], root, patch.data).returncode:
            return None
        return read_back(root, paths)


@dataclass
class Outcome:
    after: Files
    flagged: bool


Tool = Callable[[int, Patch, Files], Outcome]


def gnu_patch(paths: list[str]) -> Tool:
    def tool(_: int, patch: Patch, files: Files) -> Outcome:
        with tempfile.TemporaryDirectory() as tmp:
            root = lay_out(files, Path(tmp))
            done = run(["patch", "-p1", "--forward", "--fuzz=2", "--no-backup-if-mismatch",
                        "--reject-file=-"], root, patch.data)
            return Outcome(read_back(root, paths), done.returncode != 0)
    return tool


def wiggle(paths: list[str]) -> Tool:
    def tool(_: int, patch: Patch, files: Files) -> Outcome:
        with tempfile.TemporaryDirectory() as tmp:
            root = lay_out(files, Path(tmp) / "tree")
            (Path(tmp) / "p.patch").write_bytes(patch.data)
            done = run(["wiggle", "--merge", "--replace", "-p1", str(Path(tmp) / "p.patch")],
                       root)
            return Outcome(read_back(root, paths), done.returncode != 0)
    return tool


class GitAm:
    """A throw-away repository: the base and the base with the series (for the blobs the
    patches name), and a commit for each hand-made state of the target."""

    def __init__(self, root: Path, base: Files, series: list[Patch], states: list[Files],
                 paths: list[str]) -> None:
        self.root = root
        self.paths = paths
        run(["git", "init", "-q", "-b", "base", "."], root)
        self._commit(base, "base")
        for patch in series:  # the series on the base: every blob it names exists
            if run(["git", "apply", "--index", "-"], root, patch.data).returncode == 0:
                run(["git", "commit", "-q", "-m", patch.name], root)
        run(["git", "checkout", "-q", "--orphan", "target"], root)
        self.states: list[str] = []
        for n, state in enumerate(states):
            self.states.append(self._commit(state, f"target state {n}"))

    def _commit(self, files: Files, message: str) -> str:
        lay_out(files, self.root)
        run(["git", "add", "-A", "."], self.root)
        run(["git", "commit", "-q", "--allow-empty", "-m", message], self.root)
        return run(["git", "rev-parse", "HEAD"], self.root).stdout.decode().strip()

    def tool(self, n: int, patch: Patch, _: Files) -> Outcome:
        run(["git", "checkout", "-q", "-f", "--detach", self.states[n]], self.root)
        run(["git", "clean", "-q", "-fdx"], self.root)
        done = run(["git", "am", "-q", "-3", "--keep-cr"], self.root, patch.data)
        if done.returncode:
            run(["git", "am", "--abort"], self.root)
            run(["git", "checkout", "-q", "-f", "--detach", self.states[n]], self.root)
        return Outcome(read_back(self.root, self.paths), done.returncode != 0)


def portkit_tool(carried: dict[str, Patch], flags: dict[str, bool], paths: list[str]) -> Tool:
    def tool(_: int, patch: Patch, files: Files) -> Outcome:
        if patch.name not in carried:
            return Outcome(files, flags[patch.name])
        after = apply_with_git(files, carried[patch.name], paths)
        return Outcome(files if after is None else after, flags[patch.name])
    return tool


@dataclass
class Score:
    correct: int = 0
    hard: int = 0  # correct among the patches that need a change (not carried as they are)
    flagged: int = 0
    wrong: int = 0  # different from the hand-made result, and not flagged
    seconds: float = 0.0
    misses: list[str] = field(default_factory=list)  # "flagged 0012", "wrong 0008"


def score(tool: Tool, patches: list[Patch], states: list[Files], hard: set[str]) -> Score:
    result = Score()
    start = time.perf_counter()
    for n, patch in enumerate(patches):
        outcome = tool(n, patch, states[n])
        if outcome.after == states[n + 1]:
            result.correct += 1
            result.hard += patch.name in hard
        elif outcome.flagged:
            result.flagged += 1
            result.misses.append(f"flagged {patch.name[:4]}")
        else:
            result.wrong += 1
            result.misses.append(f"WRONG {patch.name[:4]}")
    result.seconds = time.perf_counter() - start
    return result


def bench(version: str, verbose: bool) -> None:
    series = read_series(DATA / "series")
    patches = list(series.patches)
    hand = {p.name: p for p in read_series(DATA / "expected" / version).patches}
    base = tree_mod.detect(tree_mod.fetch("pypi:llama-cpp-python==0.3.16"))
    target = tree_mod.detect(tree_mod.fetch(f"pypi:llama-cpp-python=={version}"))
    paths = sorted(set(series.paths) | {r for p in hand.values() for r in p.paths})
    states = [read_back(target.llama_root, paths)]
    for patch in patches:  # the target with the hand-made patches, one after the other
        after = apply_with_git(states[-1], hand[patch.name], paths) \
            if patch.name in hand else states[-1]
        assert after is not None, patch.name
        states.append(after)

    expected = tomllib.loads((DATA / "expected.toml").read_text())["patches"]
    hard = {p.name for p in patches if expected[p.name][version]["rebase"] != "unchanged"}
    start = time.perf_counter()
    done = rb.rebase(series, target, base=base, target_label=version)
    took = time.perf_counter() - start
    carried = {p.name: p for p in done.series.patches}
    flags = {p.file: p.status in rb.ATTENTION for p in done.report.patches}
    scores = {"portkit": score(portkit_tool(carried, flags, paths), patches, states,
                               hard)}
    scores["portkit"].seconds += took
    with tempfile.TemporaryDirectory() as tmp:
        am = GitAm(Path(tmp), read_back(base.llama_root, paths), patches, states, paths)
        scores["git am -3"] = score(am.tool, patches, states, hard)
    scores["patch --fuzz=2"] = score(gnu_patch(paths), patches, states, hard)
    if shutil.which("wiggle"):
        scores["wiggle"] = score(wiggle(paths), patches, states, hard)
    else:
        print("wiggle not found (Debian package `wiggle`): left out")

    print(f"\n0.3.16 -> {version}: {len(patches)} patches, {len(hard)} of them need a change "
          "(moved, trimmed, dropped or left to a human)")
    print(f"{'tool':<16}{'correct':>10}{'of those':>12}{'flagged':>10}{'wrong, no flag':>16}"
          f"{'seconds':>10}")
    for name, s in scores.items():
        print(f"{name:<16}{s.correct:>7}/{len(patches):<3}{s.hard:>8}/{len(hard):<3}"
              f"{s.flagged:>10}{s.wrong:>16}{s.seconds:>10.1f}")
        if verbose and s.misses:
            print(f"{'':<16}{', '.join(s.misses)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", action="append", help="llama-cpp-python version "
                    "(repeatable; default 0.3.17 and 0.3.19)")
    ap.add_argument("--verbose", action="store_true", help="name the patches each tool misses")
    args = ap.parse_args()
    for version in args.target or ["0.3.17", "0.3.19"]:
        bench(version, args.verbose)


if __name__ == "__main__":
    main()
