"""Stage 1, tree: locate or acquire a llama.cpp source tree and tell its layout and pin.

Layouts:
- plain llama.cpp checkout (src/llama.cpp, include/llama.h);
- ollama-style fork (llama/llama.cpp, ml/backend/ggml/ggml, Makefile.sync, llama/patches);
- llama-cpp-python source distribution (vendor/llama.cpp, CHANGELOG.md).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import git

from portkit.cache import cache_dir, sha256_file
from portkit.errors import PortkitError
from portkit.proc import run

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


def _git_head(path: Path) -> str | None:
    try:
        repo = git.Repo(path)
        return repo.head.commit.hexsha
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError):
        return None


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
        raise PortkitError(f"not a directory: {path}")
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
    raise PortkitError(
        f"not a llama.cpp tree: {path} (no src/llama.cpp, vendor/llama.cpp or llama/llama.cpp)"
    )


# -- fetching ---------------------------------------------------------------------------


def _known_sources() -> dict[str, Any]:
    text = resources.files("portkit.data").joinpath("sources.toml").read_text()
    return tomllib.loads(text)


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _publish(tmp: Path, dest: Path) -> Path:
    """Move a fully prepared directory into place, replacing an older copy."""
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def _fetch_pypi(requirement: str) -> Path:
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][\w.]*)", requirement)
    if not m:
        raise PortkitError("pypi spec must pin a version, e.g. pypi:llama-cpp-python==0.3.17: "
                           f"{requirement}")
    name, version = m.group(1), m.group(2)
    dest = cache_dir("trees") / f"{name}-{version}"
    if (dest / "vendor" / "llama.cpp" / "src").is_dir():
        return dest
    sdist = _download_sdist(name, version)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir("trees"), prefix=".unpack-"))
    with tarfile.open(sdist) as tar:
        members = [
            mem for mem in tar.getmembers()
            if "/vendor/llama.cpp/" in mem.name or mem.name.endswith("/CHANGELOG.md")
        ]
        for mem in members:
            mem.name = mem.name.split("/", 1)[1]
        tar.extractall(tmp, members=members, filter="data")
    if not (tmp / "vendor" / "llama.cpp" / "src").is_dir():
        shutil.rmtree(tmp)
        raise PortkitError(f"{sdist.name} carries no vendor/llama.cpp tree")
    return _publish(tmp, dest)


def _download_sdist(name: str, version: str) -> Path:
    folder = cache_dir("sdists")
    stem = f"{name.replace('-', '_')}-{version}"
    found = sorted(folder.glob(f"{stem}.tar.gz"))
    if not found:
        run([
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "--no-build-isolation", "--quiet", f"{name}=={version}", "-d", folder,
        ])
        found = sorted(folder.glob(f"{stem}.tar.gz"))
        if not found:
            raise PortkitError(f"pip downloaded no source distribution for {name}=={version}")
    sdist = found[0]
    actual = sha256_file(sdist)
    known = _known_sources().get("pypi", {}).get(name, {}).get(version, {}).get("sha256")
    record = sdist.with_suffix(sdist.suffix + ".sha256")
    expected = known or (record.read_text().strip() if record.is_file() else None)
    if expected and actual != expected:
        sdist.unlink()
        raise PortkitError(f"checksum mismatch for {sdist.name}: got {actual}, expected {expected}")
    record.write_text(actual + "\n")
    return sdist


def _fetch_git(spec: str) -> Path:
    url, sep, rev = spec.rpartition("@")
    if not sep or not url or not rev:
        raise PortkitError(f"git spec must be git:URL@REV: git:{spec}")
    mirror = cache_dir("git") / f"{_key(url)}.git"
    try:
        if mirror.exists():
            repo = git.Repo(mirror)
            repo.git.fetch("--quiet", "origin", "+refs/*:refs/*", "--prune")
        else:
            repo = git.Repo.clone_from(url, mirror, bare=True, mirror=True)
        sha = repo.rev_parse(rev).hexsha
    except (git.GitCommandError, git.BadName, ValueError) as exc:
        last = str(exc).strip().splitlines()[-1]
        raise PortkitError(f"cannot fetch {rev} from {url}: {last}") from exc
    dest = cache_dir("trees") / f"git-{_key(url)}-{sha[:12]}"
    if dest.is_dir():
        return dest
    tmp = Path(tempfile.mkdtemp(dir=cache_dir("trees"), prefix=".clone-"))
    clone = git.Repo.clone_from(str(mirror), tmp / "t", no_checkout=True)
    clone.git.checkout("--quiet", sha)
    tmp_tree = tmp / "t"
    published = _publish(tmp_tree, dest)
    shutil.rmtree(tmp)
    return published


def _fetch_local(path: Path) -> Path:
    tree = detect(path)
    dest = cache_dir("trees") / f"local-{_key(str(tree.root))}"
    tmp = Path(tempfile.mkdtemp(dir=cache_dir("trees"), prefix=".copy-"))
    shutil.copytree(tree.root, tmp / "t", symlinks=True, ignore=shutil.ignore_patterns("build"))
    published = _publish(tmp / "t", dest)
    shutil.rmtree(tmp)
    return published


def copy_tree(tree_path: Path, dest: Path) -> Path:
    """A private, writable copy of a (cached) tree at `dest`, which must not exist yet."""
    if dest.exists():
        raise PortkitError(f"{dest} exists already")
    shutil.copytree(tree_path, dest, symlinks=True)
    return dest


def fetch(spec: str) -> Path:
    """Put the tree named by SPEC in the cache and return its path."""
    if spec.startswith("pypi:"):
        path = _fetch_pypi(spec.removeprefix("pypi:"))
    elif spec.startswith("git:"):
        path = _fetch_git(spec.removeprefix("git:"))
    elif Path(spec).is_dir():
        path = _fetch_local(Path(spec))
    else:
        raise PortkitError(
            f"unknown tree spec: {spec} (want a directory, git:URL@REV or pypi:NAME==VERSION)"
        )
    detect(path)
    return path
