"""portkit: port features and patch series across drifting vendored llama.cpp trees."""

import os
import sys
from types import TracebackType

__version__ = "0.1.0"

# GitPython refuses to be imported when there is no git on PATH; portkit says "git not
# found" itself, and only when a command needs git.
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")

_excepthook = sys.excepthook


def _interrupted_early(kind: type[BaseException], value: BaseException,
                       trace: TracebackType | None) -> None:
    """Ctrl-C while portkit is still starting (importing): one line, no traceback."""
    if issubclass(kind, KeyboardInterrupt):
        sys.stderr.write("portkit: interrupted (SIGINT); nothing was changed\n")
        sys.stderr.flush()
        os._exit(130)
    _excepthook(kind, value, trace)


sys.excepthook = _interrupted_early

from portkit.transaction import checkpoint  # noqa: E402 - only once Ctrl-C is one line

checkpoint("start")
