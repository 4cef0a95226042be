"""The transaction journal and the record as input (portkit/transaction.py): what a
transaction wrote reads back, whatever ids the files it saved have; what no system has is a
bad journal; a roll-back never overwrites what the user wrote after a kill; a FIFO, a huge
file or a folder planted in .portkit is refused in one line, never waited on or read whole."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import portkit
from portkit.cli import cli
from portkit.errors import BadLock, EditedSince, RecordError
from portkit.transaction import JOURNAL_LIMIT, PATCH_LIMIT, STATE_LIMIT, Journal, _Original

from .conftest import tree_bytes


def _journal(owner: tuple[int, int], pid: int = 4242) -> Journal:
    return Journal("apply of x", pid, [_Original("src/a.cpp", b"int a;\n", 0o644, owner,
                                                 None)], [], [])


@pytest.mark.parametrize("owner", [(0, 0), (65534, 65534), (3000000000, 3000000000),
                                   (4294967294, 4294967294)])
def test_a_journal_of_any_real_owner_reads_back(owner):
    """uids and gids are unsigned 32-bit (nfsnobody 4294967294, directory services' large
    ids): the journal of a file they own must be read, or the tree could not be recovered."""
    back = Journal.parse(_journal(owner).to_json(), Path(".journal"))
    assert back.files[0].owner == owner and back.pid == 4242


@pytest.mark.parametrize("owner, pid", [((2 ** 32, 0), 1), ((-1, 0), 1), ((0, 0), 2 ** 31)])
def test_ids_no_system_has_are_a_bad_journal(owner, pid):
    with pytest.raises(RecordError, match="bad journal .*not an id"):
        Journal.parse(_journal(owner, pid).to_json(), Path(".journal"))


# -- a roll-back never overwrites what the user wrote after the kill ------------------------

ROOT = Path(portkit.__file__).resolve().parent.parent  # the portkit these tests import


def _killed_apply(tree: Path, series: Path, point: str, work: Path) -> None:
    """Run `portkit apply --series` (this checkout's code) on `tree` and SIGKILL it at
    checkpoint `point`: the journal it leaves is one a real kill leaves."""
    trace = work / "trace"
    env = {**os.environ, "PORTKIT_CHECKPOINTS": str(trace), "PORTKIT_PAUSE_AT": point,
           "PORTKIT_PAUSE_SECONDS": "60"}
    proc = subprocess.Popen([sys.executable, "-c", "from portkit.cli import main; main()",
                             "apply", "--force", "--tree", str(tree), "--series", str(series)],
                            cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while "paused" not in (trace.read_text() if trace.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, "never reached " + point
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    assert (tree / ".portkit" / ".journal").is_file()


def _series(tmp_path: Path) -> Path:
    """Two patches: one changes src/llama-graph.h, the other creates src/new.cpp."""
    series = tmp_path / "s1"
    series.mkdir()
    (series / "0001-note.patch").write_text(
        "--- a/src/llama-graph.h\n+++ b/src/llama-graph.h\n@@ -1,3 +1,4 @@\n"
        " #pragma once\n+// a note\n \n #include \"llama-arch.h\"\n")
    (series / "0002-new.patch").write_text(
        "--- /dev/null\n+++ b/src/new.cpp\n@@ -0,0 +1 @@\n+int x;\n")
    return series


@pytest.mark.parametrize("edited", ["src/llama-graph.h", "src/new.cpp"])
@pytest.mark.parametrize("command", [["recover", "--tree"], ["tree", "info"]])
def test_a_roll_back_refuses_a_file_edited_after_the_kill(fixture_tree, tmp_path, edited,
                                                          command):
    """The user's work after a crash is never overwritten (nor a file the apply created
    deleted), by recover or by a read-only command: one line names the file, nothing is
    rolled back; moved aside, the roll-back goes on and the user's copy is intact."""
    tree = fixture_tree("old")
    assert (tree / "src/llama-graph.h").read_text().startswith(
        '#pragma once\n\n#include "llama-arch.h"\n')
    pristine = tree_bytes(tree)
    _killed_apply(tree, _series(tmp_path), "write:src/new.cpp:renamed#1", tmp_path)
    with (tree / edited).open("a") as fh:
        fh.write("// my own work, written after the crash\n")
    left = tree_bytes(tree)
    del left[".portkit/.lock"]  # the killed holder's, which any command clears
    result = CliRunner().invoke(cli, [*command, str(tree)])
    assert result.exit_code == EditedSince.exit_code, result.output
    assert result.stderr.count("\n") == 1 and str(tree / edited) in result.stderr
    assert "nothing was rolled back" in result.stderr and "portkit recover" in result.stderr
    assert tree_bytes(tree) == left  # the journal and every file as they were
    mine = (tree / edited).read_bytes()
    aside = tmp_path / "mine"
    (tree / edited).rename(aside)
    recovered = CliRunner().invoke(cli, ["recover", "--tree", str(tree)])
    assert recovered.exit_code == 0 and "rolled back" in recovered.output
    assert tree_bytes(tree) == pristine and aside.read_bytes() == mine


def test_every_read_only_command_in_a_fork_edited_after_the_kill_says_so(fixture_fork,
                                                                         tmp_path):
    """A read-only command rolls a killed portkit's journal back before it reads (it never
    reads a half-written tree); where that would overwrite the user's work, it refuses in the
    same one line as recover (EditedSince, exit 4, naming the file and `portkit recover`),
    and writes nothing. `drift` in the fork too: it used to take the fork for no fork and
    ask for --series or --tree (exit 2)."""
    fork = fixture_fork("old").root
    series = tmp_path / "s1"
    series.mkdir()
    (series / "0001-note.patch").write_text(
        "--- a/src/llama-graph.h\n+++ b/src/llama-graph.h\n@@ -1,3 +1,4 @@\n"
        " #pragma once\n+// a note\n \n #include \"llama-arch.h\"\n")
    _killed_apply(fork, series, "journal:written#1", tmp_path)
    edited = fork / "llama" / "llama.cpp" / "src" / "llama-graph.h"
    with edited.open("a") as fh:
        fh.write("// my own work, written after the crash\n")
    (fork / ".portkit" / ".lock").unlink()  # the killed holder's, which any command clears
    left = tree_bytes(fork)
    for args in (["tree", "info", str(fork)], ["anchors", "--tree", str(fork)],
                 ["render", "--tree", str(fork), "--out", str(tmp_path / "rendered")],
                 ["validate", "--published", "--tree", str(fork)],
                 ["drift", "--fork", str(fork)],
                 ["drift", "--fork", str(fork), "--series", str(series)],
                 ["drift", "--fork", str(fork), "--tree", str(fork)]):
        done = CliRunner().invoke(cli, args)
        assert done.exit_code == EditedSince.exit_code, (args, done.output)
        assert done.stderr.count("\n") == 1 and str(edited) in done.stderr, (args, done.stderr)
        assert "nothing was rolled back" in done.stderr, (args, done.stderr)
        assert f"portkit recover --tree {fork}" in done.stderr, (args, done.stderr)
        assert tree_bytes(fork) == left, args
    assert not (tmp_path / "rendered").exists()


# -- what is planted in .portkit: never waited on, never read whole ---------------------------


def _portkit(*args: str) -> subprocess.CompletedProcess[str]:
    """This checkout's portkit in a process of its own: a hang is a failure (TimeoutExpired),
    not a stuck test run."""
    return subprocess.run([sys.executable, "-c", "from portkit.cli import main; main()", *args],
                          cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=30)


def _applied(fixture_tree, tmp_path: Path) -> Path:
    tree = fixture_tree("old")
    done = CliRunner().invoke(cli, ["apply", "--force", "--tree", str(tree), "--series",
                                    str(_series(tmp_path))])
    assert done.exit_code == 0, done.output
    return tree


@pytest.mark.parametrize("planted", [".portkit/.journal", ".portkit/s1/state.json",
                                     ".portkit/s1/0002-new.patch"])
def test_a_fifo_in_the_record_is_a_bad_record_not_a_hang(fixture_tree, tmp_path, planted):
    tree = _applied(fixture_tree, tmp_path) if "s1" in planted else fixture_tree("old")
    (tree / planted).parent.mkdir(exist_ok=True)
    (tree / planted).unlink(missing_ok=True)
    os.mkfifo(tree / planted)
    for args in (["tree", "info", str(tree)], ["recover", "--tree", str(tree)],
                 ["apply", "--force", "--tree", str(tree), "--series", str(tmp_path / "s1")]):
        if "s1" in planted and args[0] == "recover":
            continue  # recover reads the journal only: it has nothing to say of a record
        done = _portkit(*args)
        assert done.returncode == RecordError.exit_code, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        assert f"{tree / planted} is not a regular file" in done.stderr, done.stderr
    assert stat.S_ISFIFO((tree / planted).lstat().st_mode)  # left as it was


@pytest.mark.parametrize("planted, limit", [(".portkit/.journal", JOURNAL_LIMIT),
                                            (".portkit/s1/state.json", STATE_LIMIT),
                                            (".portkit/s1/0001-note.patch", PATCH_LIMIT)])
def test_a_record_far_bigger_than_portkit_writes_is_refused_unread(fixture_tree, tmp_path,
                                                                  planted, limit):
    """A sparse file one byte over the limit: refused by its size, in one line, exit 6."""
    tree = _applied(fixture_tree, tmp_path) if "s1" in planted else fixture_tree("old")
    (tree / planted).parent.mkdir(exist_ok=True)
    with (tree / planted).open("wb") as fh:
        fh.truncate(limit + 1)
    done = CliRunner().invoke(cli, ["tree", "info", str(tree)])
    assert done.exit_code == RecordError.exit_code, done.output
    assert done.stderr.count("\n") == 1
    assert f"{tree / planted} holds {limit + 1} bytes, more than portkit ever writes" \
        in done.stderr, done.stderr


@pytest.mark.parametrize("planted", ["folder", "fifo"])
def test_a_planted_lock_is_named_by_writers_and_passed_by_readers(fixture_tree, tmp_path,
                                                                 planted):
    tree = fixture_tree("old")
    lock = tree / ".portkit" / ".lock"
    lock.parent.mkdir()
    lock.mkdir() if planted == "folder" else os.mkfifo(lock)
    before = tree_bytes(tree)
    for args in (["apply", "--force", "--tree", str(tree), "--series",
                  str(_series(tmp_path))], ["recover", "--tree", str(tree)]):
        done = _portkit(*args)
        assert done.returncode == BadLock.exit_code == RecordError.exit_code, done.stderr
        assert done.stderr == f"portkit: {lock} is not a regular file (a folder or a FIFO?): " \
            f"portkit keeps its lock there; remove it\n"
    info = _portkit("tree", "info", str(tree))
    assert info.returncode == 0 and info.stderr == "" and "layout:" in info.stdout
    assert tree_bytes(tree) == before and lock.exists() and not lock.is_file()
