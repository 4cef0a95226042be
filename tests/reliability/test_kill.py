"""Kill `portkit apply` and `apply --reverse` at their checkpoints (every file write, every
git call, the journal, the commit, the lock) with SIGKILL and SIGTERM, then run the next
command a user would: the tree is always as it was before, or fully patched with its
record, never in between; nothing outside it changes."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest

from .conftest import Trees
from .harness import (
    APPLY,
    FOLLOW_UPS,
    REVERSE,
    Kill,
    Killed,
    interrupt,
    kill_once,
    portkit,
    reset,
    snapshot,
    state_of,
    trace_points,
)

COMMITTED = ("committed#1", "unlock#1", "end#1")  # past the commit: the change stands


def run_kills(kills: list[Kill], tree: Path, start: Path, trees: Trees,
              work: Path) -> list[Killed]:
    results = []
    for i, kill in enumerate(kills):
        reset(tree, start)
        results.append(kill_once(kill, tree, work, trees.states, FOLLOW_UPS[i % len(FOLLOW_UPS)],
                                 outside=tree.parent))
    return results


def failures(results: list[Killed], done: str, undone: str) -> list[str]:
    """Every kill that left the wrong state, an untrue message or a change outside."""
    out = []
    for r in results:
        expected = done if r.kill.point in COMMITTED else undone
        if r.kill.point is None:
            expected = r.state if r.state in (done, undone) else undone
        if r.kill.point is not None and not r.reached:
            out.append(f"{r.kill.name}: the point was never reached")
        if r.state != expected or r.notes or not r.outside_intact:
            out.append(f"{r.kill.name}: tree {r.state} (want {expected}); "
                       f"outside intact {r.outside_intact}; {r.notes}")
    return out


@pytest.fixture(scope="module")
def traced(trees: Trees, tmp_path_factory: pytest.TempPathFactory
           ) -> dict[str, tuple[list[str], float]]:
    """The checkpoints of a real apply and a real reverse, in order, and their run times."""
    work = tmp_path_factory.mktemp("trace")
    tree = work / "t"
    reset(tree, trees.before)
    return {"apply": trace_points(APPLY, tree, work / "a"),
            "reverse": trace_points(REVERSE, tree, work / "r")}


@pytest.fixture(scope="module")
def points(traced: dict[str, tuple[list[str], float]]) -> dict[str, list[str]]:
    return {command: found for command, (found, _) in traced.items()}


def test_checkpoints_cover_every_write_and_git_call(points):
    apply_points = points["apply"]
    writes = [p for p in apply_points if p.startswith("write:") and p.endswith(":renamed#1")]
    assert len(writes) == 4 + 5 + 1  # sources, patches, state.json
    assert apply_points.count("journal:written#1") == 1
    runs = [p for p in apply_points if p.startswith("run:")]
    # GNU patch, checked and then run on the private copy for each file of each patch
    assert runs == [f"run:patch#{n}" for n in range(1, len(runs) + 1)] and len(runs) >= 5
    assert points["reverse"][-4:] == ["commit#1", "committed#1", "unlock#1", "end#1"]


def test_sigkill_during_apply(trees, tree, points, tmp_path_factory):
    chosen = points["apply"][::3] + list(COMMITTED)
    kills = [Kill(APPLY, p, signal.SIGKILL) for p in dict.fromkeys(chosen)]
    results = run_kills(kills, tree, trees.before, trees, tmp_path_factory.mktemp("work"))
    assert not failures(results, done="after", undone="before")
    assert len(results) >= 16


def test_sigterm_during_apply(trees, tree, points, tmp_path_factory):
    chosen = [p for p in points["apply"] if p.startswith(("locked", "run:", "journal:"))
              or p.endswith(":temp#1")][1::2] + ["commit#1", "unlock#1"]
    kills = [Kill(APPLY, p, signal.SIGTERM) for p in chosen]
    results = run_kills(kills, tree, trees.before, trees, tmp_path_factory.mktemp("work"))
    assert not failures(results, done="after", undone="before")
    rolled_back = [r for r in results if "rolled back" in r.run.stderr]
    assert rolled_back and all(r.run.returncode == 143 for r in results)


def test_kills_during_reverse(trees, patched, points, tmp_path_factory):
    chosen = points["reverse"][1::4]
    kills = [Kill(REVERSE, p, signal.SIGKILL if i % 3 else signal.SIGTERM)
             for i, p in enumerate([*chosen, *COMMITTED])]
    results = run_kills(kills, patched, trees.after, trees, tmp_path_factory.mktemp("work"))
    assert not failures(results, done="before", undone="after")


def test_kills_at_random_times(trees, tree, traced, tmp_path_factory):
    rng = random.Random(17)
    took = traced["apply"][1]
    kills = [Kill(APPLY, None, rng.choice([signal.SIGKILL, signal.SIGTERM]),
                  rng.uniform(0.2, 1.0) * took) for _ in range(4)]
    results = run_kills(kills, tree, trees.before, trees, tmp_path_factory.mktemp("work"))
    assert not failures(results, done="after", undone="before")


@pytest.mark.parametrize("point", ["rollback:*llama-kv-cache.h#1",
                                   "write:*llama-graph.cpp:half#1"])
def test_a_recovery_that_is_killed_is_finished_by_the_next(trees, tree, tmp_path, point):
    """Killed just before its commit, then `recover` killed in the middle of rolling back:
    the next command finishes the roll-back (rolling back is safe to repeat)."""
    reached, _ = interrupt(Kill(APPLY, "commit#1", signal.SIGKILL), tree, tmp_path)
    assert reached and (tree / ".portkit" / ".journal").is_file()
    reached, _ = interrupt(Kill(["recover"], point, signal.SIGKILL), tree, tmp_path)
    assert reached and (tree / ".portkit" / ".journal").is_file()
    assert state_of(tree, trees.states) == "neither"  # half rolled back
    again = portkit(["recover"], tree)
    assert again.returncode == 0 and again.stderr == ""
    assert again.stdout.startswith("rolled back an interrupted apply of kv-rotation (pid ")
    assert snapshot(tree) == trees.states["before"]
