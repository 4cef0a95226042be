"""Run real portkit processes against a tree, kill them at named points, race them, and
check what they leave: shared by tests/reliability and benchmarks/kill.py.

A kill is made deterministic by portkit's checkpoints: with PORTKIT_CHECKPOINTS=FILE a
process notes every point it reaches, and with PORTKIT_PAUSE_AT=POINT it stops there,
so the signal lands exactly at that point.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from portkit import tree as tree_mod

PORTKIT = str(Path(sys.executable).with_name("portkit"))
PIN = "49bfddec"  # llama-cpp-python 0.3.17's llama.cpp
APPLY = ["apply", "--pin", PIN]
REVERSE = ["apply", "--reverse", "--pin", PIN]
# What a user runs next after a kill: each must first settle what the kill left.
FOLLOW_UPS = (["recover"], ["tree", "info"], ["apply", "--dry-run", "--pin", PIN])


def snapshot(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Every entry under `root` (without following links), byte for byte: files by sha256
    and mode, folders by mode, links by target."""
    out: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        if skip is not None:
            dirs[:] = [d for d in dirs if Path(folder) / d != skip]
        for name in [*dirs, *files]:
            path = Path(folder) / name
            st = path.lstat()
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "link " + os.readlink(path)
            elif path.is_dir():
                out[rel] = f"dir {st.st_mode:o}"
            else:
                out[rel] = f"{hashlib.sha256(path.read_bytes()).hexdigest()} {st.st_mode:o}"
    return out


def sdist_like(registry: Path, dest: Path) -> Path:
    """A llama-cpp-python tree as the issue has it: CHANGELOG.md and vendor/llama.cpp with
    its src/ and include/ (the files portkit reads and writes)."""
    llama = tree_mod.detect(registry).llama_root
    dest.mkdir(parents=True)
    shutil.copy2(registry / "CHANGELOG.md", dest / "CHANGELOG.md")
    for part in ("src", "include"):
        shutil.copytree(llama / part, dest / "vendor" / "llama.cpp" / part)
    return dest


def reset(tree: Path, source: Path) -> None:
    """Make `tree` a fresh copy of `source` (modes included)."""
    if tree.exists():
        for folder, dirs, _ in os.walk(tree):
            for d in dirs:
                (Path(folder) / d).chmod(0o755)  # a test may have made one read-only
        shutil.rmtree(tree)
    shutil.copytree(source, tree, symlinks=True)


def environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PORTKIT_PAUSE")}
    env.pop("PORTKIT_CHECKPOINTS", None)
    env.update(extra)
    return env


@dataclass
class Run:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    pid: int = 0

    @property
    def traceback(self) -> bool:
        return "Traceback" in self.stderr or "Traceback" in self.stdout


def portkit(args: Sequence[str], tree: Path, env: dict[str, str] | None = None,
            timeout: float = 120) -> Run:
    argv = [*args, "--tree", str(tree)] if args[:2] != ["tree", "info"] else [*args, str(tree)]
    proc = subprocess.run([PORTKIT, *argv], env=env or environ(), capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=timeout)
    return Run(list(args), proc.returncode, proc.stdout, proc.stderr)


def trace_points(args: Sequence[str], tree: Path, trace: Path) -> tuple[list[str], float]:
    """Every checkpoint a portkit run passes, in order (the run is a real one), and how
    long the run took: the span random kills are spread over."""
    trace.unlink(missing_ok=True)
    started = time.monotonic()
    run = portkit(args, tree, environ(PORTKIT_CHECKPOINTS=str(trace)))
    took = time.monotonic() - started
    assert run.returncode == 0, run.stderr
    return [line.split(" ", 1)[1] for line in trace.read_text().splitlines()], took


@dataclass
class Kill:
    """One kill: where (a checkpoint, or None: after `delay` seconds) and with what."""

    args: list[str]
    point: str | None
    signum: int
    delay: float = 0.0

    @property
    def name(self) -> str:
        where = self.point or f"after {self.delay:.3f}s"
        return f"{' '.join(self.args[:2])} {signal.Signals(self.signum).name} at {where}"


@dataclass
class Killed:
    kill: Kill
    reached: bool  # the process stopped at the point (or was still running at the delay)
    run: Run  # the killed process
    journal_left: bool  # it left a transaction for the next command to roll back
    follow_up: Run
    state: str  # "before", "after" or "neither" once the follow-up ran
    outside_intact: bool
    notes: list[str] = field(default_factory=list)


def interrupt(kill: Kill, tree: Path, work: Path) -> tuple[bool, Run]:
    """Start portkit on `tree` and signal it as `kill` says; whether the point was reached
    (or the process still ran at the delay), and the run."""
    return interrupt_argv(kill, [*kill.args, "--tree", str(tree)], work)


def interrupt_argv(kill: Kill, argv: Sequence[str], work: Path) -> tuple[bool, Run]:
    """interrupt() of `portkit ARGV` as given (a command that names its tree itself)."""
    trace = work / "trace"
    trace.unlink(missing_ok=True)
    env = environ(PORTKIT_CHECKPOINTS=str(trace), PORTKIT_PAUSE_AT=kill.point or "",
                  PORTKIT_PAUSE_SECONDS=str(PAUSE_SECONDS))
    proc = subprocess.Popen([PORTKIT, *argv], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=signals_as_a_terminal_sends_them)
    reached = _wait_for(proc, trace, kill)
    if proc.poll() is None:
        if kill.signum == signal.SIGKILL:
            os.killpg(proc.pid, signal.SIGKILL)  # git children too
        else:
            os.kill(proc.pid, kill.signum)
    try:  # a process that got its signal ends at once; one that never did sits out its pause
        out, err = proc.communicate(timeout=4 * PAUSE_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"{kill.name}: still running {4 * PAUSE_SECONDS} s after the "
                             f"signal") from None
    return reached, Run(kill.args, proc.returncode, out, err, proc.pid)


# How long a process paused at a checkpoint waits to be killed. A process that ignores the
# signal (see below) runs on after it; the harness waits four times as long before it calls
# that a hang.
PAUSE_SECONDS = 60


def signals_as_a_terminal_sends_them() -> None:
    """In the child, before portkit starts: SIGINT, SIGTERM and SIGHUP at their defaults.
    A process started by a shell in the background (a CI job beside others, `cmd &`,
    nohup) inherits SIGINT (or SIGHUP) ignored, and portkit, like any program, leaves an
    inherited ignore alone: the Ctrl-C a test sends would never arrive, and the paused
    process would sit out its whole pause (issue 19, item 9)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def state_of(tree: Path, states: dict[str, dict[str, str]]) -> str:
    now = snapshot(tree)
    return next((name for name, snap in states.items() if snap == now), "neither")


def kill_once(kill: Kill, tree: Path, work: Path, states: dict[str, dict[str, str]],
              follow_up: Sequence[str], outside: Path | None = None) -> Killed:
    """Kill portkit as `kill` says, run `follow_up`, and tell what the tree is."""
    outside_before = snapshot(outside, skip=tree) if outside else {}
    start = state_of(tree, states)
    done = next(name for name in states if name != start)
    reached, run = interrupt(kill, tree, work)
    journal_left = (tree / ".portkit" / ".journal").exists()
    notes = []
    if kill.signum != signal.SIGKILL and reached:
        notes += _check_interrupt_line(run, tree, states[start], states[done])
    after = portkit(follow_up, tree)
    if after.returncode != 0 or after.traceback:
        notes.append(f"follow-up {' '.join(follow_up)} exit {after.returncode}: "
                     f"{after.stderr.strip()[:300]}")
    if journal_left and "rolled back an interrupted" not in after.stderr + after.stdout:
        notes.append("a journal was left but the follow-up did not say it rolled it back")
    state = state_of(tree, states)
    if state == "neither":
        notes.append(_difference(snapshot(tree), states))
    intact = not outside or snapshot(outside, skip=tree) == outside_before
    return Killed(kill, reached, run, journal_left, after, state, intact, notes)


def _wait_for(proc: subprocess.Popen[str], trace: Path, kill: Kill) -> bool:
    deadline = time.monotonic() + 60
    if kill.point is None:
        time.sleep(kill.delay)
        return proc.poll() is None
    while time.monotonic() < deadline:
        if trace.exists() and " paused" in trace.read_text():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.005)
    raise TimeoutError(f"{kill.name}: the process neither paused nor ended")


def _check_interrupt_line(run: Run, tree: Path, start: dict[str, str],
                          done: dict[str, str]) -> list[str]:
    """A process that got SIGTERM says in one line what it left, and it is true."""
    if run.returncode < 0:
        return []  # ended by the signal itself: still starting, nothing to say or undo
    if run.returncode == 0:  # the signal came as it finished: it must have finished
        return [] if without_stale_lock(snapshot(tree)) == done else [
            "exit 0 after the signal, but the change is not complete"]
    lines = run.stderr.strip().splitlines()
    if len(lines) != 1 or not lines[0].startswith("portkit: interrupted (SIG"):
        return [f"not one interrupt line: {run.stderr.strip()[:300]!r}"]
    claims = {"nothing was changed": start, "the tree was rolled back": start,
              "the change was complete": done,
              "the next portkit command will roll the tree back": None}
    claim = next((c for c in claims if lines[0].endswith(c)), None)
    if claim is None:
        return [f"the interrupt line does not say what it left: {lines[0]!r}"]
    expected = claims[claim]
    if expected is None:
        left = (tree / ".portkit" / ".journal").exists()
        return [] if left else [f"said '{claim}' but left no journal"]
    if without_stale_lock(snapshot(tree)) != expected:
        return [f"said '{claim}' but that is not what the tree shows"]
    return []


def without_stale_lock(snap: dict[str, str]) -> dict[str, str]:
    """A snapshot without the lock file (and a .portkit folder holding only it): what an
    interrupt may leave besides a finished state, for the next command to tidy."""
    out = {k: v for k, v in snap.items() if k != ".portkit/.lock"}
    if ".portkit" in out and not any(k.startswith(".portkit/") for k in out):
        del out[".portkit"]
    return out


def _difference(now: dict[str, str], states: dict[str, dict[str, str]]) -> str:
    parts = []
    for name, snap in states.items():
        changed = sorted(k for k in set(now) | set(snap) if now.get(k) != snap.get(k))
        parts.append(f"vs {name}: {len(changed)} differ ({', '.join(changed[:4])})")
    return "tree is neither state: " + "; ".join(parts)


@dataclass
class Race:
    runs: list[Run]
    state: str
    truthful: bool
    why: str


def race(tree: Path, commands: Sequence[Sequence[str]], states: dict[str, dict[str, str]],
         start: str, env: dict[str, str] | None = None) -> Race:
    """Start `commands` at once on `tree` (in `start` state) and check that every exit
    status tells the truth about the tree they leave."""
    procs = [subprocess.Popen([PORTKIT, *args, "--tree", str(tree)], env=env or environ(),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for args in commands]
    runs = []
    for args, proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=120)
        runs.append(Run(list(args), proc.returncode, out, err, proc.pid))
    now = snapshot(tree)
    state = next((name for name, snap in states.items() if snap == now), "neither")
    truthful, why = _truthful(runs, state, start)
    return Race(runs, state, truthful, why)


def _truthful(runs: list[Run], state: str, start: str) -> tuple[bool, str]:
    applied = reversed_ = 0
    pids = {r.pid for r in runs}
    for r in runs:
        if r.traceback or r.stderr.count("\n") > 1:
            return False, f"{r.args}: {r.stderr[:300]!r}"
        if r.returncode == 0:
            if r.stdout.startswith("applied "):
                applied += 1
            elif r.stdout.startswith("reversed "):
                reversed_ += 1
            elif "already applied" not in r.stdout:
                return False, f"exit 0 without saying what it did: {r.stdout[:200]!r}"
        elif r.returncode == 7:
            holder = r.stderr.rsplit("(pid ", 1)[-1].rstrip(")\n")
            if not holder.isdigit() or int(holder) not in pids - {r.pid}:
                return False, f"busy, but names no other racer: {r.stderr!r}"
        elif r.returncode == 4 and "is not applied to this tree" in r.stderr:
            pass  # a reverse that came after another reverse
        else:
            return False, f"{r.args} exit {r.returncode}: {r.stderr[:300]!r}"
    net = (1 if start == "after" else 0) + applied - reversed_
    expected = {1: "after", 0: "before"}.get(net)
    if expected != state:
        return False, (f"{applied} applied and {reversed_} reversed from {start}, "
                       f"but the tree is {state}")
    return True, f"{applied} applied, {reversed_} reversed, tree {state}"
