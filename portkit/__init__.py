"""portkit: port features and patch series across drifting vendored llama.cpp trees."""

import gc
import os
import signal
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

# The signals portkit ends on with one line. A signal the caller left ignored (a background
# job's SIGINT, nohup's SIGHUP) stays ignored.
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
IGNORED = frozenset(s for s in STOPPING if signal.getsignal(s) == signal.SIG_IGN)


def _stopped_early(signum: int, _frame: object) -> None:
    """A signal while the program is still starting (importing): nothing was done yet."""
    os.write(2, f"portkit: interrupted ({signal.Signals(signum).name}); nothing was "
                f"changed\n".encode())
    os._exit(128 + signum)


if os.path.basename(sys.argv[0] if sys.argv else "") == "portkit":  # the program, not a library
    for _signum in STOPPING:
        if _signum not in IGNORED:
            signal.signal(_signum, _stopped_early)
    # A run builds symbol tables of a few hundred thousand objects that live to its end, and
    # makes few reference cycles: Python's cyclic collector, at its default of a pass every
    # 700 allocations, would walk them over and over (a tenth of a drift run's time).
    gc.set_threshold(20_000, 20, 20)

from portkit.transaction import checkpoint  # noqa: E402 - only once a signal is one line

checkpoint("start")
