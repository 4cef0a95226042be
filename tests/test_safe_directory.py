"""A checkout owned by another user (a Docker bind mount): portkit's git calls are sealed from
the user's git configuration, all but the user's `safe.directory` (global, system and the
environment's command-line entries, in git's order), which they honour as git does; where git
still refuses the repository, one line says what helps, and no other key of the user's
configuration reaches portkit's git.

git's own GIT_TEST_ASSUME_DIFFERENT_OWNER=1 makes it take every repository for another
user's: the refusal, without a second user."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from portkit import proc
from portkit import tree as tree_mod
from portkit.cli import cli
from portkit.errors import TreeError

from .conftest import git, tree_bytes

PORTKIT = str(Path(sys.executable).with_name("portkit"))


def _git_takes_every_repository_for_another_users() -> bool:
    """Whether this git has the switch (and safe.directory): it refuses a repository of
    this user's under it."""
    with tempfile.TemporaryDirectory() as work:
        sealed = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
        subprocess.run(["git", "init", "--quiet", work], env=sealed, check=True)
        done = subprocess.run(["git", "rev-parse", "--git-dir"], cwd=work, capture_output=True,
                              text=True, env={**sealed, "GIT_TEST_ASSUME_DIFFERENT_OWNER": "1"})
    return done.returncode != 0 and "dubious ownership" in done.stderr


pytestmark = pytest.mark.skipif(not _git_takes_every_repository_for_another_users(),
                                reason="a git without safe.directory's test switch")


def _user_env(tmp_path: Path, *, global_text: str = "", system_text: str | None = None,
              **more: str) -> dict[str, str]:
    """The environment of a user whose global git configuration is `global_text` (and whose
    system one is `system_text`, or none), in whose eyes every repository is another user's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GIT_", "PORTKIT_", "PIP_"))}
    config = tmp_path / "user.gitconfig"
    config.write_text(global_text)
    env.update(GIT_CONFIG_GLOBAL=str(config), GIT_TEST_ASSUME_DIFFERENT_OWNER="1",
               HOME=str(tmp_path), PORTKIT_CACHE=str(tmp_path / "cache"))
    if system_text is None:
        env["GIT_CONFIG_NOSYSTEM"] = "1"
    else:
        (tmp_path / "system.gitconfig").write_text(system_text)
        env["GIT_CONFIG_SYSTEM"] = str(tmp_path / "system.gitconfig")
    env.update(more)
    return env


def _safe(*values: str) -> str:
    return "[safe]\n" + "".join(f"\tdirectory = {v}\n" for v in values)


def _portkit(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PORTKIT, *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def test_git_knows_the_switch(fixture_git_tree, tmp_path):
    """The test's premise: under the switch, sealed git refuses the checkout."""
    root = fixture_git_tree("old")
    env = _user_env(tmp_path, GIT_CONFIG_GLOBAL=os.devnull)
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 128 and "dubious ownership" in done.stderr


@pytest.mark.parametrize("where", ["global", "global *", "system", "environment"])
def test_tree_info_reads_another_users_checkout_the_user_marked_safe(fixture_git_tree,
                                                                    tmp_path, where):
    """`portkit tree info` of a plain checkout reads its pin from git HEAD: with the checkout
    in the user's safe.directory (the global file GIT_CONFIG_GLOBAL names, the system one, or
    git's configuration in the environment), it is read as git reads it."""
    root = fixture_git_tree("old").resolve()
    head = git(root, "rev-parse", "HEAD").strip()
    if where == "global":
        env = _user_env(tmp_path, global_text=_safe(str(root)))
    elif where == "global *":
        env = _user_env(tmp_path, global_text=_safe("/elsewhere", "*"))
    elif where == "system":
        env = _user_env(tmp_path, system_text=_safe(str(root)))
    else:
        env = _user_env(tmp_path, GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="safe.directory",
                        GIT_CONFIG_VALUE_0=str(root))
    done = _portkit(env, "tree", "info", "--format", "json", str(root))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pin"] == head
    assert json.loads(done.stdout)["pin_source"] == "git HEAD"


@pytest.mark.parametrize("config", ["", "elsewhere", "reset"])
def test_tree_info_of_another_users_checkout_not_marked_safe_says_what_helps(
        fixture_git_tree, tmp_path, config):
    """Not in safe.directory (none, another folder's, or the entry reset by an empty one after
    it, as git reads the list): one line naming the checkout and the remedy, exit 4 (a tree
    portkit cannot work on), never `pin: unknown` as if the checkout had no HEAD."""
    root = fixture_git_tree("old").resolve()
    text = {"": "", "elsewhere": _safe(str(tmp_path / "other")),
            "reset": _safe(str(root), "")}[config]
    done = _portkit(_user_env(tmp_path, global_text=text), "tree", "info", str(root))
    lines = done.stderr.splitlines()
    assert done.returncode == TreeError.exit_code, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr and done.stdout == ""
    assert lines[0].startswith(f"portkit: git refuses the repository at {root}: it belongs "
                               f"to another user"), lines[0]
    assert f"git config --global --add safe.directory {root}" in lines[0]


def _note_series(tmp_path: Path, llama: Path) -> Path:
    """A series of one mail adding a line to the fork's src/llama-graph.h."""
    series = tmp_path / "fixes"
    series.mkdir()
    (series / "0001-note.patch").write_text(
        "From: Some One <one@example.invalid>\nDate: Tue, 3 Mar 2026 09:00:00 +0100\n"
        "Subject: [PATCH] graph: a note\n\n---\n" + _diff(llama, "src/llama-graph.h"))
    return series


def _diff(llama: Path, rel: str) -> str:
    work = llama.parent.parent.parent / ".note-diff"  # beside the fork
    for side in ("a", "b"):
        (work / side / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / side / rel).write_text((llama / rel).read_text())
    new = work / "b" / rel
    new.write_text(new.read_text().replace("struct ggml_cgraph;\n",
                                           "struct ggml_cgraph;\n// a note\n"))
    done = subprocess.run(["git", "diff", "--no-index", "--no-prefix", f"a/{rel}", f"b/{rel}"],
                          cwd=work, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    return done.stdout


@pytest.mark.parametrize("marked", [True, False])
def test_apply_in_another_users_fork(fixture_fork, tmp_path, monkeypatch, marked):
    """`apply` asks git (sealed, portkit.proc.git) whether the fork's files are committed:
    marked safe, the series is applied; not marked, the one line, exit 4, nothing written."""
    fork = fixture_fork("old")
    root = fork.root.resolve()
    series = _note_series(tmp_path, root / "llama" / "llama.cpp")
    home = tmp_path / "home"
    home.mkdir()
    env = _user_env(home, global_text=_safe(str(root)) if marked else "")
    for name in [k for k in os.environ if k.startswith("GIT_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = tree_bytes(root)
    done = CliRunner().invoke(cli, ["apply", "--force", "--tree", str(root),
                                    "--series", str(series)])
    if marked:
        assert done.exit_code == 0, done.output
        assert tree_bytes(root) != before
        return
    assert done.exit_code == TreeError.exit_code, done.output
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"portkit: git refuses the repository at {root}: ")
    assert tree_bytes(root) == before


def _scoped(listing: str) -> list[str]:
    """`git config --list --show-scope`'s entries other than portkit's own settings."""
    own = {f"command\t{s.split('=', 1)[0].lower()}={s.split('=', 1)[1]}"
           for s in proc.GIT_SETTINGS}
    return [ln for ln in listing.splitlines() if ln not in own]


HOSTILE = ("[core]\n\tabbrev = 12\n\tautocrlf = true\n[alias]\n\tst = status\n"
           "[user]\n\tname = Leaked\n")


def test_only_safe_directory_of_the_users_configuration_reaches_portkits_git(
        tmp_path, monkeypatch):
    """What portkit's git sees of the user's configuration: the safe.directory entries, in
    git's order (system, global, the environment's GIT_CONFIG_COUNT entries, then
    GIT_CONFIG_PARAMETERS; an empty one kept: it resets the list), as command-line
    configuration (which git honours for safe.directory); no other key of the global or
    system file or of the environment, through portkit.proc.git or through GitPython."""
    (tmp_path / "global").write_text(HOSTILE + _safe("/g1", "", "/g 2=x"))
    (tmp_path / "system").write_text(HOSTILE + _safe("/s1"))
    for name in [k for k in os.environ if k.startswith("GIT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "global"))
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", str(tmp_path / "system"))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'core.abbrev'='9' 'safe.directory'='/p'")
    monkeypatch.setenv("GIT_CONFIG_COUNT", "2")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "safe.directory")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "/c1")
    monkeypatch.setenv("GIT_CONFIG_KEY_1", "user.email")
    monkeypatch.setenv("GIT_CONFIG_VALUE_1", "leaked@example.invalid")
    safe = ["/s1", "/g1", "", "/g 2=x", "/c1", "/p"]
    work = tmp_path / "work"
    work.mkdir()
    listing = proc.git(["config", "--list", "--show-scope"], cwd=work, ceiling=tmp_path).stdout
    assert _scoped(listing) == [f"command\tsafe.directory={v}" for v in safe]
    repo = tmp_path / "repo"
    git(tmp_path, "init", "--quiet", str(repo))
    listing = tree_mod._repo(repo).git.config("--list", "--show-scope")
    assert [ln for ln in _scoped(listing) if not ln.startswith("local\t")] == [
        f"command\tsafe.directory={v}" for v in safe]
