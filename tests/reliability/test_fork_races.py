"""A fork move (`portkit rebase --onto`) and an apply on one ollama-style fork, at once: every
check of the fork's state is made under its lock, so neither ever writes onto a fork that
another changed after it looked (issue 19, item 1); and a fork is never moved onto itself
(item 7). Offline: the fixture fork and fixture targets, real portkit processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from portkit import rebase as rb
from portkit.apply import apply_series
from portkit.errors import TreeError, UsageError
from portkit.series import read_series
from portkit.tree import detect

from ..conftest import commit_all
from .conftest import GRAPH, NOTE, Arena
from .harness import PORTKIT, Run, environ, signals_as_a_terminal_sends_them, snapshot


def start(args: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([PORTKIT, *args], env=env or environ(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], args: Sequence[str]) -> Run:
    out, err = proc.communicate(timeout=120)
    return Run(list(args), proc.returncode, out, err, proc.pid)


def move_args(a: Arena, target: Path) -> list[str]:
    return ["rebase", "--onto", str(target), "--fork", str(a.fork)]


def apply_args(a: Arena) -> list[str]:
    return ["apply", "--pin", a.pin, "--series", str(a.series), "--tree", str(a.fork)]


def run(args: Sequence[str]) -> Run:
    return finish(start(args), args)


def reset(a: Arena) -> None:
    shutil.rmtree(a.fork)
    shutil.copytree(a.pristine, a.fork, symlinks=True)


def pin_of(fork: Path) -> str | None:
    return detect(fork).pin


def one_line(r: Run, code: int, words: str) -> None:
    assert r.returncode == code, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("portkit: ") and words in r.stderr, \
        r.stderr
    assert "Traceback" not in r.stderr


def states(a: Arena) -> dict[str, dict[str, str]]:
    """What the fork is after each command alone, and after each order of two commands."""
    out = {"untouched": snapshot(a.fork)}
    for name, commands in {"applied": [apply_args(a)],
                           "moved 1": [move_args(a, a.targets[0])],
                           "moved 2": [move_args(a, a.targets[1])]}.items():
        for args in commands:
            done = run(args)
            assert done.returncode == 0, done.stderr
        out[name] = snapshot(a.fork)
        reset(a)
    return out


# -- 7. a fork is not moved onto itself ---------------------------------------------------------


@pytest.mark.parametrize("onto", [".", "llama/llama.cpp", "pristine"])
def test_a_fork_is_not_moved_onto_itself(arena, onto):
    """`rebase --onto .` in a fork used to drop every patch and empty llama/patches."""
    target = arena.pristine if onto == "pristine" else arena.fork / onto
    before = snapshot(arena.fork)
    proc = subprocess.run([PORTKIT, "rebase", "--onto", str(target)], cwd=arena.fork,
                          env=environ(), capture_output=True, text=True)
    done = Run(["rebase"], proc.returncode, proc.stdout, proc.stderr)
    if onto == "pristine":  # another folder, but the fork's very pin: its own base
        one_line(done, UsageError.exit_code, f"is at llama.cpp {arena.pin[:12]}, the fork's own "
                                              "pin (Makefile.sync FETCH_HEAD): nothing to move")
    else:
        one_line(done, UsageError.exit_code, f"is the fork itself ({arena.fork})")
    assert done.stdout == ""
    assert snapshot(arena.fork) == before


# -- 1. every check under the lock ------------------------------------------------------------


def test_an_apply_paused_before_the_lock_refuses_the_fork_a_move_made_meanwhile(arena, tmp_path):
    """The apply reads the fork (pin, record) and stops just before it takes the lock; a move
    runs to the end and is committed; the apply then goes on: it reads the fork again under
    the lock and refuses the new pin (exit 4), writing nothing."""
    trace, go = tmp_path / "trace", tmp_path / "go"
    paused = start(apply_args(arena), environ(PORTKIT_CHECKPOINTS=str(trace),
                                              PORTKIT_PAUSE_AT="lock#1",
                                              PORTKIT_PAUSE_UNTIL=str(go)))
    while " paused" not in (trace.read_text() if trace.exists() else ""):
        assert paused.poll() is None, paused.communicate()
    moved = run(move_args(arena, arena.targets[0]))
    assert moved.returncode == 0, moved.stderr
    commit_all(arena.fork, "move to release 1")  # clean again: only the pin tells
    after_move = snapshot(arena.fork)
    go.touch()
    done = finish(paused, apply_args(arena))
    target_pin = pin_of(arena.targets[0])
    assert target_pin is not None
    one_line(done, TreeError.exit_code, f"the tree is at {target_pin[:12]} (from Makefile.sync "
                                        f"FETCH_HEAD), not at the pin {arena.pin}")
    assert snapshot(arena.fork) == after_move


def test_a_move_paused_before_the_lock_is_planned_again_on_the_fork_it_finds(arena, tmp_path):
    """A move plans, then stops before the lock; an apply adds a patch to the fork and is
    committed; the move goes on: the fork is not what it planned on, so it plans again under
    the lock and carries the apply's patch too (nothing of the apply is lost)."""
    trace, go = tmp_path / "trace", tmp_path / "go"
    args = move_args(arena, arena.targets[0])
    paused = start(args, environ(PORTKIT_CHECKPOINTS=str(trace), PORTKIT_PAUSE_AT="lock#1",
                                 PORTKIT_PAUSE_UNTIL=str(go)))
    while " paused" not in (trace.read_text() if trace.exists() else ""):
        assert paused.poll() is None, paused.communicate()
    applied = run(apply_args(arena))
    assert applied.returncode == 0, applied.stderr
    commit_all(arena.fork, "the graph note")
    go.touch()
    done = finish(paused, args)
    assert done.returncode == 0, done.stderr
    assert " rebase:replan#1" in trace.read_text()
    vendored = arena.fork / "llama" / "llama.cpp" / GRAPH
    assert NOTE in vendored.read_text()  # the apply's change, carried onto the target
    names = [p.name for p in read_series(arena.fork / "llama" / "patches").patches]
    assert any(n.endswith("graph-say-who-fills-the-inputs.patch") for n in names), names
    assert pin_of(arena.fork) == pin_of(arena.targets[0])


def test_a_planned_move_is_refused_on_a_fork_that_changed_without_replanning(arena):
    fork = detect(arena.fork)
    move = rb.plan_fork(fork, detect(arena.targets[0]))
    apply_series(fork, read_series(arena.series), "graph-note", pin=arena.pin)
    commit_all(arena.fork, "the graph note")
    before = snapshot(arena.fork)
    with pytest.raises(TreeError, match="changed since the move was planned"):
        rb.move_fork(move, replan=False)
    assert snapshot(arena.fork) == before


def _race(a: Arena, commands: list[list[str]], known: dict[str, dict[str, str]]) -> str:
    procs = [start(args) for args in commands]
    runs = [finish(p, args) for p, args in zip(procs, commands, strict=True)]
    now = snapshot(a.fork)
    state = next((name for name, snap in known.items() if snap == now), "neither")
    wins = [r for r in runs if r.returncode == 0]
    for r in runs:
        assert "Traceback" not in r.stderr, r.stderr
        if r.returncode != 0:  # the loser says why in one line: refused (4) or busy (7)
            one_line(r, r.returncode, "")
            assert r.returncode in (TreeError.exit_code, 7), r.stderr
    # Exactly one command's work stands, and it is the one that says it succeeded: the
    # fork is git-committed, so whoever comes second finds uncommitted files or a new pin.
    assert len(wins) == 1, [(r.args[0], r.returncode, r.stderr) for r in runs]
    winner = wins[0].args
    expected = "applied" if winner[0] == "apply" else \
        f"moved {1 + [str(t) for t in a.targets].index(winner[2])}"
    assert state == expected, (state, expected, [(r.args[:3], r.returncode) for r in runs])
    return state


@pytest.mark.parametrize("which", ["apply || move", "move || move"])
def test_plain_races_leave_one_commands_fork(arena, which):
    known = states(arena)
    seen = []
    for trial in range(3):
        reset(arena)
        if which == "apply || move":
            commands = [apply_args(arena), move_args(arena, arena.targets[trial % 2])]
        else:
            commands = [move_args(arena, arena.targets[0]), move_args(arena, arena.targets[1])]
        seen.append(_race(arena, commands[::-1] if trial % 2 else commands, known))
    assert all(s != "untouched" for s in seen)



# -- 10. every signal ends with one line; scratch of killed runs is swept ------------------------


def _paused(args: list[str], point: str, work: Path, **env: str) -> tuple[
        subprocess.Popen[str], Path]:
    trace, go = work / "trace", work / "go"
    trace.unlink(missing_ok=True)
    go.unlink(missing_ok=True)
    proc = subprocess.Popen([PORTKIT, *args], env=environ(
        PORTKIT_CHECKPOINTS=str(trace), PORTKIT_PAUSE_AT=point, PORTKIT_PAUSE_UNTIL=str(go),
        **env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True, preexec_fn=signals_as_a_terminal_sends_them)
    while " paused" not in (trace.read_text() if trace.exists() else ""):
        assert proc.poll() is None, proc.communicate()
    return proc, go


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_while_starting_is_one_line(arena, tmp_path, signum):
    """At start#1 portkit is still importing: the one line, 128+N, nothing changed."""
    before = snapshot(arena.fork)
    proc, go = _paused(move_args(arena, arena.targets[0]), "start#1", tmp_path)
    os.kill(proc.pid, signum)
    go.touch()
    done = finish(proc, ["rebase"])
    one_line(done, 128 + signum, f"interrupted ({signal.Signals(signum).name}); nothing was "
                                 f"changed")
    assert snapshot(arena.fork) == before


def test_a_sigterm_right_after_a_fork_move_says_the_move_is_complete(arena, tmp_path):
    """The move is written and the command is over, but the process has not ended: the
    signal is told in one line, with what the fork was left as (moved), and exit 143."""
    args = move_args(arena, arena.targets[0])
    proc, go = _paused(args, "end#1", tmp_path)
    os.kill(proc.pid, signal.SIGTERM)
    go.touch()
    done = finish(proc, args)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1] == "portkit: interrupted (SIGTERM); the change was complete", lines
    assert [ln for ln in lines if ln.startswith("portkit: ")] == lines[-1:]
    assert pin_of(arena.fork) == pin_of(arena.targets[0])


def test_a_killed_runs_scratch_is_swept_by_the_next_run_and_a_live_ones_is_not(arena,
                                                                               tmp_path):
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    args = move_args(arena, arena.targets[0])
    killed, _ = _paused(args, "run:patch#1", tmp_path, TMPDIR=str(tmpdir))
    os.killpg(killed.pid, signal.SIGKILL)
    killed.communicate()
    left = sorted(p.name for p in tmpdir.iterdir())
    assert len(left) == 2 and left[1] == left[0] + ".lock", left  # folder and its lock
    assert any(p.name.startswith("portkit-") for p in (tmpdir / left[0]).iterdir())
    (tmp_path / "live").mkdir()
    live, go = _paused(["tree", "info", str(arena.fork)], "end#1", tmp_path / "live",
                       TMPDIR=str(tmpdir))
    mine = {p.name for p in tmpdir.iterdir()} - set(left)
    assert len(mine) == 2  # the live run's folder and lock; the killed one's are gone
    other = subprocess.run([PORTKIT, "tree", "info", str(arena.fork)], capture_output=True,
                           text=True, env=environ(TMPDIR=str(tmpdir)))
    assert other.returncode == 0, other.stderr
    assert {p.name for p in tmpdir.iterdir()} == mine  # the live one's kept
    go.touch()
    assert finish(live, ["tree", "info"]).returncode == 0
    assert list(tmpdir.iterdir()) == []
