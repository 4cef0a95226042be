"""Kill portkit everywhere it writes, and race writers: count what the trees are left as.

    .venv/bin/python benchmarks/kill.py [--version 0.3.17] [--random 40] [--trials 50] [--seed 1]

On a copy of the registry tree (CHANGELOG.md + vendor/llama.cpp sources), a real
`portkit apply` and `portkit apply --reverse` are stopped at every checkpoint they pass
(each file write: half written, written, renamed; each git call; the journal; the commit;
the lock) and killed there with SIGKILL and with SIGTERM; the same on a git checkout of
the tree (where the dirty check runs `git status`); `portkit recover` is killed in the
middle of its roll-back; and --random kills land at random times. After each kill the
next command a user would run (recover, tree info, apply --dry-run) must leave the tree
exactly as before the command or exactly as a clean run leaves it, with nothing changed
outside it.

Then --trials races of two and of four writers (apply and reverse mixed) on one tree, and
of four that will not wait for the lock: every exit status must tell the truth about the
tree they leave.

Prints the counts and outcomes of each group; exits 1 if any kill or race went wrong.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from portkit import tree as tree_mod  # noqa: E402
from portkit.cache import cache_dir  # noqa: E402
from tests.reliability.harness import (  # noqa: E402
    APPLY,
    FOLLOW_UPS,
    REVERSE,
    Kill,
    Killed,
    environ,
    interrupt,
    kill_once,
    portkit,
    race,
    reset,
    sdist_like,
    snapshot,
    trace_points,
)

COMMITTED = ("committed#1", "unlock#1")
GIT_ENV = {"GIT_AUTHOR_NAME": "k", "GIT_AUTHOR_EMAIL": "k@k", "GIT_COMMITTER_NAME": "k",
           "GIT_COMMITTER_EMAIL": "k@k", "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_CONFIG_NOSYSTEM": "1"}


class Bench:
    def __init__(self, work: Path, version: str) -> None:
        self.work = work
        registry = tree_mod.fetch(f"pypi:llama-cpp-python=={version}")
        self.before = sdist_like(registry, work / "pristine" / "before")
        self.after = self._applied(self.before, work / "pristine" / "after")
        self.git_before = work / "pristine" / "git-before"
        shutil.copytree(self.before, self.git_before)
        _commit(self.git_before)
        self.git_after = self._applied(self.git_before, work / "pristine" / "git-after")
        self.arena = work / "arena"
        self.arena.mkdir()
        (self.arena / "neighbour.txt").write_text("not portkit's\n")
        self.tree = self.arena / "t"
        self.traces = work / "traces"
        self.traces.mkdir()
        self.failed = 0

    @staticmethod
    def _applied(source: Path, dest: Path) -> Path:
        shutil.copytree(source, dest, symlinks=True)
        run = portkit(APPLY, dest)
        if run.returncode != 0:
            raise SystemExit(f"a clean apply failed: {run.stderr}")
        return dest

    def states(self, git: bool) -> dict[str, dict[str, str]]:
        before, after = (self.git_before, self.git_after) if git else (self.before, self.after)
        return {"before": snapshot(before), "after": snapshot(after)}

    def points(self, args: list[str], start: Path) -> tuple[list[str], float]:
        reset(self.tree, start)
        return trace_points(args, self.tree, self.traces / "trace")

    def kills(self, label: str, kills: list[Kill], start: Path, git: bool, done: str,
              undone: str) -> None:
        states = self.states(git)
        results: list[Killed] = []
        for i, kill in enumerate(kills):
            reset(self.tree, start)
            results.append(kill_once(kill, self.tree, self.traces, states,
                                     FOLLOW_UPS[i % len(FOLLOW_UPS)], outside=self.arena))
        self.report(label, results, done, undone)

    def recovery_kills(self, label: str) -> int:
        """apply killed just before its commit, then `recover` killed at each point of its
        roll-back; the follow-up must finish the roll-back."""
        reset(self.tree, self.before)
        interrupt(Kill(APPLY, "commit#1", signal.SIGKILL), self.tree, self.traces)
        trace = self.traces / "recover-trace"
        trace.unlink(missing_ok=True)
        portkit(["recover"], self.tree, environ(PORTKIT_CHECKPOINTS=str(trace)))
        points = [ln.split(" ", 1)[1] for ln in trace.read_text().splitlines()
                  if " rollback:" in ln or " write:" in ln]
        states = self.states(git=False)
        results = []
        for i, point in enumerate(points):
            reset(self.tree, self.before)
            interrupt(Kill(APPLY, "commit#1", signal.SIGKILL), self.tree, self.traces)
            results.append(kill_once(Kill(["recover"], point, signal.SIGKILL), self.tree,
                                     self.traces, states, FOLLOW_UPS[i % len(FOLLOW_UPS)],
                                     outside=self.arena))
        self.report(label, results, done="before", undone="before")
        return len(results)

    def report(self, label: str, results: list[Killed], done: str, undone: str) -> None:
        states = Counter(r.state for r in results)
        wrong = []
        for r in results:
            expected = done if r.kill.point in COMMITTED else undone
            if r.kill.point is None and r.state in (done, undone):
                expected = r.state
            if r.state != expected or r.notes or not r.outside_intact or (
                    r.kill.point is not None and not r.reached):
                wrong.append(f"    {r.kill.name}: tree {r.state} (want {expected}), reached "
                             f"{r.reached}, outside intact {r.outside_intact}, {r.notes}")
        journals = sum(r.journal_left for r in results)
        said = Counter(r.run.stderr.strip().rsplit("; ", 1)[-1] for r in results
                       if r.run.returncode > 0)
        print(f"{label}: {len(results)} kills, reached {sum(r.reached for r in results)}; "
              f"left a journal {journals}; then {dict(states)}; wrong {len(wrong)}")
        if said:
            print(f"    interrupted processes said: {dict(said)}")
        for line in wrong:
            print(line)
        self.failed += len(wrong)

    def races(self, writers: int, trials: int, wait: str | None = None) -> None:
        mixes = [([APPLY] * writers, "before"), ([REVERSE] * writers, "after"),
                 ([APPLY, REVERSE] * (writers // 2), "before")]
        states = self.states(git=False)
        outcomes: Counter[str] = Counter()
        wrong = []
        for trial in range(trials):
            commands, start = mixes[trial % len(mixes)]
            reset(self.tree, self.before if start == "before" else self.after)
            env = environ(PORTKIT_LOCK_WAIT=wait) if wait is not None else None
            result = race(self.tree, commands, states, start, env=env)
            for r in result.runs:
                outcomes[_outcome(r.returncode, r.stdout + r.stderr)] += 1
            if not result.truthful:
                wrong.append(f"    trial {trial}: {result.why}")
        how = f" (PORTKIT_LOCK_WAIT={wait})" if wait is not None else ""
        print(f"{writers} writers{how}: {trials} races, {trials - len(wrong)} truthful; runs: "
              f"{dict(outcomes)}")
        for line in wrong:
            print(line)
        self.failed += len(wrong)


def _outcome(code: int, text: str) -> str:
    for word in ("already applied", "is not applied", "applied", "reversed", "another portkit"):
        if word in text:
            return f"{word} ({code})"
    return f"exit {code}"


def _commit(tree: Path) -> None:
    """vendor/llama.cpp as a committed git checkout (the dirty check then runs git status)."""
    env = {**os.environ, **GIT_ENV}
    llama = tree / "vendor" / "llama.cpp"
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "vendored"]):
        subprocess.run(["git", *args], cwd=llama, env=env, check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="0.3.17")
    parser.add_argument("--random", type=int, default=40, help="kills at random times")
    parser.add_argument("--trials", type=int, default=50, help="races of 2 and of 4 writers")
    parser.add_argument("--seed", type=int, default=1)
    opts = parser.parse_args()
    rng = random.Random(opts.seed)
    scratch = cache_dir("scratch")  # portkit's private folders: what a SIGKILL leaves there
    earlier = set(scratch.iterdir())
    with tempfile.TemporaryDirectory(prefix="portkit-kill-") as tmp:
        bench = Bench(Path(tmp), opts.version)
        both = (signal.SIGKILL, signal.SIGTERM)
        apply_points, apply_took = bench.points(APPLY, bench.before)
        reverse_points, reverse_took = bench.points(REVERSE, bench.after)
        git_points, _ = bench.points(APPLY, bench.git_before)
        total = 0
        groups = [
            ("apply", [Kill(APPLY, p, s) for p in apply_points for s in both], bench.before,
             False, "after", "before"),
            ("apply --reverse", [Kill(REVERSE, p, s) for p in reverse_points for s in both],
             bench.after, False, "before", "after"),
            ("apply in a git checkout", [Kill(APPLY, p, signal.SIGKILL) for p in git_points],
             bench.git_before, True, "after", "before"),
            ("apply at random times",
             [Kill(APPLY, None, rng.choice(both), rng.uniform(0.2, 1.0) * apply_took)
              for _ in range(opts.random // 2)], bench.before, False, "after", "before"),
            ("reverse at random times",
             [Kill(REVERSE, None, rng.choice(both), rng.uniform(0.2, 1.0) * reverse_took)
              for _ in range(opts.random - opts.random // 2)], bench.after, False, "before",
             "after"),
        ]
        for label, kills, start, git, done, undone in groups:
            bench.kills(label, kills, start, git, done, undone)
            total += len(kills)
        total += bench.recovery_kills("recover killed while rolling back")
        leftovers = set(scratch.iterdir()) - earlier
        print(f"kill points tried: {total}; scratch folders left in {scratch} by SIGKILL "
              f"(swept after an hour): {len(leftovers)}")
        bench.races(2, opts.trials)
        bench.races(4, opts.trials)
        bench.races(4, opts.trials, wait="0")  # the losers give up at once, naming the holder
    if bench.failed:
        print(f"{bench.failed} kill(s) or race(s) went wrong")
        sys.exit(1)


if __name__ == "__main__":
    main()
