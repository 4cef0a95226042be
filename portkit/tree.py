"""Stage 1, tree: locate or acquire a llama.cpp source tree and tell its layout and pin.

Layouts:
- plain llama.cpp checkout (src/llama.cpp, include/llama.h);
- ollama-style fork (llama/llama.cpp, ml/backend/ggml/ggml, Makefile.sync, llama/patches);
- llama-cpp-python source distribution (vendor/llama.cpp, CHANGELOG.md).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import tarfile
import time
import tomllib
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import git

from portkit.cache import (
    STARTED,
    cache_dir,
    cache_root,
    exclusive,
    note,
    pip_download,
    publish,
    scratch,
    sha256_file,
    sweep,
)
from portkit.errors import (
    ChecksumError,
    FetchError,
    InputError,
    PortkitError,
    SpecError,
    ToolFailed,
    UsageError,
)
from portkit.proc import git as sealed_git
from portkit.proc import safe_directory_env

PLAIN = "llama.cpp"
OLLAMA = "ollama"
SDIST = "llama-cpp-python"

_FETCH_HEAD = re.compile(r"^\s*FETCH_HEAD\s*[:?]?=\s*([0-9a-fA-F]{7,40})\s*$", re.M)
_LLAMA_COMMIT = re.compile(r'LLAMA_COMMIT\s*=\s*"([0-9a-fA-F]{7,40})"')
_CHANGELOG = re.compile(r"[Uu]pdate llama\.cpp to [\w.-]+/llama\.cpp@([0-9a-fA-F]{7,40})")


@dataclass(frozen=True)
class Tree:
    """A llama.cpp source tree as portkit sees it."""

    root: Path
    layout: str
    llama_root: Path
    ggml_root: Path
    series_dir: Path | None
    pin: str | None
    pin_source: str | None

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in data.items()}


def pin_matches(actual: str | None, wanted: str) -> bool:
    """Commit ids match when one is a prefix of the other (at least 7 hex digits)."""
    if not actual or len(wanted) < 7:
        return False
    a, w = actual.lower(), wanted.lower()
    return a.startswith(w) or w.startswith(a)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _git_env() -> dict[str, str]:
    """The environment of every git GitPython runs for portkit: deaf to the user's and the
    system's git configuration (an insteadOf, a hooks path, a credential helper) but its
    safe.directory entries (portkit.proc.safe_directory_env), and never prompting."""
    return {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0", **safe_directory_env()}


def _repo(path: Path) -> git.Repo:
    import git  # GitPython, for a git: spec's mirror (no other command needs it)

    repo = git.Repo(path)
    repo.git.update_environment(**_git_env())
    return repo


def _git_head(path: Path) -> str | None:
    """The commit the checkout at `path` is at (portkit.proc.git, sealed); None where it
    has none (no repository, an unborn branch, a broken .git). A repository git refuses as
    another user's is refused (TreeError), not taken for one without a HEAD."""
    if not (path / ".git").exists():
        return None  # no repository here (a checkout has .git, a worktree's is a file)
    done = sealed_git(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], cwd=path,
                      check=False, ceiling=path.parent)
    head = done.stdout.strip()
    return head if done.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", head) else None


def _ollama_pin(root: Path) -> tuple[str | None, str | None]:
    sync = root / "Makefile.sync"
    if sync.is_file() and (m := _FETCH_HEAD.search(_read(sync))):
        return m.group(1), "Makefile.sync FETCH_HEAD"
    info = root / "llama" / "build-info.cpp"
    if info.is_file() and (m := _LLAMA_COMMIT.search(_read(info))):
        return m.group(1), "llama/build-info.cpp LLAMA_COMMIT"
    return None, None


def detect(path: Path) -> Tree:
    """Tell the layout, source roots and pin of the tree at `path`."""
    root = path.resolve()
    if not root.is_dir():
        raise InputError(f"not a directory: {path}")
    if (root / "llama" / "llama.cpp").is_dir() and (
        (root / "Makefile.sync").is_file() or (root / "ml" / "backend" / "ggml" / "ggml").is_dir()
    ):
        pin, source = _ollama_pin(root)
        series = root / "llama" / "patches"
        return Tree(
            root, OLLAMA, root / "llama" / "llama.cpp", root / "ml" / "backend" / "ggml" / "ggml",
            series if series.is_dir() else None, pin, source,
        )
    vendored = root / "vendor" / "llama.cpp"
    if (vendored / "src").is_dir():
        pin, source = None, None
        changelog = root / "CHANGELOG.md"
        if changelog.is_file() and (m := _CHANGELOG.search(_read(changelog))):
            pin, source = m.group(1), "CHANGELOG.md"
        return Tree(root, SDIST, vendored, vendored / "ggml", None, pin, source)
    if (root / "src" / "llama.cpp").is_file() or (root / "include" / "llama.h").is_file():
        head = _git_head(root)
        return Tree(root, PLAIN, root, root / "ggml", None, head, "git HEAD" if head else None)
    raise InputError(
        f"not a llama.cpp tree: {path} (no src/llama.cpp, vendor/llama.cpp or llama/llama.cpp)"
    )


# -- fetching ---------------------------------------------------------------------------
#
# Everything a fetch makes is prepared in a scratch folder and renamed into place when it is
# complete, one process at a time per destination (portkit.cache): an interrupted or
# concurrent fetch never leaves a partial tree, sdist or mirror that a later one would take.


def _known_sources() -> dict[str, Any]:
    text = resources.files("portkit.data").joinpath("sources.toml").read_text()
    return tomllib.loads(text)


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _is_tree(path: Path) -> bool:
    try:
        detect(path)
    except PortkitError:
        return False
    return True


def _is_sdist_tree(path: Path) -> bool:
    return (path / "vendor" / "llama.cpp" / "src").is_dir()


def _fetch_pypi(requirement: str) -> Path:
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][\w.]*)", requirement)
    if not m:
        raise SpecError("pypi spec must pin a version, e.g. pypi:llama-cpp-python==0.3.17: "
                        f"{requirement}")
    name, version = m.group(1), m.group(2)
    trees = cache_dir("trees")
    dest = trees / f"{name}-{version}"
    if _is_sdist_tree(dest):
        return dest
    with exclusive(f"tree-{dest.name}", f"fetching {name}=={version}"):
        if _is_sdist_tree(dest):  # another process made it while this one waited
            return dest
        if dest.exists():
            note(f"the cached tree {dest} has no vendor/llama.cpp; unpacking it again")
        sdist = _sdist(name, version)
        with scratch(trees, ".unpack-") as tmp:
            _unpack(sdist, tmp)
            if not _is_sdist_tree(tmp):
                raise SpecError(f"{sdist.name} carries no vendor/llama.cpp tree")
            return publish(tmp, dest)


def _unpack(sdist: Path, into: Path) -> None:
    """The sdist's vendor/llama.cpp and CHANGELOG.md (which names the vendored commit)."""
    with tarfile.open(sdist) as tar:
        members = [
            mem for mem in tar.getmembers()
            if "/vendor/llama.cpp/" in mem.name or mem.name.endswith("/CHANGELOG.md")
        ]
        for mem in members:
            mem.name = mem.name.split("/", 1)[1]
        tar.extractall(into, members=members, filter="data")


def _sdist(name: str, version: str) -> Path:
    """The sdist of NAME==VERSION in the cache, verified; downloaded on first use."""
    folder = cache_dir("sdists")
    stem = f"{name.replace('-', '_')}-{version}"
    cached = folder / f"{stem}.tar.gz"
    record = folder / f"{stem}.tar.gz.sha256"
    known = _known_sources().get("pypi", {}).get(name, {}).get(version, {}).get("sha256")
    if cached.is_file():
        _verify(cached, record, known)
        return cached
    with scratch(folder, ".download-") as tmp:
        pip_download(["--no-binary", ":all:", "--no-build-isolation", f"{name}=={version}"],
                     tmp, f"{name}=={version} (source distribution) from PyPI")
        found = sorted(tmp.glob("*.tar.gz"))
        if not found:
            raise SpecError(f"pip downloaded no source distribution for {name}=={version}")
        _verify(found[0], record, known)
        return found[0].replace(cached)


def _verify(sdist: Path, record: Path, known: str | None) -> None:
    """Check an sdist against its sha256 in sources.toml, else against the one recorded when
    it was first downloaded. A hash is recorded only from a download that proved a complete
    archive carrying a llama.cpp tree. A file that fails is removed."""
    actual = sha256_file(sdist)
    if known is not None:
        if actual != known:
            sdist.unlink()
            raise ChecksumError(f"checksum mismatch for {sdist.name}: got {actual}, expected "
                                f"{known}; removed it (fetch again to download it anew)")
    else:
        recorded = _read_record(record)
        if recorded is not None and actual != recorded:
            sdist.unlink()
            raise ChecksumError(f"checksum mismatch for {sdist.name}: got {actual}, recorded "
                                f"{recorded} at its first download; removed it (delete "
                                f"{record} to accept a new download)")
        if recorded is None and (problem := _incomplete(sdist)):
            sdist.unlink()
            raise ChecksumError(f"the download of {sdist.name} is {problem}; removed it "
                                f"(fetch again to download it anew)")
    if _read_record(record, quiet=True) != actual:
        partial = record.with_name(record.name + ".partial")
        partial.write_text(actual + "\n")
        partial.replace(record)


def _read_record(record: Path, *, quiet: bool = False) -> str | None:
    """The sha256 recorded in `record`; None when there is none or it is damaged."""
    try:
        text = record.read_text().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        text = ""
    if re.fullmatch(r"[0-9a-f]{64}", text):
        return text
    if not quiet:
        note(f"ignoring the damaged checksum record {record}")
    return None


def _incomplete(sdist: Path) -> str | None:
    """Why `sdist` is not a complete .tar.gz holding vendor/llama.cpp, or None when it is."""
    try:
        with gzip.open(sdist) as gz:
            with tarfile.open(fileobj=gz, mode="r|") as tar:
                names = [member.name for member in tar]
            while gz.read(1 << 20):  # to the end: gzip checks its length and CRC there
                pass
    except (OSError, EOFError, zlib.error, tarfile.TarError) as exc:
        return f"truncated or corrupt ({exc})"
    if not any("/vendor/llama.cpp/src/" in name for name in names):
        return "an archive without vendor/llama.cpp"
    return None


def _fetch_git(spec: str) -> Path:
    import git

    url, sep, rev = spec.rpartition("@")
    if not sep or not url or not rev:
        raise SpecError(f"git spec must be git:URL@REV: git:{spec}")
    mirror = cache_dir("git") / f"{_key(url)}.git"
    with exclusive(f"git-{mirror.name}", f"fetching {url}"):
        sha = _mirror_rev(url, rev, mirror)
    trees = cache_dir("trees")
    dest = trees / f"git-{_key(url)}-{sha[:12]}"
    if _is_tree(dest):
        return dest
    with exclusive(f"tree-{dest.name}", f"checking out {sha[:12]}"):
        if _is_tree(dest):
            return dest
        with scratch(trees, ".clone-") as tmp:
            try:
                clone = git.Repo.clone_from(str(mirror), tmp, no_checkout=True, env=_git_env())
                clone.git.checkout("--quiet", sha)
            except git.GitCommandError as exc:
                raise ToolFailed(f"cannot check out {sha[:12]} from {url}: "
                                 f"{_last_line(exc)}") from exc
            return publish(tmp, dest)


def _mirror_rev(url: str, rev: str, mirror: Path) -> str:
    """Bring the bare mirror of `url` up to date (cloning it on first use) and resolve `rev`."""
    import git

    try:
        repo = None
        if mirror.exists():
            try:
                repo = _repo(mirror)
            except (git.InvalidGitRepositoryError, git.NoSuchPathError):
                note(f"the cached mirror {mirror} is damaged; cloning it again")
                shutil.rmtree(mirror)
        if repo is None:
            with scratch(mirror.parent, ".clone-") as tmp:
                git.Repo.clone_from(url, tmp, bare=True, mirror=True, env=_git_env())
                publish(tmp, mirror)
            repo = _repo(mirror)
        else:
            repo.git.fetch("--quiet", "origin", "+refs/*:refs/*", "--prune")
        return repo.rev_parse(rev).hexsha
    except (git.BadName, git.BadObject, ValueError) as exc:
        raise SpecError(f"cannot fetch {rev} from {url}: no such revision "
                        f"({_last_line(exc)})") from exc
    except git.GitCommandError as exc:
        raise _git_fetch_error(f"cannot fetch {rev} from {url}", exc) from exc


# What git says when the repository or the revision does not exist, rather than that the
# network or the remote failed to answer.
_GIT_NO_SUCH = re.compile(r"does not exist|not found|not a git repository|unknown revision|"
                          r"couldn't find remote ref|no such (file|ref)|does not appear to be",
                          re.I)


def _git_fetch_error(what: str, exc: git.GitCommandError) -> SpecError | FetchError:
    """A failed clone or fetch: SpecError when the repository or revision does not exist,
    FetchError when the network or the remote did not answer."""
    said = f"{exc.stderr or ''} {exc}"
    lines = [ln.strip().removeprefix("stderr:").strip(" '\"").removeprefix("fatal: ")
             for ln in str(exc.stderr or "").splitlines()]
    last = next((ln for ln in reversed(lines) if ln), _last_line(exc))
    if _GIT_NO_SUCH.search(said):
        return SpecError(f"{what}: {last}")
    return FetchError(f"{what}: {last}")


def _last_line(exc: Exception) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


def _copy_ignoring(root: Path) -> Callable[[str, list[str]], set[str]]:
    """What a copy of the tree at `root` leaves out: build folders, and portkit's own cache
    when it lies inside the tree (else the copy would hold a copy of itself, and so on)."""
    cache = cache_root().resolve()
    inside = cache.is_relative_to(root)

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {name for name in names if name == "build"}
        if inside and cache.name in names and Path(folder).resolve() == cache.parent:
            skip.add(cache.name)
        return skip

    return ignore


def _fetch_local(path: Path) -> Path:
    tree = detect(path)
    trees = cache_dir("trees")
    dest = trees / f"local-{_key(str(tree.root))}"
    with exclusive(f"tree-{dest.name}", f"copying {tree.root}"), \
            scratch(trees, ".copy-") as tmp:
        shutil.copytree(tree.root, tmp, symlinks=True, dirs_exist_ok=True,
                        ignore=_copy_ignoring(tree.root))
        return publish(tmp, dest)


def copy_tree(tree_path: Path, dest: Path) -> Path:
    """A private, writable copy of a (cached) tree at `dest`, which must not exist yet.

    The copy is made in a hidden sibling of `dest` and renamed into place. Another portkit
    process that copies the same tree to the same `dest` at the same time waits, then
    takes that copy rather than failing on it."""
    source, target = tree_path.resolve(), dest.resolve()
    if target.is_relative_to(source):
        raise UsageError(f"cannot copy {tree_path} into itself ({dest})")
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(f"into-{_key(str(target))}", f"copying into {dest}") as lock:
        if target.exists():
            if _copied_since_start(lock, source, target):
                return dest
            raise UsageError(f"{dest} exists already")
        with scratch(target.parent, f".{target.name}.portkit-") as tmp:
            shutil.copytree(source, tmp, symlinks=True, dirs_exist_ok=True)
            publish(tmp, target)
        lock.write_text(json.dumps({"source": str(source), "inode": target.stat().st_ino,
                                    "time": time.time()}))
    return dest


def _copied_since_start(lock: Path, source: Path, target: Path) -> bool:
    """Whether `target` is the copy of `source` that another portkit process made while this
    one was running (its lock file says so), rather than a folder that was there before."""
    try:
        made = json.loads(lock.read_text())
        return bool(made["source"] == str(source) and made["inode"] == target.stat().st_ino
                    and made["time"] >= STARTED)
    except (ValueError, KeyError, TypeError, OSError):
        return False


def fetch(spec: str) -> Path:
    """Put the tree named by SPEC in the cache and return its path."""
    for part in ("trees", "sdists", "git"):
        sweep(cache_dir(part))
    if spec.startswith("pypi:"):
        path = _fetch_pypi(spec.removeprefix("pypi:"))
    elif spec.startswith("git:"):
        path = _fetch_git(spec.removeprefix("git:"))
    elif Path(spec).is_dir():
        path = _fetch_local(Path(spec))
    else:
        raise SpecError(
            f"unknown tree spec: {spec} (want a directory, git:URL@REV or pypi:NAME==VERSION)"
        )
    detect(path)
    return path
