"""What every command shares: one line and one exit code for every failure
(docs/exit-codes.md), the roll-back of a half-done change before a tree is used, and the
options that name a tree, a feature and a format."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TypeVar

import click

from portkit import tree as tree_mod
from portkit.errors import FileError, GitMissing, Interrupted, PortkitError, UsageError
from portkit.features import DEFAULT_FEATURE
from portkit.transaction import interrupt_note, settle

F = TypeVar("F", bound=Callable[..., Any])

_STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _raise_interrupted(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Interrupted like Ctrl-C does, so that a transaction that is
    under way rolls back before the process ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise_interrupted) for s in _STOPPING_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _git_not_found(exc: BaseException) -> bool:
    """GitPython's "no git program" (only where GitPython was loaded: it is imported when a
    git repository is read, not at the start of every command)."""
    gitpython = sys.modules.get("git.exc")
    return gitpython is not None and isinstance(exc, gitpython.GitCommandNotFound)


def exit_for(exc: BaseException) -> NoReturn:
    """Print the one line a failure deserves and exit with its code (docs/exit-codes.md);
    anything that is not a PortkitError of a kind is a bug in portkit: exit 70
    (PORTKIT_DEBUG=1 shows the trace). Nothing leaves with exit 1."""
    if isinstance(exc, KeyboardInterrupt | click.Abort):
        exc = Interrupted(signal.SIGINT)
    elif _git_not_found(exc):
        exc = GitMissing("git not found: install git, or put it on PATH")
    elif isinstance(exc, OSError):
        exc = file_error(exc)
    elif isinstance(exc, click.ClickException) and not isinstance(exc, click.UsageError) \
            and exc.exit_code == 1:  # click's own catch-all code: give it a kind
        kind = FileError if isinstance(exc, click.FileError) else UsageError
        exc = kind(exc.format_message())
    if isinstance(exc, Interrupted):
        click.echo(f"portkit: {exc.message}; {interrupt_note()}", err=True)
        sys.exit(exc.exit_code)
    if isinstance(exc, PortkitError):
        kindless = type(exc) is PortkitError
        click.echo(f"portkit: {exc.message}" + (" (internal error: a failure raised without "
                                                 "its kind; report it)" if kindless else ""),
                   err=True)
        sys.exit(exc.exit_code)
    if isinstance(exc, SystemExit | click.exceptions.Exit | click.ClickException):
        raise exc
    if os.environ.get("PORTKIT_DEBUG"):
        raise exc
    click.echo(f"portkit: internal error ({type(exc).__name__}: {exc}); "
               f"rerun with PORTKIT_DEBUG=1 and report it", err=True)
    sys.exit(70)


def file_error(exc: OSError) -> FileError:
    """An OSError that no step turned into a failure of its own kind: the file, and what the
    system said (no space left, permission denied, ...), exit 13."""
    said = exc.strerror or str(exc) or type(exc).__name__
    where = exc.filename if exc.filename is not None else ""
    return FileError(f"{said}: {where}" if where != "" else said)


def fails_cleanly(fn: F) -> F:
    """Turn any failure of a command into one line on stderr and its exit code."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with signals_interrupt():
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:  # Ctrl-C and SIGTERM end in one line too
                exit_for(exc)

    return wrapper  # type: ignore[return-value]


def refuse_input(option: str, output: Path, inputs: Iterable[Path], what: str) -> None:
    """An output never goes where it would change what it is made of: a file of the series,
    anything in a target or base tree, a saved report; symbolic links followed to decide."""
    where = output.resolve()
    for given in inputs:
        real = given.resolve()
        if where.is_relative_to(real) if real.is_dir() else where == real:
            raise UsageError(f"{option} {output} would write into {given}, an input of {what}; "
                             f"write it somewhere else")


def open_tree(path: Path) -> tree_mod.Tree:
    """Detect the tree at `path`, having rolled back what a killed portkit left half done."""
    info = tree_mod.detect(path)
    line = settle(info.root, writer=False)
    if line:
        click.echo(f"portkit: {line}", err=True)
    return info


TREE_OPTION = click.option(
    "--tree", "tree_path", type=click.Path(path_type=Path), default=Path("."), show_default=True,
    help="The tree: a llama.cpp checkout, an ollama-style fork or a llama-cpp-python sdist.",
)
FORMAT_TABLE_JSON = click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
)


FEATURE_OPTION = click.option("--feature", default=DEFAULT_FEATURE, show_default=True,
                              help="A feature under templates/.")


