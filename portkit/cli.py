"""The command line: the `portkit` group over the commands (one module each under
portkit/commands/), and the program's entry point."""

from __future__ import annotations

import sys

import click

from portkit import __version__
from portkit.commands.anchors import anchors_cmd
from portkit.commands.apply import apply_cmd
from portkit.commands.common import exit_for, signals_interrupt
from portkit.commands.drift import drift_cmd
from portkit.commands.rebase import rebase_cmd
from portkit.commands.recover import recover_cmd
from portkit.commands.render import render_cmd
from portkit.commands.tree import tree
from portkit.commands.validate import validate_cmd
from portkit.errors import UsageError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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


for command in (tree, anchors_cmd, render_cmd, apply_cmd, validate_cmd, drift_cmd, rebase_cmd,
                recover_cmd):
    cli.add_command(command)


def main() -> None:
    """The `portkit` program: click's own failures (usage, Ctrl-C) in portkit's format too."""
    try:
        with signals_interrupt():
            code = cli.main(prog_name="portkit", standalone_mode=False)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "portkit"
        click.echo(f"portkit: {exc.format_message().rstrip('.')} (see {where} --help)", err=True)
        sys.exit(UsageError.exit_code)
    except click.ClickException as exc:
        click.echo(f"portkit: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except BaseException as exc:  # Ctrl-C outside a command too
        exit_for(exc)
    sys.exit(code if isinstance(code, int) else 0)
