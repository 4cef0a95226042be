"""The two sides a hunk is followed between: the base (the tree the series was written
against, or a fork's vendored tree with its series reversed) and a target, each a `Side`
(its files, index and words, read as git sees them); what is compared (`DriftInput`),
which files are looked at, and what a feature's manifest says upstream has.
"""

from __future__ import annotations

import marshal
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from portkit.cache import cache_dir, lay_down, read_entry
from portkit.errors import ApplyConflict, PortkitError
from portkit.features import Feature, templates_root
from portkit.follow.words import _IDENT, _tokens
from portkit.hunks import (
    apply_hunks,
)
from portkit.index import (
    FLAT_FORMAT,
    Index,
    flat_all,
    words_of,
)
from portkit.render import upstream_patches
from portkit.series import Series
from portkit.tree import Tree

# What drift indexes of a tree (relative to the llama.cpp root, as a series' paths are):
# llama.cpp's sources and headers and ggml's public headers and core sources, where the
# symbols a fork's patches use are defined. Files a series touches are added to these.
SCOPE = ("src/**/*.h", "src/**/*.cpp", "include/*.h", "common/*.h", "ggml/include/*.h",
         "ggml/src/*.h", "ggml/src/*.c", "ggml/src/*.cpp", "ggml/src/ggml-cpu/*.h",
         "ggml/src/ggml-cpu/*.c", "ggml/src/ggml-cpu/*.cpp")


@dataclass
class Side:
    """A tree as drift reads it: the folder whose paths the series names (a fork's vendored
    llama.cpp and ggml seen as one llama.cpp tree), and its index."""

    label: str
    root: Path
    patterns: tuple[str, ...]
    pin: str | None = None
    _flat: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _lines: dict[str, list[str] | None] = field(default_factory=dict, repr=False)
    _tokens: dict[str, dict[int, list[str]]] = field(default_factory=dict, repr=False)
    _file_words: dict[str, frozenset[str]] = field(default_factory=dict, repr=False)

    beside: Side | None = field(default=None, repr=False, compare=False)  # see `index`

    @cached_property
    def index(self) -> Index:
        """The side's index; where `beside` (the other side) has its own already, the files
        the two trees have alike share their entries."""
        other = self.beside.__dict__.get("index") if self.beside is not None else None
        return Index.build(self.root, self.patterns, other)

    def text(self, rel: str) -> str | None:
        """The file as git sees it: a symbolic link is its target's name, never the file it
        points to (which may be outside the tree: its text must not reach a report)."""
        found = read_entry(self.root / rel)
        return found[0].decode("utf-8", errors="surrogateescape") if found else None

    def lines(self, rel: str) -> list[str] | None:
        """The file's lines (`text` split; cached: many hunks read one); None when there is
        no such file."""
        if rel not in self._lines:
            text = self.text(rel)
            self._lines[rel] = text.splitlines() if text is not None else None
        return self._lines[rel]

    def flat_lines(self, rel: str) -> list[str]:
        """The file's lines without layout and comments (cached: many hunks search one)."""
        if rel not in self._flat:
            self._flat[rel] = flat_all(self.lines(rel) or [])
        return self._flat[rel]

    def flat_set(self, rel: str) -> frozenset[str] | None:
        """The file's flattened lines as a set; None when there is no such file. An indexed
        file's is kept on disk by its content's hash, as its index entry is (a search for a
        hunk's lines in every file of a kind reads the same files run after run)."""
        known = self.index.files.get(rel) if "index" in self.__dict__ else None
        entry = None
        if known is not None and not (self.root / rel).is_symlink():  # the index read it
            entry = cache_dir("flat", f"v{FLAT_FORMAT}.{marshal.version}",
                              known.sha256[:2]) / f"{known.sha256}.marshal"
            try:
                kept = marshal.loads(entry.read_bytes())
                if isinstance(kept, list) and all(isinstance(x, str) for x in kept):
                    return frozenset(kept)
            except (OSError, EOFError, ValueError, TypeError):
                pass  # none yet, or damaged (a full disk, a killed run): flattened again
        if self.lines(rel) is None:
            return None
        found = frozenset(self.flat_lines(rel))
        if entry is not None:
            tmp = entry.with_suffix(f".{os.getpid()}.tmp")  # concurrent runs never share one
            try:
                tmp.write_bytes(marshal.dumps(sorted(found)))
                tmp.replace(entry)
            except OSError:
                tmp.unlink(missing_ok=True)  # a cache that cannot be written is no cache
        return found

    def file_words(self, rel: str) -> frozenset[str]:
        """The names used in one file (as `words`, without reading every file)."""
        if "words" in self.__dict__ and rel in self.words:
            return self.words[rel]
        if rel not in self._file_words:  # (a file the index leaves out is read for them)
            known = self.index.files.get(rel) if "index" in self.__dict__ else None
            if known is not None and known.words is not None \
                    and not (self.root / rel).is_symlink():  # the index read the file itself
                self._file_words[rel] = known.words
                return known.words
            text = self.text(rel)
            self._file_words[rel] = frozenset(_IDENT.findall(text)) if text else frozenset()
        return self._file_words[rel]

    def tokens_at(self, rel: str, at: int) -> list[str]:
        """The tokens of the file's line `at` (0-based; cached line by line: a search reads
        only the lines a cheaper test let through)."""
        known = self._tokens.setdefault(rel, {})
        if at not in known:
            known[at] = _tokens((self.lines(rel) or [])[at])
        return known[at]

    @cached_property
    def words(self) -> dict[str, frozenset[str]]:
        """The names used in each indexed file (for "is this name new?")."""
        return {rel: f.words if f.words is not None else words_of(self.index.source(rel))
                for rel, f in self.index.files.items()}

    @cached_property
    def all_words(self) -> frozenset[str]:
        return frozenset().union(*self.words.values()) if self.words else frozenset()


@contextmanager
def tree_view(tree: Tree) -> Iterator[Path]:
    """The tree's llama.cpp root as a series sees it. A fork that vendors ggml apart
    (ml/backend/ggml/ggml beside llama/llama.cpp) is shown as one tree, ggml/ included,
    through symbolic links in a temporary folder; the tree itself is only read."""
    if (tree.llama_root / "ggml").exists() or not tree.ggml_root.is_dir():
        yield tree.llama_root
        return
    with tempfile.TemporaryDirectory(prefix="portkit-view-") as tmp:
        view = Path(tmp)
        for entry in tree.llama_root.iterdir():
            (view / entry.name).symlink_to(entry)
        (view / "ggml").symlink_to(tree.ggml_root)
        yield view


@contextmanager
def reversed_base(series: Series, tree: Tree) -> Iterator[Path]:
    """The tree a fork's series was written against: its vendored tree with the series taken
    out (the engine reverse-applies it, last patch first, in a scratch copy)."""
    with tree_view(tree) as view, apply_hunks(series, view, reverse=True, exact=True) as back:
        if not back.ok:
            first = next(h for h in back.hunks if not h.landed)
            raise ApplyConflict(f"the series does not come out of {tree.root} cleanly "
                               f"({first.patch}: {first.describe()}); give the base with --base")
        with tempfile.TemporaryDirectory(prefix="portkit-base-") as tmp:
            base = Path(tmp)
            for rel in _scope_files(view, SCOPE):
                (base / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(view / rel, base / rel)
            lay_down(base, back.files)
            yield base


def _scope_files(root: Path, patterns: Iterable[str]) -> list[str]:
    found = {p.relative_to(root).as_posix() for pattern in patterns for p in root.glob(pattern)
             if p.is_file()}
    return sorted(found)


@dataclass
class DriftInput:
    """What a drift run compares: the series, its base, and the targets (label, tree)."""

    series: Series
    series_label: str
    base: Tree | None  # None: the targets' fork is the base, with the series reversed
    targets: list[tuple[str, Tree]] = field(default_factory=list)


def _patterns(series: Series) -> tuple[str, ...]:
    return tuple(dict.fromkeys((*SCOPE, *series.paths)))


def feature_of(series: Series) -> Feature | None:
    """The portkit feature a series was rendered from (every subject is one of its manifest's
    patches), whose manifest then says when a patch is upstream in another form."""
    subjects = {p.subject for p in series.patches}
    for manifest in sorted(templates_root().glob("*/manifest.toml")):
        feature = Feature.load(manifest.parent.name)
        if subjects and subjects <= {spec.subject for spec in feature.manifest.patches}:
            return feature
    return None


def _upstream(feature: Feature, tree: Tree) -> dict[str, str]:
    try:
        return upstream_patches(feature, feature.resolve(tree))
    except PortkitError:  # the feature's anchors are not all in this tree: say nothing
        return {}


@contextmanager
def _base_root(job: DriftInput, fork: Tree | None) -> Iterator[tuple[Path, str | None]]:
    if job.base is not None:
        with tree_view(job.base) as root:
            yield root, job.base.pin
        return
    assert fork is not None
    with reversed_base(job.series, fork) as root:
        yield root, fork.pin
