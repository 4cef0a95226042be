"""Every hole the reliability issue lists, one test each, on 0.3.17's registry tree: the one
line portkit says, its exit code, no traceback, and the tree and everything beside it left
byte for byte as they were (or exactly as a clean run leaves them)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from portkit.errors import (
    ApplyConflict,
    BusyError,
    RecordError,
    ToolFailed,
    ToolMissing,
    TreeError,
    UsageError,
)
from portkit.transaction import tree_lock

from ..test_tree import make_ollama_fork
from .harness import (
    APPLY,
    PIN,
    PORTKIT,
    REVERSE,
    Kill,
    Run,
    environ,
    interrupt,
    portkit,
    snapshot,
    state_of,
)

RECORD = Path(".portkit") / "kv-rotation"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_CONFIG_NOSYSTEM": "1"}


def fails(run: Run, code: int, line: str) -> None:
    """`run` failed with exactly one line on stderr, starting with `line`, and `code`."""
    assert run.returncode == code, (run.returncode, run.stderr)
    assert run.stderr.startswith(f"portkit: {line}"), run.stderr
    assert run.stderr.count("\n") == 1 and run.stdout == "", run.stderr
    assert not run.traceback


def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout


def submodule_checkout(tree: Path) -> Path:
    """Make vendor/llama.cpp a git submodule checkout as an sdist ships it: a .git file
    pointing at <tree>/.git/modules/vendor/llama.cpp, everything committed. Returns the
    repository's git folder."""
    llama = tree / "vendor" / "llama.cpp"
    gitdir = tree / ".git" / "modules" / "vendor" / "llama.cpp"
    gitdir.parent.mkdir(parents=True)
    git("init", "-q", "--separate-git-dir", str(gitdir), str(llama), cwd=tree)
    (llama / ".git").write_text("gitdir: ../../.git/modules/vendor/llama.cpp\n")
    git("add", "-A", cwd=llama)
    git("commit", "-qm", "vendored", cwd=llama)
    return gitdir


def state_json(tree: Path) -> dict:
    return json.loads((tree / RECORD / "state.json").read_text())


def write_state(tree: Path, data: object) -> None:
    (tree / RECORD / "state.json").write_text(json.dumps(data))


# -- 1. kills while writing -------------------------------------------------------------------


def test_sigterm_while_writing_rolls_back_and_says_so(trees, tree, tmp_path, work):
    everything = snapshot(tmp_path)
    reached, run = interrupt(Kill(APPLY, "write:*llama-kv-cache.h:half#1", signal.SIGTERM),
                             tree, work)
    assert reached
    fails(run, 128 + signal.SIGTERM, "interrupted (SIGTERM); the tree was rolled back")
    assert snapshot(tmp_path) == everything


def test_a_rerun_after_a_kill_rolls_back_first_then_applies_whole(trees, tree, tmp_path, work):
    """The issue: on a tree without git, a re-run 'completed' a half-applied tree."""
    reached, _ = interrupt(Kill(APPLY, "write:*llama-graph.cpp:renamed#1", signal.SIGKILL),
                           tree, work)
    assert reached and state_of(tree, trees.states) == "neither"
    again = portkit(APPLY, tree)
    assert again.returncode == 0 and again.stdout.startswith("applied 5 patch(es)")
    assert again.stderr.startswith("portkit: rolled back an interrupted apply of kv-rotation")
    assert snapshot(tree) == trees.states["after"]


def test_reverse_after_a_killed_reverse_still_reverses(trees, patched, tmp_path, work):
    reached, _ = interrupt(Kill(REVERSE, "delete:*state.json#1", signal.SIGKILL), patched, work)
    assert reached
    again = portkit(REVERSE, patched)
    assert again.returncode == 0 and again.stdout.startswith("reversed 5 patch(es)")
    assert snapshot(patched) == trees.states["before"]


@pytest.mark.parametrize("point", ["run:git ls-files#1", "run:git hash-object#1",
                                   "run:git status#1"])
def test_sigkill_during_the_dirty_check_leaves_no_index_lock(tree, work, point):
    gitdir = submodule_checkout(tree)
    if point == "run:git status#1":  # only a file that differs from the index needs status
        with (tree / "vendor" / "llama.cpp" / "src" / "llama-graph.h").open("a") as fh:
            fh.write("// local work\n")
    index = (gitdir / "index").read_bytes()
    reached, _ = interrupt(Kill(APPLY, point, signal.SIGKILL), tree, work)
    assert reached
    assert not (gitdir / "index.lock").exists()
    assert (gitdir / "index").read_bytes() == index
    expected = TreeError.exit_code if point == "run:git status#1" else 0
    assert portkit(APPLY, tree).returncode == expected


@pytest.mark.parametrize("what", ["the feature", "a series making a new file"])
def test_the_repositorys_config_runs_no_program_during_the_dirty_check(tree, work, what):
    """An sdist ships .git/modules/vendor/llama.cpp/config: a file-system monitor or a clean
    filter named there must not run when portkit checks for uncommitted changes (a file the
    series makes is in neither the index nor the tree: nothing to ask git status about)."""
    args = APPLY
    if what == "a series making a new file":
        series = work / "new-file"
        series.mkdir()
        (series / "0001-new.patch").write_text(
            "--- a/src/llama-graph.h\n+++ b/src/llama-graph.h\n@@ -1,2 +1,3 @@\n #pragma once\n"
            "+#include \"llama-new.h\"\n \n"
            "--- /dev/null\n+++ b/src/llama-new.h\n@@ -0,0 +1 @@\n+#pragma once\n")
        args = [*APPLY, "--series", str(series)]
    gitdir = submodule_checkout(tree)
    marker = work / "ran"
    hook = work / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\ncat\n")
    hook.chmod(0o755)
    llama = tree / "vendor" / "llama.cpp"
    (llama / ".gitattributes").write_text("* filter=evil\n")
    git("add", ".gitattributes", cwd=llama)
    git("commit", "-qm", "attributes", cwd=llama)
    git("config", "core.fsmonitor", str(hook), cwd=llama)
    git("config", "filter.evil.clean", str(hook), cwd=llama)
    for path in (llama / "src").iterdir():
        os.utime(path, (1, 1))  # stale stat data: git would hash the files again
    index = (gitdir / "index").read_bytes()
    run = portkit(args, tree)
    assert run.returncode == 0, run.stderr
    assert not marker.exists()
    assert (gitdir / "index").read_bytes() == index


# -- 2. one writer at a time ------------------------------------------------------------------


def test_a_second_writer_waits_then_names_the_holder(tree, tmp_path):
    everything = snapshot(tmp_path)
    with tree_lock(tree):
        run = portkit(APPLY, tree, environ(PORTKIT_LOCK_WAIT="0.3"))
    fails(run, BusyError.exit_code, f"another portkit is working on this tree (pid {os.getpid()})")
    assert snapshot(tmp_path) == everything


def test_readers_wait_for_a_writer_in_the_middle_of_its_transaction(trees, tree, tmp_path, work):
    trace = work / "trace"
    env = environ(PORTKIT_CHECKPOINTS=str(trace),
                  PORTKIT_PAUSE_AT="write:*llama-graph.h:temp#1", PORTKIT_PAUSE_SECONDS="1")
    writer = subprocess.Popen([PORTKIT, *APPLY, "--tree", str(tree)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while " paused" not in (trace.read_text() if trace.exists() else ""):
        assert writer.poll() is None
    reader = portkit(["apply", "--dry-run", "--pin", PIN], tree)
    assert writer.wait(timeout=60) == 0
    assert reader.returncode == 0 and "already applied" in reader.stdout, reader.stderr
    assert snapshot(tree) == trees.states["after"]


# -- 3. the record is input, not trusted ------------------------------------------------------


@pytest.mark.parametrize("copy", ["../outside/precious.txt", "/etc/hostname",
                                  "vendor/../../outside/precious.txt", "CHANGELOG.md"])
def test_series_copies_outside_the_series_folder_are_refused(patched, tmp_path, copy):
    data = state_json(patched)
    data["series_copies"] = [{"path": copy, "sha256": "0" * 64}]
    write_state(patched, data)
    everything = snapshot(tmp_path)
    fails(portkit(REVERSE, patched), RecordError.exit_code,
          f"bad record {patched / RECORD / 'state.json'}: ")
    assert snapshot(tmp_path) == everything


@pytest.mark.parametrize("field, value, said", [
    ("order", -1, "order is not a count"), ("order", "2", "order is not a count"),
    ("order", True, "order is not a count"),
    ("patches", [{"name": "../state.json", "sha256": "0" * 64}], "a patch: "),
    ("patches", [{"name": "state.json", "sha256": "0" * 64}], "is not a patch file name"),
    ("patches", [{"name": ".hidden", "sha256": "0" * 64}], "is not a patch file name"),
    ("files", [{"path": "src/llama-graph.cpp", "sha256": "x"}], "is not a {path, sha256}"),
])
def test_the_records_order_patch_names_and_files_are_checked(patched, tmp_path, field, value,
                                                             said):
    data = state_json(patched)
    data[field] = value
    write_state(patched, data)
    everything = snapshot(tmp_path)
    fails(portkit(REVERSE, patched), RecordError.exit_code,
          f"bad record {patched / RECORD / 'state.json'}: ")
    assert said in portkit(REVERSE, patched).stderr
    assert snapshot(tmp_path) == everything


@pytest.mark.parametrize("planted", [".portkit", ".portkit/kv-rotation", ".portkit/.lock",
                                     ".portkit/.journal"])
def test_a_symlink_planted_in_the_record_is_refused(tree, tmp_path, planted):
    target = tmp_path / "outside"
    link = tree / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target if planted != ".portkit/.lock" else target / "precious.txt")
    everything = snapshot(tmp_path)
    run = portkit(APPLY, tree)
    fails(run, RecordError.exit_code, "")
    assert str(tree / ".portkit") in run.stderr
    assert snapshot(tmp_path) == everything


def test_a_symlinked_patch_in_the_record_is_refused(patched, tmp_path):
    patch = next((patched / RECORD).glob("0003-*.patch"))
    shutil.copy(patch, tmp_path / "outside" / patch.name)
    patch.unlink()
    patch.symlink_to(tmp_path / "outside" / patch.name)
    everything = snapshot(tmp_path)
    fails(portkit(REVERSE, patched), RecordError.exit_code, "bad record ")
    assert snapshot(tmp_path) == everything


@pytest.mark.parametrize("content", [b"{not json", b"", b"[1, 2]", b'{"feature": "\xff\xfe"}',
                                     b'{"schema": "portkit-record/2", "feature": "kv-rotation", '
                                     b'"files": "src/llama-graph.cpp"}'])
@pytest.mark.parametrize("command", [APPLY, REVERSE])
def test_a_damaged_state_file_is_a_bad_record(patched, tmp_path, content, command):
    (patched / RECORD / "state.json").write_bytes(content)
    everything = snapshot(tmp_path)
    fails(portkit(command, patched), RecordError.exit_code,
          f"bad record {patched / RECORD / 'state.json'}: ")
    assert snapshot(tmp_path) == everything


def test_a_record_with_a_missing_patch_is_refused_not_half_reversed(patched, tmp_path):
    next((patched / RECORD).glob("0004-*.patch")).unlink()
    everything = snapshot(tmp_path)
    run = portkit(REVERSE, patched)
    fails(run, RecordError.exit_code, "bad record ")
    assert "patch 0004-graph-rotate" in run.stderr and "is missing" in run.stderr
    assert snapshot(tmp_path) == everything


def test_a_record_without_patches_never_reads_standard_input(patched, tmp_path):
    for patch in (patched / RECORD).glob("*.patch"):
        patch.unlink()
    data = state_json(patched)
    data["patches"] = []
    write_state(patched, data)
    everything = snapshot(tmp_path)
    proc = subprocess.Popen([PORTKIT, *REVERSE, "--tree", str(patched)], env=environ(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)  # stdin stays open: a reader of it would hang
    fails(Run(REVERSE, proc.returncode, out, err), RecordError.exit_code, "bad record ")
    assert "it lists no patches" in err
    assert snapshot(tmp_path) == everything


def test_the_first_record_format_is_still_read(trees, patched):
    data = state_json(patched)
    write_state(patched, {"feature": "kv-rotation", "pin": data["pin"],
                          "files": [f["path"] for f in data["files"]], "series_copies": []})
    run = portkit(REVERSE, patched)
    assert run.returncode == 0, run.stderr
    assert snapshot(patched) == trees.states["before"]


def test_a_journal_that_points_outside_is_refused(tree, tmp_path):
    (tree / ".portkit").mkdir()
    (tree / ".portkit" / ".journal").write_text(json.dumps({
        "schema": "portkit-journal/1", "action": "apply of kv-rotation", "pid": 1,
        "files": [{"path": "../outside/precious.txt", "existed": True, "mode": 420,
                   "owner": None, "data": "", "after_sha256": None}],
        "made_folders": [], "removed_folders": []}))
    everything = snapshot(tmp_path)
    fails(portkit(["recover"], tree), RecordError.exit_code,
          f"bad journal {tree / '.portkit' / '.journal'}: ")
    assert snapshot(tmp_path) == everything


@pytest.mark.parametrize("field, value", [("owner", [99999999999999999999999, 0]),
                                          ("pid", 1e400)])
def test_a_journal_with_an_id_out_of_range_is_refused(tree, tmp_path, field, value):
    """A hostile journal: an owner no system has, a pid of infinity. Refused as a bad
    journal, and nothing (no temporary file either) is left in the tree."""
    rel = next(p.relative_to(tree).as_posix() for p in sorted(tree.rglob("llama.cpp"))
               if p.is_file())
    original = (tree / rel).read_bytes()
    (tree / rel).write_bytes(original + b"// edited\n")
    entry = {"path": rel, "existed": True, "mode": 420, "owner": None,
             "data": base64.b64encode(original).decode(), "after_sha256": None}
    journal = {"schema": "portkit-journal/1", "action": "apply of kv-rotation", "pid": 1,
               "files": [entry], "made_folders": [], "removed_folders": []}
    if field == "owner":
        entry["owner"] = value
    else:
        journal["pid"] = value
    (tree / ".portkit").mkdir()
    (tree / ".portkit" / ".journal").write_text(json.dumps(journal))
    everything = snapshot(tmp_path)
    fails(portkit(["recover"], tree), RecordError.exit_code,
          f"bad journal {tree / '.portkit' / '.journal'}: ")
    assert snapshot(tmp_path) == everything


def test_json_nested_too_deep_is_a_bad_record_or_journal(patched, tmp_path):
    deep = "[" * 200000 + "]" * 200000
    (patched / RECORD / "state.json").write_text(deep)
    fails(portkit(REVERSE, patched), RecordError.exit_code, "bad record ")
    (patched / ".portkit" / ".journal").write_text(deep)
    everything = snapshot(tmp_path)
    fails(portkit(["recover"], patched), RecordError.exit_code, "bad journal ")
    assert snapshot(tmp_path) == everything


def test_a_record_listing_its_patches_by_name_only_is_refused(patched, tmp_path):
    data = state_json(patched)
    data["patches"] = [p["name"] for p in data["patches"]]
    write_state(patched, data)
    everything = snapshot(tmp_path)
    fails(portkit(REVERSE, patched), RecordError.exit_code, "bad record ")
    assert snapshot(tmp_path) == everything


def test_a_feature_name_is_never_a_path(tree, tmp_path):
    everything = snapshot(tmp_path)
    fails(portkit([*APPLY, "--feature", "../outside"], tree), UsageError.exit_code,
          "not a feature name: '../outside'")
    assert snapshot(tmp_path) == everything


# -- 4. the user's git configuration stays out -------------------------------------------------


def test_autocrlf_of_the_user_does_not_reach_the_tree(trees, tree, tmp_path):
    submodule_checkout(tree)
    git("config", "core.autocrlf", "true", cwd=tree / "vendor" / "llama.cpp")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[core]\n\tautocrlf = true\n\teol = crlf\n")
    env = environ(HOME=str(home), XDG_CONFIG_HOME=str(home))
    before = snapshot(tree)
    run = portkit(APPLY, tree, env)
    assert run.returncode == 0, run.stderr
    patched = snapshot(tree)
    for rel, digest in trees.states["after"].items():
        assert patched[rel] == digest, f"{rel} differs from a clean apply (line endings?)"
    assert portkit(REVERSE, tree, env).returncode == 0
    assert snapshot(tree) == before


@pytest.mark.parametrize("dirty", [False, True])
def test_the_dirty_check_never_writes_the_users_index(tree, dirty):
    gitdir = submodule_checkout(tree)
    for path in (tree / "vendor" / "llama.cpp" / "src").iterdir():
        os.utime(path, (1, 1))  # stale stat data: a refreshing `git status` rewrites the index
    if dirty:
        with (tree / "vendor" / "llama.cpp" / "src" / "llama-graph.cpp").open("a") as fh:
            fh.write("// local work\n")
    index = (gitdir / "index").read_bytes()
    run = portkit(APPLY, tree)
    if dirty:
        fails(run, TreeError.exit_code, "uncommitted changes in src/llama-graph.cpp; commit")
    else:
        assert run.returncode == 0, run.stderr
    assert (gitdir / "index").read_bytes() == index
    assert not (gitdir / "index.lock").exists()


def test_git_variables_of_the_caller_do_not_redirect_portkit(trees, tree, tmp_path):
    env = environ(GIT_DIR=str(tmp_path / "nowhere"), GIT_WORK_TREE=str(tmp_path / "outside"),
                  GIT_INDEX_FILE=str(tmp_path / "outside" / "index"))
    everything = snapshot(tmp_path, skip=tree)
    assert portkit(APPLY, tree, env).returncode == 0
    assert snapshot(tree) == trees.states["after"]
    assert snapshot(tmp_path, skip=tree) == everything


# -- 5. the smaller holes ---------------------------------------------------------------------


@pytest.mark.parametrize("pin", ["49bfddeca18e62fa3d39114a23e9fcbdf8a22388a",
                                 "49bfddeca18e62fa3d39114a23e9fcbdf8a22388ab", "49bfdd",
                                 "49bfddeg", "--force"])
def test_a_pin_is_7_to_40_hex_digits(tree, tmp_path, pin):
    everything = snapshot(tmp_path)
    fails(portkit(["apply", f"--pin={pin}"], tree), UsageError.exit_code,
          "--pin must be 7 to 40 hex digits of a llama.cpp commit")
    assert snapshot(tmp_path) == everything


def test_a_source_that_is_not_utf8_is_named(tree, tmp_path):
    graph = tree / "vendor" / "llama.cpp" / "src" / "llama-graph.cpp"
    graph.write_bytes(graph.read_bytes() + b"// \xff\xfe latin-1 comment\n")
    everything = snapshot(tmp_path)
    fails(portkit(APPLY, tree), TreeError.exit_code,
          "cannot render kv-rotation: src/llama-graph.cpp is not UTF-8 text")
    assert portkit(["anchors"], tree).returncode == 0
    assert snapshot(tmp_path) == everything


def test_without_git_only_what_needs_git_fails(tree, tmp_path, work):
    bare = work / "empty-path"
    bare.mkdir()
    env = environ(PATH=str(bare))
    everything = snapshot(tmp_path)
    info = portkit(["tree", "info"], tree, env)
    assert info.returncode == 0 and info.stderr == ""
    usage = subprocess.run([PORTKIT, "--help"], env=env, capture_output=True, text=True)
    assert usage.returncode == 0 and usage.stderr == "" and "Usage: portkit" in usage.stdout
    fails(portkit(APPLY, tree, env), ToolMissing.exit_code,
          "GNU patch not found: install the Debian package `patch`, or put it on PATH")
    assert snapshot(tmp_path) == everything
    # With GNU patch and still no git, a tree that is no git checkout is patched and restored.
    (bare / "patch").symlink_to(shutil.which("patch") or "/usr/bin/patch")
    assert portkit(APPLY, tree, env).returncode == 0
    assert portkit([*APPLY, "--reverse"], tree, env).returncode == 0
    assert snapshot(tmp_path) == everything


def test_ctrl_c_while_starting_is_one_line(tree, tmp_path, work):
    everything = snapshot(tmp_path)
    reached, run = interrupt(Kill(APPLY, "start#1", signal.SIGINT), tree, work)
    assert reached
    assert (run.returncode, run.stderr) == (130, "portkit: interrupted (SIGINT); nothing was "
                                                 "changed\n")
    reached, run = interrupt(Kill(APPLY, "locked#1", signal.SIGINT), tree, work)
    assert reached and "Aborted" not in run.stderr + run.stdout
    fails(run, 130, "interrupted (SIGINT); nothing was changed")
    assert snapshot(tmp_path) == everything


def test_an_edited_series_copy_is_not_deleted(registry_tree, tmp_path):
    fork = make_ollama_fork(registry_tree("0.3.17"), tmp_path / "fork", PIN)
    assert portkit(APPLY, fork).returncode == 0
    copy = next((fork / "llama" / "patches").glob("0003-*.patch"))
    copy.write_text(copy.read_text() + "\nReviewed-by: someone\n")
    everything = snapshot(tmp_path)
    fails(portkit(REVERSE, fork), TreeError.exit_code,
          f"{copy} was edited since portkit added it to the series")
    assert snapshot(tmp_path) == everything


def test_render_into_a_folder_that_holds_something_else_is_refused(tree, tmp_path):
    out = tmp_path / "series"
    assert portkit(["render", "--out", str(out)], tree).returncode == 0
    first = snapshot(out)
    again = portkit(["render", "--out", str(out)], tree)
    assert again.returncode == 0 and snapshot(out) == first  # this very series: fine
    (out / "0009-mine.patch").write_text("my own work\n")
    everything = snapshot(tmp_path)
    fails(portkit(["render", "--out", str(out)], tree), UsageError.exit_code,
          f"{out} is not empty and does not hold this series")
    assert snapshot(tmp_path) == everything


def test_a_failing_patch_tool_is_reported_as_such_not_as_a_changed_tree(patched, tmp_path,
                                                                         work):
    real = shutil.which("patch")
    (work / "patch").write_text(f'#!/bin/sh\ncase "$*" in *--version*) exec {real} "$@";; esac\n'
                                f'echo "patch: **** Can\'t create temporary file: No space left '
                                f'on device" >&2; exit 2\n')
    (work / "patch").chmod(0o755)
    everything = snapshot(tmp_path)
    run = portkit(APPLY, patched, environ(PATH=f"{work}:{os.environ['PATH']}"))
    fails(run, ToolFailed.exit_code, "GNU patch failed (exit 2): Can't create temporary file")
    assert "changed since" not in run.stderr
    assert snapshot(tmp_path) == everything


def test_a_conflict_names_the_patch_and_the_hunk(patched, tmp_path):
    graph = patched / "vendor" / "llama.cpp" / "src" / "llama-graph.cpp"
    graph.write_text(graph.read_text().replace("llama_attn_rot_apply(ctx0,",
                                               "llama_attn_rot_apply_local(ctx0,"))
    everything = snapshot(tmp_path)
    run = portkit(REVERSE, patched)
    fails(run, ApplyConflict.exit_code, "kv-rotation was applied by portkit, but the tree has "
                                        "changed since (the series does not come out: 0004-")
    assert ": src/llama-graph.cpp hunk #" in run.stderr and "failed at line" in run.stderr
    assert snapshot(tmp_path) == everything


def test_apply_then_reverse_leaves_no_trace(trees, tree, tmp_path):
    everything = snapshot(tmp_path)
    assert portkit(APPLY, tree).returncode == 0
    assert portkit(REVERSE, tree).returncode == 0
    assert snapshot(tmp_path) == everything
    nothing = portkit(["recover"], tree)
    assert nothing.stdout == f"nothing to recover in {tree}\n"
    assert snapshot(tmp_path) == everything


def test_a_usage_error_is_one_line(tree):
    run = subprocess.run([PORTKIT, "apply", "--bogus"], capture_output=True, text=True,
                         env=environ())
    assert run.returncode == UsageError.exit_code and run.stdout == ""
    assert run.stderr.startswith("portkit: No such option") and run.stderr.count("\n") == 1
    assert "--bogus" in run.stderr and run.stderr.endswith(" (see portkit apply --help)\n")


def test_the_exit_code_table_is_documented():
    table = (Path(__file__).parents[2] / "docs" / "exit-codes.md").read_text()
    from portkit import errors

    for name in dir(errors):
        cls = getattr(errors, name)
        if isinstance(cls, type) and issubclass(cls, errors.PortkitError):
            code = "128+N" if cls is errors.Interrupted else str(cls.exit_code)
            assert f"| {code} | `{name}` |" in table, name
