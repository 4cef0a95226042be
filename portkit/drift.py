"""Drift: how each patch of a series fares on other trees, hunk by hunk, and why.

For every target the series is applied in order by the per-hunk engine (portkit.hunks, GNU
patch underneath), each patch on top of the earlier ones that applied. A hunk that lands is
clean, offset or fuzz, as GNU patch says; one that reverse-applies is already-applied. Only
where the whole patch is there already does a hunk that lands become present-upstream: each
such hunk only adds lines the target's file has as one block, new since the base (landing it
would write upstream's lines twice), and every other hunk of the patch is there by the rules
below; elsewhere such a block is a note to review. A hunk that fails is followed into the
target:

  relocated         its enclosing symbol in the base (function, method, class, file-scope
                    declaration) was found in the target by the anchor engine's Locator
                    (exact / alias / structure / similarity), and the hunk, re-expressed
                    with the target's names, lands inside it;
  present-upstream  the target already has the change in another form: every line the
                    hunk adds is there, or every new name it brings is already used at that
                    place in the target, or every line it adds is there under upstream's
                    names (a definition upstream added under a name akin to the hunk's);
  conflict          none of that: the reason (file gone, symbol gone, context changed) and
                    the nearest match in the target.

Semantic drift: the symbols a patch's added lines use (functions, methods, types, fields,
enumerators, macros, variables) are looked up in the base and in the target; each one that
is gone, renamed, or whose signature or type changed is listed, even when the text applies.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher
from functools import cached_property, lru_cache
from pathlib import Path

from portkit.anchors import Candidate, Locator, akin, aliases_of, canonical, find
from portkit.cache import lay_down, read_entry
from portkit.drift_model import (
    ALREADY_APPLIED,
    CLEAN,
    CONFLICT,
    FUZZ,
    OFFSET,
    PRESENT_UPSTREAM,
    RELOCATED,
    DriftReport,
    HunkDrift,
    Moved,
    Nearest,
    NotVendored,
    PatchDrift,
    SemanticChange,
    TargetDrift,
)
from portkit.errors import ApplyConflict, PortkitError, UsageError
from portkit.features import Feature, templates_root
from portkit.fork import fork_scope
from portkit.hunks import (
    ALREADY,
    HunkResult,
    PatchResult,
    _copy_in,
    _gnu,
    _Run,
    _Verdict,
    _verdicts,
    apply_hunks,
)
from portkit.hunks import CLEAN as H_CLEAN
from portkit.hunks import FUZZ as H_FUZZ
from portkit.hunks import OFFSET as H_OFFSET
from portkit.index import (
    CLASS,
    DECLARATION,
    ENUM,
    ENUMERATOR,
    FIELD,
    FUNCTION,
    MACRO,
    VARIABLE,
    Index,
    Symbol,
    flat,
)
from portkit.merge import line_blocks
from portkit.render import upstream_patches
from portkit.series import FileDiff, Hunk, Patch, Series
from portkit.tree import Tree

# What drift indexes of a tree (relative to the llama.cpp root, as a series' paths are):
# llama.cpp's sources and headers and ggml's public headers and core sources, where the
# symbols a fork's patches use are defined. Files a series touches are added to these.
SCOPE = ("src/**/*.h", "src/**/*.cpp", "include/*.h", "common/*.h", "ggml/include/*.h",
         "ggml/src/*.h", "ggml/src/*.c", "ggml/src/*.cpp", "ggml/src/ggml-cpu/*.h",
         "ggml/src/ggml-cpu/*.c", "ggml/src/ggml-cpu/*.cpp")
FUZZ_LIMIT = 2
PLACE_SIMILARITY = 0.85  # how alike a line must be to the neighbour an insertion follows
SURE = 0.6  # a located symbol below this confidence is not followed
MARGIN = 0.05  # ... nor one the runner-up comes this close to
_IDENT = re.compile(r"[A-Za-z_]\w*")
_KEYWORDS = frozenset({
    "alignas", "alignof", "auto", "bool", "break", "case", "catch", "char", "class", "const",
    "constexpr", "const_cast", "continue", "decltype", "default", "delete", "do", "double",
    "dynamic_cast", "else", "enum", "explicit", "extern", "false", "float", "for", "friend",
    "goto", "if", "inline", "int", "long", "mutable", "namespace", "new", "noexcept",
    "nullptr", "operator", "private", "protected", "public", "register", "reinterpret_cast",
    "return", "short", "signed", "sizeof", "static", "static_assert", "static_cast", "struct",
    "switch", "template", "this", "throw", "true", "try", "typedef", "typeid", "typename",
    "union", "unsigned", "using", "virtual", "void", "volatile", "while", "override", "final",
    "size_t", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t",
    "uint64_t", "std", "NULL", "define", "include", "ifdef", "ifndef", "endif", "elif",
    "pragma", "defined"
})
_USED_KINDS = (FUNCTION, DECLARATION, FIELD, ENUMERATOR, MACRO, CLASS, ENUM, VARIABLE)
_MEMBER_USE = re.compile(r"(?=\b([A-Za-z_]\w*)\s*(?:\.|->)\s*([A-Za-z_]\w*))")
# `Name(`, `Name{`, `Name var(` / `Name var{`: an object of the class Name built
_CONSTRUCTS = re.compile(r"\b([A-Za-z_]\w*)(?:\s+[A-Za-z_]\w*)?\s*[({]")
# `Class * name`, `const struct Class & name`, followed by `,` `)` `=` `;` `{`: name is a Class
_DECLARES = re.compile(r"\b(?:struct\s+)?([A-Za-z_]\w*)\s*(?:const\s*)?[*&]+\s*(?:const\s+)?"
                       r"([A-Za-z_]\w*)\s*(?=[,)=;{\[])")
_MEANINGFUL = 4  # a line shorter than this, flattened, says nothing on its own ("}", "});")
_NEAR = 12  # lines within which an insertion's neighbour below may be, upstream having added some


def identifiers(lines: Iterable[str]) -> list[str]:
    """The names in `lines`, in order of first use, without keywords and string contents."""
    seen: dict[str, None] = {}
    for line in lines:
        code = re.sub(r'"(?:\\.|[^"\\])*"', '""', line.split("//", 1)[0])
        for name in _IDENT.findall(code):
            if name not in _KEYWORDS and len(name) > 1:
                seen.setdefault(name)
    return list(seen)


@lru_cache(maxsize=4096)
def _definition(name: str) -> re.Pattern[str]:
    word = re.escape(name)
    return re.compile("|".join((
        rf"^[A-Za-z_][\w:<>,\s*&]*\b{word}\s*\(",  # ret name(...) at file scope
        rf"^\s*(?:[\w:<>,*&]+\s+)+[*&]*{word}\s*(?:[;={{\[]|$)",  # type name; / = / {
        rf"^\s*(?:[\w:<>,*&]+\s+)+[*&]*{word}\s*\(",  # (member) function declaration
        rf"^\s*#\s*define\s+{word}\b",
        rf"^\s*{word}\s*(?:=[^=]|,|$)")))  # an enumerator


def _defines(name: str, lines: Iterable[str]) -> bool:
    """Whether `lines` define `name` (a function or declaration at file scope, a field, a
    variable, an enumerator or a macro) rather than only use it."""
    pattern = _definition(name)
    return any(name in line and pattern.search(line) for line in lines)


def _meaningful(lines: Iterable[str]) -> list[str]:
    return [f for f in (flat(line) for line in lines) if len(f) >= _MEANINGFUL]


_TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.]*|\S")


def _tokens(line: str) -> list[str]:
    """A line's C++ tokens, roughly: names, numbers, and every other character apart."""
    code = re.sub(r'"(?:\\.|[^"\\])*"', '""', line.split("//", 1)[0])
    return _TOKEN.findall(code)


def _akin(a: str, b: str) -> bool:
    """Whether `b` reads as a rename of `a`: anchors' rule (`akin`), the one for both."""
    return akin(a, b)


def _unify(ours: list[str], theirs: list[str], wild: frozenset[str], gained: frozenset[str],
           mapping: dict[str, str]) -> dict[str, str] | None:
    """`mapping` extended so that `ours` reads as `theirs` when each wild name stands for one
    name upstream gained that reads as its rename (one for one), or None. Every other token
    must be the same, and a
    line that has a wild name must also have two names of its own that match as they are."""
    if len(ours) != len(theirs):
        return None
    out = dict(mapping)
    literal = has_wild = 0
    for a, b in zip(ours, theirs, strict=True):
        if a in wild:
            has_wild = 1
            if out.get(a, b) != b or b not in gained or not _akin(a, b) \
                    or (a not in out and b in out.values()):
                return None
            out[a] = b
        elif a != b:
            return None
        elif _IDENT.fullmatch(a):
            literal += 1
    return out if not has_wild or literal >= 2 else None


@dataclass
class Side:
    """A tree as drift reads it: the folder whose paths the series names (a fork's vendored
    llama.cpp and ggml seen as one llama.cpp tree), and its index."""

    label: str
    root: Path
    patterns: tuple[str, ...]
    pin: str | None = None
    _flat: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _tokens: dict[str, list[list[str]]] = field(default_factory=dict, repr=False)
    _file_words: dict[str, frozenset[str]] = field(default_factory=dict, repr=False)

    @cached_property
    def index(self) -> Index:
        return Index.build(self.root, self.patterns)

    def text(self, rel: str) -> str | None:
        """The file as git sees it: a symbolic link is its target's name, never the file it
        points to (which may be outside the tree: its text must not reach a report)."""
        found = read_entry(self.root / rel)
        return found[0].decode("utf-8", errors="surrogateescape") if found else None

    def flat_lines(self, rel: str) -> list[str]:
        """The file's lines without layout and comments (cached: many hunks search one)."""
        if rel not in self._flat:
            text = self.text(rel)
            self._flat[rel] = [flat(x) for x in text.splitlines()] if text is not None else []
        return self._flat[rel]

    def file_words(self, rel: str) -> frozenset[str]:
        """The names used in one file (as `words`, without reading every file)."""
        if "words" in self.__dict__:
            return self.words.get(rel, frozenset())
        if rel not in self._file_words:
            text = self.text(rel)
            self._file_words[rel] = frozenset(_IDENT.findall(text)) if text else frozenset()
        return self._file_words[rel]

    def token_lines(self, rel: str) -> list[list[str]]:
        """The file's lines as tokens (cached, like flat_lines)."""
        if rel not in self._tokens:
            text = self.text(rel)
            self._tokens[rel] = [_tokens(x) for x in text.splitlines()] if text else []
        return self._tokens[rel]

    @cached_property
    def words(self) -> dict[str, frozenset[str]]:
        """The names used in each indexed file (for "is this name new?")."""
        return {rel: frozenset(_IDENT.findall(self.index.source(rel).decode(
                    "utf-8", errors="replace"))) for rel in self.index.files}

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


def _patch_lines(patch: Patch) -> dict[int, int]:
    """The line (1-based) of each hunk's @@ header in the patch file, by hunk index."""
    lines = patch.text.splitlines()
    out: dict[int, int] = {}
    at = 0
    for hunk in patch.hunks:
        head = hunk.text.splitlines()[0]
        while at < len(lines) and lines[at] != head:
            at += 1
        out[hunk.patch_index] = at + 1 if at < len(lines) else 1
        at += 1
    return out


def _changed_offset(hunk: Hunk) -> int:
    """Lines from the hunk's start to its first removed or added line (old side)."""
    count = 0
    for line in hunk.text.splitlines()[1:]:
        if line.startswith((" ",)):
            count += 1
        elif line.startswith(("-", "+")):
            return count
    return 0


def place_insertion(old_lines: list[str], at: int, target: list[str],
                    span: tuple[int, int]) -> int | None:
    """Where a pure insertion goes in `target` (0-based index of the line it goes before),
    within `span` (1-based lines): after the line most like its last neighbour above (and
    before one like its first neighbour below), when that place is clearly the best one.
    `old_lines` are the hunk's context lines, the insertion after the first `at` of them."""
    above = [flat(x) for x in old_lines[:at] if len(flat(x)) >= _MEANINGFUL]
    below = [flat(x) for x in old_lines[at:] if len(flat(x)) >= _MEANINGFUL]
    if not above:
        return None
    lo, hi = max(span[0] - 1, 0), min(span[1], len(target))
    flat_target = [flat(x) for x in target]
    scored: list[tuple[float, int]] = []
    for i in range(lo, hi):
        if len(flat_target[i]) < _MEANINGFUL:
            continue
        score = SequenceMatcher(None, above[-1], flat_target[i]).ratio()
        if score < PLACE_SIMILARITY:
            continue
        rest = [x for x in flat_target[i + 1:min(i + 4, hi)] if len(x) >= _MEANINGFUL]
        if below and rest:
            score += 0.5 * SequenceMatcher(None, below[0], rest[0]).ratio()
        scored.append((score, i))
    scored.sort(reverse=True)
    if not scored or (len(scored) > 1 and scored[0][0] - scored[1][0] < MARGIN):
        return None
    return scored[0][1] + 1


@dataclass(frozen=True)
class Landing:
    """A hunk carried into the target by relocation: the file it lands in, that file's bytes
    (as the earlier patches left it) with this hunk alone applied, the fuzz it took, and why
    its place is only a guess, if it is."""

    file: str
    data: bytes
    fuzz: int
    guess: str = ""  # why its place is not sure ("" when it is)


def _hunk_key(hunk: Hunk) -> tuple[str, int, int, str]:
    return hunk.path, hunk.patch_index, hunk.old_start, hunk.text


def _one_block(hunk: Hunk) -> bool:
    """Whether the hunk adds its lines in one run (so that they go in at one place)."""
    marks = "".join(line[:1] for line in hunk.text.splitlines()[1:] if line[:1] in " -+")
    return marks.strip(" ").count("+") == len(marks.strip(" ")) > 0


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" \t"))]


def _insert(data: bytes, placed: int, old_lines: list[str], cut: int,
            added: list[str]) -> Landing | None:
    """`data` with `added` (lines with their ends) inserted where place_insertion put them:
    after its line `placed` (1-based; the one like the hunk's last meaningful line above the
    insertion, which is after the hunk's first `cut` old lines) and the short lines that
    follow that one in the hunk, which must follow it in the target too (else None);
    indented as the target indents that line. When the target has other lines before the
    one the insertion went before, it goes right before that one (after code upstream put at
    the top, a guard say) if it is near, and the landing says that its place is a guess.
    `file` is left for the caller."""
    lines = data.decode("utf-8", errors="surrogateescape").splitlines(keepends=True)
    above = max(i for i in range(cut) if len(flat(old_lines[i])) >= _MEANINGFUL)
    tail = [flat(x) for x in old_lines[above + 1:cut]]
    if [flat(x) for x in lines[placed:placed + len(tail)]] != tail:
        return None
    here, there = _indent(old_lines[above]), _indent(lines[placed - 1])
    if here != there and set(here + there) <= {" "}:
        shift = len(there) - len(here)
        added = [(" " * shift + line if shift > 0 else line[min(-shift, len(_indent(line))):])
                 if line.strip() else line for line in added]
    at, guess = placed + len(tail), ""
    below = next((i for i in range(cut, len(old_lines))
                  if len(flat(old_lines[i])) >= _MEANINGFUL), None)
    if below is not None and at < len(lines):
        # the short lines between the insertion and that line, blank lines aside
        head = [f for f in (flat(x) for x in old_lines[cut:below]) if f]
        want = flat(old_lines[below])
        k = next((k for k in range(at, min(at + _NEAR, len(lines)))
                  if flat(lines[k]) == want), None)
        between = [f for f in (flat(x) for x in lines[at:k]) if f] if k is not None else []
        what = old_lines[below].strip()
        if k is None or between[len(between) - len(head):] != head:
            guess = f"the line it goes before ({what!r}) does not follow in the target"
        elif len(between) > len(head):
            start, count = k, len(head)
            while count:
                start -= 1
                count -= bool(flat(lines[start]))
            guess = (f"upstream has {len(between) - len(head)} lines between the lines it goes "
                     f"after and before ({what!r}); it was put right before that one")
            at = start
    if not lines[at - 1].endswith("\n"):
        lines[at - 1] += "\n"
    if added and not added[-1].endswith("\n") and at < len(lines):
        added[-1] += "\n"
    return Landing("", "".join(lines[:at] + added + lines[at:]).encode(
        "utf-8", errors="surrogateescape"), 0, guess)


def _find_block(hay: list[str], needle: list[str], near: int) -> int | None:
    """The 0-based start of `needle` in `hay` (flattened lines; layout-blind), the match
    nearest `near`."""
    want = [flat(x) for x in needle]
    if not want:
        return None
    starts = [i for i, line in enumerate(hay[:len(hay) - len(want) + 1])
              if line == want[0] and hay[i:i + len(want)] == want]
    return min(starts, key=lambda i: abs(i - near)) if starts else None


@lru_cache(maxsize=1)
def _fast_tmp() -> str | None:
    """Where drift's scratch files go: a memory file system when there is one to write in
    (GNU patch runs hundreds of times on them; a disk makes each run cost a few writes),
    else the system's temporary folder."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


def _has_run(hay: list[str], run: list[str]) -> bool:
    """Whether `run` occurs in `hay` as consecutive items."""
    n = len(run)
    return any(hay[i:i + n] == run for i, line in enumerate(hay) if line == run[0])


def _wholly_there(hunks: list[HunkDrift], blocks: dict[int, str]) -> list[HunkDrift]:
    """A patch the target has all of: the hunks that do not land (or land only with fuzz)
    found there by the presence rules, the ones that land found there as one block each
    (`there_as_block`: landing them would duplicate upstream's lines) is present upstream,
    every hunk of it. Where the rest of the patch is not there, such a block is a note to
    review on a hunk that keeps what text says."""
    if not blocks:
        return hunks
    there = (ALREADY_APPLIED, PRESENT_UPSTREAM)
    if all(h.status in there or i in blocks for i, h in enumerate(hunks)):
        return [replace(h, status=PRESENT_UPSTREAM,
                        reason=f"it {h.reason}, but the target has it already: {blocks[i]} "
                               "(landing it would write them twice), as it has the rest of "
                               "the patch")
                if i in blocks else h for i, h in enumerate(hunks)]
    return [replace(h, reason=f"{h.reason}; to review: {blocks[i]}") if i in blocks else h
            for i, h in enumerate(hunks)]


def _partly_there(hunks: list[HunkDrift]) -> list[HunkDrift]:
    """A patch part of which the target has while the rest still applies is a patch to
    refresh (without the part that is there), not one that fits: each hunk that is there
    needs attention then, saying so. When every hunk is there, or another one is in
    conflict anyway, the hunks keep their statuses."""
    there = (ALREADY_APPLIED, PRESENT_UPSTREAM)
    if not any(h.status in there for h in hunks) or \
            not all(h.status in (*there, CLEAN, OFFSET) for h in hunks) or \
            all(h.status in there for h in hunks):
        return hunks
    return [replace(h, status=CONFLICT, offset=0, fuzz=0,
                    reason=f"the patch is partly upstream: {h.reason}, while the rest of it "
                           "is not; refresh the patch without this hunk",
                    nearest=h.nearest)
            if h.status in there else h for h in hunks]


class _Carry(_Run):
    """Drift's run of a series on a target (GNU patch underneath, as the engine runs it), with
    two differences that make it read real history as a maintainer does:

      - GNU patch's verdict stands as it says it: a hunk it places at an offset, without
        fuzz, is offset (the engine also tries such a hunk reversed, which costs a run of
        GNU patch per hunk and can only turn a hunk that applies into an "already there");
      - a patch that fails still lends the later patches what of it was carried: the hunks
        GNU patch placed, the files it creates, and the hunks drift relocated (`lend`), so
        that one failure does not fail every later patch on the same files.
    """

    @classmethod
    @contextmanager
    def on(cls, series: Series, root: Path) -> Iterator[_Carry]:
        with tempfile.TemporaryDirectory(prefix="portkit-drift-", dir=_fast_tmp()) as tmp:
            tree = Path(tmp) / "tree"
            tree.mkdir()
            modes = {}
            for rel in series.paths:
                mode = _copy_in(root / rel, tree / rel)
                if mode is not None:
                    modes[rel] = mode
            run = cls(tree, Path(tmp) / "try", FUZZ_LIMIT, False, False, modes)
            run._files = {rel: (tree / rel).read_bytes() if (tree / rel).is_file() else None
                          for rel in series.paths}
            yield run

    check_offsets = False  # also try an offset hunk reversed (see patch)
    _files: dict[str, bytes | None]  # the tree's files, as carried so far

    def _landed(self, f: FileDiff, hunk: Hunk, base: HunkResult, verdict: _Verdict,
                at: int) -> HunkResult:
        if verdict.fuzz or self.check_offsets:
            return super()._landed(f, hunk, base, verdict, at)
        return replace(base, status=H_OFFSET if verdict.offset else H_CLEAN,
                       offset=verdict.offset, line=verdict.line)

    def patch(self, patch: Patch) -> PatchResult:
        before = {rel: self._files.get(rel) for rel in patch.paths}
        result = self._patch(patch)
        if any(h.status == ALREADY for h in result.hunks) and \
                any(h.status == H_OFFSET for h in result.hunks):
            # Part of the patch is there already: a hunk placed at an offset may be there
            # too (one that adds a line GNU patch would add a second time elsewhere).
            self.lend(before)
            self.check_offsets = True
            result = self._patch(patch)
            self.check_offsets = False
        if not result.applied and not result.problems:
            created = [f.path for f in patch.files if f.status == "created"]
            self.lend({rel: (self.trial / rel).read_bytes() for rel in created
                       if (self.trial / rel).is_file()})
        return result

    def _patch(self, patch: Patch) -> PatchResult:
        """The engine's run of one patch (_Run.patch), without emptying the try folder
        each time: only the patch's own files are laid there, which is all GNU patch
        reads."""
        self.trial.mkdir(exist_ok=True)
        lay_down(self.trial, {rel: self._files.get(rel) for rel in patch.paths})
        result = PatchResult(patch, [], applied=False)
        for f in patch.files:
            self._file(patch, f, result)
        result.applied = not result.problems and not result.failed
        if result.applied:
            self.lend({rel: (self.trial / rel).read_bytes() if (self.trial / rel).is_file()
                       else None for rel in patch.paths})
        return result

    def lend(self, files: dict[str, bytes | None]) -> None:
        """Later patches see these files so (None: absent)."""
        lay_down(self.tree, files)
        self._files.update(files)

    def files(self) -> dict[str, bytes | None]:
        """Every file the series touches, as carried so far (None: absent)."""
        return dict(self._files)


class _Target:
    """One target: the engine's run of the series on it, and the follow-up of failed hunks."""

    def __init__(self, series: Series, base: Side, target: Side,
                 upstream: dict[str, str] | None = None) -> None:
        self.series = series
        self.base = base
        self.target = target
        self.upstream = upstream or {}  # subject -> why, for a feature series portkit knows
        self.locator = Locator(base.index, target.index)
        self.current: dict[str, bytes | None] = {}
        self.homes: dict[str, str | None] = {}
        self.starts: dict[tuple[str, int, int, str], int] = {}
        self.places: dict[tuple[str, str, int], tuple[Candidate | None, str]] = {}
        self.landings: dict[tuple[str, int, int, str], Landing] = {}  # relocated hunks' bytes
        self.follow_lines = False  # map the index's lines into `current` (see _line_now)
        self._blocks: dict[str, tuple[bytes | None, list[tuple[int, int]]]] = {}
        self._room: tempfile.TemporaryDirectory[str] | None = None  # for _gnu_trial
        self._meaningful: dict[tuple[str, str], list[str]] = {}  # (side, file) -> its lines

    def run(self) -> TargetDrift:
        """The series patch by patch on the target, each on the files as the earlier ones
        were carried (what of them landed, relocated hunks included; see _Carry)."""
        patches = []
        with _Carry.on(self.series, self.target.root) as carry:
            for patch in self.series.patches:
                presult = carry.patch(patch)
                self.current = carry.files()
                self.landings.clear()
                patches.append(self.patch(presult))
                if not presult.applied:
                    carry.lend({landing.file: self.current[landing.file]
                                for landing in self.landings.values()})
        return TargetDrift(self.target.label, self.target.pin, tuple(patches))

    def patch(self, presult: PatchResult) -> PatchDrift:
        """One patch as the engine fared with it on `self.current`, hunk by hunk."""
        patch = presult.patch
        at = _patch_lines(patch)
        hunks: list[HunkDrift] = []
        blocks: dict[int, str] = {}  # landed hunks whose added block the target has already
        for hr in presult.hunks:
            assert hr.hunk is not None
            line = at.get(hr.hunk.patch_index, 1)
            if patch.subject in self.upstream and hr.status != ALREADY:
                hunks.append(HunkDrift(
                    hr.file, hr.old_start, PRESENT_UPSTREAM, "the target has this part of "
                    f"the feature upstream ({self.upstream[patch.subject]})", line))
                continue
            hunks.append(self._hunk(patch, hr.hunk, hr.status, hr.offset, hr.fuzz,
                                    hr.reason, line, hr.line))
            if hunks[-1].status in (CLEAN, OFFSET):
                block = self.there_as_block(hr.hunk)
                if block:
                    blocks[len(hunks) - 1] = block
        if not hunks:  # nothing to apply hunk by hunk (a binary patch, say)
            where = patch.paths[0] if patch.paths else patch.name
            hunks = [HunkDrift(where, 1, CONFLICT, problem, 1)
                     for problem in presult.problems or ["the patch changes no text"]]
        hunks = _wholly_there(hunks, blocks)
        hunks = _partly_there(hunks)
        there = all(h.status in (PRESENT_UPSTREAM, ALREADY_APPLIED) for h in hunks)
        return PatchDrift(patch.name, patch.subject, tuple(hunks),
                          () if there else tuple(self.semantic(patch)))

    # -- one hunk ----------------------------------------------------------------------

    def _hunk(self, patch: Patch, hunk: Hunk, status: str, offset: int, fuzz: int,
              reason: str, patch_line: int, found: int | None = None) -> HunkDrift:
        base_sym = self.base_symbol(hunk)
        name = base_sym.qualname if base_sym else None
        if status == H_FUZZ:
            there = self.there_verbatim(hunk)
            if there:
                return HunkDrift(hunk.path, hunk.old_start, PRESENT_UPSTREAM,
                                 f"it lands only with fuzz {fuzz}, and the target has it "
                                 f"already: {there}", patch_line, offset, fuzz, name)
        if status in (H_CLEAN, H_OFFSET, H_FUZZ):
            # Text first: where GNU patch places a hunk, that is its verdict. No presence
            # rule and no locator overrules it (they may only be wrong where text is not).
            mapped = {H_CLEAN: CLEAN, H_OFFSET: OFFSET, H_FUZZ: FUZZ}[status]
            said = "applies as it is" if mapped == CLEAN else (
                f"applies {offset:+d} lines away" + (f" with fuzz {fuzz}" if fuzz else ""))
            note = self.review_note(hunk)
            if note:
                said += f"; to review: upstream may have it already ({note})"
            return HunkDrift(hunk.path, hunk.old_start, mapped, said, patch_line, offset, fuzz,
                             name)
        if status == ALREADY:
            return HunkDrift(hunk.path, hunk.old_start, ALREADY_APPLIED,
                             "the target has exactly this change (it reverse-applies)",
                             patch_line, symbol=name,
                             nearest=Nearest(hunk.path, found, "\n".join(
                                 hunk.new_lines[:12])) if found else None)
        return self.follow(hunk, base_sym, reason, patch_line)

    def there_verbatim(self, hunk: Hunk) -> str:
        """For a hunk GNU patch lands only by ignoring context (fuzz: git apply would not
        take it): why the target's file has its change already by a rule that reads the
        lines as they are, when the lines it adds are new to the file since the base."""
        text = self.target.text(hunk.path)
        if text is None:
            return ""
        place = Place(self, hunk, hunk.path, None, text.splitlines())
        if not place.added or set(place.added) <= set(self.base.flat_lines(hunk.path)):
            return ""
        for rule in PRESENCE_RULES:
            if rule.verbatim:
                why = rule.holds(place)
                if why:
                    return why
        return ""

    def there_as_block(self, hunk: Hunk) -> str:
        """For a hunk that lands and only adds lines: why landing it would write upstream's
        lines a second time, or "": the target's file (as upstream has it) has every
        meaningful line it adds (two at least), in order and next to each other, and the
        base's file did not have them so. Evidence only: the hunk keeps what text says
        unless the rest of its patch is there too (`_wholly_there`)."""
        added = _meaningful(hunk.added)
        if len(added) < 2 or _meaningful(hunk.removed) or \
                not set(_IDENT.findall("\n".join(hunk.added))) <= self.target.file_words(hunk.path):
            return ""  # (cheap first: a name it adds that the file lacks)

        def meaningful(side: Side) -> list[str]:
            key = (side.label, hunk.path)
            if key not in self._meaningful:
                self._meaningful[key] = [f for f in side.flat_lines(hunk.path)
                                         if len(f) >= _MEANINGFUL]
            return self._meaningful[key]

        if not _has_run(meaningful(self.target), added) or \
                _has_run(meaningful(self.base), added):
            return ""
        return f"its {len(added)} added lines are there as one block, new since the base"

    def review_note(self, hunk: Hunk) -> str:
        """For a hunk that applies: a function or declaration it adds that upstream seems to
        have added under an akin name (a note only: the hunk's status is what text says)."""
        if hunk.removed or hunk.path not in self.target.index.files:
            return ""
        known = self.base.file_words(hunk.path)
        if not any(_defines(w, hunk.added) for w in identifiers(hunk.added) if w not in known):
            return ""  # it defines no new name
        text = self.target.text(hunk.path)
        if text is None:
            return ""
        place = Place(self, hunk, hunk.path, None, text.splitlines())
        return there_under_upstreams_names(place)

    def between(self, hunk: Hunk) -> str:
        """What a hunk between definitions goes next to, and whether the target has it."""
        said = []
        for sym, side in zip(self.neighbours(hunk), ("after", "before"), strict=True):
            if sym is not None:
                cand, _ = self.located(sym)
                said.append(f"it goes {side} {sym.qualname}, " + (
                    f"which is {cand.symbol.qualname} at {cand.symbol.where}" if cand
                    else "which is not in the target"))
        return "; " + "; ".join(said) if said else ""

    def neighbours(self, hunk: Hunk) -> tuple[Symbol | None, Symbol | None]:
        """The base's definitions just above and just below a hunk between definitions."""
        if hunk.path not in self.base.index.files:
            return None, None
        at = self.base_start(hunk) + _changed_offset(hunk) + 1
        index = self.base.index
        top = [s for s in index.symbols if s.file == hunk.path and s.kind != FIELD
               and index.enclosing(hunk.path, s.start_line) in (s, None)]
        above = [s for s in top if s.end_line < at]
        below = [s for s in top if s.start_line >= at]
        return (max(above, key=lambda s: s.end_line) if above else None,
                min(below, key=lambda s: s.start_line) if below else None)

    def base_start(self, hunk: Hunk) -> int:
        """Where the hunk's old side is in the base file (0-based), or where it says."""
        key = (hunk.path, hunk.patch_index, hunk.old_start, hunk.text)
        if key not in self.starts:
            found = _find_block(self.base.flat_lines(hunk.path), list(hunk.old_lines),
                                hunk.old_start - 1)
            self.starts[key] = found if found is not None else hunk.old_start - 1
        return self.starts[key]

    def base_symbol(self, hunk: Hunk) -> Symbol | None:
        """The base's symbol around the hunk's first change."""
        if hunk.path not in self.base.index.files:
            return None
        first = self.base_start(hunk) + _changed_offset(hunk)
        last = max(len(self.base.flat_lines(hunk.path)), 1)
        sym = self.base.index.enclosing(hunk.path, min(first + 1, last))
        if hunk.removed or sym is None:
            return sym
        # A pure insertion goes between two lines: it is inside what holds both of them.
        before = self.base.index.enclosing(hunk.path, min(max(first, 1), last))
        return sym if before is not None and before.qualname == sym.qualname else None

    def located(self, sym: Symbol) -> tuple[Candidate | None, str]:
        """Where `sym` went in the target: one sure candidate, or why there is none."""
        key = (sym.qualname, sym.file, sym.start_line)
        if key not in self.places:
            self.places[key] = self._locate(sym)
        return self.places[key]

    def _locate(self, sym: Symbol) -> tuple[Candidate | None, str]:
        found = self.locator.locate(sym, floor=SURE)
        if not found or found[0].confidence < SURE:
            return None, f"{sym.qualname} is not in the target"
        if len(found) > 1 and found[0].confidence - found[1].confidence < MARGIN \
                and found[1].symbol.qualname != found[0].symbol.qualname:
            return None, (f"{sym.qualname} could be {found[0].symbol.qualname} or "
                          f"{found[1].symbol.qualname} in the target")
        return found[0], ""

    def follow(self, hunk: Hunk, base_sym: Symbol | None, reason: str,
               patch_line: int) -> HunkDrift:
        name = base_sym.qualname if base_sym else None
        cand, why_not = self.located(base_sym) if base_sym else (None, "")
        if cand is not None and base_sym is not None:
            tsym = cand.symbol
            upstream = self.present(hunk, tsym.file, (tsym.start_line, tsym.end_line))
            if upstream:
                return HunkDrift(hunk.path, hunk.old_start, PRESENT_UPSTREAM,
                                 f"{tsym.qualname} in the target has it already: {upstream}",
                                 patch_line, symbol=name)
            moved = self.relocate(hunk, base_sym, tsym)
            if moved is not None:
                line, offset, fuzz = moved
                where = ("renamed " if tsym.name != base_sym.name else "") + (
                    f"moved to {tsym.file}" if tsym.file != base_sym.file else "")
                return HunkDrift(
                    hunk.path, hunk.old_start, RELOCATED,
                    f"{base_sym.qualname} is {tsym.qualname} at {tsym.where} in the target"
                    f"{' (' + where.strip() + ')' if where.strip() else ''}; found by "
                    f"{cand.strategy}", patch_line, offset, fuzz, name,
                    Moved(tsym.file, line, tsym.qualname, cand.strategy or "similarity"))
            near = self.nearest(hunk, tsym.file, (tsym.start_line, tsym.end_line))
            into = self.base_start(hunk) + 1 - base_sym.start_line
            line = near.line if near is not None else min(
                tsym.start_line + max(into, 0), tsym.end_line)
            return HunkDrift(hunk.path, hunk.old_start, CONFLICT,
                             f"context changed in {tsym.qualname} ({tsym.where})", patch_line,
                             symbol=name, nearest=near,
                             moved_to=Moved(tsym.file, line, tsym.qualname,
                                            cand.strategy or "similarity"))
        if self._current(hunk.path) is not None:
            upstream = self.present(hunk, hunk.path, None)
            if upstream and base_sym is None:
                return HunkDrift(hunk.path, hunk.old_start, PRESENT_UPSTREAM,
                                 f"{hunk.path} in the target has it already: {upstream}",
                                 patch_line)
            why = why_not or (f"context changed ({reason})" if reason else "context changed")
            return HunkDrift(hunk.path, hunk.old_start, CONFLICT, why, patch_line, symbol=name,
                             nearest=self.nearest(hunk, hunk.path, None))
        home = self.home(hunk.path)
        if home is not None and (base_sym is None or cand is None):
            upstream = self.present(hunk, home, None, verbatim=base_sym is None)
            if upstream:
                return HunkDrift(hunk.path, hunk.old_start, PRESENT_UPSTREAM,
                                 f"{home} in the target has it already: {upstream}",
                                 patch_line, symbol=name)
            moved = self.relocate_in_file(hunk, home)
            if moved is not None:
                line, offset, fuzz = moved
                around = self.target.index.enclosing(home, line) \
                    if home in self.target.index.files else None
                return HunkDrift(
                    hunk.path, hunk.old_start, RELOCATED,
                    f"{hunk.path} is {home} in the target (where its symbols went)",
                    patch_line, offset, fuzz, name,
                    Moved(home, line, around.qualname if around else "", "structure"))
        why = f"{hunk.path} is not in the target" + (f"; {why_not}" if why_not else "")
        if base_sym is None:
            why += self.between(hunk)
        near = self.nearest(hunk, home, None) if home else self.nearest_anywhere(hunk)
        if near is None and base_sym is None:
            near = self.after_neighbour(hunk)
        return HunkDrift(hunk.path, hunk.old_start, CONFLICT, why, patch_line, symbol=name,
                         nearest=near)

    def after_neighbour(self, hunk: Hunk) -> Nearest | None:
        """For a hunk between definitions that no lines place: the end of the definition it
        goes after, where the locator found that one in the target."""
        above, _ = self.neighbours(hunk)
        cand = self.located(above)[0] if above is not None else None
        if cand is None:
            return None
        tsym = cand.symbol
        current = self._current(tsym.file)
        if current is None:
            return None
        lines = current.decode("utf-8", errors="surrogateescape").splitlines()
        end = min(self._line_now(tsym.file, tsym.end_line, always=True), len(lines))
        start = max(end - 2, 1)
        return Nearest(tsym.file, start, "\n".join(lines[start - 1:end]))

    # -- relocation --------------------------------------------------------------------

    def home(self, rel: str) -> str | None:
        """Where a base file that the target lacks went: the target file of the same kind
        that holds most of its classes and functions (by name, through aliases)."""
        if rel in self.homes:
            return self.homes[rel]
        votes: Counter[str] = Counter()
        suffix = Path(rel).suffix
        if rel in self.base.index.files:
            for sym in self.base.index.symbols:
                if sym.file != rel or sym.kind not in (CLASS, FUNCTION) or "::" in sym.scope:
                    continue
                for cand in find(self.target.index, sym.qualname, (sym.kind,)):
                    if cand.symbol.file.endswith(suffix):
                        votes[cand.symbol.file] += 1
                        break
        self.homes[rel] = votes.most_common(1)[0][0] if votes else None
        return self.homes[rel]

    def relocate_in_file(self, hunk: Hunk, rel: str) -> tuple[int, int, int] | None:
        names = {w: a for w in identifiers(hunk.old_lines) if not self.target.index.find(w)
                 for a in aliases_of(w)[:1] if a != w and self.target.index.find(a)}
        return self._trial(hunk, rel, hunk.old_start, names, None)

    def renames(self, hunk: Hunk, base_sym: Symbol, tsym: Symbol) -> dict[str, str]:
        """Names of the hunk's context to spell as the target does: the symbol's own and its
        class's, and every name the base defines that the target knows by an alias."""
        out: dict[str, str] = {}
        if base_sym.name != tsym.name:
            out[base_sym.name] = tsym.name
        base_scope, target_scope = base_sym.scope.rsplit("::", 1)[-1], \
            tsym.scope.rsplit("::", 1)[-1]
        if base_scope and target_scope and base_scope != target_scope:
            out[base_scope] = target_scope
        for word in identifiers(hunk.old_lines):
            if word in out or self.target.index.find(word) or not self.base.index.find(word):
                continue
            for alias in aliases_of(word):
                if alias != word and self.target.index.find(alias):
                    out[word] = alias
                    break
        return out

    def relocate(self, hunk: Hunk, base_sym: Symbol,
                 tsym: Symbol) -> tuple[int, int, int] | None:
        """Try the hunk, in the target's spelling, inside `tsym`: (line, offset, fuzz) where it
        lands, or None."""
        into = self.base_start(hunk) + 1 - base_sym.start_line
        now = self._line_now
        return self._trial(hunk, tsym.file, max(1, now(tsym.file, tsym.start_line) + into),
                           self.renames(hunk, base_sym, tsym),
                           (now(tsym.file, tsym.start_line - 3), now(tsym.file, tsym.end_line + 3)))

    def _line_now(self, rel: str, line: int, *, always: bool = False) -> int:
        """A line of the target's file as upstream has it, in the file as the earlier patches
        left it: the same line when not `follow_lines` (drift's own runs, where the index's
        lines stand for both), unless `always`."""
        current = self.current.get(rel) if self.follow_lines or always else None
        upstream = self.target.text(rel) if current is not None else None
        if current is None or upstream is None:
            return line
        if self._blocks.get(rel, (None, []))[0] is not current:
            self._blocks[rel] = (current, line_blocks(
                upstream.encode("utf-8", errors="surrogateescape"), current))
        blocks = self._blocks[rel][1]
        at = bisect_right(blocks, (line - 1, len(current) + 1)) - 1
        a, b = blocks[at] if at >= 0 else (0, 0)
        return line + b - a

    def _trial(self, hunk: Hunk, rel: str, old_start: int, names: dict[str, str],
               span: tuple[int, int] | None, *,
               upstream: bool = False) -> tuple[int, int, int] | None:
        """The hunk with `names` respelled, tried on the target's `rel` (as the earlier
        patches left it, or as `upstream` has it) from `old_start`: (line, offset, fuzz)
        where it lands within `span` lines, or None."""
        text = self.target.text(rel) if upstream else None
        current = text.encode("utf-8", "surrogateescape") if text is not None \
            else None if upstream else self._current(rel)
        if current is None:
            return None
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b") if names else None

        def spell(line: str) -> str:
            return pattern.sub(lambda m: names[m.group(1)], line) if pattern else line

        body = [spell(line) for line in hunk.text.splitlines()[1:]]
        old_len = sum(1 for ln in body if ln[:1] in (" ", "-"))
        new_len = sum(1 for ln in body if ln[:1] in (" ", "+"))
        text = (f"--- a/{rel}\n+++ b/{rel}\n"
                f"@@ -{old_start},{old_len} +{old_start},{new_len} @@\n" + "\n".join(body) + "\n")
        found = self._gnu_trial(rel, current, text)
        if found is not None:
            line, offset, fuzz, after = found
            if span is not None and not span[0] <= line <= span[1]:
                return None  # the context is elsewhere: not inside the symbol it went to
            if not upstream:
                self._landed(hunk, Landing(rel, after, fuzz))
            return line, offset, fuzz
        if span is None or hunk.removed:
            return None
        lines = current.decode("utf-8", errors="surrogateescape").splitlines()
        placed = place_insertion([spell(x) for x in hunk.old_lines], _changed_offset(hunk),
                                 lines, span)
        if placed is None:
            return None
        if not upstream and _one_block(hunk):
            landing = _insert(current, placed, [spell(x) for x in hunk.old_lines],
                              _changed_offset(hunk), [spell(x) for x in hunk.added])
            if landing is not None:
                self._landed(hunk, replace(landing, file=rel))
        return placed + 1, placed + 1 - old_start - _changed_offset(hunk), 0

    def _gnu_trial(self, rel: str, current: bytes,
                   section: str) -> tuple[int, int, int, bytes] | None:
        """GNU patch's run of one hunk (`section`, a one-hunk diff of `rel`) on `current`, as
        the engine runs it, in a scratch folder kept for all trials: (line, offset, fuzz,
        the file after) where it lands, or None. Where it lands is its verdict (text
        first: no reverse trial)."""
        if self._room is None:
            self._room = tempfile.TemporaryDirectory(prefix="portkit-trial-", dir=_fast_tmp())
        root = Path(self._room.name)
        shutil.rmtree(root / "t", ignore_errors=True)
        (root / "t" / rel).parent.mkdir(parents=True)
        (root / "t" / rel).write_bytes(current)
        (root / "s.diff").write_bytes(section.encode("utf-8", errors="surrogateescape"))
        _, out = _gnu(["--force", "--verbose", "-p1", "--no-backup-if-mismatch",
                       "--reject-file=-", f"--fuzz={FUZZ_LIMIT}", "-i", str(root / "s.diff")],
                      root / "t")
        verdict = _verdicts(out).get(1)
        if verdict is None or verdict.word != "succeeded" or not (root / "t" / rel).is_file():
            return None
        return verdict.line, verdict.offset, verdict.fuzz, (root / "t" / rel).read_bytes()

    def _landed(self, hunk: Hunk, landing: Landing) -> None:
        """Keep where a hunk was relocated to; in drift's own run, the later hunks and
        patches see the file with it (the series as carried)."""
        self.landings[_hunk_key(hunk)] = landing
        if not self.follow_lines:
            self.current[landing.file] = landing.data

    # -- already there ----------------------------------------------------------------

    def present(self, hunk: Hunk, rel: str, span: tuple[int, int] | None, *,
                verbatim: bool = True) -> str:
        """Why the target as upstream has it (its file `rel`, within `span` lines) has the
        failed hunk's change already, or "": the first rule of PRESENCE_RULES that holds
        says why (without `verbatim`, the rules that read lines as they are are skipped).
        Only for a hunk that does not apply: none of these overrules one that does."""
        text = self.target.text(rel)
        if text is None:
            return ""
        lines = text.splitlines()
        if span is not None:
            lines = lines[max(span[0] - 1, 0):span[1]]
        place = Place(self, hunk, rel, span, lines)
        for rule in PRESENCE_RULES:
            if verbatim or not rule.verbatim:
                why = rule.holds(place)
                if why:
                    return why
        return ""

    def present_renamed(self, hunk: Hunk, rel: str, span: tuple[int, int] | None,
                        removed: list[str]) -> str:
        """Why the target's file `rel` (within `span` lines) has what the hunk adds under
        other names, or "": the hunk defines a name the target does not have, and every
        meaningful added line is there, in order and close together, once each name the
        target lacks (the hunk's own new names, names upstream renamed) is read as one name
        upstream gained that reads as its rename. A definition at file scope is looked for in
        the whole file. Lines the hunk removes must be gone from there."""
        here = self.target.file_words(rel)
        wild = frozenset(w for w in identifiers(hunk.added)
                         if w not in here and not self.target.index.find(w))
        defining = [line for line in hunk.added if any(_defines(w, [line]) for w in wild)]
        if not defining:
            return ""
        # cheap first: a name the hunk defines must have an akin name new in the file
        new_here = here - self.base.all_words
        if not any(_akin(w, g) for w in wild if _defines(w, defining) for g in new_here):
            return ""
        lo, hi = 0, None
        if span is not None and all(line[:1] in (" ", "\t") for line in defining):
            lo, hi = max(span[0] - 1, 0), span[1]
        theirs = self.target.token_lines(rel)[lo:hi]
        ours = [_tokens(line) for line in hunk.added if len(flat(line)) >= _MEANINGFUL]
        reach = len(hunk.added) + _NEAR

        def match(i: int, after: int, mapping: dict[str, str]) -> tuple[dict[str, str],
                                                                        list[int]] | None:
            if i == len(ours):
                return mapping, []
            stop = len(theirs) if i == 0 else min(len(theirs), after + 1 + reach)
            for j in range(after + 1, stop):
                extended = _unify(ours[i], theirs[j], wild, new_here, mapping)
                if extended is not None:
                    rest = match(i + 1, j, extended)
                    if rest is not None:
                        return rest[0], [j, *rest[1]]
            return None

        found = match(0, -1, {})
        if found is None or not found[0]:
            return ""
        mapping, at = found
        near = set(self.target.flat_lines(rel)[lo:hi][max(at[0] - 2, 0):at[-1] + 3])
        if any(r in near for r in removed):
            return ""
        return "it has " + ", ".join(f"{a} as {b}" for a, b in mapping.items())

    # -- nearest match -----------------------------------------------------------------

    def nearest(self, hunk: Hunk, rel: str, span: tuple[int, int] | None) -> Nearest | None:
        current = self._current(rel)
        if current is None:
            return None
        lines = current.decode("utf-8", errors="surrogateescape").splitlines()
        lo, hi = (max(span[0] - 1, 0), span[1]) if span else (0, len(lines))
        votes: Counter[int] = Counter()
        where: dict[str, list[int]] = defaultdict(list)
        for i in range(lo, min(hi, len(lines))):
            where[flat(lines[i])].append(i)
        old = list(hunk.old_lines)
        for pos, line in enumerate(old):
            key = flat(line)
            if len(key) < _MEANINGFUL:
                continue
            for i in where.get(key, ()):
                votes[i - pos] += 1
        if not votes:
            votes = self._alike_votes(old, lines, lo, min(hi, len(lines)))
        if not votes:
            return None
        start, count = max(votes.items(),
                           key=lambda kv: (kv[1], -abs(kv[0] - hunk.old_start + 1)))
        if count < 2:
            return None  # a line or two alike anywhere is no place: better none than a wrong one
        start = max(start, 0)
        text = "\n".join(lines[start:start + max(len(old), 1)][:12])
        return Nearest(rel, start + 1, text)

    @staticmethod
    def _alike_votes(old: list[str], lines: list[str], lo: int, hi: int) -> Counter[int]:
        """Where the hunk's old lines are, when none of them is there as it was (upstream
        renamed what they use): each line votes for the lines between `lo` and `hi` that use
        mostly the same names (at least 3 of them, 60% alike)."""
        votes: Counter[int] = Counter()
        words = [frozenset(identifiers([line])) for line in old]
        if not any(len(w) >= 3 for w in words):
            return votes
        theirs = [frozenset(identifiers([lines[i]])) for i in range(lo, hi)]
        for pos, mine in enumerate(words):
            if len(mine) < 3:
                continue
            for i, other in enumerate(theirs):
                if other and len(mine & other) >= 0.6 * len(mine | other):
                    votes[lo + i - pos] += 1
        return votes

    def nearest_anywhere(self, hunk: Hunk) -> Nearest | None:
        """For a hunk whose file is gone: the nearest match in the target file of the same
        kind that shares the most of its meaningful lines."""
        wanted = set(_meaningful(hunk.old_lines))
        if not wanted:
            return None
        suffix = Path(hunk.path).suffix
        best: tuple[int, str] | None = None
        for rel in self.target.index.files:
            if not rel.endswith(suffix):
                continue
            text = self.target.index.source(rel).decode("utf-8", errors="replace")
            shared = len(wanted & {flat(x) for x in text.splitlines()})
            if shared >= max(2, len(wanted) / 2) and (best is None or shared > best[0]):
                best = (shared, rel)
        return self.nearest(hunk, best[1], None) if best else None

    def _words_now(self, rel: str) -> frozenset[str]:
        """The names in the target's file `rel` as the series is carried (its own added
        files and lines included)."""
        data = self._current(rel)
        if data is None:
            return frozenset()
        return frozenset(_IDENT.findall(data.decode("utf-8", errors="replace")))

    def _current(self, rel: str) -> bytes | None:
        """The target's file as the earlier patches of the series left it."""
        if rel in self.current:
            return self.current[rel]
        found = read_entry(self.target.root / rel)
        return found[0] if found else None

    # -- semantic drift ----------------------------------------------------------------

    def semantic(self, patch: Patch) -> list[SemanticChange]:
        """The symbols the patch's added lines use whose definition changed in the target:
        only symbols resolved without doubt (see `meanings`)."""
        added_all = [line for h in patch.hunks for line in h.added]
        defined_here = set(identifiers(added_all)) - self.base.all_words
        out: dict[str, SemanticChange] = {}
        for hunk in patch.hunks:
            receivers: dict[str, set[str]] = defaultdict(set)
            bare: set[str] = set()
            built: set[str] = set()
            typed = self.declared(hunk)
            for line in hunk.added:
                for obj, member in _MEMBER_USE.findall(line):
                    receivers[member].add(typed.get(obj, obj))
                bare.update(_bare_names(line))
                built.update(_CONSTRUCTS.findall(line))
            around = self.base_symbol(hunk)
            home = (around.qualname if around and around.kind in (CLASS, ENUM)
                    else around.scope if around else "")
            for word in identifiers(hunk.added):
                if word in defined_here or word in out:
                    continue
                change = self.changed(word, receivers.get(word, set()), home,
                                      word in bare, word in built)
                if change is not None:
                    out[word] = change
        return list(out.values())

    def declared(self, hunk: Hunk) -> dict[str, str]:
        """The objects the hunk's own lines declare as a pointer or reference to a class the
        base defines (`const llama_context * ctx`, a parameter or a local): name -> class.
        A name declared as two classes is left out."""
        seen: dict[str, set[str]] = defaultdict(set)
        for line in (*hunk.old_lines, *hunk.added):
            code = re.sub(r'"(?:\\.|[^"\\])*"', '""', line.split("//", 1)[0])
            for cls, name in _DECLARES.findall(code):
                if name not in _KEYWORDS and any(
                        s.kind == CLASS for s in self.base.index.find(cls, (CLASS,))):
                    seen[name].add(cls)
        return {name: next(iter(classes)) for name, classes in seen.items()
                if len(classes) == 1}

    def meanings(self, word: str, receivers: set[str], home: str,
                 bare: bool = True, built: bool = True) -> list[Symbol]:
        """What `word` names in the base where the patch uses it, when that is known without
        doubt; else nothing. Used on an object (`hparams.n_rot`), it is a member of the class
        the object is named after (llama_hparams), or of the hunk's own class (`this->`);
        used bare, a member of the class whose method the hunk is in, or else a free
        function, macro, type, enumerator or variable with exactly one definition (a class
        with its constructors) and no member of that name anywhere. A member name alone
        (`dev`, `path`, `second`) never resolves."""
        found = self.base.index.find(word, _USED_KINDS)
        if not found:
            return []

        def scope_of(sym: Symbol) -> str:
            return sym.scope.rsplit("::", 1)[-1]

        chosen: list[Symbol] = []
        if receivers:
            named = {r for r in receivers if len(r) >= 3 and r != "this"}
            chosen = [s for s in found if s.scope and any(
                scope_of(s) == r or scope_of(s).endswith("_" + r) for r in named)]
            if not chosen and "this" in receivers and home:
                chosen = [s for s in found if s.scope == home]
        elif bare:
            if home:
                chosen = [s for s in found if s.scope == home]
            if not chosen:
                free = [s for s in found if not self._member(s) or scope_of(s) == word]
                quals = {canonical(s.qualname) for s in free if scope_of(s) != word}
                if len(free) == len(found) and len(quals) == 1:
                    # a class stands for its constructors only where it builds an object
                    chosen = [s for s in free if built or scope_of(s) != word]
        return sorted(chosen, key=lambda s: (s.kind not in (FUNCTION, DECLARATION, MACRO),
                                             s.kind not in (CLASS, ENUM)))

    def _member(self, sym: Symbol) -> bool:
        """Whether `sym` is a member of a class (not a free symbol of a namespace or an
        unscoped enum's enumerator)."""
        if not sym.scope:
            return False
        owners = self.base.index.by_qualname.get(sym.scope, [])
        return any(o.kind == CLASS for o in owners) or (
            sym.kind != ENUMERATOR and any(o.kind == ENUM for o in owners))

    def renamed_member(self, sym: Symbol) -> Symbol | None:
        """Where a member the target's class lacks went, when that is known without doubt:
        the class is there, and of the members of the same kind it gained (names the base's
        class did not have) exactly one reads as a rename of it (`_akin`)."""
        if not sym.scope or not self._member(sym):
            return None
        scope = canonical(sym.scope)
        had = {s.name for s in _by_scope(self.base.index).get(scope, ())}
        kinds = {sym.kind} | ({FUNCTION, DECLARATION} if sym.kind in (FUNCTION, DECLARATION)
                              else set())
        gained = {s.name: s for s in _by_scope(self.target.index).get(scope, ())
                  if s.kind in kinds and s.name not in had and _akin(sym.name, s.name)}
        return next(iter(gained.values())) if len(gained) == 1 else None

    def heirs(self, sym: Symbol, twin: Symbol) -> list[Symbol]:
        """Where a field or variable went when its name now means something else (a field
        renamed `x_full` and the name kept for an accessor `x(il)`): the symbols of its kind,
        beside the new meaning, whose names extend the old one."""
        data = (FIELD, VARIABLE)
        if (sym.kind in data) == (twin.kind in data):
            return []
        return [s for s in self.target.index.symbols if s.kind == sym.kind
                and s.scope == twin.scope and s.name != sym.name
                and (s.name.startswith(sym.name + "_") or s.name.endswith("_" + sym.name))]

    def changed(self, word: str, receivers: set[str], home: str,
                bare: bool = True, built: bool = True) -> SemanticChange | None:
        """How the symbol(s) `word` names changed in the target, or None when one meaning
        of it is unchanged (no claim then on the others), or when what it names is not
        known without doubt."""
        base_syms = self.meanings(word, receivers, home, bare, built)
        if not base_syms:
            return None
        by_qual = {canonical(s.qualname): s
                   for s in self.target.index.find(word, _USED_KINDS)}
        changes: list[SemanticChange] = []
        missing: list[Symbol] = []
        for sym in base_syms:
            twin = by_qual.get(canonical(sym.qualname))
            if twin is None:
                missing.append(sym)
                continue
            detail = _difference(sym, twin)
            if not detail:
                if sym.kind in (CLASS, ENUM) and (changes or missing):
                    continue  # a class stands for its constructors, which did change
                return None
            heirs = self.heirs(sym, twin)
            if heirs:
                changes.append(SemanticChange(
                    word, "renamed", f"{sym.qualname} is "
                    f"{' or '.join(h.qualname for h in heirs)} now; the name is a {twin.kind} "
                    f"now ({twin.signature()})"))
                continue
            kind = "signature" if sym.kind in (FUNCTION, DECLARATION, MACRO) and \
                twin.kind in (FUNCTION, DECLARATION, MACRO) else "type"
            changes.append(SemanticChange(word, kind, detail))
        if changes:
            return changes[0]
        for sym in missing:
            cand, _ = self.located(sym)
            if cand is not None and cand.symbol.name != word:
                return SemanticChange(word, "renamed", f"{sym.qualname} is "
                                      f"{cand.symbol.qualname} in the target "
                                      f"({cand.symbol.where}, {cand.strategy})")
        for sym in missing:
            heir = self.renamed_member(sym)
            if heir is not None:
                return SemanticChange(word, "renamed", f"{sym.qualname} is {heir.qualname} in "
                                      f"the target ({heir.where}, the one member of its kind "
                                      "the class gained under an akin name)")
        sym = missing[0]
        if self._current(sym.file) is None or word in self._words_now(sym.file):
            # Still in its file: the index missed it (a parse error). Or its whole file is
            # not in the target: a file the fork keeps beside upstream's (its own headers),
            # which says nothing about the name.
            return None
        return SemanticChange(word, "removed", f"{sym.qualname} ({sym.kind} at {sym.where} "
                              f"in the base) is not in the target")


_SCOPES: dict[int, tuple[Index, dict[str, list[Symbol]]]] = {}


def _by_scope(index: Index) -> dict[str, list[Symbol]]:
    """An index's members by their class (today's names), built once per index."""
    kept = _SCOPES.get(id(index))
    if kept is None or kept[0] is not index:
        table: dict[str, list[Symbol]] = defaultdict(list)
        for sym in index.symbols:
            if sym.scope:
                table[canonical(sym.scope)].append(sym)
        if len(_SCOPES) > 8:
            _SCOPES.clear()
        kept = _SCOPES[id(index)] = (index, dict(table))
    return kept[1]


def _bare_names(line: str) -> set[str]:
    """The names a line uses on their own: not after `.`, `->` or `::`."""
    code = re.sub(r'"(?:\\.|[^"\\])*"', '""', line.split("//", 1)[0])
    return {m.group(1) for m in re.finditer(r"(?<![\w.>:])([A-Za-z_]\w*)", code)
            if not re.search(r"(?:\.|->|::)\s*$", code[:m.start()])}


def _spelled(text: str) -> str:
    """A type as C++ reads it: today's names (`canonical`), without the elaborated-type
    keywords C code writes (`struct llama_model &` is `llama_model &`) and spacing."""
    return " ".join(re.sub(r"\b(?:struct|class|union|enum)\s+", "", canonical(text)).split())


def _difference(old: Symbol, new: Symbol) -> str:
    """How a symbol's interface changed ("" when it did not)."""
    if old.kind != new.kind and {old.kind, new.kind} != {FUNCTION, DECLARATION}:
        return f"{old.qualname} was a {old.kind} ({old.signature()}), is a {new.kind} now " \
               f"({new.signature()})"
    if old.kind in (FUNCTION, DECLARATION, MACRO):
        if [_spelled(p) for p in old.params] != [_spelled(p) for p in new.params]:
            return f"{old.signature()} is {new.signature()} now"
        if old.kind != MACRO and _spelled(old.returns) != _spelled(new.returns):
            return f"{old.qualname} returns {new.returns or '?'} now, not {old.returns or '?'}"
    if old.kind in (FIELD, VARIABLE) and _spelled(old.returns) != _spelled(new.returns):
        return f"{old.qualname} is {new.returns} now, not {old.returns}"
    return ""


# -- present upstream: the rules, in order ---------------------------------------------------


@dataclass
class Place:
    """Where a failed hunk's change is looked for: the target's file `rel` as upstream has
    it, within `span` lines (its `lines`), and what each presence rule reads of the hunk."""

    target: _Target
    hunk: Hunk
    rel: str
    span: tuple[int, int] | None
    lines: list[str]

    @cached_property
    def flat_lines(self) -> list[str]:
        return [flat(line) for line in self.lines]

    @cached_property
    def here(self) -> set[str]:
        return set(self.flat_lines)

    @cached_property
    def added(self) -> list[str]:
        return _meaningful(self.hunk.added)

    @cached_property
    def removed(self) -> list[str]:
        return [r for r in _meaningful(self.hunk.removed) if r not in set(self.added)]

    @cached_property
    def new_names(self) -> list[str]:
        """The names the hunk's added lines bring that its file in the base lacks."""
        base = self.target.base
        known = base.words.get(self.hunk.path, base.all_words)
        return [w for w in identifiers(self.hunk.added) if w not in known]


def added_lines_there(p: Place) -> str:
    """Every meaningful line the hunk adds is there, and the lines it removes are gone from
    around them (the same line may well stay elsewhere in the function)."""
    if not p.added or not all(a in p.here for a in p.added):
        return ""
    wanted = set(p.added)
    at = [i for i, f in enumerate(p.flat_lines) if f in wanted]
    reach = len(p.hunk.old_lines) + 2
    near = set(p.flat_lines[max(min(at) - reach, 0):max(at) + reach + 1])
    return "" if any(r in near for r in p.removed) else f"all {len(p.added)} added lines are there"


def removed_lines_gone(p: Place) -> str:
    """A hunk that only removes lines: none of them is there any more."""
    if p.added or not p.removed or any(r in p.here for r in p.removed):
        return ""
    return f"the {len(p.removed)} lines it removes are gone"


def new_names_there(p: Place) -> str:
    """Every name the hunk brings is there (used right there; one it defines, defined
    anywhere in the target), and no line it removes is left."""
    if not p.new_names or any(r in p.here for r in p.removed):
        return ""
    words = set(_IDENT.findall("\n".join(p.lines)))
    defined = {w for w in p.new_names if _defines(w, p.hunk.added)}
    index = p.target.target.index
    if any(w not in words and not (w in defined and index.find(w)) for w in p.new_names):
        return ""
    return f"it has {', '.join(p.new_names[:4])}" + (" ..." if len(p.new_names) > 4 else "")


def there_under_upstreams_names(p: Place) -> str:
    """Every meaningful added line is there once the names the target lacks are read as
    the akin names upstream gained (`present_renamed`), and no line it removes is left."""
    if not p.new_names or any(r in p.here for r in p.removed):
        return ""
    return p.target.present_renamed(p.hunk, p.rel, p.span, p.removed)


@dataclass(frozen=True)
class PresenceRule:
    name: str
    holds: Callable[[Place], str]
    verbatim: bool  # reads the lines as they are (skipped where only names can tell)


# The one ordered table: the first rule that holds says why a failed hunk is upstream.
PRESENCE_RULES: tuple[PresenceRule, ...] = (
    PresenceRule("added lines there", added_lines_there, True),
    PresenceRule("removed lines gone", removed_lines_gone, True),
    PresenceRule("new names there", new_names_there, False),
    PresenceRule("there under upstream's names", there_under_upstreams_names, False),
)


# -- the whole report --------------------------------------------------------------------


@dataclass
class DriftInput:
    """What a drift run compares: the series, its base, and the targets (label, tree)."""

    series: Series
    series_label: str
    base: Tree | None  # None: the targets' fork is the base, with the series reversed
    targets: list[tuple[str, Tree]] = field(default_factory=list)


def _patterns(series: Series) -> tuple[str, ...]:
    return tuple(dict.fromkeys((*SCOPE, *series.paths)))


def drift(job: DriftInput, fork: Tree | None = None) -> DriftReport:
    """Run drift for every target; the base is `job.base`, or `fork` with the series out.
    With a fork, its series is checked as the fork vendors llama.cpp: the sections for
    files it does not vendor are left out (and listed once in the report), and every tree
    is seen as the fork would vendor it (portkit.fork)."""
    if job.base is None and fork is None:
        raise UsageError("drift needs the tree the series was written against (--base)")
    if fork is None:
        return _drift(job, None)
    with fork_scope(fork, job.series, [t for _, t in job.targets], job.base) as seen:
        scoped = seen.scoped
        report = _drift(DriftInput(scoped.series, job.series_label, seen.base,
                                   [(label, view) for (label, _), view
                                    in zip(job.targets, seen.trees, strict=True)]), fork)
    order = [p.name for p in job.series.patches]
    untouched = {p.name: p for p in job.series.patches if p.name in scoped.untouched}
    targets = []
    mine = fork.root.resolve()
    for t, (_, tree) in zip(report.targets, job.targets, strict=True):
        rows = {p.file: p for p in t.patches}
        rows.update({name: PatchDrift(name, p.subject, ()) for name, p in untouched.items()})
        targets.append(replace(t, patches=tuple(rows[n] for n in order if n in rows),
                               own=tree.root.resolve() == mine))
    return replace(report, targets=tuple(targets), fork=True, not_vendored=tuple(
        NotVendored(u.patch, u.path) for u in scoped.unvendored))


def _drift(job: DriftInput, fork: Tree | None) -> DriftReport:
    patterns = _patterns(job.series)
    feature = feature_of(job.series)
    with _base_root(job, fork) as (base_root, base_pin):
        base = Side("base", base_root, patterns, base_pin)
        targets = []
        for label, tree in job.targets:
            upstream = _upstream(feature, tree) if feature else {}
            with tree_view(tree) as root:
                targets.append(_Target(job.series, base, Side(label, root, patterns, tree.pin),
                                       upstream).run())
    return DriftReport(job.series_label, tuple(targets))


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


# -- one patch at a time (for rebase) -----------------------------------------------------


class Follow:
    """Drift one patch at a time on a target whose patched files the caller keeps (how
    rebase carries a series): each patch classified as drift classifies it, on the files as
    the caller's earlier patches left them, and each hunk it relocates with its landing."""

    def __init__(self, target: _Target) -> None:
        self._target = target
        target.follow_lines = True

    @property
    def base(self) -> Side:
        return self._target.base

    @property
    def target(self) -> Side:
        return self._target.target

    def patch(self, presult: PatchResult, current: dict[str, bytes | None]) -> PatchDrift:
        """Drift of the patch the engine ran as `presult` on `current` (the caller's files
        by path; a file not in it is the target's own)."""
        self._target.current = current
        self._target.landings.clear()
        return self._target.patch(presult)

    def semantic(self, patch: Patch) -> list[SemanticChange]:
        """The symbols the patch's added lines use that changed between base and target."""
        return self._target.semantic(patch)

    def look_at(self, current: dict[str, bytes | None]) -> None:
        """Take `current` (the caller's files by path) as the target's files from now on."""
        self._target.current = current

    def landing(self, hunk: Hunk) -> Landing | None:
        """Where the last patch's hunk went, when drift relocated it."""
        return self._target.landings.get(_hunk_key(hunk))

    def home(self, hunk: Hunk) -> tuple[str, int, int, str] | None:
        """Where what the hunk's symbol in the base became is, in the target's file as the
        earlier patches left it: (file, first line, last line, qualified name); None when
        the hunk is between definitions or its symbol was not found."""
        t = self._target
        sym = t.base_symbol(hunk)
        cand = t.located(sym)[0] if sym is not None else None
        if cand is None:
            return None
        ts = cand.symbol
        return ts.file, t._line_now(ts.file, ts.start_line), t._line_now(ts.file, ts.end_line), \
            ts.qualname

    def relocate(self, hunk: Hunk) -> Landing | None:
        """The hunk carried into what its symbol in the base became, as drift relocates a
        hunk whose context is gone (when it can)."""
        t = self._target
        sym = t.base_symbol(hunk)
        cand = t.located(sym)[0] if sym is not None else None
        if sym is None or cand is None or t.relocate(hunk, sym, cand.symbol) is None:
            return None
        return t.landings.get(_hunk_key(hunk))


@contextmanager
def follow(series: Series, base: Tree | None, target: Tree, label: str,
           fork: Tree | None = None) -> Iterator[Follow]:
    """A Follow of `series` on `target`; the base is `base`, or `fork` with the series out."""
    if base is None and fork is None:
        raise UsageError("the tree the series was written against is needed (--base)")
    patterns = _patterns(series)
    feature = feature_of(series)
    upstream = _upstream(feature, target) if feature else {}
    with _base_root(DriftInput(series, label, base), fork) as (base_root, base_pin), \
            tree_view(target) as root:
        yield Follow(_Target(series, Side("base", base_root, patterns, base_pin),
                             Side(label, root, patterns, target.pin), upstream))
