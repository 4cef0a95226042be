"""The fork move: an ollama-style fork moved onto a newer tree in one transaction (its
pin, its vendored files by its rsync rules, its series carried), planned from a private
copy of the fork and checked again under the fork's lock.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from portkit.apply import refuse_uncommitted
from portkit.errors import ApplyConflict, PortkitError, TreeError, UsageError
from portkit.fork import (
    FILTER,
    Vendoring,
    deleted,
)
from portkit.fork import files as _files
from portkit.paths import EXECUTABLE, REGULAR, SYMLINK
from portkit.rebase.compile import compile_check
from portkit.rebase.report import DROPPED, NEEDS_HUMAN, NEEDS_REVIEW, Rebased, RebasedPatch
from portkit.rebase.run import _scratch, rebase
from portkit.series import (
    parse_patch,
    read_series,
)
from portkit.transaction import (
    Change,
    Delete,
    RemoveFolder,
    Write,
    checkpoint,
    settle,
    transaction,
    tree_lock,
)
from portkit.tree import OLLAMA, Tree, pin_matches

# Read as bytes, and only the commit itself rewritten: a CRLF file or one with bytes that
# are not UTF-8 keeps every other byte as it was.
_FETCH_HEAD = re.compile(rb"^([ \t]*FETCH_HEAD[ \t]*[:?]?=[ \t]*)([0-9a-fA-F]{7,40})([ \t]*\r?)$",
                         re.M)


_LLAMA_COMMIT = re.compile(rb'(LLAMA_COMMIT\s*=\s*")([0-9a-fA-F]{7,40})(")')


# (Imports of this part are made where they are used: the top of the module belongs to the
# carrier above.)
#
# What a move reads of a fork (relative to its root): its plan is made from a private copy of
# these, and the fork must still hold exactly that copy, under its lock, when it is written.
_FORK_FILES = ("Makefile.sync", "llama/build-info.cpp")


_FORK_FOLDERS = ("llama/llama.cpp", "llama/patches", "ml/backend/ggml/ggml")


def fork_state(root: Path) -> dict[str, str]:
    """What a move of the fork at `root` depends on: every file (sha256) and symbolic link
    (its target) of its pin files, vendored folders and series, without following links."""
    return _fork_copy(root, None)


def _fork_copy(root: Path, into: Path | None) -> dict[str, str]:
    """fork_state(root); with `into`, those very bytes copied there as well (one read)."""
    from portkit.transaction import sha256

    state: dict[str, str] = {}

    def take(rel: str) -> None:
        path = root / rel
        if path.is_symlink():
            state[rel] = "link " + os.readlink(path)
            if into is not None:
                (into / rel).parent.mkdir(parents=True, exist_ok=True)
                (into / rel).symlink_to(os.readlink(path))
        elif path.is_file():
            data = path.read_bytes()
            state[rel] = sha256(data)
            if into is not None:
                (into / rel).parent.mkdir(parents=True, exist_ok=True)
                (into / rel).write_bytes(data)

    for rel in _FORK_FILES:
        take(rel)
    for top in _FORK_FOLDERS:
        if (root / top).is_symlink():
            take(top)
            continue
        for folder, dirs, names in os.walk(root / top):
            here = Path(folder).relative_to(root).as_posix()
            dirs[:] = sorted(d for d in dirs if d != ".git")
            for name in [*dirs, *sorted(names)]:
                rel = f"{here}/{name}"
                if name in names or (root / rel).is_symlink():
                    take(rel)
            if into is not None:
                (into / here).mkdir(parents=True, exist_ok=True)
    return state


@dataclass
class ForkMove:
    """What `rebase --onto` does to a fork, all in one transaction: the vendored files
    refreshed from the target with the carried series, the new pin, the new series.
    `state` is the fork as the plan read it (fork_state): the move is only written onto
    exactly that fork."""

    fork: Tree
    rebased: Rebased
    pin: str
    changes: list[Change] = field(default_factory=list)
    state: dict[str, str] = field(default_factory=dict)
    # how it was planned, to plan it again on the fork as it is once the lock is taken
    target: Tree | None = None
    base: Tree | None = None
    target_label: str = "target"
    compiled: bool = False  # compile_check was run on the carried series

    @property
    def blocked(self) -> list[RebasedPatch]:
        """The patches that need a human: the fork is not moved while there are any."""
        return [p for p in self.rebased.report.patches if p.status == NEEDS_HUMAN]

    def describe(self) -> str:
        """The plan, one line per change (for --dry-run), then the patches the move drops
        from the series and what holds it back."""
        old = self.fork.pin or "?"
        lines = [f"move {self.fork.root} from {old[:12]} to {self.pin[:12]}:"]
        lines += [f"  {'write' if isinstance(c, Write) else 'delete'} {c.rel}"
                  for c in self.changes]
        dropped = [p for p in self.rebased.report.patches if p.status == DROPPED]
        folder = (self.fork.series_dir.relative_to(self.fork.root).as_posix()
                  if self.fork.series_dir else "llama/patches")
        if dropped:
            lines.append(f"dropped from {folder} with the move ({len(dropped)}):")
            lines += [f"  {folder}/{p.file}: {p.reason}" for p in dropped]
        review = [p for p in self.rebased.report.patches if p.status == NEEDS_REVIEW]
        if review:
            lines.append(f"carried for review ({len(review)}): "
                         + ", ".join(p.file for p in review))
        if self.blocked:
            lines.append(f"blocked: {len(self.blocked)} patch(es) need a human: "
                         + ", ".join(p.file for p in self.blocked))
        return "\n".join(lines) + "\n"


def refuse_self_target(fork: Tree, target: Tree, label: str = "target") -> None:
    """A fork is not moved onto itself: a target that is the fork (or a folder of it), or
    that is at the fork's own pin (its base), is a bad --onto (UsageError)."""
    mine, theirs = fork.root.resolve(), target.root.resolve()
    if theirs == mine or theirs.is_relative_to(mine) or mine.is_relative_to(theirs):
        raise UsageError(f"--onto {label} is the fork itself ({mine}): give the newer "
                         f"llama.cpp tree to move it onto")
    if fork.pin and target.pin and pin_matches(fork.pin, target.pin):
        raise UsageError(f"--onto {label} is at llama.cpp {target.pin[:12]}, the fork's own "
                         f"pin ({fork.pin_source}): nothing to move it onto")


def plan_fork(fork: Tree, target: Tree, *, base: Tree | None = None,
              target_label: str = "target") -> ForkMove:
    """Carry the fork's series onto `target` (its base: `base`, else the fork with the series
    taken out) and plan the move. Nothing is written: see move_fork. The plan is made from a
    private copy of what it reads of the fork, and remembers it (ForkMove.state)."""
    if fork.layout != OLLAMA or fork.series_dir is None:
        raise UsageError(f"{fork.root} is not an ollama-style fork with llama/patches "
                         "(give the series with --series)")
    from portkit.errors import TreeError
    from portkit.tree import detect

    refuse_self_target(fork, target, target_label)
    for rel in _FORK_FOLDERS:
        if (fork.root / rel).is_symlink():
            raise TreeError(f"{fork.root / rel} is a symbolic link: portkit moves a fork whose "
                            f"{rel} is a folder of its own (make it one, then run it again)")
    if target.pin is None or not re.fullmatch(r"[0-9a-fA-F]{7,40}", target.pin):
        raise TreeError(f"the commit of {target.root} is not known: the fork's pin cannot "
                           "be moved to it (give a git target)")
    with _scratch("portkit-fork-") as tmp:
        state = _fork_copy(fork.root, tmp / "fork")
        copy = detect(tmp / "fork")
        if copy.layout != OLLAMA or copy.series_dir is None:  # moved away as it was read
            raise TreeError(f"{fork.root} changed while portkit read it: run it again")
        try:
            move = _plan(copy, target, base, target_label)
        except PortkitError as exc:  # named as the user knows it, not as the private copy
            if not isinstance(exc, UsageError) and fork_state(fork.root) != state:
                # read while another portkit wrote it (half an apply): that, not the series
                raise TreeError(f"{fork.root} changed while portkit read it (another portkit "
                                "at work on it?): nothing was changed; run it again") from exc
            exc.message = exc.message.replace(str(tmp / "fork"), str(fork.root))
            exc.args = (exc.message,)
            raise
        move.changes += _records_moved(fork, copy, move)
    move.fork, move.state = fork, state
    move.target, move.base, move.target_label = target, base, target_label
    return move


def _plan(fork: Tree, target: Tree, base: Tree | None, target_label: str) -> ForkMove:
    assert fork.series_dir is not None
    series = read_series(fork.series_dir)
    rebased = rebase(series, target, base=base, fork=fork,
                     series_label=fork.series_dir.relative_to(fork.root).as_posix(),
                     target_label=target_label)
    move = ForkMove(fork, rebased, target.pin or "")
    move.changes += _vendored(fork, target, rebased.carried)
    move.changes += _pin_changes(fork, move.pin)
    folder = fork.series_dir.relative_to(fork.root).as_posix()
    kept = {p.name: p.data for p in rebased.series.patches}
    had = {p.name: p.data for p in series.patches}
    move.changes += [Delete(f"{folder}/{name}") for name in had if name not in kept]
    move.changes += [Write(f"{folder}/{name}", data) for name, data in kept.items()
                     if had.get(name) != data]  # carried anew, or numbered again
    return move


def _records_moved(fork: Tree, copy: Tree, move: ForkMove) -> list[Change]:
    """The records `apply` left in the fork (.portkit/<name>/) carried with the move: each
    of its patches is its copy in llama/patches as the move writes it (numbered again, made
    for the new tree), so that --reverse takes out what the fork now holds, and removes the
    copy by its new name; a patch that drops (upstream has it) leaves the record, and a
    record left with no patch goes, and the files only a dropped patch touched leave the
    record. A record whose copies the move kept as they were still says the new pin and what
    its files hold now. The record of a copy the move did not
    carry (taken out of the series by hand) stays as it was."""
    from dataclasses import replace

    from portkit.record import applied, in_llama, record_rel, state_json
    from portkit.transaction import sha256

    rows = {row.file: row for row in move.rebased.report.patches}
    carried = {p.name: p for p in move.rebased.series.patches}
    kept = {name: p.data for name, p in carried.items()}
    written = {c.rel: c.data if isinstance(c, Write) else None for c in move.changes}
    assert fork.series_dir is not None
    folder = fork.series_dir.relative_to(fork.root).as_posix()
    changes: list[Change] = []
    for record in applied(fork):
        copies = {c.path for c in record.copies}
        if any(c.sha256 is not None and (copy.root / c.path).is_file() and sha256(
                (copy.root / c.path).read_bytes()) != c.sha256 for c in record.copies):
            continue  # a copy edited by hand: its record stays as it was (--reverse says so)
        series, levels, moved = [], [], False
        for (name, data), level in zip(record.series, record.levels, strict=True):
            row = rows.get(name) if f"{folder}/{name}" in copies else None
            if row is None:
                series.append((name, data))
                levels.append(level)
                continue
            moved = True
            if row.output is not None:
                series.append((row.output, kept[row.output]))
                levels.append(1)  # a fork's patch, as the move writes it
        if not moved:
            continue  # the move carried none of its copies (taken out by hand): as it was
        rel = record_rel(record.feature)
        names = {name for name, _ in series}
        changes += [Delete(f"{rel}/{name}", record=True) for name, _ in record.series
                    if name not in names]
        if not series:
            changes += [Delete(f"{rel}/state.json", record=True),
                        RemoveFolder(rel, record=True)]
            continue
        touched = {}
        for path in dict.fromkeys(p for (name, data), level in zip(series, levels, strict=True)
                                  for p in (carried[name] if kept.get(name) == data
                                            else parse_patch(name, data, strip=level)).paths):
            where = in_llama(copy, path)
            touched[path] = written[where] if where in written else (
                (copy.root / where).read_bytes() if (copy.root / where).is_file() else None)
        if series == record.series and record.pin == move.pin and {
                e.path: e.sha256 for e in record.touched} == {
                path: sha256(data) if data is not None else None
                for path, data in touched.items()}:
            continue  # the move changed nothing the record says
        changes += [Write(f"{rel}/{name}", data, record=True) for name, data in series
                    if (name, data) not in record.series]
        now = replace(fork, pin=move.pin)
        changes.append(Write(f"{rel}/state.json", state_json(
            now, record.feature, series, touched,
            [f"{folder}/{name}" for name, _ in series if f"{folder}/{name}" in copies
             or name not in dict(record.series)], record.order, levels, given=record.given),
            record=True))
    return changes


def _vendored(fork: Tree, target: Tree, carried: dict[str, bytes | None]) -> list[Write | Delete]:
    """The vendored files refreshed: each side (llama.cpp, ggml) sent from the target with
    the carried series applied, under the rules rsync syncs that side with (portkit.fork:
    the side's .rsync-filter and what Makefile.sync's rsync line adds); a file the target
    does not send is deleted where rsync --delete would delete it."""
    vendoring = Vendoring.of(fork)
    sources = vendoring.layout_files(target)
    new: dict[str, bytes | None] = {path: _content(source) for path, source in sources.items()}
    for path, data in carried.items():
        if vendoring.sends(path):
            new[path] = data
    changes: list[Write | Delete] = []
    apart = len(vendoring.sides) > 1
    for side in vendoring.sides:
        mine = fork.root / side.folder
        skip = frozenset({"ggml"}) if apart and not side.prefix else frozenset()
        current = set(_files(mine, [], skip))
        ours = {path.removeprefix(side.prefix): (data, _mode(sources.get(path)))
                for path, data in new.items() if vendoring.side(path)[0] == side}
        for rel, (data, mode) in sorted(ours.items()):
            if data is None:
                if rel in current:
                    changes.append(Delete(f"{side.folder}/{rel}"))
            elif rel not in current or _content(mine / rel) != data or (
                    mode is not None and _mode(mine / rel) != mode):
                changes.append(Write(f"{side.folder}/{rel}", data, mode))
        changes += [Delete(f"{side.folder}/{rel}") for rel in sorted(current - set(ours))
                    if rel != FILTER and deleted(side.rules, rel)]
    return changes


def _content(path: Path) -> bytes:
    """A vendored file's bytes, or a symbolic link's target (rsync -a sends links as links)."""
    return os.fsencode(os.readlink(path)) if path.is_symlink() else path.read_bytes()


def _mode(path: Path | None) -> int | None:
    """git's mode of a vendored file, as rsync -a keeps it (a link, the execute bit)."""
    if path is None:
        return None
    if path.is_symlink():
        return SYMLINK
    return EXECUTABLE if path.stat().st_mode & 0o111 else REGULAR


def _pin_changes(fork: Tree, pin: str) -> list[Write | Delete]:
    """Makefile.sync's FETCH_HEAD (and llama/build-info.cpp's LLAMA_COMMIT, when it names
    the old pin) set to `pin`."""
    out: list[Write | Delete] = []
    sync = fork.root / "Makefile.sync"
    if sync.is_file():
        data = sync.read_bytes()
        m = _FETCH_HEAD.search(data)
        if not m:
            raise TreeError(f"{sync} has no FETCH_HEAD line to move")
        out.append(Write("Makefile.sync", data[:m.start(2)] + pin.encode() + data[m.end(2):]))
    info = fork.root / "llama" / "build-info.cpp"
    if info.is_file() and fork.pin:
        data = info.read_bytes()
        new = _LLAMA_COMMIT.sub(lambda m: m.group(1) + pin.encode() + m.group(3)
                                if pin_matches(m.group(2).decode(), fork.pin or "")
                                else m.group(0), data)
        if new != data:
            out.append(Write("llama/build-info.cpp", new))
    return out


def move_fork(move: ForkMove, *, replan: bool = True) -> tuple[ForkMove, str | None]:
    """Make the move's changes to the fork in one transaction; a failure anywhere leaves the
    fork as it was. Everything about the fork is checked under its lock, once it is taken:
    the fork must be exactly as the plan read it (ForkMove.state), else the move is planned
    again on the fork as it is now, under the lock (with replan=False: refused, TreeError);
    a fork that another portkit moved to this very pin meanwhile is refused (TreeError);
    then its uncommitted files. Returns the move written (a replanned one that
    needs a human is returned unwritten: see .blocked) and what the lock's settling said (a
    roll-back of an earlier, killed portkit), if anything."""
    if move.blocked:
        raise ApplyConflict(f"{len(move.blocked)} patch(es) need a human "
                           f"({', '.join(p.file for p in move.blocked)}): the fork is not moved")
    from portkit.errors import TreeError
    from portkit.tree import detect

    root = move.fork.root
    with tree_lock(root):
        checkpoint("rebase:locked")
        said = settle(root, writer=True)
        if fork_state(root) != move.state:
            now = detect(root)
            if now.pin and pin_matches(now.pin, move.pin):
                raise TreeError(f"{root} was moved to llama.cpp {now.pin[:12]} by another "
                                f"portkit while this one waited: nothing was changed")
            if not replan or move.target is None:
                raise TreeError(f"{root} changed since the move was planned (pin "
                                f"{(now.pin or '?')[:12]}): nothing was changed; run it again")
            checkpoint("rebase:replan")
            again = plan_fork(now, move.target, base=move.base, target_label=move.target_label)
            if move.compiled:
                again.rebased, again.compiled = compile_check(again.rebased, move.target), True
            move = again
            if move.blocked:
                return move, said
        # portkit's own records under .portkit are carried with the move, committed or not
        refuse_uncommitted(root, [c.rel for c in move.changes if not c.record])
        with transaction(root, f"rebase onto {move.pin[:12]}", move.changes):
            checkpoint("rebase:written")
    return move, said
