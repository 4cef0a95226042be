"""Stage 5, apply: put a rendered series into a tree, all or nothing, and take it out again.

The series is applied with `git apply` (which checks every hunk before it writes), inside
a transaction that snapshots every file it may touch and puts them back on any failure.
What was applied is recorded under <tree>/.portkit/<feature>/ (the series and a state
file), so that a second run can say "already applied" and --reverse can undo it exactly.
In an ollama-style fork the series is also written to llama/patches with the next free
numbers, as the fork's own patches are.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import git

from portkit.build import CompileResult, compile_units
from portkit.cache import cache_dir
from portkit.errors import PortkitError
from portkit.proc import run
from portkit.render import Rendered, render
from portkit.series import next_number
from portkit.tree import OLLAMA, Tree, pin_matches

APPLIED, ALREADY, PRESENT, REVERSED, DRY_RUN = (
    "applied", "already applied", "present upstream", "reversed", "dry run")


@dataclass
class Outcome:
    status: str
    patches: list[tuple[str, str]] = field(default_factory=list)  # (file name, text)
    files: list[str] = field(default_factory=list)
    series_copies: list[str] = field(default_factory=list)
    rendered: Rendered | None = None
    compiled: CompileResult | None = None


def record_dir(tree: Tree, feature: str) -> Path:
    return tree.root / ".portkit" / feature


def check_pin(tree: Tree, pin: str) -> None:
    if tree.pin is None:
        raise PortkitError(
            f"cannot tell which llama.cpp commit {tree.root} is at (no Makefile.sync FETCH_HEAD, "
            f"build-info, CHANGELOG or git HEAD); pass --force to skip the pin check")
    if not pin_matches(tree.pin, pin):
        raise PortkitError(f"the tree is at {tree.pin[:12]} (from {tree.pin_source}), not at the "
                           f"pin {pin}; pass --force to apply anyway")


def _scratch_git_dir() -> Path:
    """An empty repository: git apply works on the llama.cpp root as a plain work tree,
    whatever repository (a fork's, a submodule link) encloses or sits in it."""
    path = cache_dir("git") / "apply-scratch.git"
    if not (path / "HEAD").is_file():
        run(["git", "init", "--quiet", "--bare", path])
    return path


def git_apply(root: Path, patches: list[Path], *, reverse: bool = False) -> None:
    """`git apply` of a series, in order, with paths relative to `root`. git checks every
    hunk of every patch before it writes anything. (Its --check mode cannot be used for a
    series: it checks each patch against the files as they are, not as the earlier
    patches leave them.)"""
    args = ["git", f"--git-dir={_scratch_git_dir()}", f"--work-tree={root}",
            "apply", "--whitespace=nowarn", *(["-R"] if reverse else [])]
    run([*args, *[p.resolve() for p in patches]], cwd=root)


def _check_series(tree: Tree, patches: list[Path], files: list[str], *,
                  reverse: bool = False) -> None:
    """Apply the series to a scratch copy of the files it touches: raise if it does not."""
    with tempfile.TemporaryDirectory(prefix="portkit-check-") as scratch:
        for rel in files:
            src = tree.llama_root / rel
            if src.is_file():
                (Path(scratch) / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, Path(scratch) / rel)
        git_apply(Path(scratch), patches, reverse=reverse)


def _refuse_dirty(tree: Tree, files: list[str]) -> None:
    try:
        repo = git.Repo(tree.llama_root, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return
    top = Path(repo.working_tree_dir or tree.llama_root)
    paths = [str((tree.llama_root / f).relative_to(top)) for f in files]
    dirty = repo.git.status("--porcelain", "--", *paths).splitlines()
    if dirty:
        raise PortkitError(f"uncommitted changes in {dirty[0][3:]}"
                           + (f" and {len(dirty) - 1} more" if len(dirty) > 1 else "")
                           + "; commit or stash them first")


def _read_only(path: Path) -> bool:
    """Not writable for us, or marked read-only by its owner (which root would ignore)."""
    return not os.access(path, os.W_OK) or not path.stat().st_mode & 0o222


def _refuse_unwritable(paths: list[Path]) -> None:
    for path in paths:
        if path.exists() and _read_only(path):
            raise PortkitError(f"cannot write {path} (read-only)")
        folder = path.parent
        while not folder.exists():
            folder = folder.parent
        if _read_only(folder):
            raise PortkitError(f"cannot write in {folder} (read-only)")


def _restore(path: Path, data: bytes | None) -> None:
    if data is None:
        path.unlink(missing_ok=True)
    elif not path.is_file() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


@contextmanager
def transaction(files: list[Path], folders: list[Path]) -> Iterator[None]:
    """Snapshot `files` and `folders` (existing or not); put them all back on any error."""
    saved = {f: (f.read_bytes() if f.is_file() else None) for f in files}
    contents = {d: ({p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
                    if d.is_dir() else None) for d in folders}
    try:
        yield
    except BaseException:
        for folder, content in contents.items():
            if content is None:
                shutil.rmtree(folder, ignore_errors=True)
                continue
            for extra in [p for p in folder.rglob("*") if p.is_file() and p not in content]:
                extra.unlink()
            for path, data in content.items():
                _restore(path, data)
        for path, original in saved.items():
            _restore(path, original)
        raise


@dataclass(frozen=True)
class Record:
    """What `apply` left in <tree>/.portkit/<feature>/: the series and what it touched."""

    folder: Path
    files: list[str]
    series_copies: list[str]

    @property
    def patches(self) -> list[Path]:
        return sorted(self.folder.glob("*.patch"))


def read_record(tree: Tree, feature: str) -> Record | None:
    folder = record_dir(tree, feature)
    state = folder / "state.json"
    if not state.is_file():
        return None
    data = json.loads(state.read_text())
    return Record(folder, list(data.get("files", [])), list(data.get("series_copies", [])))


def apply(tree: Tree, feature: str, *, pin: str | None, force: bool = False,
          dry_run: bool = False, compile_check: bool = False) -> Outcome:
    """Render the feature for `tree` and apply it, all or nothing.

    With `compile_check`, the translation units the series touches are compiled before the
    transaction ends: a series that does not compile is taken out again.
    """
    if pin is not None and not force:
        check_pin(tree, pin)
    record = record_dir(tree, feature)
    previous = read_record(tree, feature)
    if previous is not None:
        try:
            _check_series(tree, list(reversed(previous.patches)), previous.files, reverse=True)
        except PortkitError as exc:
            raise PortkitError(f"{feature} was applied by portkit, but the tree has changed since "
                               f"({exc.message}); see {record}") from exc
        return Outcome(ALREADY, [(p.name, p.read_text()) for p in previous.patches],
                       previous.files)
    rendered = render(tree, feature)
    if rendered.present_upstream:
        return Outcome(PRESENT, rendered=rendered)
    files = rendered.files()
    first = next_number(tree.series_dir) if tree.layout == OLLAMA and tree.series_dir else 1
    mails = rendered.mails(first)
    if dry_run:
        return Outcome(DRY_RUN, mails, files, rendered=rendered)
    _refuse_dirty(tree, files)
    copies = [tree.series_dir / name for name, _ in mails] if tree.series_dir else []
    _refuse_unwritable([tree.llama_root / f for f in files] + copies)
    with transaction([tree.llama_root / f for f in files] + copies, [tree.root / ".portkit"]):
        record.mkdir(parents=True, exist_ok=True)
        for name, text in mails:
            (record / name).write_text(text)
        git_apply(tree.llama_root, sorted(record.glob("*.patch")))
        for copy, (_, text) in zip(copies, mails, strict=False):  # no copies outside a fork
            copy.write_text(text)
        (record / "state.json").write_text(json.dumps({
            "feature": feature, "pin": tree.pin, "files": files,
            "series_copies": [str(c.relative_to(tree.root)) for c in copies],
        }, indent=2) + "\n")
        compiled = compile_units(tree, files) if compile_check else None
    return Outcome(APPLIED, mails, files, [str(c) for c in copies], rendered, compiled)


def reverse(tree: Tree, feature: str, *, pin: str | None, force: bool = False,
            dry_run: bool = False) -> Outcome:
    """Take out a series that `apply` put in, restoring the tree byte for byte."""
    if pin is not None and not force:
        check_pin(tree, pin)
    record = read_record(tree, feature)
    if record is None:
        raise PortkitError(f"{feature} is not applied to this tree "
                           f"(no record in {record_dir(tree, feature)})")
    recorded = record.patches
    files = record.files
    copies = [tree.root / c for c in record.series_copies]
    mails = [(p.name, p.read_text()) for p in recorded]
    if dry_run:
        return Outcome(DRY_RUN, mails, files)
    _refuse_unwritable([tree.llama_root / f for f in files])
    with transaction([tree.llama_root / f for f in files] + copies, [tree.root / ".portkit"]):
        git_apply(tree.llama_root, list(reversed(recorded)), reverse=True)
        for copy in copies:
            copy.unlink(missing_ok=True)
        shutil.rmtree(record.folder)
        portkit_dir = tree.root / ".portkit"
        if portkit_dir.is_dir() and not any(portkit_dir.iterdir()):
            portkit_dir.rmdir()
    return Outcome(REVERSED, mails, files, [str(c) for c in copies])
