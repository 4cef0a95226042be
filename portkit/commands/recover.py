"""`portkit recover`: roll back what an interrupted portkit left half done."""

from __future__ import annotations

from pathlib import Path

import click

from portkit import tree as tree_mod
from portkit.commands.common import TREE_OPTION, fails_cleanly
from portkit.transaction import recover, recovered_line
from portkit.transaction import tree_lock as lock_tree


@click.command("recover")
@TREE_OPTION
@fails_cleanly
def recover_cmd(tree_path: Path) -> None:
    """Roll back what an interrupted portkit left half done in the tree.

    Every portkit command does this first anyway; this one does only that, and waits
    for a portkit still working on the tree (PORTKIT_LOCK_WAIT seconds) to finish.
    """
    root = tree_mod.detect(tree_path).root
    journal = None
    if (root / ".portkit").exists() or (root / ".portkit").is_symlink():
        with lock_tree(root):
            journal = recover(root)
    click.echo(recovered_line(root, journal) if journal else f"nothing to recover in {root}")
