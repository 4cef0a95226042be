"""The record `apply` leaves in <tree>/.portkit/<feature>/, read as untrusted input.

state.json (schema portkit-record/2) names the feature, the pin, its place among the
tree's records in apply order, the series' patch files with their sha256, the files the
series touches with the sha256 each had after the apply (null: the series deletes it),
and the copies of the series put into an ollama-style fork's llama/patches with theirs.
The patches themselves sit beside it. Reading a record checks all of it: every path is
relative and stays inside the tree (no `..`, nothing absolute, no symbolic link on the
way, .portkit included), every patch is there with its recorded checksum. Anything else is
a RecordError naming the record: portkit never acts on a record it cannot trust.

The first, unversioned state.json (feature, pin, files, series_copies; the patches found
beside it) is still read, with the numbering of the patches' subjects standing in for the
missing list.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from portkit.errors import PortkitError, RecordError, TreeError, UsageError
from portkit.series import parse_patch
from portkit.transaction import (
    PATCH_LIMIT,
    RECORD_FOLDER,
    STATE_LIMIT,
    TreeFiles,
    path_parts,
    sha256,
)
from portkit.tree import Tree

SCHEMA = "portkit-record/2"
STATE = "state.json"

_FEATURE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# a fork's series file, as git format-patch names it (0005-.patch for a subject of no
# letters or digits)
_PATCH_NAME = re.compile(r"\d{4}-[A-Za-z0-9._-]{0,200}\.patch")
# a patch file kept in a record: any plain name of the series' (`fix.diff`, a quilt patch)
_RECORD_NAME = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9._+~-]{0,200}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SUBJECT = re.compile(r"^Subject: \[PATCH(?: (\d+)/(\d+))?\]", re.M)


@dataclass(frozen=True)
class Entry:
    """A path with the sha256 its file must have (None: not recorded, a first-format record)."""

    path: str
    sha256: str | None


@dataclass(frozen=True)
class Record:
    """A checked record: what `apply` put into the tree, and the series it applied."""

    folder: Path
    feature: str
    pin: str | None
    series: list[tuple[str, bytes]]  # (patch file name, its bytes), in order
    touched: list[Entry]  # relative to the llama.cpp root; sha256 after the apply (None: gone)
    copies: list[Entry]  # relative to the tree's root
    order: int = 0  # the record's place among the tree's records, in apply order (0: unknown)
    strips: tuple[int, ...] = ()  # each patch's -pN (quilt's), in order; () : all -p1
    given: str | None = None  # what the series given to apply --series changes (its sha256)

    @property
    def levels(self) -> list[int]:
        """Each patch's -pN, in series order."""
        return list(self.strips) if self.strips else [1] * len(self.series)

    @property
    def patches(self) -> list[Path]:
        return [self.folder / name for name, _ in self.series]

    @property
    def files(self) -> list[str]:
        return [e.path for e in self.touched]


def check_feature(feature: str) -> str:
    """A feature's name, which names its record folder: a plain name, never a path."""
    if not _FEATURE.fullmatch(feature):
        raise UsageError(f"not a feature name: {feature!r} (letters, digits, '.', '_', '-')")
    return feature


def check_series_name(folder: Path) -> str:
    """The name `apply --series` records a series folder under: the folder's own, which
    names its record folder too, so a plain name as a feature's (said as the folder's)."""
    name = folder.resolve().name
    if not _FEATURE.fullmatch(name):
        raise UsageError(f"the name of the --series folder {folder} is the name its record is "
                         f"kept under, and {name!r} cannot be one: rename the folder (or copy "
                         f"it) to a name of letters, digits, '.', '_' and '-' that starts with "
                         f"a letter or digit (at most 100)")
    return name


def record_rel(feature: str) -> str:
    """The record folder, relative to the tree's root."""
    return f"{RECORD_FOLDER}/{check_feature(feature)}"


def llama_rel(tree: Tree) -> str:
    """The llama.cpp root relative to the tree's root, '' when they are one."""
    rel = tree.llama_root.relative_to(tree.root).as_posix()
    return "" if rel == "." else rel


def ggml_apart(tree: Tree, rel: str) -> bool:
    """Whether `rel` (relative to the llama.cpp root) is a ggml/ path of a tree that vendors
    ggml apart from llama.cpp (ollama's ml/backend/ggml/ggml)."""
    return (rel == "ggml" or rel.startswith("ggml/")) and not tree.ggml_root.is_relative_to(
        tree.llama_root) and tree.ggml_root.is_relative_to(tree.root)


def in_llama(tree: Tree, rel: str) -> str:
    """A path relative to the llama.cpp root, made relative to the tree's root. In a tree
    that vendors ggml apart (ollama's ml/backend/ggml/ggml), a ggml/ path is there."""
    if ggml_apart(tree, rel):
        ggml = tree.ggml_root.relative_to(tree.root).as_posix()
        return ggml + rel[len("ggml"):]
    prefix = llama_rel(tree)
    return f"{prefix}/{rel}" if prefix else rel


def record_names(names: list[str]) -> list[str]:
    """The names a series' patches are kept under in a record: each its own where it is a
    plain file name, else made one (`sub/x.patch` is `sub--x.patch`, other characters `_`),
    and numbered by its place where two would be one."""
    out: list[str] = []
    for position, name in enumerate(names, 1):
        flat = re.sub(r"[^A-Za-z0-9._+~-]", "_", name.replace("/", "--"))[:190]
        flat = flat if _RECORD_NAME.fullmatch(flat) and flat != STATE else f"patch-{flat}"
        kept, again = flat, 0
        while kept in out or kept in names[position:]:  # never one another patch has
            again += 1
            kept = f"{position:04d}-{again}-{flat}"
        out.append(kept)
    return out


def state_json(tree: Tree, feature: str, series: list[tuple[str, bytes]],
               touched: dict[str, bytes | None], copies: list[str], order: int,
               strips: list[int] | None = None, given: str | None = None) -> bytes:
    """state.json of a record: `touched` maps each file (relative to the llama.cpp root) to
    its bytes after the apply (None: the series deletes it); `copies` are relative to the
    tree's root; `order`: the record's place among the tree's records; `strips`: each
    patch's -pN where it is not 1 (a quilt series'); `given`: the identity of the series
    given to `apply --series` (apply.series_identity)."""
    by_name = dict(series)
    return json.dumps({
        "schema": SCHEMA,
        "feature": feature,
        "pin": tree.pin,
        "order": order,
        **({"series_sha256": given} if given else {}),
        "patches": [{"name": name, "sha256": sha256(data)} | ({"strip": level} if level != 1
                                                               else {})
                    for (name, data), level in zip(series, strips or [1] * len(series),
                                                   strict=True)],
        "files": [{"path": rel, "sha256": None if data is None else sha256(data)}
                  for rel, data in sorted(touched.items())],
        "series_copies": [{"path": rel, "sha256": sha256(by_name[rel.rsplit("/", 1)[-1]])}
                          for rel in copies],
    }, indent=2).encode() + b"\n"


class _Reader:
    def __init__(self, tree: Tree, feature: str, files: TreeFiles) -> None:
        self.tree = tree
        self.feature = feature
        self.files = files
        self.rel = record_rel(feature)
        self.state = tree.root / self.rel / STATE
        self.strips: list[int] = []

    def bad(self, what: str) -> RecordError:
        return RecordError(f"bad record {self.state}: {what}; portkit will not act on it "
                           f"(restore it, or move {self.state.parent} out of the tree if the "
                           f"tree is not patched)")

    def read(self, rel: str, limit: int) -> bytes | None:
        try:
            found = self.files.read(rel, limit=limit)
        except TreeError as exc:
            raise self.bad(exc.message) from exc
        return None if found is None else found[0]

    def path(self, value: Any, what: str) -> str:
        if not isinstance(value, str):
            raise self.bad(f"{what} is not a path: {value!r}")
        try:
            path_parts(value)
        except RecordError as exc:
            raise self.bad(f"{what}: {exc.message}") from exc
        return value

    def entry(self, value: Any, what: str, key: str = "path", gone: bool = False) -> Entry:
        """A {key, sha256} entry; with `gone`, a sha256 of null (a file the series deletes)."""
        if isinstance(value, str):  # the first format: paths only
            return Entry(self.path(value, what), None)
        if gone and isinstance(value, dict) and "sha256" in value and value["sha256"] is None:
            return Entry(self.path(value.get(key), what), None)
        if not isinstance(value, dict) or not _SHA256.fullmatch(str(value.get("sha256"))):
            raise self.bad(f"{what} is not a {{{key}, sha256}} entry: {value!r}")
        return Entry(self.path(value.get(key), what), value["sha256"])

    def copy(self, entry: Entry) -> Entry:
        series = self.tree.series_dir
        folder = series.relative_to(self.tree.root).as_posix() if series else None
        name = entry.path.rsplit("/", 1)[-1]
        if folder is None or entry.path != f"{folder}/{name}" or not _PATCH_NAME.fullmatch(name):
            raise self.bad(f"series copy {entry.path} is not a patch file of this tree's series "
                           f"folder ({folder or 'none'})")
        return entry

    def series(self, data: dict[str, Any]) -> list[tuple[str, bytes]]:
        if "schema" in data:
            listed = data.get("patches")
            if not isinstance(listed, list):
                raise self.bad("no list of patches")
            for p in listed:
                if not isinstance(p, dict):
                    raise self.bad(f"a patch is not a {{name, sha256}} entry: {p!r}")
            entries = [self.entry(p, "a patch", key="name") for p in listed]
            self.strips = [p.get("strip", 1) for p in listed]
            if any(type(level) is not int or not 0 <= level <= 9 for level in self.strips):
                raise self.bad(f"a patch's strip is not a -pN level: {self.strips!r}")
        else:
            entries = [Entry(p.name, None) for p in sorted((self.tree.root / self.rel).iterdir())
                       if p.name.endswith(".patch")]
        if not entries:
            raise self.bad("it lists no patches")
        out = []
        for entry in entries:
            if not _RECORD_NAME.fullmatch(entry.path) or entry.path == STATE:
                raise self.bad(f"{entry.path!r} is not a patch file name")
            text = self.read(f"{self.rel}/{entry.path}", PATCH_LIMIT)
            if text is None:
                raise self.bad(f"patch {entry.path} is missing")
            if entry.sha256 is not None and sha256(text) != entry.sha256:
                raise self.bad(f"patch {entry.path} is not the one applied (sha256 differs)")
            out.append((entry.path, text))
        if "schema" not in data:
            self.numbering(out)
        return out

    def named(self, series: list[tuple[str, bytes]]) -> set[str]:
        """Every path the record's patches name."""
        levels = self.strips if len(self.strips) == len(series) else [1] * len(series)
        try:
            return {path for (name, text), level in zip(series, levels, strict=True)
                    for path in parse_patch(name, text, strip=level).paths}
        except PortkitError as exc:
            raise self.bad(f"a patch of it cannot be read ({exc.message})") from exc

    def numbering(self, series: list[tuple[str, bytes]]) -> None:
        """A first-format record lists no patches: its [PATCH k/n] subjects must be 1..n."""
        tags = []
        for name, text in series:
            m = _SUBJECT.search(text.decode("utf-8", errors="replace"))
            if m is None:
                raise self.bad(f"patch {name} has no [PATCH] subject")
            tags.append((int(m.group(1) or 1), int(m.group(2) or 1)))
        total = len(series)
        if sorted(tags) != [(k, total) for k in range(1, total + 1)]:
            raise self.bad(f"its patches are not a whole series ({total} of "
                           f"{max(n for _, n in tags)})")

    def record(self) -> Record | None:
        raw = self.read(f"{self.rel}/{STATE}", STATE_LIMIT)
        if raw is None:
            try:
                planted = self.files.exists(self.rel)
            except TreeError as exc:
                raise self.bad(exc.message) from exc
            if planted:  # a transaction makes the folder and its state.json together
                raise self.bad("its folder is there without state.json")
            return None
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise self.bad("not UTF-8") from exc
        except ValueError as exc:
            raise self.bad(f"not JSON ({exc})") from exc
        except RecursionError as exc:
            raise self.bad("not JSON a reader can take (nested too deep)") from exc
        if not isinstance(data, dict):
            raise self.bad("not a JSON object")
        schema = data.get("schema")
        if schema is not None and schema != SCHEMA:
            raise self.bad(f"unknown schema {schema!r} (this portkit reads {SCHEMA})")
        if data.get("feature") != self.feature:
            raise self.bad(f"it is the record of {data.get('feature')!r}, not {self.feature!r}")
        pin = data.get("pin")
        if pin is not None and not isinstance(pin, str):
            raise self.bad(f"pin is not a string: {pin!r}")
        files, copies = data.get("files"), data.get("series_copies", [])
        if not isinstance(files, list) or not files or not isinstance(copies, list):
            raise self.bad("files and series_copies must be lists (files not empty)")
        order = data.get("order", 0)
        if type(order) is not int or order < 0:
            raise self.bad(f"order is not a count: {order!r}")
        touched = [self.entry(f, "a touched file", gone="schema" in data) for f in files]
        for entry in touched:
            self.path(in_llama(self.tree, entry.path), "a touched file")
        series = self.series(data)
        named = self.named(series)
        for entry in touched:  # a record's files are its patches' own, never another file
            if entry.path not in named:
                raise self.bad(f"it lists {entry.path}, which none of its patches touches")
        own = {name: sha256(text) for name, text in series}
        checked = [self.copy(self.entry(c, "a series copy")) for c in copies]
        for entry in checked:  # a copy is one of the record's own patches, never another file
            name = entry.path.rsplit("/", 1)[-1]
            if name not in own or entry.sha256 not in (None, own[name]):
                raise self.bad(f"series copy {entry.path} is not one of its patches")
        given = data.get("series_sha256")
        if given is not None and not _SHA256.fullmatch(str(given)):
            raise self.bad(f"series_sha256 is not a sha256: {given!r}")
        return Record(self.tree.root / self.rel, self.feature, pin, series, touched, checked,
                      order, tuple(self.strips) if any(x != 1 for x in self.strips) else (),
                      given)


def read_record(tree: Tree, feature: str) -> Record | None:
    """The checked record of `feature` in `tree`; None when the feature is not applied."""
    with TreeFiles(tree.root) as files:
        return _Reader(tree, feature, files).record()


def applied(tree: Tree) -> list[Record]:
    """Every feature or series portkit applied to `tree`, by its checked record (a
    state.json that is not a file, a FIFO or a folder planted there, is a bad record)."""
    folder = tree.root / RECORD_FOLDER
    if not folder.is_dir() or folder.is_symlink():
        return []
    names = sorted(p.name for p in folder.iterdir()
                   if _FEATURE.fullmatch(p.name) and os.path.lexists(p / STATE))
    return [r for r in (read_record(tree, name) for name in names) if r is not None]

