"""Stage 5, apply: put a rendered series into a tree, all or nothing, and take it out again.

The patched bytes of every file the series touches are computed first, in a private
folder (`patched_contents`); only then is the tree written, through one journaled
transaction (portkit.transaction) that also writes the record: the series and a state
file under <tree>/.portkit/<feature>/ (portkit.record), so that a second run can say
"already applied" and --reverse can undo it exactly. In an ollama-style fork the series is
also written to llama/patches with the next free numbers, as the fork's own patches are.
Writers hold the tree's lock, and first roll back whatever a killed portkit left.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

from portkit.build import CompileResult, compile_units
from portkit.cache import cache_dir, lay_down, scratch, sweep
from portkit.errors import (
    ApplyConflict,
    InputError,
    PortkitError,
    SpecError,
    TreeError,
    UsageError,
)
from portkit.features import feature_dir
from portkit.fork import Vendoring
from portkit.hunks import apply_hunks
from portkit.index import source_files
from portkit.paths import EXECUTABLE, SYMLINK
from portkit.proc import git, last_line, run
from portkit.record import (
    Record,
    applied,
    check_feature,
    ggml_apart,
    in_llama,
    llama_rel,
    record_names,
    record_rel,
    state_json,
)
from portkit.record import read_record as read_record  # validate reads records through apply
from portkit.render import Rendered, render
from portkit.series import (
    OLLAMA as OLLAMA_CONVENTIONS,
)
from portkit.series import (
    PATCH_SUFFIXES,
    PORTKIT,
    REGULAR,
    Conventions,
    Patch,
    Series,
    git_diff,
    heading_drivers,
    new_patch,
    next_number,
    parse_patch,
    read_series,
)
from portkit.transaction import (
    Change,
    Delete,
    RemoveFolder,
    TreeFiles,
    Write,
    checkpoint,
    settle,
    sha256,
    transaction,
    tree_lock,
)
from portkit.tree import OLLAMA, Tree, detect, pin_matches

APPLIED, ALREADY, PRESENT, REVERSED, DRY_RUN = (
    "applied", "already applied", "present upstream", "reversed", "dry run")

_PIN = re.compile(r"[0-9a-fA-F]{7,40}")
_FAILED_AT = re.compile(r"patch failed: (.+):(\d+)$", re.M)


@dataclass
class Outcome:
    status: str
    patches: list[tuple[str, str]] = field(default_factory=list)  # (file name, text)
    files: list[str] = field(default_factory=list)
    series_copies: list[str] = field(default_factory=list)
    rendered: Rendered | None = None
    compiled: CompileResult | None = None


def check_pin(tree: Tree, pin: str) -> None:
    if not _PIN.fullmatch(pin):
        raise UsageError(f"--pin must be 7 to 40 hex digits of a llama.cpp commit: {pin!r}")
    if tree.pin is None:
        raise TreeError(
            f"cannot tell which llama.cpp commit {tree.root} is at (no Makefile.sync FETCH_HEAD, "
            f"build-info, CHANGELOG or git HEAD); pass --force to skip the pin check")
    if not pin_matches(tree.pin, pin):
        raise TreeError(f"the tree is at {tree.pin[:12]} (from {tree.pin_source}), not at the "
                        f"pin {pin}; pass --force to apply anyway")


# -- patching in a private folder ------------------------------------------------------------


def _conflict(name: str, text: bytes, stderr: str, reverse: bool) -> PortkitError:
    """git apply's complaint as one line naming the patch, the file and the hunk."""
    failed = _FAILED_AT.search(stderr)
    if failed is None:
        last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
        if "does not apply" in stderr or "No such file" in stderr or "already exists" in stderr:
            return ApplyConflict(f"patch {name} does not apply: {last.removeprefix('error: ')}")
        return ApplyConflict(f"git apply failed on patch {name}: {last}")
    path, line = failed.group(1), int(failed.group(2))
    hunk = "a hunk"
    try:
        for patched in PatchSet(text.decode("utf-8", errors="replace")):
            if patched.path == path:
                for number, h in enumerate(patched, 1):
                    if (h.target_start if reverse else h.source_start) == line:
                        hunk = f"hunk {number} of {len(patched)}"
    except UnidiffParseError:
        pass
    return ApplyConflict(f"patch {name} does not apply to {path}: {hunk} (line {line}) "
                         f"does not match")


def _git_apply_one(root: Path, patch: Path, text: bytes, reverse: bool) -> None:
    proc = git(["apply", *(["-R"] if reverse else []), "--", patch.resolve()], cwd=root,
               check=False, ceiling=root.resolve().parent)
    if proc.returncode != 0:
        raise _conflict(patch.name, text, proc.stderr or last_line(proc), reverse)


def git_apply(root: Path, patches: list[Path], *, reverse: bool = False) -> None:
    """`git apply` of patch files to the files under `root`, one after the other (a series
    given reversed with reverse=True takes it out). git checks every hunk of a patch before
    it writes; no repository around `root` is looked at. For portkit's own copies of a
    tree: a user's tree is only written through `patched_contents` and a transaction."""
    for patch in patches:
        _git_apply_one(root, patch, patch.read_bytes(), reverse)


def patched_contents(root: Path | Tree, files: Sequence[str], patches: Sequence[tuple[str, bytes]],
                     reverse: bool = False, strips: Sequence[int] | None = None,
                     ) -> dict[str, bytes | None]:
    """What each of `files` (relative to `root`) holds once the series `patches` ((name,
    text), in series order) is applied, or taken out with reverse=True; None: it is gone.
    Worked out by the per-hunk engine (GNU patch, offsets allowed, no fuzz) on copies in a
    private folder of the cache: `root` is only read. Any hunk that does not land is an
    ApplyConflict naming the patch, the file and the hunk."""
    return {rel: None if entry is None else entry[0]
            for rel, entry in patched_files(root, files, patches, reverse, strips).items()}


def patched_files(root: Path | Tree, files: Sequence[str], patches: Sequence[tuple[str, bytes]],
                  reverse: bool = False, strips: Sequence[int] | None = None,
                  start: dict[str, tuple[bytes, int] | None] | None = None,
                  ) -> dict[str, tuple[bytes, int] | None]:
    """patched_contents with git's mode of each file (REGULAR, EXECUTABLE, SYMLINK: then the
    bytes are the link's target; `strips`: each patch's -pN, 1 where not given). A symbolic
    link in the tree is read, never followed, only
    where the series itself says the file is one. `start` gives files as they are to be
    taken instead of the tree's (None: absent), as patched_files returned them. `root` a
    Tree: the files are read where the tree keeps them (in_llama: ollama's ggml apart)."""
    tree = root if isinstance(root, Tree) else None

    def where(rel: str) -> str:
        return in_llama(tree, rel) if tree is not None else rel

    top = tree.root if tree is not None else root
    assert isinstance(top, Path)
    levels = list(strips) if strips is not None else [1] * len(patches)
    parsed = [parse_patch(name, text, strip=level)
              for (name, text), level in zip(patches, levels, strict=True)]
    # every path the series names: a record lists the files present after it only
    files = list(dict.fromkeys([*files, *(p for patch in parsed for p in patch.paths)]))
    links = {p for patch in parsed for f in patch.files if f.is_symlink
             for p in (f.old_path, f.new_path) if p is not None}
    folders = cache_dir("scratch")
    sweep(folders)  # what killed processes left
    with scratch(folders, ".copy-") as private:
        work = private / "tree"
        work.mkdir()
        with TreeFiles(top) as tree_files:
            for rel in files:
                if start is not None and rel in start:
                    given = start[rel]
                    if given is not None:
                        (work / rel).parent.mkdir(parents=True, exist_ok=True)
                        if given[1] == SYMLINK:
                            os.symlink(os.fsdecode(given[0]), work / rel)
                            continue
                        (work / rel).write_bytes(given[0])
                        if given[1] == EXECUTABLE:
                            (work / rel).chmod(0o755)
                    continue
                found = tree_files.read(where(rel), links=rel in links)
                if found is not None:
                    (work / rel).parent.mkdir(parents=True, exist_ok=True)
                    if stat.S_ISLNK(found[1].st_mode):
                        os.symlink(found[0], work / rel)
                        continue
                    (work / rel).write_bytes(found[0])
                    if found[1].st_mode & 0o100:
                        (work / rel).chmod(0o755)
        with apply_hunks(parsed, work, fuzz=0, reverse=reverse) as result:
            failed = next((h for h in result.hunks if not h.landed), None)
            if failed is not None:
                verb = "come out" if reverse else "apply"
                raise ApplyConflict(f"the series does not {verb}: {failed.describe()}")
            problem = next((p for r in result.patches for p in r.problems), None)
            if problem is not None:
                raise ApplyConflict(problem)
            out: dict[str, tuple[bytes, int] | None] = {}
            for rel in files:
                data = result.files.get(rel, (work / rel).read_bytes()
                                        if (work / rel).is_file() else None)
                out[rel] = None if data is None else (data, result.modes.get(rel, REGULAR))
            return out


@contextmanager
def unpatched_view(tree: Tree, feature: str, patterns: Sequence[str]) -> Iterator[Tree]:
    """The tree as it was before portkit applied `feature` (the tree itself when it did
    not): the files matching `patterns`, with the recorded series taken out, in a private
    folder. What portkit added is never mistaken for upstream's."""
    record = read_record(tree, feature)
    if record is None:
        yield tree
        return
    restored = patched_contents(tree, record.files, record.series, reverse=True,
                                strips=record.levels)
    folders = cache_dir("scratch")
    with scratch(folders, ".view-") as private:
        for rel in [*source_files(tree.llama_root, patterns), "include/llama.h"]:
            if (tree.llama_root / rel).is_file():
                (private / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(tree.llama_root / rel, private / rel)
        lay_down(private, restored)
        yield replace(tree, llama_root=private)


# -- checks before writing --------------------------------------------------------------------


def render_checked(tree: Tree, feature: str) -> Rendered:
    """render(), with a source that is not UTF-8 reported as such (the series is text)."""
    try:
        return render(tree, feature)
    except UnicodeDecodeError as exc:
        raise TreeError(f"cannot render {feature}: {_not_utf8(tree, exc)} is not UTF-8 text; "
                        f"portkit patches UTF-8 sources only") from exc


def _not_utf8(tree: Tree, exc: UnicodeDecodeError) -> str:
    sources = sorted(p for part in ("src", "include") for p in (tree.llama_root / part).rglob("*")
                     if p.is_file() and not p.is_symlink())
    contents = {p: p.read_bytes() for p in sources}
    culprits = [p for p, data in contents.items() if data == exc.object]
    for path, data in contents.items():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            culprits.append(path)
    return str(culprits[0].relative_to(tree.llama_root)) if culprits else "a source file"


def _enclosing_repository(path: Path) -> bool:
    return any((folder / ".git").exists() for folder in (path, *path.parents))


def _by_root(tree: Tree, files: list[str]) -> list[tuple[Path, list[str]]]:
    """`files` (relative to the llama.cpp root) by the folder they are under: the llama.cpp
    root, and ggml's where the tree vendors it apart (ollama's)."""
    apart = [f for f in files if ggml_apart(tree, f)]
    rest = [f for f in files if f not in apart]
    groups = [(tree.llama_root, rest)] if rest else []
    if apart:
        groups.append((tree.ggml_root, [f[len("ggml/"):] for f in apart]))
    return groups


def refuse_uncommitted(root: Path, files: list[str]) -> None:
    """Refuse `files` (relative to `root`) with uncommitted changes in the repository holding
    `root`. The check
    only reads: git takes no lock on the index and does not refresh it, and files whose
    bytes are those of the index, or that are neither in it nor on disk (new files), are
    known clean without `git status` (which could run a clean filter or a file-system
    monitor that the repository's configuration names)."""
    if not files or not _enclosing_repository(root):
        return
    listed = git(["ls-files", "--stage", "-z", "--", *files], cwd=root, check=False)
    if listed.returncode != 0:
        if "not a git repository" in listed.stderr:
            return  # a stray .git (a submodule link whose repository was not shipped)
        raise TreeError(f"cannot tell whether {root} has uncommitted changes: "
                        f"git ls-files failed: {last_line(listed)}")
    staged = {entry.split("\t", 1)[1]: entry.split()[1]
              for entry in listed.stdout.split("\0") if "\t" in entry}
    # a file neither in the index nor on disk is one the series makes: nothing to lose
    files = [f for f in files if f in staged or os.path.lexists(root / f)]
    if not files:
        return
    if sorted(staged) == sorted(files) and all((root / f).is_file() and not
                                               (root / f).is_symlink() for f in files):
        hashed = git(["hash-object", "--no-filters", "--", *files], cwd=root)
        if hashed.stdout.split() == [staged[f] for f in files]:
            return
    status = git(["status", "--porcelain", "--untracked-files=all", "--", *files],
                 cwd=root, check=False)
    if status.returncode != 0:
        raise TreeError(f"cannot tell whether {root} has uncommitted changes: "
                        f"git status failed: {last_line(status)}")
    dirty = status.stdout.splitlines()
    if dirty:
        raise TreeError(f"uncommitted changes in {dirty[0][3:]}"
                        + (f" and {len(dirty) - 1} more" if len(dirty) > 1 else "")
                        + "; commit or stash them first")


def _read_only(path: Path) -> bool:
    """Not writable for us, or marked read-only by its owner (which root would ignore)."""
    return not os.access(path, os.W_OK) or not path.stat().st_mode & 0o222


def _refuse_unwritable(paths: list[Path]) -> None:
    for path in paths:
        if path.exists() and _read_only(path):
            raise TreeError(f"cannot write {path} (read-only)")
        folder = path.parent
        while not folder.exists():
            folder = folder.parent
        if _read_only(folder):
            raise TreeError(f"cannot write in {folder} (read-only)")


@contextmanager
def _writing(tree: Tree) -> Iterator[Tree]:
    """Hold the tree's lock, having rolled back what a killed portkit left half done; the
    tree as it is now, read again under the lock. Every check of the tree's state (pin,
    record, uncommitted files, the fork's series) is made on it: what was read before the
    lock was taken may have been changed by the portkit that held it (a fork move)."""
    with tree_lock(tree.root):
        line = settle(tree.root, writer=True)
        if line:
            print(f"portkit: {line}", file=sys.stderr)
        checkpoint("writing")
        yield detect(tree.root)


# -- apply and reverse ------------------------------------------------------------------------


def _texts(record: Record) -> list[tuple[str, str]]:
    return [(name, text.decode("utf-8", errors="replace")) for name, text in record.series]


def _changed_since(feature: str, record: Record, exc: ApplyConflict) -> ApplyConflict:
    return ApplyConflict(f"{feature} was applied by portkit, but the tree has changed since "
                         f"({exc.message}); see {record.folder}")


def apply(tree: Tree, feature: str, *, pin: str | None, force: bool = False,
          dry_run: bool = False, compile_check: bool = False) -> Outcome:
    """Render the feature for `tree` and apply it, all or nothing.

    With `compile_check`, the translation units the series touches are compiled before the
    transaction ends: a series that does not compile is taken out again.
    """
    check_feature(feature)
    if dry_run:
        return _apply(tree, feature, pin=pin, force=force, dry_run=True, compile_check=False)
    with _writing(tree) as now:
        return _apply(now, feature, pin=pin, force=force, dry_run=False,
                      compile_check=compile_check)


def _apply(tree: Tree, feature: str, *, pin: str | None, force: bool, dry_run: bool,
           compile_check: bool) -> Outcome:
    if pin is not None and not force:
        check_pin(tree, pin)
    previous = _already(tree, feature)
    if previous is not None:
        return previous
    rendered = render_checked(tree, feature)
    if rendered.present_upstream:
        return Outcome(PRESENT, rendered=rendered)
    series = rendered.series(fork_conventions(tree)) if _is_fork(tree) \
        else rendered.series(PORTKIT, 1)
    return _put(tree, feature, series, rendered.files(), dry_run=dry_run,
                compile_check=compile_check, rendered=rendered)


def apply_series(tree: Tree, series: Series, name: str, *, pin: str | None,
                 force: bool = False, dry_run: bool = False,
                 compile_check: bool = False) -> Outcome:
    """Apply any series (a folder of patches that portkit did not render) all or nothing,
    recorded under `name` like a feature: `reverse` takes it out again. In a fork, the
    patches are also added to its series with its next numbers."""
    check_feature(name)
    if dry_run:
        return _apply_series(tree, series, name, pin=pin, force=force, dry_run=True,
                             compile_check=False)
    with _writing(tree) as now:
        return _apply_series(now, series, name, pin=pin, force=force, dry_run=False,
                             compile_check=compile_check)


def _apply_series(tree: Tree, series: Series, name: str, *, pin: str | None, force: bool,
                  dry_run: bool, compile_check: bool) -> Outcome:
    if pin is not None and not force:
        check_pin(tree, pin)
    previous = _already(tree, name, series)
    if previous is not None:
        return previous
    files = list(dict.fromkeys(series.paths))
    given = series_identity(series.patches)
    if tree.layout == OLLAMA:
        _refuse_unvendored(tree, series)
    if _is_fork(tree):
        series = _as_fork_patches(tree, series)
    else:
        series = replace(series, patches=tuple(
            replace(p, name=kept) for p, kept in
            zip(series.patches, record_names([p.name for p in series.patches]), strict=True)))
    return _put(tree, name, series, files, dry_run=dry_run, compile_check=compile_check,
                given=given)


_NUMBER = re.compile(r"^\d{4}-")


def _refuse_unvendored(tree: Tree, series: Series) -> None:
    """In a fork, refuse (InputError) a series that changes a file the fork's rsync rules do
    not vendor (portkit.fork.Vendoring): written there, the next `make -f Makefile.sync
    sync` would delete it, and a patch made at the fork's root (llama/llama.cpp/src/...)
    would land two folders deep instead of failing. Nothing is written before."""
    vendoring = Vendoring.of(tree)
    for patch in series.patches:
        for path in patch.paths:
            if not vendoring.sends(path):
                hint = " (a patch made at the fork's root? a series names llama.cpp's " \
                       "paths: src/..., ggml/...)" if path.startswith(
                           (f"{llama_rel(tree)}/", "ml/")) else ""
                raise InputError(f"{series.folder / patch.name} changes {path}, which this "
                                 f"fork does not vendor: its rsync rules would not bring "
                                 f"{vendoring.in_fork(path).relative_to(tree.root)} into the "
                                 f"fork{hint}; nothing was applied")


def _as_fork_patches(tree: Tree, series: Series) -> Series:
    """The series as the fork's own patches, with its next numbers: each written again as
    `git format-patch` writes the fork's series (its options, the file names it gives), with
    the patch's own subject, author, date, message and diff. A plain diff (any -pN) is
    written as git's diff of the change it makes (`diff --git`, `index` lines, headings as
    the fork's series has them), with its file name as its subject and the author git's
    configuration names: `git am` applies only mails."""
    assert tree.series_dir is not None
    try:
        own: Series | None = read_series(tree.series_dir)
    except PortkitError:
        own = None
    conventions = fork_conventions(tree, own)
    try:
        drivers = heading_drivers((own or read_series(tree.series_dir, lenient=True)).patches)
    except PortkitError:
        drivers = {}
    first, total = conventions.next_number, conventions.next_number + len(series.patches) - 1
    out: list[Patch] = []
    state: dict[str, tuple[bytes, int] | None] = {}  # the files as the patches so far left them
    for i, patch in enumerate(series.patches):
        diff = patch.diff
        if not all(f.git for f in patch.files):
            diff = _git_form(tree, state, patch, conventions.abbrev, drivers)
        elif patch.strip != 1:
            raise UsageError(f"{series.folder / patch.name} is a -p{patch.strip} git patch: a "
                             f"fork's series holds -p1 patches (git am); write it as one first")
        state.update(patched_files(tree, list(patch.paths),
                                   [(patch.name, patch.data)], strips=[patch.strip],
                                   start=state))
        stem = _NUMBER.sub("", PurePosixPath(patch.name).name)
        stem = stem.rsplit(".", 1)[0] if stem.endswith(PATCH_SUFFIXES) else stem
        out.append(new_patch(
            conventions, subject=patch.subject or stem or "patch", body=patch.body,
            author=patch.author if patch.author is not None else _author(tree, patch.name),
            date=patch.date or datetime.now(UTC).astimezone(), diff=diff,
            number=first + i, total=total))
    return replace(series, patches=tuple(out))


def _git_form(tree: Tree, state: dict[str, tuple[bytes, int] | None], patch: Patch,
              abbrev: int, drivers: dict[str, str]) -> str:
    """The change `patch` makes (to the files as `state` has them, else as the tree has
    them) as git's own diff of it."""
    paths = list(patch.paths)
    was = patched_files(tree, paths, [], start=state)
    now = patched_files(tree, paths, [(patch.name, patch.data)],
                        strips=[patch.strip], start=state)
    return git_diff({r: e[0] if e else None for r, e in was.items()},
                    {r: e[0] if e else None for r, e in now.items()}, abbrev=abbrev,
                    modes=({r: e[1] for r, e in was.items() if e},
                           {r: e[1] for r, e in now.items() if e}), drivers=drivers)


def _author(tree: Tree, name: str) -> str:
    """`Name <email>` as git would write the user as an author: `git var GIT_AUTHOR_IDENT`
    in the fork, with the user's configuration and environment (GIT_AUTHOR_*, the fork's,
    GIT_CONFIG_GLOBAL's or ~/.gitconfig's author.* and user.*, EMAIL), only read."""
    # the configuration git reads and the author it is told; never a GIT_DIR of a caller's
    # hook: the fork's own repository
    keep = re.compile(r"GIT_AUTHOR_(NAME|EMAIL)|GIT_CONFIG_(GLOBAL|SYSTEM|NOSYSTEM|COUNT|"
                      r"PARAMETERS|KEY_\d+|VALUE_\d+)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or keep.fullmatch(k)}
    env["LC_ALL"] = "C"
    try:
        done = run(["git", "-c", "core.hooksPath=" + os.devnull, "var", "GIT_AUTHOR_IDENT"],
                   cwd=tree.root, env=env, check=False)
    except PortkitError:
        done = None
    found = re.fullmatch(r"(.+?) <(.*)> \d+ [+-]\d{4}", done.stdout.strip()) \
        if done is not None and done.returncode == 0 else None
    if found is None or not found.group(2):
        why = last_line(done) if done is not None else "git not found"
        raise UsageError(f"{name} is a plain diff: the fork's series holds mails with an "
                         f"author, and git names none ({why}); set git's user.name and "
                         f"user.email, or give it as a mail (git format-patch)")
    return f"{found.group(1)} <{found.group(2)}>"


def _is_fork(tree: Tree) -> bool:
    return tree.layout == OLLAMA and tree.series_dir is not None


def fork_conventions(tree: Tree, own: Series | None = None) -> Conventions:
    """How the fork writes its series (llama/patches; `own`: that series, read already), so
    that what portkit adds looks like the fork's own patches; ollama's format-patch options
    where the folder is empty or cannot be read."""
    assert tree.series_dir is not None
    if own is not None:
        return own.conventions
    try:
        return read_series(tree.series_dir).conventions
    except PortkitError:
        return replace(OLLAMA_CONVENTIONS, next_number=next_number(tree.series_dir))


def _already(tree: Tree, name: str, series: Series | None = None) -> Outcome | None:
    """ALREADY when the record says `name` is applied (and the tree still shows it). With
    `series`: only when it is that series (the same diffs); another series of that name is
    refused (TreeError). Without: only when it is the feature's record, not a series'."""
    previous = read_record(tree, name)
    if previous is None:
        return None
    if series is None:
        _refuse_series_record(previous, "take the series out first (`portkit apply --reverse "
                              "--series DIR`), or apply it from a folder of another name")
    _refuse_another(previous, series, "take it out first with --reverse, or apply this one "
                    "from a folder of another name")
    try:
        patched_contents(tree, previous.files, previous.series, reverse=True,
                         strips=previous.levels)
    except ApplyConflict as exc:
        raise _changed_since(name, previous, exc) from exc
    return Outcome(ALREADY, _texts(previous), previous.files)


def _refuse_series_record(record: Record, then: str) -> None:
    """Refuse (TreeError) to take the record of `apply --series` for a feature's: a series
    record keeps the identity of the series given (Record.given), a feature's has none. A
    feature is never "already applied", nor taken out, because a series of its name was."""
    if record.given is not None:
        raise TreeError(f"a series named {record.feature} is applied to this tree (by "
                        f"`portkit apply --series`), not the feature {record.feature}: {then}")


def _a_feature(name: str) -> bool:
    try:
        feature_dir(name)
    except SpecError:
        return False
    return True


def _refuse_another(record: Record, series: Series | None, then: str) -> None:
    """Refuse (TreeError) when `series` is not the series `record` applied under its name:
    not the same changes as the series given to that apply (series_identity), or, for a
    record that does not say, as the record's own patches (a feature's record, said so)."""
    if series is None:
        return
    theirs = record.given or series_identity(
        [parse_patch(n, data, strip=level)
         for (n, data), level in zip(record.series, record.levels, strict=True)])
    if series_identity(series.patches) != theirs:
        if record.given is None and _a_feature(record.feature):
            raise TreeError(f"the feature {record.feature} is applied to this tree, not the "
                            f"series in {series.folder} (its folder's name is the "
                            f"feature's): apply the series from a folder of another name")
        raise TreeError(f"another series named {record.feature} is applied to this tree (its "
                        f"patches differ from those in {series.folder}): {then}")


def series_identity(patches: Sequence[Patch]) -> str:
    """What a series changes, however it is written (its -pN, `index` lines, line numbers,
    mail): each file's paths and each hunk's lines, context included. A record keeps that of
    the series given, so a fork's copies written as git's diffs, or carried by a fork move
    (renamed, moved, some dropped), are still known for that series."""
    return sha256(repr([(f.old_path, f.new_path, [(h.old_lines, h.new_lines) for h in f.hunks])
                        for p in patches for f in p.files]).encode())


def _put(tree: Tree, name: str, series: Series, files: list[str], *, dry_run: bool,
         compile_check: bool, rendered: Rendered | None = None,
         given: str | None = None) -> Outcome:
    """Write `series` into the tree in one transaction, with its record and, in a fork, its
    copies in llama/patches."""
    mails = [(p.name, p.text) for p in series.patches]
    if dry_run:
        return Outcome(DRY_RUN, mails, files, rendered=rendered)
    for root, rels in _by_root(tree, files):
        refuse_uncommitted(root, rels)
    copies = [tree.series_dir / p.name for p in series.patches] \
        if tree.series_dir and _is_fork(tree) else []
    _refuse_unwritable([tree.root / in_llama(tree, f) for f in files] + copies)
    patches = [(p.name, p.data) for p in series.patches]
    patched = patched_files(tree, files, patches,
                            strips=[p.strip for p in series.patches])
    copy_rels = [c.relative_to(tree.root).as_posix() for c in copies]
    record = record_rel(name)
    changes: list[Change] = [Write(in_llama(tree, rel), *entry) if entry is not None
                             else Delete(in_llama(tree, rel)) for rel, entry in patched.items()]
    changes += [Write(rel, data) for rel, (_, data) in zip(copy_rels, patches, strict=False)]
    changes += [Write(f"{record}/{patch}", data, record=True) for patch, data in patches]
    touched = {rel: None if entry is None else entry[0] for rel, entry in patched.items()}
    order = 1 + max((r.order for r in applied(tree)), default=0)
    changes.append(Write(f"{record}/state.json",
                         state_json(tree, name, patches, touched, copy_rels, order,
                                    [p.strip for p in series.patches], given), record=True))
    with transaction(tree.root, f"apply of {name}", changes):
        compiled = compile_units(tree, files) if compile_check else None
    return Outcome(APPLIED, mails, files, [str(c) for c in copies], rendered, compiled)


def reverse(tree: Tree, feature: str, *, pin: str | None, force: bool = False,
            dry_run: bool = False, series: Series | None = None,
            of_series: bool | None = None) -> Outcome:
    """Take out a series that `apply` put in, restoring the tree byte for byte. With
    `series`, only when it is the series recorded under that name. `of_series`: what is
    taken out is a series of `apply --series` (True; given `series`, it is one), or the
    feature (False): the record of the one is never taken for the other's."""
    check_feature(feature)
    kind = series is not None if of_series is None else of_series
    if dry_run:
        return _reverse(tree, feature, pin=pin, force=force, dry_run=True, series=series,
                        of_series=kind)
    with _writing(tree) as now:
        return _reverse(now, feature, pin=pin, force=force, dry_run=False, series=series,
                        of_series=kind)


def _reverse(tree: Tree, feature: str, *, pin: str | None, force: bool,
             dry_run: bool, series: Series | None, of_series: bool) -> Outcome:
    if pin is not None and not force:
        check_pin(tree, pin)
    record = read_record(tree, feature)
    if record is None:
        raise TreeError(f"{feature} is not applied to this tree "
                        f"(no record in {tree.root / record_rel(feature)})")
    if not of_series:
        _refuse_series_record(record, "give --series DIR to take the series out")
    elif record.given is None and series is None and _a_feature(feature):
        raise TreeError(f"the feature {feature} is applied to this tree, not a series of that "
                        f"name: leave out --series to take the feature out")
    _refuse_another(record, series, "nothing was taken out")
    mails = _texts(record)
    if dry_run:
        return Outcome(DRY_RUN, mails, record.files)
    _refuse_under_later(tree, record)
    present = _refuse_edited_copies(tree, record)
    _refuse_unwritable([tree.root / in_llama(tree, f) for f in record.files])
    try:
        restored = patched_files(tree, record.files, record.series, reverse=True,
                                 strips=record.levels)
    except ApplyConflict as exc:
        raise _changed_since(feature, record, exc) from exc
    folder = record_rel(feature)
    changes: list[Change] = [Write(in_llama(tree, rel), *entry) if entry is not None
                             else Delete(in_llama(tree, rel)) for rel, entry in restored.items()]
    changes += [Delete(rel) for rel in present]
    changes += [Delete(f"{folder}/{name}", record=True) for name, _ in record.series]
    changes += [Delete(f"{folder}/state.json", record=True), RemoveFolder(folder, record=True)]
    with transaction(tree.root, f"reverse of {feature}", changes):
        pass
    return Outcome(REVERSED, mails, record.files, [str(tree.root / c) for c in present])


def _refuse_under_later(tree: Tree, record: Record) -> None:
    """A series comes out only from under none applied after it that touches its files:
    taken out from under one, the later one could not come out again."""
    mine = set(record.files)
    for later in applied(tree):
        shared = sorted(mine & set(later.files))
        if later.feature != record.feature and shared and _after(tree, later, record, shared):
            raise TreeError(f"{record.feature} cannot come out from under {later.feature}, "
                            f"applied after it to the same files ({', '.join(shared[:3])}"
                            f"{' and more' if len(shared) > 3 else ''}): take out "
                            f"{later.feature} first")


def _after(tree: Tree, other: Record, record: Record, shared: list[str]) -> bool:
    """Whether `other` was applied after `record`: by their recorded order, or, where one
    has none (a record from before portkit kept it), when a file both touch has the
    checksum `other` recorded for it and not the one `record` did: `other` wrote it last."""
    if record.order and other.order:
        return other.order > record.order
    theirs = {e.path: e.sha256 for e in other.touched}
    mine = {e.path: e.sha256 for e in record.touched}
    with TreeFiles(tree.root) as files:
        for rel in shared:
            found = files.read(in_llama(tree, rel))
            now = sha256(found[0]) if found is not None else None
            if theirs.get(rel) != mine.get(rel) and now == theirs.get(rel):
                return True
    return False


def _refuse_edited_copies(tree: Tree, record: Record) -> list[str]:
    """The series copies still in the fork's llama/patches, refusing any edited since."""
    originals = dict(record.series)
    present = []
    with TreeFiles(tree.root) as files:
        for copy in record.copies:
            found = files.read(copy.path)
            if found is None:
                continue  # taken out of the series by hand already
            name = copy.path.rsplit("/", 1)[-1]
            expected = copy.sha256 or (sha256(originals[name]) if name in originals else None)
            if sha256(found[0]) != expected:
                raise TreeError(f"{tree.root / copy.path} was edited since portkit added it to "
                                f"the series; restore it or take it out of the series yourself, "
                                f"then run --reverse again")
            present.append(copy.path)
    return present
