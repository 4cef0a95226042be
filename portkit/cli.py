"""The command line: the `portkit` group over the commands (one module each under
portkit/commands/), and the program's entry point."""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Callable
from contextlib import suppress
from types import FrameType
from typing import NoReturn

import click

from portkit import IGNORED, STOPPING, __version__
from portkit.commands.common import _raise_interrupted, exit_for
from portkit.drift.model import ATTENTION_EXIT
from portkit.errors import Interrupted, UsageError
from portkit.proc import drop_scratch, own_scratch
from portkit.transaction import checkpoint, interrupt_note, wake

# Each command's module, loaded when the command runs (or --help lists them all): `portkit
# drift` need not import what apply, validate and rebase need, and starts that much sooner.
COMMANDS = {
    "tree": "portkit.commands.tree:tree",
    "anchors": "portkit.commands.anchors:anchors_cmd",
    "render": "portkit.commands.render:render_cmd",
    "apply": "portkit.commands.apply:apply_cmd",
    "validate": "portkit.commands.validate:validate_cmd",
    "drift": "portkit.commands.drift:drift_cmd",
    "rebase": "portkit.commands.rebase:rebase_cmd",
    "recover": "portkit.commands.recover:recover_cmd",
}


class _Commands(click.Group):
    """The group over COMMANDS, in their order, each imported when it is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module, name = where.split(":")
        command = getattr(importlib.import_module(module), name)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="portkit")
def cli() -> None:
    """Port features and patch series across drifting vendored llama.cpp trees.

    \b
    The pipeline:  tree -> index -> anchors -> render -> apply -> validate
                                  `-> drift report / rebase of an existing series
    Start with:    portkit tree info .        (what portkit sees in your checkout)
                   portkit anchors --tree .   (where each part of a feature belongs)
                   portkit drift --tree pypi:llama-cpp-python==0.3.19   (in a fork)
    """


class _Late:
    """A signal that came once the command was over (noted, not raised)."""

    signum: int | None = None


def _note(signum: int, _frame: FrameType | None) -> None:
    if _Late.signum is None:
        _Late.signum = signum
    wake()


def _handlers(handler: Callable[[int, FrameType | None], None] | None) -> None:
    """Every stopping signal (but those the caller left ignored) to `handler`; None: SIGINT
    raises KeyboardInterrupt and SIGTERM, SIGHUP raise Interrupted (a transaction under way
    rolls back)."""
    for signum in STOPPING:
        if signum in IGNORED:
            continue
        if handler is not None:
            signal.signal(signum, handler)
        elif signum == signal.SIGINT:
            signal.signal(signum, signal.default_int_handler)
        else:
            signal.signal(signum, _raise_interrupted)


def _code(exc: SystemExit) -> int:
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    click.echo(f"portkit: {exc.code}", err=True)
    return 1


def _report(failure: BaseException) -> int:
    """The one line of a failure (click's own ones in portkit's format too) and its code."""
    try:
        if isinstance(failure, click.UsageError):
            where = failure.ctx.command_path if failure.ctx else "portkit"
            click.echo(f"portkit: {failure.format_message().rstrip('.')} (see {where} --help)",
                       err=True)
            return UsageError.exit_code
        if isinstance(failure, click.ClickException):
            click.echo(f"portkit: {failure.format_message()}", err=True)
            return failure.exit_code
        exit_for(failure)  # Ctrl-C outside a command too
    except SystemExit as exc:
        return _code(exc)


def main() -> NoReturn:
    """The `portkit` program. Every signal ends it with one line and 128+N: while it starts
    (portkit/__init__.py), while a command runs (Interrupted: a transaction rolls back), and
    once the command is over (the line says what it left, e.g. a fork move complete)."""
    _handlers(None)
    failure: BaseException | None = None
    code = 0
    try:  # (a signal while the scratch folder is made is one line too: see test_kill)
        own_scratch()
        result = cli.main(prog_name="portkit", standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except BaseException as exc:
        failure = exc
    _handlers(_note)  # from here on a signal is noted, not raised: the end is not cut short
    checkpoint("end")
    if isinstance(failure, SystemExit):
        code = _code(failure)
    elif failure is not None:
        code = _report(failure)
    _end(code, reported=failure is not None and not isinstance(failure, SystemExit))


def _end(code: int, *, reported: bool) -> NoReturn:
    """Flush, tidy and exit; a signal that came once the command was over (and had said
    nothing yet) is told in one line, with what the command left, and exits 128+N."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):
            stream.flush()
    drop_scratch()
    if _Late.signum is not None and (code in (0, ATTENTION_EXIT) and not reported):
        with suppress(OSError):
            os.write(2, f"portkit: {Interrupted(_Late.signum).message}; "
                        f"{interrupt_note()}\n".encode())
        code = 128 + _Late.signum
    os._exit(code)  # no interpreter shutdown: no window where a signal kills it unheard
