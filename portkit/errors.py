"""The one way portkit reports a failure: a PortkitError carries a one-line message."""


class PortkitError(Exception):
    """A user-facing failure. The CLI prints `portkit: <message>` and exits non-zero."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class AnchorError(PortkitError):
    """An anchor could not be resolved to exactly one place."""

    exit_code = 3
