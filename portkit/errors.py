"""The one way portkit reports a failure: a PortkitError carries a one-line message and the
exit code of its kind. The table of codes is docs/exit-codes.md; cli.fails_cleanly prints
them. Exit code 70 is kept for bugs in portkit (an exception that is not a PortkitError).
"""

from __future__ import annotations

import signal


class PortkitError(Exception):
    """A user-facing failure. The CLI prints `portkit: <message>` and exits non-zero."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(PortkitError):
    """A bad option or argument: nothing was looked at yet."""

    exit_code = 2


class AnchorError(PortkitError):
    """An anchor could not be resolved to exactly one place (missing or ambiguous)."""

    exit_code = 3


class TreeError(PortkitError):
    """The tree is not in a state portkit can work on: wrong pin, uncommitted or read-only
    files, not patched (for --reverse), changed since portkit patched it, symbolic links."""

    exit_code = 4


class ApplyConflict(PortkitError):
    """A patch of the series does not apply to the tree (names the patch and the hunk)."""

    exit_code = 5


class RecordError(PortkitError):
    """portkit's own record in <tree>/.portkit cannot be trusted (damaged or planted)."""

    exit_code = 6


class BusyError(PortkitError):
    """Another portkit process holds the tree's lock."""

    exit_code = 7


class ChecksumError(PortkitError):
    """A download does not have the checksum it must have."""

    exit_code = 8


class SpecError(PortkitError):
    """A tree spec, feature, anchor set or manifest is malformed or unknown."""

    exit_code = 9


class BuildError(PortkitError):
    """Configuring, compiling or building a tree failed."""

    exit_code = 10


class ToolMissing(PortkitError):
    """A step needs a program (git, GNU patch) that is not on PATH."""

    exit_code = 11


class GitMissing(ToolMissing):
    """A step needs the git program and there is none on PATH."""


class Interrupted(PortkitError):
    """Ctrl-C or SIGTERM: exit 128 + the signal number, as a shell reports it."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(f"interrupted ({signal.Signals(signum).name})")
        self.exit_code = 128 + signum
