"""Every write portkit makes to a user's tree: journaled, atomic, locked, and undone after a crash.

A transaction first writes a journal, <tree>/.portkit/.journal, holding the original bytes,
mode and owner of every file it will touch (or that the file did not exist), the folders
it will make or remove, and the sha256 each file will end with. Then it writes each file
atomically (a temporary file in the same folder, fsync, rename, fsync of the folder), and
commits by removing the journal. A process killed anywhere in between leaves the journal
behind; the next portkit command rolls the tree back from it before anything else (see
`settle`), and `portkit recover` does it on demand. Rolling back only ever moves files
towards their journaled originals, so a roll-back that is itself killed is simply done again.

Files are reached by walking the path from the tree's root one folder at a time without
following symbolic links (openat with O_NOFOLLOW): nothing portkit writes can be
redirected outside the tree, whatever is planted on the way.

One writer per tree: `tree_lock` holds an flock on <tree>/.portkit/.lock (the kernel
releases it when the process dies, however it dies); a second writer waits
PORTKIT_LOCK_WAIT seconds, then gives up with BusyError. The lock file and an empty
.portkit folder are removed when the lock is released, so that apply then --reverse leaves
the tree byte for byte as it was.

`checkpoint(name)` marks the places where a kill is interesting; the kill tests use
PORTKIT_PAUSE_AT to stop a real portkit process exactly there.
"""

from __future__ import annotations

import base64
import binascii
import errno
import fcntl
import fnmatch
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from portkit.errors import (
    BadLock,
    BusyError,
    EditedSince,
    RecordError,
    TreeError,
    UsageError,
)
from portkit.paths import EXECUTABLE, REGULAR, SYMLINK, link_problem, path_problem
from portkit.paths import RECORD_FOLDER as RECORD_FOLDER

JOURNAL = ".journal"
LOCK = ".lock"
JOURNAL_SCHEMA = "portkit-journal/1"
DEFAULT_LOCK_WAIT = 5.0
# The most portkit reads of a file it wrote under .portkit, far above anything it writes: a
# bigger one is damaged or planted, and is refused unread (it would be read whole). A
# journal holds the original bytes of every file its transaction touches (a fork move: the
# vendored files a vendor bump rewrites), a patch a whole patch, state.json names and
# checksums only.
JOURNAL_LIMIT = 1 << 30
PATCH_LIMIT = 64 << 20
STATE_LIMIT = 16 << 20

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# -- checkpoints: where the kill tests stop a real process ---------------------------------


_hits: dict[str, int] = {}


def checkpoint(point: str) -> None:
    """With PORTKIT_CHECKPOINTS=FILE, note "pid point#n" there (the n-th time this process
    reaches the point); with PORTKIT_PAUSE_AT=PATTERN (fnmatch on "point#n"), also stop at
    the first match for PORTKIT_PAUSE_SECONDS (60): time for a test to kill the process; with
    PORTKIT_PAUSE_UNTIL=FILE as well, go on as soon as FILE exists (a test's go-ahead)."""
    trace = os.environ.get("PORTKIT_CHECKPOINTS")
    if not trace:
        return
    _hits[point] = _hits.get(point, 0) + 1
    name = f"{point}#{_hits[point]}"
    pattern = os.environ.get("PORTKIT_PAUSE_AT", "")
    pause = bool(pattern) and fnmatch.fnmatchcase(name, pattern)
    with open(trace, "a") as out:
        out.write(f"{os.getpid()} {name}{' paused' if pause else ''}\n")
    if pause:
        os.environ["PORTKIT_PAUSE_AT"] = ""  # once per process
        seconds = float(os.environ.get("PORTKIT_PAUSE_SECONDS", "60"))
        until = os.environ.get("PORTKIT_PAUSE_UNTIL")
        deadline = time.monotonic() + seconds  # or until that file exists: a test's go-ahead
        while time.monotonic() < deadline and not _Pause.woken and not (
                until and os.path.exists(until)):
            time.sleep(0.01)  # a signal that raises ends it; one that is only noted: woken


class _Pause:
    woken = False


def wake() -> None:
    """End a checkpoint's pause (a signal came that does not raise: the test's signal)."""
    _Pause.woken = True


# -- paths inside a tree ---------------------------------------------------------------------


def path_parts(rel: str) -> list[str]:
    """The parts of a relative path, refused when it could leave the folder it is taken in."""
    parts = rel.split("/")
    if (not rel or rel.startswith("/") or "\0" in rel
            or any(p in ("", ".", "..") for p in parts)):
        raise RecordError(f"not a plain relative path: {rel!r}")
    return parts


def refuse_owned(root: Path, rel: str, own: bool = False) -> None:
    """The last word on where portkit writes: never into a path git or portkit keeps its own
    files in (portkit.paths), whatever asked for it; `own` lets portkit's record, under
    .portkit, through (never .git)."""
    if own and (rel == RECORD_FOLDER or rel.startswith(RECORD_FOLDER + "/")):
        rel_inside = rel[len(RECORD_FOLDER) + 1:]
        problem = path_problem(rel_inside) if rel_inside else None
    else:
        problem = path_problem(rel)
    if problem:
        raise TreeError(f"{root / rel}: portkit does not write there ({problem})")


def _link_error(root: Path, parts: Sequence[str]) -> TreeError:
    return TreeError(f"{root.joinpath(*parts)} is a symbolic link or not a folder: portkit "
                     f"does not write through links")


class TreeFiles:
    """Files under `root`, reached without following a symbolic link below it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # paths under .portkit that this writer may touch: portkit's record and journal
        # (every other path under .portkit or .git is refused, see refuse_owned)
        self.own: set[str] = set()

    def _refuse(self, rel: str) -> None:
        refuse_owned(self.root, rel, rel in self.own)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> TreeFiles:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def folder(self, parts: Sequence[str]) -> int:
        """An fd of the folder root/parts (the caller closes it); FileNotFoundError if absent."""
        fd = os.dup(self.fd)
        try:
            for i, part in enumerate(parts):
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise _link_error(self.root, parts[: i + 1]) from exc
                    raise
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, rel: str, *, links: bool = False,
             limit: int | None = None) -> tuple[bytes, os.stat_result] | None:
        """Bytes and status of a regular file, None if there is none at `rel`. With `links`,
        a symbolic link there is read too (never followed): its target, and its lstat.
        Anything else there (a folder, a FIFO, a device, a socket) is a TreeError, found
        without blocking: a FIFO is never waited on, a device never opened; so is a file of
        more than `limit` bytes, refused unread."""
        *folders, name = path_parts(rel)
        try:
            dfd = self.folder(folders)
        except FileNotFoundError:
            return None
        try:
            kind = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
            if not (stat.S_ISREG(kind) or stat.S_ISLNK(kind)):
                raise TreeError(f"{self.root / rel} is not a regular file")
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dfd)
        except FileNotFoundError:
            os.close(dfd)
            return None
        except TreeError:
            os.close(dfd)
            raise
        except OSError as exc:
            try:
                if exc.errno == errno.ELOOP and links:
                    return (os.fsencode(os.readlink(name, dir_fd=dfd)),
                            os.stat(name, dir_fd=dfd, follow_symlinks=False))
            finally:
                os.close(dfd)
            if exc.errno == errno.ELOOP:
                raise _link_error(self.root, path_parts(rel)) from exc
            if exc.errno == errno.ENXIO:  # replaced by a socket since the stat
                raise TreeError(f"{self.root / rel} is not a regular file") from exc
            raise
        os.close(dfd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise TreeError(f"{self.root / rel} is not a regular file")
            if limit is not None and st.st_size > limit:
                raise TreeError(f"{self.root / rel} holds {st.st_size} bytes, more than "
                                f"portkit ever writes there ({limit >> 20} MiB)")
            with os.fdopen(os.dup(fd), "rb") as fh:
                return fh.read(), st
        finally:
            os.close(fd)

    def exists(self, rel: str) -> bool:
        *folders, name = path_parts(rel)
        try:
            dfd = self.folder(folders)
        except FileNotFoundError:
            return False
        try:
            os.stat(name, dir_fd=dfd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(dfd)

    def write(self, rel: str, data: bytes, mode: int, owner: tuple[int, int] | None) -> None:
        """Replace `rel` by `data` atomically: readers see the old or the new file, never a
        part of one, and a crash leaves at most a temporary file beside it."""
        self._refuse(rel)
        *folders, name = path_parts(rel)
        dfd = self.folder(folders)
        tmp = _temp_name(name)
        try:
            _unlink_at(tmp, dfd)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=dfd)
            try:
                half = len(data) // 2
                _write_all(fd, data[:half])
                checkpoint(f"write:{rel}:half")
                _write_all(fd, data[half:])
                if owner is not None and os.geteuid() == 0:
                    os.fchown(fd, *owner)  # root rewriting a user's file keeps it theirs
                os.fchmod(fd, mode)
                os.fsync(fd)
            except Exception:  # a write, an owner or a mode refused: no temporary left
                os.close(fd)
                _unlink_at(tmp, dfd)
                raise
            except BaseException:  # interrupted: the rollback takes the temporary away
                os.close(fd)
                raise
            os.close(fd)
            checkpoint(f"write:{rel}:temp")
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            checkpoint(f"write:{rel}:renamed")
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def write_link(self, rel: str, target: bytes) -> None:
        """Make `rel` a symbolic link to `target` atomically (made beside it, renamed over)."""
        self._refuse(rel)
        problem = link_problem(rel, os.fsdecode(target))
        if problem:
            raise TreeError(f"{self.root / rel}: portkit does not make it ({problem})")
        *folders, name = path_parts(rel)
        dfd = self.folder(folders)
        tmp = _temp_name(name)
        try:
            _unlink_at(tmp, dfd)
            os.symlink(target, tmp, dir_fd=dfd)
            checkpoint(f"write:{rel}:temp")
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            checkpoint(f"write:{rel}:renamed")
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def remove(self, rel: str) -> None:
        self._refuse(rel)
        *folders, name = path_parts(rel)
        try:
            dfd = self.folder(folders)
        except FileNotFoundError:
            return
        try:
            _unlink_at(name, dfd)
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def remove_temp(self, rel: str) -> None:
        """The temporary file a killed `write` of `rel` may have left."""
        *folders, name = path_parts(rel)
        try:
            dfd = self.folder(folders)
        except (FileNotFoundError, TreeError):
            return
        try:
            _unlink_at(_temp_name(name), dfd)
        finally:
            os.close(dfd)

    def make_folder(self, rel: str, mode: int = 0o777) -> None:
        self._refuse(rel)
        *folders, name = path_parts(rel)
        dfd = self.folder(folders)
        try:
            try:
                os.mkdir(name, mode, dir_fd=dfd)
            except FileExistsError:
                os.close(self.folder(path_parts(rel)))  # a folder, not a link or a file
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def remove_folder(self, rel: str) -> None:
        """Remove an empty folder (absent already: fine)."""
        self._refuse(rel)
        *folders, name = path_parts(rel)
        try:
            dfd = self.folder(folders)
        except FileNotFoundError:
            return
        try:
            os.rmdir(name, dir_fd=dfd)
            os.fsync(dfd)
        except FileNotFoundError:
            pass
        finally:
            os.close(dfd)

    def folder_mode(self, rel: str) -> int | None:
        try:
            fd = self.folder(path_parts(rel))
        except FileNotFoundError:
            return None
        try:
            return stat.S_IMODE(os.fstat(fd).st_mode)
        finally:
            os.close(fd)


def _temp_name(name: str) -> str:
    return f".{name}.portkit-tmp"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _unlink_at(name: str, dfd: int) -> None:
    with suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dfd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the journal -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Write:
    """Make the file at `rel` (relative to the tree's root) hold `data`. `mode` is git's:
    REGULAR or EXECUTABLE set the permissions as git does (the file's own, the execute bits
    cleared or added where it can be read), SYMLINK makes a symbolic link to `data`; None
    keeps the file's permissions. `record`: portkit's record under .portkit, the one place
    under it a change may write."""

    rel: str
    data: bytes
    mode: int | None = None
    record: bool = False


@dataclass(frozen=True)
class Delete:
    """Remove the file (or symbolic link) at `rel` (absent already: fine)."""

    rel: str
    record: bool = False


@dataclass(frozen=True)
class RemoveFolder:
    """Remove the folder at `rel`, which the changes before it leave empty."""

    rel: str
    record: bool = False


Change = Write | Delete | RemoveFolder


@dataclass(frozen=True)
class _Original:
    rel: str
    data: bytes | None  # None: the file did not exist
    mode: int
    owner: tuple[int, int] | None
    after: str | None  # sha256 the transaction gives it; None: it removes it
    link: bool = False  # a symbolic link (`data` its target)


@dataclass(frozen=True)
class Journal:
    """What a transaction needs to undo itself, as written to <tree>/.portkit/.journal."""

    action: str
    pid: int
    files: list[_Original]
    made_folders: list[str]  # made by the transaction, shallowest first
    removed_folders: list[tuple[str, int]]  # (path, mode), shallowest first

    def to_json(self) -> bytes:
        return json.dumps({
            "schema": JOURNAL_SCHEMA, "action": self.action, "pid": self.pid,
            "files": [{"path": f.rel, "existed": f.data is not None, "mode": f.mode,
                       "owner": list(f.owner) if f.owner else None,
                       "data": base64.b64encode(f.data).decode() if f.data is not None else None,
                       "after_sha256": f.after, "link": f.link} for f in self.files],
            "made_folders": self.made_folders,
            "removed_folders": [{"path": p, "mode": m} for p, m in self.removed_folders],
        }, indent=1).encode() + b"\n"

    @staticmethod
    def parse(raw: bytes, where: Path) -> Journal:
        def bad(what: str) -> RecordError:
            return RecordError(f"bad journal {where}: {what}; nothing was rolled back: if the "
                               f"tree is as you want it, delete the journal")

        try:
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or data.get("schema") != JOURNAL_SCHEMA:
                raise bad(f"not a {JOURNAL_SCHEMA} journal")
            files = []
            for entry in data["files"]:
                existed = entry["existed"]
                owner = entry["owner"]
                files.append(_Original(
                    _checked(entry["path"]),
                    base64.b64decode(entry["data"], validate=True) if existed else None,
                    int(entry["mode"]) & 0o7777,
                    (_id(owner[0], 2 ** 32), _id(owner[1], 2 ** 32)) if owner else None,
                    entry["after_sha256"], entry.get("link") is True))
            made = [_checked(p) for p in data["made_folders"]]
            removed = [(_checked(e["path"]), int(e["mode"]) & 0o7777)
                       for e in data["removed_folders"]]
            return Journal(str(data["action"]), _id(data["pid"], 2 ** 31), files, made, removed)
        except RecordError as exc:
            raise bad(exc.message) from exc
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError,
                binascii.Error, OverflowError) as exc:
            raise bad(f"{type(exc).__name__}: {exc}") from exc
        except RecursionError as exc:
            raise bad("nested too deep") from exc


def _id(value: Any, limit: int) -> int:
    """A user, group (below 2^32) or process id (below 2^31) as a journal may hold one."""
    if type(value) is not int or not 0 <= value < limit:
        raise RecordError(f"not an id: {str(value)[:40]}")
    return value


def _checked(rel: Any) -> str:
    if not isinstance(rel, str):
        raise RecordError(f"a path is not a string: {rel!r}")
    path_parts(rel)
    return rel


class _Outcome:
    """What the last transaction of this process came to, for the message of an interrupt."""

    state = "nothing was changed"


def interrupt_note() -> str:
    return _Outcome.state


def note_complete() -> None:
    """The command's change is made (a folder published, not a transaction): an interrupt
    from now on says so."""
    _Outcome.state = "the change was complete"


def _journal_rel() -> str:
    return f"{RECORD_FOLDER}/{JOURNAL}"


def _plan(files: TreeFiles, action: str, changes: Sequence[Change]) -> Journal:
    originals: dict[str, _Original] = {}
    made: list[str] = []
    removed: list[tuple[str, int]] = []
    mask = _umask()
    for change in changes:  # all of them before anything is written
        refuse_owned(files.root, change.rel, change.record)
    for change in changes:
        if isinstance(change, RemoveFolder):
            mode = files.folder_mode(change.rel)
            if mode is not None:
                removed.append((change.rel, mode))
            continue
        current = files.read(change.rel, links=True)
        if current is None:
            entry = _Original(change.rel, None, 0o666 & ~mask, None, None)
        else:
            data, st = current
            entry = _Original(change.rel, data, stat.S_IMODE(st.st_mode),
                              (st.st_uid, st.st_gid), None, stat.S_ISLNK(st.st_mode))
        after = sha256(change.data) if isinstance(change, Write) else None
        originals[change.rel] = _Original(entry.rel, entry.data, entry.mode, entry.owner, after,
                                          entry.link)
        if isinstance(change, Write):
            parts = path_parts(change.rel)[:-1]
            for depth in range(1, len(parts) + 1):
                rel = "/".join(parts[:depth])
                if rel not in made and files.folder_mode(rel) is None:
                    made.append(rel)
    return Journal(action, os.getpid(), list(originals.values()), made, removed)


def _write_journal(files: TreeFiles, journal: Journal) -> None:
    pfd = files.folder([RECORD_FOLDER])
    try:
        tmp = JOURNAL + ".tmp"
        _unlink_at(tmp, pfd)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=pfd)
        try:
            _write_all(fd, journal.to_json())
            os.fsync(fd)
        finally:
            os.close(fd)
        checkpoint("journal:temp")
        os.rename(tmp, JOURNAL, src_dir_fd=pfd, dst_dir_fd=pfd)
        os.fsync(pfd)
    finally:
        os.close(pfd)
    checkpoint("journal:written")


def _permissions(original: _Original, mode: int | None) -> int:
    """The permissions a file written with git's `mode` gets, as git gives them."""
    fresh = original.data is None or original.link
    if not fresh and mode in (EXECUTABLE, REGULAR) and (
            bool(original.mode & 0o111) == (mode == EXECUTABLE)):
        return original.mode  # no change of kind: the file keeps its exact permissions
    if mode == EXECUTABLE:
        return 0o777 & ~_umask() if fresh else original.mode | (original.mode & 0o444) >> 2
    if mode == REGULAR:
        return 0o666 & ~_umask() if fresh else original.mode & ~0o111
    return 0o666 & ~_umask() if original.link else original.mode


def _perform(files: TreeFiles, journal: Journal, changes: Sequence[Change]) -> None:
    records = [c.rel for c in changes if c.record]
    files.own.update(records)
    files.own.update(rel for rel in journal.made_folders
                     if any(r.startswith(rel + "/") for r in records))
    for rel in journal.made_folders:
        files.make_folder(rel, 0o777 & ~_umask())
        checkpoint(f"mkdir:{rel}")
    modes = {f.rel: f for f in journal.files}
    for change in changes:
        if isinstance(change, Write):
            original = modes[change.rel]
            if change.mode == SYMLINK:
                files.write_link(change.rel, change.data)
            else:
                files.write(change.rel, change.data, _permissions(original, change.mode),
                            original.owner)
        elif isinstance(change, Delete):
            files.remove(change.rel)
            checkpoint(f"delete:{change.rel}")
        else:
            files.remove_folder(change.rel)
            checkpoint(f"rmdir:{change.rel}")


def _commit(files: TreeFiles) -> None:
    files.own.add(_journal_rel())
    files.remove(_journal_rel())
    _Outcome.state = "the change was complete"
    checkpoint("committed")


def _refuse_edited(files: TreeFiles, journal: Journal) -> None:
    """Refuse (EditedSince) to roll back over a file changed after the transaction stopped:
    one that holds neither its journaled bytes nor those the transaction was to give it
    (after_sha256). A file gone is no loss: the roll-back puts the original back."""
    for original in journal.files:
        try:
            current = files.read(original.rel, links=True)
        except TreeError:
            current = None  # a link on the way or a folder there: the roll-back says so
        if current is None or current[0] == original.data or (
                original.after is not None and sha256(current[0]) == original.after):
            continue
        root = files.root
        raise EditedSince(
            f"{root / original.rel} was changed after an interrupted {journal.action} (pid "
            f"{journal.pid}) stopped: it is neither as it was before nor as portkit wrote "
            f"it, so nothing was rolled back; move your version of it out of the tree, run "
            f"`portkit recover --tree {root}`, then put your changes back")


def _roll_back(files: TreeFiles, journal: Journal) -> None:
    """Put every journaled file and folder back as it was. Safe to repeat at any point;
    refused, before anything is written, where a file was changed after the transaction
    stopped (_refuse_edited)."""
    _refuse_edited(files, journal)
    # the journal is portkit's own: what it lists under .portkit is the record (.git stays
    # refused whatever it lists)
    files.own.update([_journal_rel(), _journal_rel() + ".tmp"])
    files.own.update(f.rel for f in journal.files)
    files.own.update(journal.made_folders)
    files.own.update(rel for rel, _ in journal.removed_folders)
    for rel, mode in journal.removed_folders:
        if files.folder_mode(rel) is None:
            files.make_folder(rel, mode)
    for original in reversed(journal.files):
        files.remove_temp(original.rel)
        current = files.read(original.rel, links=True)
        is_link = current is not None and stat.S_ISLNK(current[1].st_mode)
        if original.data is None:
            if current is not None:
                files.remove(original.rel)
        elif original.link:
            if current is None or current[0] != original.data or not is_link:
                files.write_link(original.rel, original.data)
        elif current is None or current[0] != original.data or is_link or (
                stat.S_IMODE(current[1].st_mode) != original.mode):
            files.write(original.rel, original.data, original.mode, original.owner)
        checkpoint(f"rollback:{original.rel}")
    for rel in reversed(journal.made_folders):
        try:
            files.remove_folder(rel)
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
    files.remove(_journal_rel())
    files.remove(_journal_rel() + ".tmp")


@contextmanager
def transaction(root: Path, action: str, changes: Sequence[Change]) -> Iterator[None]:
    """Make `changes` to the tree at `root` (whose lock the caller holds), then run the
    with-block; commit when it ends, roll everything back if anything in it raises."""
    with TreeFiles(root) as files:
        journal = _plan(files, action, changes)
        try:
            _Outcome.state = "the next portkit command will roll the tree back"
            _write_journal(files, journal)
            _perform(files, journal, changes)
            yield
            checkpoint("commit")
        except BaseException:
            _roll_back(files, journal)
            _Outcome.state = "the tree was rolled back"
            raise
        _commit(files)


# -- recovery ----------------------------------------------------------------------------------


def recover(root: Path) -> Journal | None:
    """Roll back the transaction a killed process left (the caller holds the lock)."""
    with TreeFiles(root) as files:
        files.own.add(_journal_rel() + ".tmp")
        files.remove(_journal_rel() + ".tmp")  # never completed: nothing written
        try:
            found = files.read(_journal_rel(), limit=JOURNAL_LIMIT)
        except TreeError as exc:
            raise RecordError(f"bad journal {root / _journal_rel()}: {exc.message}; remove "
                              f"it") from exc
        if found is None:
            return None
        journal = Journal.parse(found[0], root / _journal_rel())
        _roll_back(files, journal)
    return journal


def recovered_line(root: Path, journal: Journal) -> str:
    return (f"rolled back an interrupted {journal.action} (pid {journal.pid}) in {root}: "
            f"its {len(journal.files)} file(s) are as they were before it")


# -- the lock ----------------------------------------------------------------------------------


def lock_wait() -> float:
    try:
        return max(0.0, float(os.environ.get("PORTKIT_LOCK_WAIT", DEFAULT_LOCK_WAIT)))
    except ValueError as exc:
        raise UsageError(f"PORTKIT_LOCK_WAIT must be a number of seconds: "
                           f"{os.environ['PORTKIT_LOCK_WAIT']}") from exc


def _record_folder(files: TreeFiles) -> int:
    """An fd of <tree>/.portkit, made if need be."""
    while True:
        try:
            os.mkdir(RECORD_FOLDER, 0o777, dir_fd=files.fd)
        except FileExistsError:
            pass
        except PermissionError as exc:
            raise TreeError(f"cannot write in {files.root} (read-only)") from exc
        try:
            return files.folder([RECORD_FOLDER])
        except FileNotFoundError:
            continue  # a releasing holder removed it (empty) between the two calls
        except TreeError as exc:
            raise RecordError(f"{files.root / RECORD_FOLDER} is not a folder (a symbolic "
                              f"link?): portkit keeps its record there; remove it") from exc


def _holder(fd: int, wait: bool) -> str:
    """The pid the lock's holder wrote into it (it writes it just after taking the lock:
    with `wait`, give it a moment)."""
    for _ in range(50 if wait else 1):
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if pid.isdigit():
            return f"pid {pid}"
        time.sleep(0.01)
    return "pid unknown"


@contextmanager
def tree_lock(root: Path, wait: float | None = None) -> Iterator[None]:
    """Hold the tree's writer lock for the with-block (BusyError after `wait` seconds)."""
    deadline = time.monotonic() + (lock_wait() if wait is None else wait)
    checkpoint("lock")  # about to take it: what was read of the tree so far may go stale
    with TreeFiles(root) as files:
        while True:
            pfd = _record_folder(files)
            try:
                fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                             | os.O_CLOEXEC, 0o644, dir_fd=pfd)
            except FileNotFoundError:  # the holder removed .portkit as we opened it
                os.close(pfd)
                continue
            except OSError as exc:
                os.close(pfd)
                if exc.errno == errno.ELOOP:
                    raise BadLock(f"{root / RECORD_FOLDER / LOCK} is a symbolic link; "
                                  f"remove it") from exc
                if exc.errno in (errno.EISDIR, errno.ENXIO):
                    raise _bad_lock(root) from exc
                raise
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device planted there
                os.close(fd)
                os.close(pfd)
                raise _bad_lock(root)
            if _locked(fd, pfd):
                break
            give_up = time.monotonic() >= deadline
            holder = _holder(fd, wait=give_up)
            os.close(fd)
            os.close(pfd)
            if give_up:
                raise BusyError(f"another portkit is working on this tree ({holder})")
            time.sleep(0.05)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            checkpoint("locked")
            yield
        finally:
            checkpoint("unlock")
            # Removed while still held: a waiter that opened this file finds it gone and
            # starts again, so no two processes ever hold locks on different files.
            _unlink_at(LOCK, pfd)
            try:
                os.rmdir(RECORD_FOLDER, dir_fd=files.fd)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    raise
            os.close(fd)
            os.close(pfd)


def _bad_lock(root: Path) -> BadLock:
    return BadLock(f"{root / RECORD_FOLDER / LOCK} is not a regular file (a folder or a "
                   f"FIFO?): portkit keeps its lock there; remove it")


def _locked(fd: int, pfd: int) -> bool:
    """Take the flock of `fd` without waiting; True when it is ours and still the lock
    file (a holder that released may have unlinked the file we opened)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    try:
        named = os.stat(LOCK, dir_fd=pfd, follow_symlinks=False)
    except FileNotFoundError:
        named = None
    mine = os.fstat(fd)
    if named is None or (named.st_dev, named.st_ino) != (mine.st_dev, mine.st_ino):
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    return True


def settle(root: Path, *, writer: bool) -> str | None:
    """Before a command works on the tree at `root`: roll back what a killed portkit left
    half done, and remove a lock file nobody holds. A writer (which holds the lock) has
    done this already; a reader does it only if the lock is free, and never waits.

    Returns the one line to tell the user when something was rolled back.
    """
    folder = root / RECORD_FOLDER
    if writer:
        journal = recover(root)
        return recovered_line(root, journal) if journal else None
    if folder.is_symlink() or not folder.is_dir():
        return None  # a reader does not write; a writer will refuse a linked .portkit
    journaled = any((folder / name).exists() for name in (JOURNAL, JOURNAL + ".tmp"))
    if not journaled and not (folder / LOCK).exists():
        return None
    try:  # a live writer's transaction is worth waiting for: the tree is half written
        with tree_lock(root, wait=lock_wait() if journaled else 0):
            journal = recover(root)
    except (BusyError, BadLock):
        # a live writer owns the journal and will finish or roll back itself; a lock
        # nobody can take is a writer's to refuse: reading is all the command does
        return None
    except EditedSince:
        raise  # the user's work is at stake: no command goes on over a half-written tree
    except (PermissionError, TreeError):
        return None  # a tree this user cannot write: reading it is all the command does
    return recovered_line(root, journal) if journal else None


# -- a new folder, all at once ----------------------------------------------------------------


def publish_folder(dest: Path, files: dict[str, bytes]) -> None:
    """Create `dest` (absent or empty) holding `files`, all at once: a failure or a kill
    leaves `dest` as it was (at worst a hidden temporary folder beside it)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.portkit-"))
    try:
        for name, data in files.items():
            with (tmp / name).open("wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        tmp.chmod(0o777 & ~_umask())
        os.rename(tmp, dest)
        note_complete()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
