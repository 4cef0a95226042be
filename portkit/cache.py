"""Where portkit keeps what it downloads, unpacks and computes, and how it fills it safely.

$PORTKIT_CACHE, or ~/.cache/portkit.

Several portkit processes may fill the cache at once, and any of them may be interrupted.
So a download or an unpacked tree is made in a scratch folder beside its destination and
published by renaming it, one process at a time per destination (`exclusive`); a scratch
folder is removed on any exception, Ctrl-C or SIGTERM (`scratch`), and one left behind by a
killed process is swept away later (`sweep`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from portkit.errors import FetchError, SpecError, ToolFailed
from portkit.paths import EXECUTABLE, REGULAR, SYMLINK
from portkit.proc import run

# Prefixes of the scratch folders portkit makes inside the cache; anything else is left alone.
SCRATCH_PREFIXES = (".unpack-", ".clone-", ".copy-", ".download-", ".old-")
STALE_AFTER = 3600.0  # seconds: a scratch folder that old and unlocked has no owner left
# When this process started, near enough (portkit is imported first thing): what another
# process made after it was made "at the same time".
STARTED = time.time()


def cache_root() -> Path:
    root = Path(os.environ.get("PORTKIT_CACHE") or Path.home() / ".cache" / "portkit")
    root.mkdir(parents=True, exist_ok=True)
    return root


def cache_dir(*parts: str) -> Path:
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def note(message: str) -> None:
    """One line of news on stderr (stdout stays the command's answer)."""
    sys.stderr.write(f"portkit: {message}\n")
    sys.stderr.flush()


@contextmanager
def exclusive(name: str, what: str) -> Iterator[Path]:
    """Hold the cache-wide lock `name` (an flock on a file under locks/): one process at a
    time prepares a given destination; the others wait, then find it made. Yields the lock
    file, where the holder may leave a note for the next one."""
    path = cache_dir("locks") / f"{name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            note(f"waiting for another portkit process to finish {what}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def terminable() -> Iterator[None]:
    """Let SIGTERM unwind the stack like Ctrl-C does, so that `finally` blocks run."""
    if threading.current_thread() is not threading.main_thread() or (
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def lay_down(root: Path, files: Mapping[str, bytes | None],
             modes: Mapping[str, int] | None = None) -> None:
    """Write `files` (paths relative to `root`) into a folder portkit owns (a scratch copy,
    a cache entry; never a user's tree, which only the transaction writes): bytes are
    written, folders made as needed; None removes the file. With `modes` (git's, by path),
    a file is made executable (100755) or a symbolic link whose target is its bytes
    (120000), as git would check it out."""
    for rel, data in files.items():
        path = root / rel
        if path.is_symlink() or (data is None and path.exists()):
            path.unlink()
        if data is None:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = None if modes is None else modes.get(rel, REGULAR)
        if mode == SYMLINK:
            os.symlink(os.fsdecode(data), path)
            continue
        path.write_bytes(data)
        if mode is not None:
            path.chmod(0o755 if mode == EXECUTABLE else 0o644)


def read_entry(path: Path) -> tuple[bytes, int] | None:
    """A file as git sees it, never following a symbolic link: its bytes (a link's target,
    for a link) and its git mode; None when there is no file (or something else is there)."""
    try:
        st = path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        return os.fsencode(os.readlink(path)), SYMLINK
    if stat.S_ISREG(st.st_mode):
        return path.read_bytes(), EXECUTABLE if st.st_mode & 0o100 else REGULAR
    return None


@contextmanager
def scratch(parent: Path, prefix: str) -> Iterator[Path]:
    """A new, locked, empty folder in `parent` to prepare something in. Rename it into place
    when it is complete; whatever is still there at the end, however it ends, is removed."""
    with terminable():
        path = _new_folder(parent, prefix)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
            os.close(fd)


def _new_folder(parent: Path, prefix: str) -> Path:
    """Like tempfile.mkdtemp, but with the umask's permissions rather than 0700: the folder
    becomes a tree or a copy that others may read."""
    while True:
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path


def _in_use(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def sweep(parent: Path, *, older_than: float = STALE_AFTER,
          prefixes: tuple[str, ...] = SCRATCH_PREFIXES) -> list[Path]:
    """Remove the scratch folders in `parent` (named by one of `prefixes`) that interrupted
    processes left: older than `older_than` seconds and locked by no one. Return what was
    removed."""
    now = time.time()
    removed = []
    for path in parent.iterdir():
        if not path.name.startswith(prefixes) or not path.is_dir() or path.is_symlink():
            continue
        try:
            age = now - path.lstat().st_mtime
        except FileNotFoundError:
            continue
        if age > older_than and not _in_use(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def publish(ready: Path, dest: Path) -> Path:
    """Rename the complete folder `ready` to `dest`, replacing an older `dest` with two
    renames (the old one is moved aside first), so that `dest` is never half made."""
    if dest.exists():
        aside = _new_folder(dest.parent, ".old-")
        dest.rename(aside / dest.name)
        ready.rename(dest)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        ready.rename(dest)
    return dest


def pip_download(args: Sequence[str], into: Path, what: str) -> None:
    """`pip download ARGS -d INTO`, saying what is downloaded. On a terminal pip's own
    progress bar shows; elsewhere pip is quiet and its last line is the error, if any.
    A failure is a SpecError when the index has no such distribution, a FetchError when the
    index did not answer, else a ToolFailed (docs/exit-codes.md)."""
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", *args, "-d", str(into)]
    note(f"downloading {what}")
    if not sys.stderr.isatty():
        proc = run([*argv, "--quiet"], check=False)
        code, said = proc.returncode, proc.stderr or ""
    else:
        # pip draws its progress bar on its stdout; send it to our stderr so that our stdout
        # stays the command's answer (e.g. the path that `tree fetch` prints).
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(),
                              stderr=subprocess.PIPE, text=True, check=False)
        code, said = done.returncode, done.stderr or ""
        sys.stderr.write(said)
    if code != 0:
        raise pip_failure(what, code, said)


# pip's words for an index that did not answer (it retries, warning each time, then says it
# found no matching distribution, as it does for one that does not exist).
_PIP_UNREACHABLE = ("Retrying (", "connection broken", "NewConnectionError",
                    "Could not fetch URL", "ConnectTimeout", "ReadTimeout")


def pip_failure(what: str, code: int, said: str) -> SpecError | FetchError | ToolFailed:
    """The error for a `pip download` of `what` that exited `code` saying `said`."""
    lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
    last = lines[-1].removeprefix("ERROR: ") if lines else f"exit {code}"
    if any(word in said for word in _PIP_UNREACHABLE):
        return FetchError(f"cannot download {what}: the package index did not answer "
                          f"(pip: {last})")
    if "No matching distribution found" in said:
        return SpecError(f"{what}: no such distribution on the package index (pip: {last})")
    return ToolFailed(f"pip download of {what} failed (exit {code}): {last}")
