"""What every command shares: one line and one exit code for every failure
(docs/exit-codes.md), the roll-back of a half-done change before a tree is used, and the
options that name a tree, a feature and a format."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TypeVar

import click
from git.exc import GitCommandNotFound

from portkit import tree as tree_mod
from portkit.errors import GitMissing, Interrupted, PortkitError
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


def exit_for(exc: BaseException) -> NoReturn:
    """Print the one line a failure deserves and exit with its code; anything that is not a
    PortkitError is a bug in portkit: exit 70 (PORTKIT_DEBUG=1 shows the trace)."""
    if isinstance(exc, KeyboardInterrupt | click.Abort):
        exc = Interrupted(signal.SIGINT)
    elif isinstance(exc, GitCommandNotFound):
        exc = GitMissing("git not found: install git, or put it on PATH")
    if isinstance(exc, Interrupted):
        click.echo(f"portkit: {exc.message}; {interrupt_note()}", err=True)
        sys.exit(exc.exit_code)
    if isinstance(exc, PortkitError):
        click.echo(f"portkit: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    if isinstance(exc, OSError):
        click.echo(f"portkit: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "),
                   err=True)
        sys.exit(1)
    if isinstance(exc, SystemExit | click.exceptions.Exit | click.ClickException):
        raise exc
    if os.environ.get("PORTKIT_DEBUG"):
        raise exc
    click.echo(f"portkit: internal error ({type(exc).__name__}: {exc}); "
               f"rerun with PORTKIT_DEBUG=1 and report it", err=True)
    sys.exit(70)


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


