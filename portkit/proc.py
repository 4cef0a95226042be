"""The one way portkit runs a subprocess, and the one way it runs git.

No subprocess reads portkit's standard input (a command that would wait for it gets an
empty one instead). Every git call goes through `git()`, which seals git off from the
user's and the system's configuration and from GIT_* variables of the calling
environment, so that what portkit computes with git does not depend on who runs it. One
key of the user's configuration gets through: `safe.directory` (`safe_directories`), the
repositories of other users (a Docker bind mount) that the user told git to trust; it
decides only whether git works in a repository at all, never what it computes there.

The portkit program keeps every temporary file of its own and of the programs it runs in
one folder of its own, $TMPDIR/portkit-run-*, beside a lock file it holds (flock) for as
long as it lives (`own_scratch`): a later run removes the folders whose owner is gone (killed
outright), and never a live run's.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from portkit.errors import GitMissing, ToolFailed, ToolMissing, TreeError
from portkit.transaction import checkpoint

# Settings that decide the bytes git reads and writes, or what it may run on its own:
# line endings are never converted, no file-system monitor or hook is started.
GIT_SETTINGS = (
    "core.autocrlf=false", "core.eol=lf", "core.safecrlf=false", "core.fsmonitor=false",
    "core.hooksPath=" + os.devnull, "core.quotePath=false", "apply.whitespace=nowarn",
    # the user's attributes (~/.config/git/attributes: `*.m binary`, a diff driver) would
    # change portkit's diffs too; only the ones portkit gives count
    "core.attributesFile=" + os.devnull,
)


def run(
    args: Sequence[str | Path],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    capture: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise a PortkitError naming it and its last output line."""
    argv = [str(a) for a in args]
    name = command_name(argv)
    try:
        with subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
        ) as child:
            try:
                checkpoint(f"run:{name}")
                out, err = child.communicate()
            except BaseException:
                child.kill()  # an interrupt ends the child too
                raise
    except FileNotFoundError as exc:
        if Path(argv[0]).name == "git":
            raise GitMissing("git not found: install git, or put it on PATH") from exc
        raise ToolMissing(f"command not found: {argv[0]}") from exc
    # Bytes as the program wrote them: a CR stays a CR (a CRLF file's diff is a diff of CRLF
    # lines; text mode's universal newlines would drop them), and bytes that are not UTF-8
    # (a patch's Latin-1 line, a path) come through as they are (surrogateescape, as
    # portkit reads every patch).
    proc = subprocess.CompletedProcess(argv, child.returncode, _text(out), _text(err))
    if check and proc.returncode != 0:
        raise _tool_failed(proc)
    return proc


def _tool_failed(proc: subprocess.CompletedProcess[str]) -> ToolFailed:
    """The failure of a command that exited non-zero: its name, code and last line."""
    return ToolFailed(f"{command_name(list(proc.args))} failed (exit {proc.returncode}): "
                      f"{last_line(proc)}")


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", "surrogateescape")


def command_name(argv: list[str]) -> str:
    """The program and its first words, without options: `git apply`, `cmake /src`."""
    words: list[str] = []
    for i, arg in enumerate(argv):
        if not arg.startswith("-") and (i == 0 or argv[i - 1] != "-c"):
            words.append(Path(arg).name if i == 0 else arg)
            if len(words) == 2:
                break
    return " ".join(words)


def last_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The last non-blank line a command printed (stderr first: where errors go)."""
    out = (proc.stderr or "") + (proc.stdout or "")
    return next((ln.strip() for ln in reversed(out.strip().splitlines()) if ln.strip()), "")


def git_env(ceiling: Path | None = None) -> dict[str, str]:
    """The environment of every git call: no GIT_* variable of the caller (a hook's GIT_DIR
    would redirect it), no global or system configuration, no optional index writes; the
    user's safe.directory entries as git's command-line configuration. One GIT_* variable
    is kept: git's own GIT_TEST_ASSUME_DIFFERENT_OWNER, which takes every repository for
    another user's; it can only make git refuse more, and it lets portkit's tests show what
    a checkout of another user's does without a second user."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GIT_") or k == "GIT_TEST_ASSUME_DIFFERENT_OWNER"}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", GIT_OPTIONAL_LOCKS="0",
               GIT_TERMINAL_PROMPT="0", LC_ALL="C", **safe_directory_env())
    if ceiling is not None:  # never look for a repository at or above this folder
        env["GIT_CEILING_DIRECTORIES"] = str(ceiling)
    return env


# The caller's GIT_* variables that choose the configuration the user's git reads: the global
# file (GIT_CONFIG_GLOBAL; else ~/.gitconfig and $XDG_CONFIG_HOME/git/config, from HOME and
# XDG_CONFIG_HOME), the system one, and the environment's command-line entries.
_USER_CONFIG = re.compile(r"GIT_CONFIG_(GLOBAL|SYSTEM|NOSYSTEM|COUNT|PARAMETERS|KEY_\d+|"
                          r"VALUE_\d+)")
# The scopes git reads safe.directory from (its "protected" configuration): a repository's
# own configuration could otherwise declare itself safe.
_PROTECTED = ("system", "global", "command")


def safe_directories() -> tuple[str, ...]:
    """The user's safe.directory entries, in git's order (system, global, the environment's
    command-line configuration), as git would read them for the user: `git config
    --get-all` under the user's environment, outside any repository. An empty entry stays:
    it empties the list before it, for portkit's git as for the user's. No entry when git
    cannot tell (no git, a configuration it refuses, a git before 2.26's --show-scope)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GIT_") or _USER_CONFIG.fullmatch(k)}
    return _safe_directories(tuple(sorted(env.items())))


@functools.cache
def _safe_directories(environ: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    if shutil.which("git") is None:
        return ()
    with tempfile.TemporaryDirectory(prefix="portkit-nowhere-") as nowhere:
        env = {**dict(environ), "LC_ALL": "C", "GIT_CEILING_DIRECTORIES": str(Path(nowhere).parent)}
        done = run(["git", "config", "--show-scope", "-z", "--get-all", "safe.directory"],
                   cwd=Path(nowhere), env=env, check=False)
    if done.returncode != 0:  # 1: no entry; else git could not read the configuration
        return ()
    fields = done.stdout.split("\0")
    return tuple(value for scope, value in zip(fields[0::2], fields[1::2], strict=False)
                 if scope in _PROTECTED)


def safe_directory_env() -> dict[str, str]:
    """The user's safe.directory entries as git's command-line configuration in the
    environment (GIT_CONFIG_COUNT, GIT_CONFIG_KEY_n, GIT_CONFIG_VALUE_n: protected, so git
    honours them), and nothing else: GIT_CONFIG_COUNT is always set, GIT_CONFIG_PARAMETERS
    always empty, so that none of the caller's own entries count (GitPython runs git in the
    caller's environment plus these)."""
    values = safe_directories()
    env = {"GIT_CONFIG_COUNT": str(len(values)), "GIT_CONFIG_PARAMETERS": ""}
    for i, value in enumerate(values):
        env[f"GIT_CONFIG_KEY_{i}"] = "safe.directory"
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


_DUBIOUS = re.compile(r"dubious ownership in repository at '(.*)'")


def _ownership_refused(stderr: str, where: Path | str) -> TreeError:
    """The one line of git's refusal (in `stderr`) of a repository owned by another user: what
    helps (portkit's git honours safe.directory where the user's git reads it; git's own
    advice names the global file only)."""
    found = _DUBIOUS.search(stderr)
    repo = found.group(1) if found is not None and found.group(1) else str(where)
    return TreeError(f"git refuses the repository at {repo}: it belongs to another user "
                     f"(git's \"dubious ownership\"); mark it safe in the global or the system "
                     f"git configuration of the user running portkit (git config --global "
                     f"--add safe.directory {repo}), or run portkit as its owner")


def git(args: Sequence[str | Path], *, cwd: Path, check: bool = True,
        ceiling: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `git ARGS` in `cwd`, sealed from the user's configuration (see GIT_SETTINGS).

    With `ceiling`, git finds no repository enclosing `cwd` (it works on plain files). A
    repository git refuses as another user's is refused (TreeError), with check or without.
    """
    if shutil.which("git") is None:
        raise GitMissing("git not found: install git, or put it on PATH")
    settings = [arg for setting in GIT_SETTINGS for arg in ("-c", setting)]
    done = run(["git", "--no-optional-locks", *settings, *args], cwd=cwd, check=False,
               env=git_env(ceiling))
    if done.returncode != 0 and _DUBIOUS.search(done.stderr):
        raise _ownership_refused(done.stderr, cwd)
    if check and done.returncode != 0:
        raise _tool_failed(done)
    return done


def stream(
    args: Sequence[str | Path],
    log: Path,
    *,
    on_line: Callable[[str], None],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """Run a long command with its output going to `log`, calling `on_line` for each line
    (for a progress display); return its exit code."""
    argv = [str(a) for a in args]
    with log.open("w") as out, subprocess.Popen(
        argv, cwd=cwd, env=env, text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    ) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                out.write(line)
                on_line(line.rstrip("\n"))
        except BaseException:
            proc.kill()  # an interrupt ends the build too, instead of waiting for it
            raise
        return proc.wait()


# -- the program's own scratch folder ---------------------------------------------------------

RUN_PREFIX = "portkit-run-"


class _Own:
    folder: Path | None = None
    lock: Path | None = None
    fd: int | None = None


def sweep_runs(base: Path) -> list[Path]:
    """Remove the scratch folders under `base` whose owner process is gone: its lock file
    is free (the kernel released the flock when it died). A live owner holds it; another
    user's are left alone. Returns what was removed."""
    removed: list[Path] = []
    try:
        locks = [e for e in base.iterdir() if e.name.startswith(RUN_PREFIX)
                 and e.name.endswith(".lock")]
    except OSError:
        return removed
    for lock in locks:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    continue  # its owner lives
                raise
            folder = lock.with_name(lock.name.removesuffix(".lock"))
            shutil.rmtree(folder, ignore_errors=True)
            lock.unlink(missing_ok=True)
            removed.append(folder)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def own_scratch() -> Path | None:
    """Give this process a scratch folder of its own (see the module's docstring) and make
    it the temporary folder of everything it makes and runs (tempfile, $TMPDIR); first sweep
    the ones of portkit processes that were killed. None if $TMPDIR cannot be written."""
    base = Path(tempfile.gettempdir())
    sweep_runs(base)
    name = f"{RUN_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    lock, folder, unnamed = base / f"{name}.lock", base / name, base / f".{name}.lock"
    try:
        fd = os.open(unnamed, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError:
        return None
    try:  # the lock is held before a sweeper can see it, and the folder never lacks one
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(unnamed, lock)
        folder.mkdir(mode=0o700)
    except OSError:
        os.close(fd)
        unnamed.unlink(missing_ok=True)
        lock.unlink(missing_ok=True)
        return None
    _Own.folder, _Own.lock, _Own.fd = folder, lock, fd
    tempfile.tempdir = str(folder)
    os.environ["TMPDIR"] = str(folder)
    return folder


def drop_scratch() -> None:
    """Remove this process's scratch folder (at its end)."""
    if _Own.folder is None or _Own.lock is None or _Own.fd is None:
        return
    shutil.rmtree(_Own.folder, ignore_errors=True)
    _Own.lock.unlink(missing_ok=True)
    os.close(_Own.fd)
    _Own.folder = _Own.lock = _Own.fd = None
