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

On an ollama-style fork (the offline fixture fork, two newer fixture trees to move it
onto, a series of the fork's own): the fork move (`rebase --onto`), `apply --series` and
`rebase --series --out` killed at every checkpoint with SIGKILL and SIGTERM (the fork, or
--out, must be untouched or exactly as a clean run leaves it; a SIGTERM says so truly in its
last line); then --trials races of apply || move and of move || move, on a committed fork
(the second finds a new pin or uncommitted files) and on one without git (the second one
plans again under the lock): every exit status truthful, the fork exactly as the commands
that say they succeeded leave it, in some order.

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
from tests.conftest import FORK_PATCHES, commit_all, copy_fixture, lay_out_fork  # noqa: E402
from tests.reliability.harness import (  # noqa: E402
    APPLY,
    FOLLOW_UPS,
    PORTKIT,
    REVERSE,
    Kill,
    Killed,
    Run,
    environ,
    interrupt,
    interrupt_argv,
    kill_once,
    portkit,
    race,
    reset,
    sdist_like,
    snapshot,
    trace_points,
)

COMMITTED = ("committed#1", "unlock#1", "end#1")
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


class ForkBench:
    """The fork move, apply --series and rebase --out, killed and raced (see the docstring)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        fork = lay_out_fork("old", work / "fork-pristine", work / "upstream")
        llama = fork.root / "llama" / "llama.cpp"
        (llama / ".rsync-filter").write_text("protect *.go\ninclude /include/\n"
                                             "include /include/*.h\ninclude /src/\n"
                                             "include /src/**\nexclude *\n")
        (fork.root / "ml" / "backend" / "ggml" / "ggml" / ".rsync-filter").write_text(
            "include /include/\ninclude /include/*.h\nexclude *\n")
        commit_all(fork.root, "vendoring rules")
        self.pin = fork.base
        self.pristine = fork.root
        self.bare = work / "fork-bare"  # the same fork without git
        shutil.copytree(self.pristine, self.bare, ignore=shutil.ignore_patterns(".git"))
        self.targets = []
        for n in (1, 2):
            target = copy_fixture("renamed", work / f"target-{n}")
            with (target / "src" / "llama.cpp").open("a") as fh:
                fh.write(f"// upstream release {n}\n")
            commit_all(target, f"release {n}")
            self.targets.append(target)
        self.series = work / "graph-note"
        self.series.mkdir()
        (self.series / "0001-graph-say-who-fills-the-inputs.patch").write_bytes(
            _graph_patch(llama, work / "patch-work"))
        self.base = copy_fixture("old", work / "base")  # what llama/patches was written on
        self.own = work / "own-series"
        shutil.copytree(self.pristine / "llama" / "patches", self.own)
        self.arena = work / "fork-arena"
        self.arena.mkdir()
        self.fork = self.arena / "fork"
        self.traces = work / "fork-traces"
        self.traces.mkdir()
        self.failed = 0

    def move(self, n: int) -> list[str]:
        return ["rebase", "--onto", str(self.targets[n - 1]), "--fork", str(self.fork)]

    def apply(self) -> list[str]:
        return ["apply", "--pin", self.pin, "--series", str(self.series), "--tree",
                str(self.fork)]

    def out(self) -> list[str]:
        return ["rebase", "--series", str(self.own), "--base", str(self.base), "--onto",
                str(self.targets[0]), "--out", str(self.arena / "out")]

    def reset(self, start: Path) -> None:
        for path in (self.fork, self.arena / "out"):
            if path.exists():
                shutil.rmtree(path)
        shutil.copytree(start, self.fork, symlinks=True)

    def known(self, start: Path, sequences: dict[str, list[list[str]]]) -> dict[str, dict]:
        """The arena after each sequence of commands run alone, one after the other."""
        out = {}
        for name, commands in sequences.items():
            self.reset(start)
            for args in commands:
                done = subprocess.run([PORTKIT, *args], env=environ(), capture_output=True,
                                      text=True)
                if done.returncode not in (0, 20):
                    raise SystemExit(f"{name}: {' '.join(args)} failed: {done.stderr}")
            out[name] = snapshot(self.arena)
        return out

    def kills(self, label: str, args: list[str], done: str) -> int:
        states = self.known(self.pristine, {"before": [], done: [args]})
        self.reset(self.pristine)
        trace = self.traces / "points"
        trace.unlink(missing_ok=True)
        ran = subprocess.run([PORTKIT, *args], env=environ(PORTKIT_CHECKPOINTS=str(trace)),
                             capture_output=True, text=True)
        assert ran.returncode in (0, 20), ran.stderr
        points = [ln.split(" ", 1)[1] for ln in trace.read_text().splitlines()]
        counts: Counter[str] = Counter()
        wrong = []
        for point in points:
            for signum in (signal.SIGKILL, signal.SIGTERM):
                self.reset(self.pristine)
                reached, run = interrupt_argv(Kill(args, point, signum), args, self.traces)
                follow = subprocess.run([PORTKIT, "recover", "--tree", str(self.fork)],
                                        env=environ(), capture_output=True, text=True)
                now = snapshot(self.arena)
                state = next((n for n, snap in states.items() if snap == now), "neither")
                counts[state] += 1
                why = _fork_kill_wrong(run, reached, signum, state, done, follow)
                if why:
                    wrong.append(f"    {label} {signal.Signals(signum).name} at {point}: {why}")
        print(f"{label}: {2 * len(points)} kills at {len(points)} points; then {dict(counts)}; "
              f"wrong {len(wrong)}")
        for line in wrong:
            print(line)
        self.failed += len(wrong)
        return 2 * len(points)

    def races(self, which: str, trials: int) -> None:
        outcomes: Counter[str] = Counter()
        wrong = []
        for start, label in ((self.pristine, "committed fork"), (self.bare, "fork without git")):
            seqs: dict[str, list[list[str]]] = {"untouched": [], "apply": [self.apply()],
                                                "move 1": [self.move(1)],
                                                "move 2": [self.move(2)]}
            if start == self.bare:  # the second one plans again on what the first left
                seqs.update({"apply, move 1": [self.apply(), self.move(1)],
                             "apply, move 2": [self.apply(), self.move(2)],
                             "move 1, move 2": [self.move(1), self.move(2)],
                             "move 2, move 1": [self.move(2), self.move(1)]})
            known = self.known(start, seqs)
            for trial in range(trials // 2):
                if which == "apply || move":
                    commands = [self.apply(), self.move(1 + trial % 2)]
                else:
                    commands = [self.move(1), self.move(2)]
                if trial % 4 >= 2:
                    commands.reverse()
                self.reset(start)
                procs = [subprocess.Popen([PORTKIT, *c], env=environ(), text=True,
                                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE) for c in commands]
                runs = []
                for c, proc in zip(commands, procs, strict=True):
                    out, err = proc.communicate(timeout=300)
                    runs.append(Run(c, proc.returncode, out, err, proc.pid))
                now = snapshot(self.arena)  # some orders leave the same fork: all names
                state = " = ".join(n for n, snap in known.items() if snap == now) or "neither"
                for r in runs:
                    outcomes[f"{r.args[0]} {r.returncode}"] += 1
                why = _race_wrong(runs, state, self.targets)
                if why:
                    wrong.append(f"    {label} trial {trial}: {why}")
        print(f"{which}: {trials} races, {trials - len(wrong)} truthful; runs: "
              f"{dict(outcomes)}")
        for line in wrong:
            print(line)
        self.failed += len(wrong)


def _graph_patch(llama: Path, work: Path) -> bytes:
    rel = "src/llama-graph.h"
    for side in ("a", "b"):
        (work / side / "src").mkdir(parents=True)
        shutil.copy(llama / rel, work / side / rel)
    text = (work / "b" / rel).read_text()
    (work / "b" / rel).write_text(text.replace("struct ggml_cgraph;\n", "struct ggml_cgraph;\n"
                                               "// graph inputs are filled by the host\n"))
    diff = subprocess.run(["git", "diff", "--no-index", "--no-prefix", f"a/{rel}", f"b/{rel}"],
                          cwd=work, capture_output=True, text=True).stdout
    assert FORK_PATCHES and diff
    return ("From: k <k@k>\nSubject: [PATCH] graph: say who fills the inputs\n\n---\n"
            + diff).encode()


_CLAIMS = {"nothing was changed": "before", "the tree was rolled back": "before",
           "the change was complete": "after"}


def _fork_kill_wrong(run: Run, reached: bool, signum: int, state: str, done: str,
                     follow: subprocess.CompletedProcess[str]) -> str:
    """What is wrong with one kill of a fork command, or ''."""
    if not reached:
        return "the point was never reached"
    if follow.returncode != 0 or "Traceback" in follow.stderr + run.stderr:
        return f"follow-up exit {follow.returncode}: {follow.stderr.strip()[:200]}"
    if state not in ("before", done):
        return f"the arena is {state}"
    if signum == signal.SIGKILL:
        return ""
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("portkit: ")]
    if run.returncode != 128 + signum or len(lines) != 1 or \
            not lines[0].startswith("portkit: interrupted (SIGTERM); "):
        return f"exit {run.returncode}, said {run.stderr.strip()[-200:]!r}"
    claim = lines[0].split("; ", 1)[1]
    if claim == "the next portkit command will roll the tree back":
        return "" if state == "before" else "said it would be rolled back, but it stands"
    want = {"before": "before", "after": done}.get(_CLAIMS.get(claim, ""), "?")
    return "" if state == want else f"said {claim!r}, but the arena is {state}"


def _race_wrong(runs: list[Run], state: str, targets: list[Path]) -> str:
    """What is wrong with one race of fork commands, or '': every loser says why in one line
    (refused 4, busy 7), and the fork is what the winners leave in the order they ran."""
    for r in runs:
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("portkit: ")]
        if "Traceback" in r.stderr:
            return f"{r.args[:3]}: traceback"
        if r.returncode not in (0, 20) and (r.returncode not in (4, 7) or len(lines) != 1):
            return f"{r.args[:3]} exit {r.returncode}: {r.stderr.strip()[-200:]!r}"
    names = []
    for r in runs:
        if r.returncode in (0, 20):
            names.append("apply" if r.args[0] == "apply" else
                         f"move {1 + [str(t) for t in targets].index(r.args[2])}")
    if not names:
        return "nobody won" if state != "untouched" else "nobody won, fork untouched"
    orders = {", ".join(names), ", ".join(reversed(names))}
    return "" if orders & set(state.split(" = ")) else f"winners {names}, but the fork is {state}"


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
    parser.add_argument("--fork-only", action="store_true",
                        help="only the fork's kills and races (offline fixtures, quick)")
    opts = parser.parse_args()
    rng = random.Random(opts.seed)
    scratch = cache_dir("scratch")  # portkit's private folders: what a SIGKILL leaves there
    earlier = set(scratch.iterdir())
    with tempfile.TemporaryDirectory(prefix="portkit-kill-") as tmp:
        forks = ForkBench(Path(tmp) / "forks")
        fork_total = forks.kills("fork move", forks.move(1), "after")
        fork_total += forks.kills("apply --series in the fork", forks.apply(), "after")
        fork_total += forks.kills("rebase --series --out", forks.out(), "after")
        print(f"fork kill points tried: {fork_total}")
        forks.races("apply || move", opts.trials)
        forks.races("move || move", opts.trials)
        if opts.fork_only:
            sys.exit(1 if forks.failed else 0)
        bench = Bench(Path(tmp), opts.version)
        bench.failed += forks.failed
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
