"""The one way portkit reports a failure: a PortkitError carries a one-line message and the
exit code of its kind. The table of codes is docs/exit-codes.md; commands.common.exit_for
prints them. Every failure is raised as one of the subclasses below, never as PortkitError
itself: exit code 70 is kept for bugs in portkit (an exception that is not a PortkitError, or
a PortkitError raised without a kind), and no failure exits 1 (tests/test_exit_codes.py).
"""

from __future__ import annotations

import signal


class PortkitError(Exception):
    """A user-facing failure. The CLI prints `portkit: <message>` and exits non-zero. Raise
    one of its subclasses: a PortkitError without a kind is a bug (exit 70)."""

    exit_code = 70

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


class EditedSince(TreeError):
    """A file a killed portkit's transaction wrote was changed after the kill (it is neither
    as it was nor as the transaction wrote it): rolling back would overwrite the user's
    work, so nothing is rolled back. Every command refuses the tree until the user moves
    that file aside."""


class ApplyConflict(PortkitError):
    """A patch of the series does not apply to the tree (names the patch and the hunk)."""

    exit_code = 5


class RecordError(PortkitError):
    """portkit's own record in <tree>/.portkit cannot be trusted (damaged or planted)."""

    exit_code = 6


class BadLock(RecordError):
    """<tree>/.portkit/.lock is not a lock file portkit can take (a folder, a FIFO, a link
    planted there): a writer refuses it; a reader goes on, as without the lock."""


class BusyError(PortkitError):
    """Another portkit process holds the tree's lock."""

    exit_code = 7


class ChecksumError(PortkitError):
    """A download does not have the checksum it must have (or is truncated, or lacks the
    file it must hold)."""

    exit_code = 8


class SpecError(PortkitError):
    """A tree spec, feature, anchor set, manifest or model is malformed or unknown, or names
    something that does not exist (a PyPI version, a git revision or repository)."""

    exit_code = 9


class BuildError(PortkitError):
    """Configuring, compiling or building a tree failed."""

    exit_code = 10


class ToolMissing(PortkitError):
    """A step needs a program (git, GNU patch, cmake, a C++ compiler) that is not on PATH, or
    a system file that is not installed."""

    exit_code = 11


class GitMissing(ToolMissing):
    """A step needs the git program and there is none on PATH."""


class InputError(PortkitError):
    """An input portkit was given (a --series folder or a patch in it, a saved drift report, a
    tree path, a model file) does not exist, cannot be read, or is not what it must be."""

    exit_code = 12


class UnreadablePatch(InputError):
    """One patch file of a series cannot be read (not a patch, a malformed diff, a path no
    patch may name): the message names the file and why. `drift` reports it as that
    patch's verdict; elsewhere it refuses the series."""


class CoverLetter(UnreadablePatch):
    """The file is a format-patch cover letter (`[PATCH 0/N]`, no diff): not a patch, and no
    fault either. A series keeps it as it is, in its place."""


class FileError(PortkitError):
    """Reading or writing a file failed for a reason of the system's (an OSError portkit did
    not expect: no space left, permission denied, a file that vanished)."""

    exit_code = 13


class ToolFailed(PortkitError):
    """A program portkit runs (git, GNU patch, pip, the validation harness) failed in a way
    that says nothing about the tree or the series."""

    exit_code = 14


class FetchError(PortkitError):
    """A download or a fetch failed because the network, the index or the remote did not
    answer (try again later); a thing that does not exist is a SpecError."""

    exit_code = 15


class ValidationFailed(PortkitError):
    """`validate` ran to the end and a check fails (the report says which): a verdict on the
    port, like drift's 20, not a failure to run."""

    exit_code = 21


class Interrupted(PortkitError):
    """Ctrl-C or SIGTERM: exit 128 + the signal number, as a shell reports it."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(f"interrupted ({signal.Signals(signum).name})")
        self.exit_code = 128 + signum
