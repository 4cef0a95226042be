"""An ollama-style fork: what it vendors of llama.cpp, and trees seen the way it vendors them.

Such a fork applies its series (llama/patches) to a full llama.cpp checkout and then copies a
subset of it with rsync, one folder per side: llama.cpp into llama/llama.cpp and its ggml/
into ml/backend/ggml/ggml, each under the rules of the folder's `.rsync-filter` (merged by the
rsync line of Makefile.sync, with the rules that line gives before it). So its patches touch
files it does not vendor (other backends, CMake files), and its vendored tree lacks them.

This module reads those rules as rsync does, or refuses what it does not read by name:

- include/exclude (`+`/`-`), show/hide (`S`/`H`: the sending side only), protect/risk
  (`P`/`R`: the receiving side only), `clear` (`!`); a pattern with a slash (or `**`) is
  matched against the path, else against the name; a leading slash anchors it at the synced
  folder, a trailing one matches folders only; `*` stays within a name, `**` does not,
  `dir/***` is the folder and all it holds, `?`, `[...]` and backslash escapes as rsync's
  wildcards; the first matching rule decides, and an excluded folder is not entered.
- refused (TreeError, naming the rule and its line): merge and dir-merge rules in a filter
  file (`merge`, `.`, `dir-merge`, `:`), per-directory filter files (rsync's `-F`, or a
  dir-merge on the rsync line), rule modifiers (`-!`, `+/`, `include,s` ...), and any other
  word.

With the rules, `Vendoring` tells whether a path of llama.cpp's layout is vendored, `scope`
splits a fork's series into the sections it can check and those it cannot (reported once,
"N sections touch files this fork does not vendor: not checked"), and `vendored_view` lays
out any llama.cpp tree (a registry tree, a folder, a git checkout, another fork) as the fork
would vendor it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from portkit.errors import TreeError
from portkit.series import Patch, Series, diff_git_paths
from portkit.tree import OLLAMA, PLAIN, Tree

FILTER = ".rsync-filter"
SYNC = "Makefile.sync"

_RULE_WORDS = {"include": "include", "+": "include", "exclude": "exclude", "-": "exclude",
               "protect": "protect", "P": "protect", "risk": "risk", "R": "risk",
               "show": "show", "S": "show", "hide": "hide", "H": "hide"}
_MERGES = {"merge": "merge", ".": "merge", "dir-merge": "dir-merge", ":": "dir-merge"}
# the side each action applies to: include and exclude apply to both
_SENDER = frozenset({"include", "exclude", "show", "hide"})
_RECEIVER = frozenset({"include", "exclude", "protect", "risk"})
_SENDS = frozenset({"include", "show"})
_DELETABLE = frozenset({"include", "risk"})


@dataclass(frozen=True)
class Rule:
    """One rule of an rsync filter: what it does and the pattern it matches, as rsync
    matches it (see the module's notes)."""

    action: str
    pattern: str

    def matches(self, rel: str, is_dir: bool) -> bool:
        pattern = self.pattern
        if pattern.endswith("/***"):
            stem = pattern[:-4]
            return Rule(self.action, stem + "/").matches(rel, is_dir) or \
                Rule(self.action, stem + "/**").matches(rel, is_dir)
        if pattern.endswith("/"):
            if not is_dir:
                return False
            pattern = pattern[:-1]
        anchored = pattern.startswith("/")
        pattern = pattern.lstrip("/")
        rx = _wildmatch(pattern)
        parts = rel.split("/")
        if anchored:
            return bool(rx.fullmatch(rel))
        if "/" in pattern or "**" in pattern:
            return any(rx.fullmatch("/".join(parts[k:])) for k in range(len(parts)))
        return bool(rx.fullmatch(parts[-1]))


def _wildmatch(pattern: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        end = pattern.find("]", i + 2) if c == "[" else -1
        if c == "[" and end != -1:
            body = pattern[i + 1:end]
            body = "^" + body[1:] if body[:1] in "!^" else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
            continue
        out.append("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c))
        i += 1
    return re.compile("".join(out))


def parse_rule(line: str, where: str) -> Rule | str | None:
    """One filter line: a Rule, "clear" for `!`/`clear`, None for a comment or a blank line.
    A merge rule, a modifier or an unknown word is refused by name (TreeError)."""
    text = line.strip()
    if not text or text[0] in "#;":
        return None
    if text in ("!", "clear"):
        return "clear"
    word, _, pattern = text.partition(" ")
    name, comma, modifiers = word.partition(",")
    if name in _MERGES or name[:1] in ".:":
        kind = _MERGES.get(name, "dir-merge" if name[:1] == ":" else "merge")
        what = "per-directory filter files" if kind == "dir-merge" else \
            "rules read from another file"
        raise TreeError(f"{where}: portkit does not follow rsync's {kind} rule {text!r} "
                        f"({what}): write its rules in the filter file itself")
    if name not in _RULE_WORDS and name[:1] in ("+", "-", "P", "R", "S", "H"):
        comma, modifiers, name = ",", name[1:], name[0]
    if name not in _RULE_WORDS:
        raise TreeError(f"{where}: portkit does not read the rsync rule {text!r} (it reads "
                        "include, exclude, show, hide, protect, risk, clear and their "
                        "one-letter forms)")
    if comma and modifiers:
        raise TreeError(f"{where}: portkit does not read the rsync rule {text!r}: the "
                        f"modifier {modifiers!r} of {name!r} changes what it matches")
    if not pattern.strip():
        raise TreeError(f"{where}: the rsync rule {text!r} has no pattern")
    return Rule(_RULE_WORDS[name], pattern.strip())


def read_filter(path: Path) -> list[Rule]:
    """The rules of an rsync filter file; none when there is no file. `clear` (or `!`)
    forgets the rules before it; what portkit does not read is refused by name."""
    if not path.is_file():
        return []
    rules: list[Rule] = []
    for number, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        rule = parse_rule(raw, f"{path}:{number}")
        if rule == "clear":
            rules.clear()
        elif isinstance(rule, Rule):
            rules.append(rule)
    return rules


def _first(rules: Sequence[Rule], rel: str, is_dir: bool, actions: frozenset[str]) -> str:
    return next((r.action for r in rules if r.action in actions and r.matches(rel, is_dir)),
                "include")


def _folders(rules: Sequence[Rule], rel: str, actions: frozenset[str],
             passing: frozenset[str]) -> bool:
    parts = rel.split("/")
    return all(_first(rules, "/".join(parts[:i]), True, actions) in passing
               for i in range(1, len(parts)))


def sent(rules: Sequence[Rule], rel: str) -> bool:
    """Whether rsync sends the file `rel` (relative to the synced folder) under `rules`:
    neither it nor a folder above it is excluded or hidden, the first matching rule of the
    sending side deciding."""
    return _folders(rules, rel, _SENDER, _SENDS) and _first(rules, rel, False, _SENDER) in _SENDS


def deleted(rules: Sequence[Rule], rel: str) -> bool:
    """Whether rsync --delete removes `rel` from the receiving side when the sender does not
    send it: neither it nor a folder above it is excluded or protected (the receiving side's
    rules: hide and show do not apply there)."""
    return _folders(rules, rel, _RECEIVER, _DELETABLE) and \
        _first(rules, rel, False, _RECEIVER) in _DELETABLE


def files(root: Path, rules: Sequence[Rule], skip: frozenset[str] = frozenset()) -> list[str]:
    """The files under `root` that the rules send, relative to it (`.git` and the top-level
    names in `skip` left out; folders the rules keep back not entered)."""
    out: list[str] = []
    for folder, dirs, names in os.walk(root):
        here = Path(folder).relative_to(root).as_posix()
        prefix = "" if here == "." else here + "/"
        dirs[:] = sorted(d for d in dirs if d != ".git" and not (not prefix and d in skip)
                         and _first(rules, prefix + d, True, _SENDER) in _SENDS)
        out += [prefix + n for n in sorted(names) if not (not prefix and n in skip)
                and _first(rules, prefix + n, False, _SENDER) in _SENDS]
    return out


# -- the rsync line of Makefile.sync ---------------------------------------------------------

_TARGET = re.compile(r"^([^\s:#=][^:=]*?)\s*:(?!=)")


def _recipe(makefile: str, target: str) -> str | None:
    """The rsync command of the recipe that makes `target`, continuation lines joined."""
    lines = makefile.replace("\\\n", " ").splitlines()
    for i, line in enumerate(lines):
        m = _TARGET.match(line)
        if not m or target not in m.group(1).split():
            continue
        for body in lines[i + 1:]:
            if not body.startswith("\t"):
                break
            if re.search(r"(^|[\s@;&|])rsync\s", body):
                return body.strip().lstrip("@-+").strip()
    return None


def _single_sources(command: str) -> tuple[str, ...]:
    """The single files the rsync line sends besides its folder, relative to the upstream
    checkout (`$(addprefix $<,/LICENSE /ggml/)` or `$</LICENSE`): ollama sends llama.cpp's
    LICENSE into each vendored folder that way."""
    items: list[str] = []
    for m in re.finditer(r"\$\(addprefix \$<,([^)]*)\)", command):
        items += m.group(1).split()
    items += re.findall(r"(?<![(,])\$<(/\S+)", command)
    return tuple(i.strip("/") for i in items if i.strip("/") and not i.endswith("/"))


def sync_sources(root: Path, folder: str) -> tuple[str, ...]:
    """The single files Makefile.sync's rsync line sends into `folder` (see _single_sources)."""
    sync = root / SYNC
    command = _recipe(sync.read_text(errors="replace"), folder) if sync.is_file() else None
    return _single_sources(command) if command else ()


def sync_rules(root: Path, folder: str) -> list[Rule]:
    """The rules rsync syncs `folder` (relative to the fork's root) with: those its
    Makefile.sync line gives (`-f RULE`, `--filter=RULE`, `--include=`, `--exclude=`, in
    order), the folder's `.rsync-filter` read where that line merges it; without such a
    line, the `.rsync-filter` alone. Per-directory filter files are refused by name."""
    own = root / folder / FILTER
    sync = root / SYNC
    command = _recipe(sync.read_text(errors="replace"), folder) if sync.is_file() else None
    if command is None:
        return read_filter(own)
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    rules: list[Rule] = []
    where = f"{sync} (the rsync line of {folder})"
    merged = False
    i = 0
    while i < len(words):
        word, value = words[i], None
        if word in ("-f", "--filter") and i + 1 < len(words):
            value, i = words[i + 1], i + 1
        elif word.startswith("--filter="):
            value = word.removeprefix("--filter=")
        elif word.startswith(("--include=", "--exclude=")):
            key, _, pattern = word.partition("=")
            value = f"{key.removeprefix('--')} {pattern}"
        elif word.startswith("-f") and len(word) > 2 and not word.startswith("--"):
            value = word[2:]
        elif word == "-F" or (word.startswith("-") and not word.startswith("--")
                              and "F" in word[1:] and word[1:].isalpha()):
            raise TreeError(f"{where}: portkit does not follow rsync's -F (per-directory "
                            "filter files): write the rules in the folder's .rsync-filter")
        elif word.startswith(("--include-from", "--exclude-from", "--files-from")):
            raise TreeError(f"{where}: portkit does not follow rsync's {word.split('=')[0]}")
        i += 1
        if value is None:
            continue
        head, _, rest = value.strip().partition(" ")
        if _MERGES.get(head.partition(",")[0]) == "merge":
            named = rest.strip().replace("$@", folder).replace("$(@)", folder)
            if Path(named) not in (Path(folder) / FILTER, Path(FILTER)):
                raise TreeError(f"{where}: portkit does not follow the merge of {named!r} "
                                f"(it reads {folder}/{FILTER})")
            rules += read_filter(own)
            merged = True
            continue
        rule = parse_rule(value, where)
        if rule == "clear":
            rules.clear()
        elif isinstance(rule, Rule):
            rules.append(rule)
    if not merged and own.is_file():
        raise TreeError(f"{where}: the rsync line does not merge {folder}/{FILTER}: portkit "
                        "cannot tell which of its rules apply")
    return rules


# -- what a fork vendors ---------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One vendored folder: where it is in the fork, where it is in llama.cpp's layout
    (a path prefix: "" or "ggml/"), and its rules."""

    folder: str  # relative to the fork's root
    prefix: str
    rules: tuple[Rule, ...]
    singles: tuple[str, ...] = ()  # files sent from llama.cpp's root too (its LICENSE)


@dataclass(frozen=True)
class Vendoring:
    """What a fork vendors of llama.cpp: its sides, ggml's first."""

    root: Path
    sides: tuple[Side, ...]

    @classmethod
    def of(cls, fork: Tree) -> Vendoring:
        if fork.layout != OLLAMA:
            raise TreeError(f"{fork.root} is not an ollama-style fork")
        root = fork.root
        llama = fork.llama_root.relative_to(root).as_posix()
        sides = []
        if not fork.ggml_root.is_relative_to(fork.llama_root):
            ggml = fork.ggml_root.relative_to(root).as_posix()
            sides.append(Side(ggml, "ggml/", tuple(sync_rules(root, ggml)),
                              sync_sources(root, ggml)))
        sides.append(Side(llama, "", tuple(sync_rules(root, llama)), sync_sources(root, llama)))
        return cls(root, tuple(sides))

    def side(self, path: str) -> tuple[Side, str]:
        """The side a path of llama.cpp's layout belongs to, and the path within it."""
        side = next(s for s in self.sides if path.startswith(s.prefix))  # the last has ""
        return side, path.removeprefix(side.prefix)

    def sends(self, path: str) -> bool:
        """Whether the fork's rsync rules bring this path of llama.cpp into the fork."""
        side, rel = self.side(path)
        return sent(side.rules, rel)

    def in_fork(self, path: str) -> Path:
        side, rel = self.side(path)
        return self.root / side.folder / rel

    def layout_files(self, tree: Tree) -> dict[str, Path]:
        """Every file of `tree` (any layout) that the fork would vendor, by its path in
        llama.cpp's layout."""
        out: dict[str, Path] = {}
        apart = len(self.sides) > 1
        for side in self.sides:
            skip: frozenset[str] = frozenset()
            if side.prefix:
                source = tree.ggml_root
            else:
                source = tree.llama_root
                skip = frozenset({"ggml"}) if apart else skip
            if not source.is_dir():
                continue
            for rel in files(source, side.rules, skip):
                if rel != FILTER:
                    out[side.prefix + rel] = source / rel
            for single in side.singles:  # sent by name from llama.cpp's root
                name = PurePosixPath(single).name
                if (tree.llama_root / single).is_file() and sent(side.rules, name):
                    out[side.prefix + name] = tree.llama_root / single
        return out


@contextmanager
def vendored_view(tree: Tree, vendoring: Vendoring) -> Iterator[Tree]:
    """`tree` as the fork would vendor it: a scratch copy of the files its rules send, in
    llama.cpp's layout (ggml/ inside), with the tree's pin. The tree itself is only read."""
    with tempfile.TemporaryDirectory(prefix="portkit-vendored-") as tmp:
        view = Path(tmp) / "tree"
        view.mkdir()
        for rel, source in vendoring.layout_files(tree).items():
            dest = view / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            st = source.lstat()
            if stat.S_ISLNK(st.st_mode):
                dest.symlink_to(os.readlink(source))
            elif stat.S_ISREG(st.st_mode):
                shutil.copyfile(source, dest)
                os.chmod(dest, stat.S_IMODE(st.st_mode))
        (view / "ggml").mkdir(exist_ok=True)
        yield Tree(view, PLAIN, view, view / "ggml", None, tree.pin, tree.pin_source)


# -- a fork's series: what can be checked ------------------------------------------------------


@dataclass(frozen=True)
class Unvendored:
    """A file section of a patch that touches a file the fork does not vendor."""

    patch: str
    path: str
    why: str  # "not sent by the rsync rules" or "not in the vendored tree"


@dataclass(frozen=True)
class Scoped:
    """A fork's series split into what portkit can check and what it cannot: `series` holds
    each patch with only its sections for vendored files (a patch with none is left out of
    it), `left_out` the other sections' text by patch, in their order, and `unvendored` one
    entry per section left out."""

    series: Series
    original: Series
    unvendored: tuple[Unvendored, ...] = ()
    left_out: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    @property
    def untouched(self) -> frozenset[str]:
        """The patches that touch only files the fork does not vendor."""
        kept = {p.name for p in self.series.patches}
        return frozenset(p.name for p in self.original.patches if p.name not in kept)


def sections(patch: Patch) -> list[tuple[str, str]] | None:
    """The patch's diff cut into its file sections (path, text), in order; None when the
    cut is not sure (a section without git's `diff --git` header)."""
    if not patch.files or not all(f.git for f in patch.files):
        return None
    cuts = [m.start() for m in re.finditer(r"^diff --git ", patch.diff, re.M)]
    if len(cuts) != len(patch.files):
        return None
    bounds = [*cuts, len(patch.diff)]
    return [(f.path, patch.diff[bounds[i]:bounds[i + 1]]) for i, f in enumerate(patch.files)]


def _finally_gone(series: Series) -> set[str]:
    """The paths the series leaves without a file (deleted, or renamed away)."""
    gone: set[str] = set()
    for patch in series.patches:
        for f in patch.files:
            if f.old_path is not None and (f.new_path is None or f.status == "renamed"):
                gone.add(f.old_path)
            if f.new_path is not None:
                gone.discard(f.new_path)
    return gone


def why_unvendored(vendoring: Vendoring, path: str, gone: set[str]) -> str | None:
    """Why the fork does not vendor `path` (llama.cpp's layout), or None when it does."""
    if not vendoring.sends(path):
        return "not sent by the fork's rsync rules"
    if path not in gone and not os.path.lexists(vendoring.in_fork(path)):
        return "not in the fork's vendored tree"
    return None


def scope(series: Series, vendoring: Vendoring) -> Scoped:
    """The fork's series split into the sections for files it vendors and the others."""
    gone = _finally_gone(series)
    kept: list[Patch] = []
    unvendored: list[Unvendored] = []
    left_out: dict[str, list[tuple[str, str]]] = {}
    for patch in series.patches:
        cut = sections(patch)
        verdicts = []
        for f in patch.files:
            why = next((w for p in (f.old_path, f.new_path) if p is not None
                        and (w := why_unvendored(vendoring, p, gone))), None)
            verdicts.append(why)
        if not any(verdicts):
            kept.append(patch)
            continue
        if cut is None:  # cannot be cut safely: checked whole (and fails as it fails)
            kept.append(patch)
            continue
        mine = [text for (_, text), why in zip(cut, verdicts, strict=True) if why is None]
        left_out[patch.name] = [(path, text) for (path, text), why
                                in zip(cut, verdicts, strict=True) if why is not None]
        unvendored += [Unvendored(patch.name, path, why) for (path, _), why
                       in zip(cut, verdicts, strict=True) if why is not None]
        if mine:
            kept.append(patch.with_diff("".join(mine)))
    out = replace(series, patches=tuple(kept),
                  unreadable=series.unreadable)
    return Scoped(out, series, tuple(unvendored), left_out)


def put_back(diff: str, original: Patch, left_out: Sequence[tuple[str, str]]) -> str:
    """A carried diff with the sections left out (for files the fork does not vendor) put
    back unchanged, each where the original patch had it among its sections."""
    carried: dict[str, str] = {}
    order: list[str] = []
    cuts = [m.start() for m in re.finditer(r"^diff --git ", diff, re.M)]
    head = diff[:cuts[0]] if cuts else diff
    known = {path for f in original.files for path in (f.old_path, f.new_path) if path}
    bounds = [*cuts, len(diff)]
    for i in range(len(cuts)):
        text = diff[bounds[i]:bounds[i + 1]]
        line = text.split("\n", 1)[0][len("diff --git "):]
        path = diff_git_paths(line, known, prefixed=original.strip != 0)[1]
        carried[path] = text
        order.append(path)
    out: list[str] = []
    placed: set[str] = set()
    away = dict(left_out)
    for f in original.files:
        if f.path in away:
            out.append(away.pop(f.path))
        elif f.path in carried and f.path not in placed:
            out.append(carried[f.path])
            placed.add(f.path)
    out += [carried[p] for p in order if p not in placed and carried[p] not in out]
    out += list(away.values())
    return head + "".join(out)


def not_vendored_line(count: int) -> str:
    """The one line a report says about the sections it left out."""
    return (f"{count} section{'s' if count != 1 else ''} touch{'es' if count == 1 else ''} "
            "files this fork does not vendor: not checked")


@dataclass
class ForkScope:
    """A fork's series and trees as portkit checks them: the series scoped to what the fork
    vendors, and each tree (targets, a given base) as the fork would vendor it."""

    scoped: Scoped
    trees: list[Tree]
    base: Tree | None


@contextmanager
def fork_scope(fork: Tree, series: Series, trees: Sequence[Tree],
               base: Tree | None = None) -> Iterator[ForkScope]:
    """The fork's series scoped and `trees` (and `base`) seen as the fork vendors them."""
    vendoring = Vendoring.of(fork)
    scoped = scope(series, vendoring)
    with ExitStack() as stack:
        views = [stack.enter_context(vendored_view(t, vendoring)) for t in trees]
        seen = stack.enter_context(vendored_view(base, vendoring)) if base is not None else None
        yield ForkScope(scoped, views, seen)
