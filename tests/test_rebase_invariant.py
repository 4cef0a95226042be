"""Issue 17's invariant: where `git am -3` carries a patch cleanly, portkit carries it as git
does, byte for byte (the files it leaves), or marks it needs-review (or needs-human) with a
reason that names the evidence (a file or a symbol).

The reference is real `git am -3`, run as a maintainer's vendor work dir would run it
(`git_am_3`): a scratch repository, sealed from the user's git configuration, holding the
base tree (the files the series touches), the series applied on it one commit per patch
(branch patched-old: the blobs git's 3-way fallback reads), and the whole target tree as a
child commit of the base (branch upstream-new: what git's rename detection searches); then
`git am -3` of each patch in order onto upstream-new, and on a conflict `git am --skip`, so
later patches go on from the tree without it (as the ollama bench baseline does). A patch
without `index` lines is given the ones `git format-patch` writes from the chain (the blobs
before and after it), else git would have no base to fall back on; the hunks are the
patch's own, byte for byte.

`check_invariant` walks portkit's report in order, keeping portkit's state (the target with
each carried patch applied by `git apply`). A patch is compared where git am -3 is clean on
the files portkit had before it (those it touches, and those git or portkit changed for
it): in sequence, where git's tree is portkit's there; else, where they differ (a patch
one of them left out earlier), by `git am -3` of the patch alone onto portkit's tree (a
child commit of the target, in the same repository). A patch git am -3 conflicts on, on
the same files, is not compared: the invariant says nothing of it.

Offline: small C++/CMake trees written here, one per rule of git's that portkit must
follow. Slow: the 40-patch fork series (tests/data/fork-series, written against 0.3.16)
onto 0.3.17 and 0.3.19, and each rotation series (patches/kv-rotation/<pin>) onto the
registry trees newer than its own; each prints a one-line summary (`pytest -s`).
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from portkit import rebase as rb
from portkit.series import Patch, Series, read_series
from portkit.tree import detect

REPO = Path(__file__).resolve().parent.parent
FORK_SERIES = REPO / "tests" / "data" / "fork-series" / "series"
ROTATION = REPO / "patches" / "kv-rotation"
ROTATION_PINS = {"0.3.16": "4227c9be4268ac844921b90f31595f81236bd317",
                 "0.3.17": "49bfddeca18e62fa3d39114a23e9fcbdf8a22388",
                 "0.3.19": "c0159f9c1f874da15e94f371d136f5920b4b5335"}
NEWER = ["0.3.17", "0.3.19", "0.3.20"]

# git sealed from the user's and the system's configuration, with a fixed identity and date
SEALED = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C",
    "GIT_AUTHOR_NAME": "Vendor Work", "GIT_AUTHOR_EMAIL": "vendor@example.invalid",
    "GIT_COMMITTER_NAME": "Vendor Work", "GIT_COMMITTER_EMAIL": "vendor@example.invalid",
    "GIT_AUTHOR_DATE": "2025-10-13T12:00:00+00:00",
    "GIT_COMMITTER_DATE": "2025-10-13T12:00:00+00:00",
}
ZERO = "0" * 40

Entry = tuple[int, bytes]  # git's mode, and the bytes (a symbolic link's target)
Files = dict[str, Entry | None]


def git(cwd: Path, *args: str | Path, check: bool = True,
        data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(["git", *map(str, args)], cwd=cwd, env=SEALED, input=data,
                          capture_output=True, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"git {' '.join(map(str, args))} in {cwd}: exit "
                             f"{done.returncode}: {done.stderr.decode(errors='replace')}")
    return done


def entry(path: Path) -> Entry | None:
    """A file as git sees it (never following a symbolic link), or None."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return 0o120000, os.fsencode(os.readlink(path))
    if stat.S_ISREG(st.st_mode):
        return (0o100755 if st.st_mode & 0o100 else 0o100644), path.read_bytes()
    return None


def lay(root: Path, files: Files) -> None:
    """Write `files` under `root` (None: no file there)."""
    for rel, found in files.items():
        path = root / rel
        if path.is_symlink() or path.exists():
            path.unlink()
        if found is None:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        mode, data = found
        if mode == 0o120000:
            path.symlink_to(os.fsdecode(data))
        else:
            path.write_bytes(data)
            path.chmod(0o755 if mode == 0o100755 else 0o644)


def read(root: Path, paths: Iterable[str]) -> Files:
    return {rel: entry(root / rel) for rel in paths}


# -- git am -3, in a maintainer's vendor work dir --------------------------------------------


@dataclass(frozen=True)
class AmStep:
    """One patch through `git am -3`."""

    name: str
    clean: bool
    fell_back: bool  # git apply did not take it as it is: git merged it three ways
    before: str  # HEAD before it
    after: str  # HEAD after it (== before when it conflicted, or had nothing to change)
    changed: tuple[str, ...]  # the paths its commit changes (both sides of a rename)
    said: str


@dataclass
class AmRun:
    repo: Path
    target: str  # the commit of the target tree (upstream-new before any patch)
    steps: list[AmStep]
    mails: dict[str, tuple[bytes, int]]  # what git am reads of each patch, and its -p
    _trees: dict[str, dict[str, tuple[int, str]]] = field(default_factory=dict)
    _blobs: dict[str, bytes] = field(default_factory=dict)

    def files(self, commit: str, paths: Iterable[str]) -> Files:
        """The files `paths` in `commit`."""
        if commit not in self._trees:
            listing = git(self.repo, "ls-tree", "-r", "-z", "--full-tree", commit).stdout
            tree: dict[str, tuple[int, str]] = {}
            for item in listing.split(b"\0"):
                if item:
                    meta, _, rel = item.partition(b"\t")
                    mode, _, sha = meta.decode().split(" ")
                    tree[os.fsdecode(rel)] = (int(mode, 8), sha)
            self._trees[commit] = tree
        out: Files = {}
        for rel in paths:
            found = self._trees[commit].get(rel)
            if found is None:
                out[rel] = None
                continue
            mode, sha = found
            if sha not in self._blobs:
                self._blobs[sha] = git(self.repo, "cat-file", "blob", sha).stdout
            out[rel] = (mode, self._blobs[sha])
        return out

    def onto(self, name: str, files: Files) -> AmStep:
        """`git am -3` of the patch `name` alone onto the target with `files` in place of its
        own (portkit's tree before the patch), as a child commit of the target."""
        git(self.repo, "checkout", "-q", "-f", "--detach", self.target)
        git(self.repo, "clean", "-qfdx")
        lay(self.repo, files)
        git(self.repo, "add", "-A", "-f")
        git(self.repo, "commit", "-q", "--allow-empty", "-m", f"portkit's tree before {name}")
        return _am_step(self.repo, name, *self.mails[name])


def _am_step(repo: Path, name: str, mail: bytes, strip: int) -> AmStep:
    """`git am -3` of one patch onto HEAD; a conflict is skipped (HEAD stays)."""
    head = git(repo, "rev-parse", "HEAD").stdout.decode().strip()
    (repo.parent / "mail").write_bytes(mail)
    done = git(repo, "am", "-3", f"-p{strip}", repo.parent / "mail", check=False)
    said = (done.stdout + done.stderr).decode(errors="replace")
    if done.returncode == 0:
        after = git(repo, "rev-parse", "HEAD").stdout.decode().strip()
        changed = git(repo, "diff", "--name-only", "--no-renames", "-z", head, after)
        return AmStep(name, True, "Falling back to patching base and 3-way merge" in said,
                      head, after,
                      tuple(os.fsdecode(p) for p in changed.stdout.split(b"\0") if p), said)
    if git(repo, "am", "--skip", check=False).returncode != 0:
        git(repo, "am", "--abort", check=False)
    git(repo, "reset", "-q", "--hard", head)
    git(repo, "clean", "-qfdx")
    return AmStep(name, False, True, head, head, (), said)


def _copy_tree(source: Path, dest: Path) -> None:
    """Every file of `source` (but a `.git` of its own, e.g. a submodule's gitfile) into `dest`."""
    shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True,
                    ignore=lambda folder, names: [".git"] if Path(folder) == source else [])


def _with_index_lines(patch: Patch, repo: Path, parent: str, commit: str) -> bytes:
    """`patch` with an `index` line (the blobs before and after it in the chain, as git
    format-patch writes them) in each git section with text that has none."""
    lines = patch.data.splitlines(keepends=True)
    sections = iter(f for f in patch.files if f.git)
    out: list[bytes] = []
    current = None
    has_index = False
    for line in lines:
        if line.startswith(b"diff --git "):
            current, has_index = next(sections, None), False
        elif line.startswith(b"index "):
            has_index = True
        elif line.startswith(b"--- ") and current is not None and current.hunks \
                and not has_index:
            old = _blob(repo, parent, current.old_path)
            new = _blob(repo, commit, current.new_path)
            out.append(f"index {old}..{new}\n".encode())
            has_index = True
        out.append(line)
    return b"".join(out)


def _blob(repo: Path, commit: str, rel: str | None) -> str:
    if rel is None:
        return ZERO
    return git(repo, "rev-parse", f"{commit}:{rel}").stdout.decode().strip()


def _as_mail(patch: Patch, data: bytes) -> bytes:
    """What `git am` reads: the patch's own mail, or a plain patch (quilt, a bare diff) under
    a minimal mail header (its preamble becomes the message)."""
    if patch.is_mail:
        return data
    subject = patch.subject or patch.name
    return (f"From {ZERO} Mon Sep 17 00:00:00 2001\nFrom: Series <series@example.invalid>\n"
            f"Subject: [PATCH] {subject}\n\n").encode() + data


def git_am_3(series: Series, base: Path, target: Path, work: Path) -> AmRun:
    """`git am -3` of `series` (written against the tree `base`) onto the tree `target`, patch
    by patch, in a scratch repository holding the base, the series as one commit per patch
    and the target as a child commit of the base; a patch that conflicts is skipped."""
    repo = work / "vendor"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "upstream-old")
    for key, value in (("core.compression", "0"), ("gc.auto", "0")):  # speed only
        git(repo, "config", key, value)
    lay(repo, read(base, series.paths))
    git(repo, "add", "-A", "-f")
    git(repo, "commit", "-q", "--allow-empty", "-m", "the base tree")
    base_commit = git(repo, "rev-parse", "HEAD").stdout.decode().strip()

    git(repo, "checkout", "-q", "-b", "patched-old")
    mails: dict[str, bytes] = {}
    for patch in series.patches:
        parent = git(repo, "rev-parse", "HEAD").stdout.decode().strip()
        (work / "patch").write_bytes(patch.data)
        git(repo, "apply", "--index", f"-p{patch.strip}", "--whitespace=nowarn", work / "patch")
        git(repo, "commit", "-q", "--allow-empty", "-m", patch.subject or patch.name)
        commit = git(repo, "rev-parse", "HEAD").stdout.decode().strip()
        mails[patch.name] = _as_mail(patch, _with_index_lines(patch, repo, parent, commit))

    git(repo, "checkout", "-q", "-b", "upstream-new", base_commit)
    git(repo, "rm", "-rq", "--cached", "--ignore-unmatch", ".")
    for child in repo.iterdir():
        if child.name != ".git":
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    _copy_tree(target, repo)
    git(repo, "add", "-A", "-f")
    git(repo, "commit", "-q", "--allow-empty", "-m", "the target tree")
    target_commit = git(repo, "rev-parse", "HEAD").stdout.decode().strip()
    run = AmRun(repo, target_commit, [], {p.name: (mails[p.name], p.strip)
                                          for p in series.patches})
    for patch in series.patches:
        run.steps.append(_am_step(repo, patch.name, *run.mails[patch.name]))
    return run


# -- the invariant --------------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_~][A-Za-z0-9_]*(?:::[A-Za-z_~][A-Za-z0-9_]*)*")


def evidence(reason: str, paths: Iterable[str], texts: Iterable[bytes]) -> str | None:
    """What `reason` names of the patch: one of the files `paths`, or a symbol (a name
    written as code is: with `_`, `::` or an inner capital) that the patch or the files it
    touches hold; None when it names neither."""
    for rel in sorted(paths, key=len, reverse=True):
        if rel in reason:
            return rel
    hay = b"\n".join(texts)
    for name in _IDENT.findall(reason):
        code_like = "_" in name.strip("_") or "::" in name or re.search(r"[a-z][A-Z]", name)
        if code_like and re.search(rb"\b" + re.escape(name.encode()) + rb"\b", hay):
            return name
    return None


SEQUENTIAL = "in sequence"  # on git am -3's own tree, the same as portkit's before the patch
OWN_TREE = "on portkit's tree"  # git am -3 of the patch alone onto portkit's tree before it


@dataclass(frozen=True)
class Verdict:
    """One patch: what git am -3 and portkit did with it, and whether the invariant holds."""

    name: str
    status: str  # portkit's
    am_clean: bool  # in sequence
    compared: str | None  # where git am -3 was clean on the files portkit had: SEQUENTIAL...
    identical: bool  # compared, and portkit leaves the files git am -3 leaves
    flagged: str | None  # compared, different, and marked for attention: the evidence named
    problem: str | None  # the invariant broken: how


@dataclass(frozen=True)
class Check:
    label: str
    verdicts: tuple[Verdict, ...]

    @property
    def problems(self) -> list[str]:
        return [v.problem for v in self.verdicts if v.problem]

    def summary(self) -> str:
        vs = self.verdicts
        compared = [v for v in vs if v.compared]
        return (f"invariant {self.label}: {len(vs)} patches; git am -3 clean "
                f"{sum(v.am_clean for v in vs)} in sequence, compared {len(compared)} ("
                f"{sum(v.compared == SEQUENTIAL for v in vs)} in sequence, "
                f"{sum(v.compared == OWN_TREE for v in vs)} alone on portkit's tree), "
                f"identical {sum(v.identical for v in vs)}, flagged "
                f"{sum(v.flagged is not None for v in vs)}, disagreements {len(self.problems)}")


def _diff(rel: str, git_has: Entry | None, ours: Entry | None, limit: int = 24) -> str:
    def lines(e: Entry | None) -> list[str]:
        return [] if e is None else e[1].decode("utf-8", "replace").splitlines()
    head = [f"{rel}: git am -3 " + ("has no such file" if git_has is None else
                                    f"mode {git_has[0]:o}")
            + ", portkit " + ("has none" if ours is None else f"mode {ours[0]:o}")]
    body = list(difflib.unified_diff(lines(git_has), lines(ours), "git am -3", "portkit",
                                     n=1, lineterm=""))
    return "\n".join(head + body[:limit] + (["..."] if len(body) > limit else []))


def check_invariant(series: Series, rebased: rb.Rebased, am: AmRun, target: Path, work: Path,
                    label: str) -> Check:
    """Issue 17's invariant, patch by patch, for `rebased` (portkit's rebase of `series` onto
    the tree `target`) against `am` (git am -3 of it). A patch is compared where git am -3
    had the files portkit had before it: in sequence (git's tree, with the patches git
    skipped left out, is portkit's there), or else `git am -3` of the patch alone onto
    portkit's tree."""
    patches = {p.name: p for p in series.patches}
    carried = {p.name: p for p in rebased.series.patches}
    steps = {s.name: s for s in am.steps}
    universe = sorted(set(series.paths) | set(rebased.series.paths)
                      | {rel for s in am.steps for rel in s.changed})
    state = work / "portkit-state"
    state.mkdir(parents=True)
    lay(state, read(target, universe))
    verdicts: list[Verdict] = []
    for row in rebased.report.patches:
        before = read(state, universe)
        broken = None
        if row.output is not None:
            mine = carried[row.output]
            (work / "carried.patch").write_bytes(mine.data)
            done = git(state, "apply", f"-p{mine.strip}", "--whitespace=nowarn",
                       work / "carried.patch", check=False)
            if done.returncode != 0:
                broken = (f"{row.file}: portkit's carried patch does not apply to the tree as "
                          f"its earlier patches leave it: {done.stderr.decode(errors='replace')}")
        after = read(state, universe)
        step, patch = steps.get(row.file), patches.get(row.file)
        if step is None or patch is None:  # a patch portkit cannot read: no text to compare
            verdicts.append(Verdict(row.file, row.status, False, None, False, None, broken))
            continue
        mine_paths = set(carried[row.output].paths) if row.output is not None else set()
        where = SEQUENTIAL
        relevant = sorted(set(patch.paths) | set(step.changed) | mine_paths)
        if any(am.files(step.before, relevant)[r] != before[r] for r in relevant):
            where, step = OWN_TREE, am.onto(row.file, before)
            relevant = sorted(set(patch.paths) | set(step.changed) | mine_paths)
            assert am.files(step.before, universe) == before  # the tree portkit had
        if not step.clean:
            verdicts.append(Verdict(row.file, row.status, steps[row.file].clean, None, False,
                                    None, broken))
            continue
        git_before, git_after = am.files(step.before, relevant), am.files(step.after, relevant)
        differ = [r for r in relevant if git_after[r] != after[r]]
        verdict = Verdict(row.file, row.status, steps[row.file].clean, where, not differ, None,
                          broken)
        if differ:
            shown = "\n".join(_diff(r, git_after[r], after[r]) for r in differ)
            if row.status in rb.ATTENTION:
                texts = [patch.data] + [e[1] for r in relevant for e in
                                        (git_before[r], git_after[r], after[r]) if e is not None]
                named = evidence(row.reason, relevant, texts) if row.reason.strip() else None
                verdict = replace(verdict, flagged=named, problem=broken or (None if named else (
                    f"{row.file}: {row.status}, but its reason names no file or symbol of the "
                    f"patch: {row.reason!r}\n{shown}")))
            else:
                how = "by its 3-way fallback" if step.fell_back else "as git apply takes it"
                verdict = replace(verdict, problem=(
                    f"{row.file}: git am -3 ({where}) carries it cleanly ({how}); portkit says "
                    f"{row.status} ({row.reason}) and leaves other files:\n{shown}"))
        verdicts.append(verdict)
    return Check(label, tuple(verdicts))


def invariant(series: Series, base: Path, target: Path, work: Path, label: str, *,
              base_tree: Path | None = None, target_tree: Path | None = None
              ) -> tuple[Check, AmRun, rb.Rebased]:
    """git am -3 and portkit's rebase of `series` from `base` onto `target` (llama.cpp roots;
    `base_tree`/`target_tree`: the trees portkit is given, when not those roots), checked."""
    am = git_am_3(series, base, target, work / "am")
    rebased = rb.rebase(series, detect(target_tree or target), base=detect(base_tree or base))
    check = check_invariant(series, rebased, am, target, work / "check", label)
    print(check.summary())
    return check, am, rebased


def assert_invariant(check: Check) -> None:
    assert not check.problems, (
        f"{check.summary()}\n\n" + "\n\n".join(check.problems))


# -- offline: small C++/CMake trees, one rule of git's each -----------------------------------

CMAKE = """\
cmake_minimum_required(VERSION 3.14)
project(llama CXX)

option(LLAMA_WERROR "treat warnings as errors" OFF)

add_subdirectory(src)
add_subdirectory(examples/simple)
"""

SRC_CMAKE = """\
add_library(llama llama.cpp llama-vocab.cpp)
target_include_directories(llama PUBLIC ../include)
target_compile_features(llama PUBLIC cxx_std_17)
if (LLAMA_WERROR)
    target_compile_options(llama PRIVATE -Werror)
endif()
"""

HEADER = """\
#pragma once
#include <cstdint>

int32_t llama_add(int32_t a, int32_t b);
int32_t llama_scale(int32_t x, int32_t k);
int32_t llama_vocab_size(void);
"""

LLAMA = """\
#include "llama.h"

#include <cstdio>

int32_t llama_add(int32_t a, int32_t b) {
    int32_t s = a + b;
    return s;
}

int32_t llama_scale(int32_t x, int32_t k) {
    int32_t y = x;
    y = y * k;
    y = y + 1;
    y = y - 1;
    return y;
}

static void llama_report(int32_t n) {
    std::printf("n = %d\\n", n);
    std::printf("done\\n");
}
"""

VOCAB = """\
#include "llama.h"

int32_t llama_vocab_size(void) {
    const int32_t n_base = 32000;
    const int32_t n_extra = 0;
    return n_base + n_extra;
}
"""

SIMPLE = """\
#include "llama.h"

#include <cstdio>

int main(int argc, char ** argv) {
    int32_t a = argc;
    int32_t b = 2;
    int32_t c = llama_add(a, b);
    std::printf("%d\\n", c);
    (void) argv;
    return 0;
}
"""

SIMPLE_CMAKE = """\
add_executable(llama-simple simple.cpp)
target_link_libraries(llama-simple PRIVATE llama)
"""

TREE = {"CMakeLists.txt": CMAKE, "src/CMakeLists.txt": SRC_CMAKE, "include/llama.h": HEADER,
        "src/llama.cpp": LLAMA, "src/llama-vocab.cpp": VOCAB,
        "examples/simple/simple.cpp": SIMPLE, "examples/simple/CMakeLists.txt": SIMPLE_CMAKE}

Edits = dict[str, tuple[str, str]]  # file -> (old text, found once; its replacement)


def edited(files: dict[str, str], edits: Edits) -> dict[str, str]:
    out = dict(files)
    for rel, (old, new) in edits.items():
        assert out[rel].count(old) == 1, (rel, old)
        out[rel] = out[rel].replace(old, new)
    return out


def write(root: Path, files: dict[str, str]) -> Path:
    lay(root, {rel: (0o100644, text.encode()) for rel, text in files.items()})
    return root


def project(root: Path, target: dict[str, str],
            series: Sequence[tuple[str, Edits]]) -> tuple[Path, Path, Series]:
    """(base tree, target tree, series): TREE, `target` and the series `git format-patch`
    writes of one commit per patch on TREE (each edit made as the patches before left it)."""
    base = write(root / "base", TREE)
    upstream = write(root / "target", target)
    repo = write(root / "history", TREE)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    files = dict(TREE)
    for subject, edits in series:
        files = edited(files, edits)
        write(repo, {rel: files[rel] for rel in edits})
        git(repo, "commit", "-q", "-a", "-m", subject)
    git(repo, "format-patch", "-q", "--no-signature", "--zero-commit", "-o", root / "series",
        "main~" + str(len(series)))
    return base, upstream, read_series(root / "series")



def test_invariant_rule_git_apply_takes_a_patch_as_it_is(tmp_path, offline_cache):
    """Upstream changed code far from the patches (a new function at the end of llama.cpp,
    CMake's minimum version): git apply takes both as they are, some lines away or not; portkit's
    files are git's."""
    target = edited(TREE, {
        "src/llama.cpp": ("    std::printf(\"done\\n\");\n}\n",
                          "    std::printf(\"done\\n\");\n}\n\nint32_t llama_zero(void) {\n"
                          "    return 0;\n}\n"),
        "CMakeLists.txt": ("VERSION 3.14", "VERSION 3.16")})
    base, upstream, series = project(tmp_path, target, [
        ("llama: check the sum", {"src/llama.cpp": ("    int32_t s = a + b;\n",
                                                    "    int32_t s = a + b;\n"
                                                    "    // checked by the fork\n")}),
        ("cmake: a fork option", {"CMakeLists.txt": ("add_subdirectory(src)\n",
                                                     "option(LLAMA_FORK \"fork\" ON)\n\n"
                                                     "add_subdirectory(src)\n")})])
    check, am, _ = invariant(series, base, upstream, tmp_path / "run", "as-is")
    assert [(s.clean, s.fell_back) for s in am.steps] == [(True, False)] * 2  # the rule
    assert [(v.compared, v.identical) for v in check.verdicts] == [(SEQUENTIAL, True)] * 2
    assert_invariant(check)


def test_invariant_rule_gits_three_way_merge_takes_context_changed_around_a_patch(
        tmp_path, offline_cache):
    """Upstream reworded the lines right around the patch's insertion (its context): git
    apply refuses it, git am -3's 3-way merge takes it; portkit's files are git's."""
    target = edited(TREE, {"src/llama.cpp": ("    y = y * k;\n    y = y + 1;\n",
                                             "    y *= k;\n    y = y + 1;\n")})
    base, upstream, series = project(tmp_path, target, [
        ("scale: clamp", {"src/llama.cpp": ("    y = y + 1;\n    y = y - 1;\n",
                                            "    y = y + 1;\n    y = y > 99 ? 99 : y;\n"
                                            "    y = y - 1;\n")})])
    check, am, _ = invariant(series, base, upstream, tmp_path / "run", "context")
    (step,) = am.steps
    assert step.clean and step.fell_back  # the rule: git apply alone does not take it
    (verdict,) = check.verdicts
    assert verdict.compared == SEQUENTIAL and verdict.identical, check.summary()
    assert_invariant(check)


def test_invariant_rule_gits_rename_detection_follows_a_file_upstream_moved(
        tmp_path, offline_cache):
    """Upstream moved examples/simple/ to tools/simple/ (same file names, one line changed
    far from the patch): git am -3 finds simple.cpp there by its rename detection and merges;
    portkit's files are git's, the moved file and no other."""
    target = {rel: text for rel, text in TREE.items() if not rel.startswith("examples/")}
    target["tools/simple/simple.cpp"] = SIMPLE.replace("    return 0;\n", "    return 1;\n")
    target["tools/simple/CMakeLists.txt"] = SIMPLE_CMAKE
    target["CMakeLists.txt"] = CMAKE.replace("examples/simple", "tools/simple")
    base, upstream, series = project(tmp_path, target, [
        ("simple: a third operand", {"examples/simple/simple.cpp": (
            "    int32_t b = 2;\n", "    int32_t b = 2;\n    int32_t d = 3;\n")})])
    check, am, _ = invariant(series, base, upstream, tmp_path / "run", "rename")
    (step,) = am.steps
    assert step.clean and step.fell_back and step.changed == ("tools/simple/simple.cpp",)
    (verdict,) = check.verdicts
    assert verdict.compared == SEQUENTIAL and verdict.identical, check.summary()
    assert_invariant(check)


def test_invariant_rule_gits_conflict_beside_upstreams_rewrite_is_settled_for_review(
        tmp_path, offline_cache):
    """Patch 1 inserts a line right before lines upstream rewrote: git's merge calls the
    touching changes a conflict, and git am -3 skips the patch. portkit settles it (the
    insertion stays on its side of the rewrite) and must say needs-review, naming the file.
    Patch 2 (another file) goes on from the same tree in both, as git carries it; patch 3,
    on patch 1's file, finds another tree in git's sequence (without patch 1), so it is
    compared with git am -3 of it alone onto portkit's tree."""
    target = edited(TREE, {"src/llama.cpp": ("    int32_t s = a + b;\n    return s;\n",
                                             "    const int32_t s = a + b;\n"
                                             "    return s + 0;\n")})
    base, upstream, series = project(tmp_path, target, [
        ("add: trace", {"src/llama.cpp": ("    int32_t s = a + b;\n",
                                          "    // trace: llama_add\n    int32_t s = a + b;\n")}),
        ("vocab: one extra token", {"src/llama-vocab.cpp": ("n_extra = 0;", "n_extra = 1;")}),
        ("report: flush", {"src/llama.cpp": ("    std::printf(\"done\\n\");\n",
                                             "    std::printf(\"done\\n\");\n"
                                             "    std::fflush(stdout);\n")})])
    check, am, rebased = invariant(series, base, upstream, tmp_path / "run", "beside")
    first, second, third = am.steps
    assert not first.clean and "CONFLICT (content)" in first.said  # the rule
    assert second.clean and third.clean
    row = rebased.report.patches[0]
    assert row.status == rb.NEEDS_REVIEW and row.output is not None, row
    assert "src/llama.cpp" in row.reason
    assert "// trace: llama_add" in (rebased.carried["src/llama.cpp"] or b"").decode()
    v1, v2, v3 = check.verdicts
    assert v1.compared is None and v1.problem is None
    assert (v2.compared, v2.identical) == (SEQUENTIAL, True)
    assert (v3.compared, v3.identical) == (OWN_TREE, True)
    assert_invariant(check)


def test_invariant_rule_a_patch_already_upstream_reverse_applies_and_changes_nothing(
        tmp_path, offline_cache):
    """Upstream made the patch's very change (it reverse-applies to the target): git am -3
    says there is nothing to change, and portkit carries nothing either; the next patch
    goes on from the same tree in both."""
    change = ("    const int32_t n_extra = 0;\n", "    const int32_t n_extra = 0;\n"
              "    static_assert(n_base > 0, \"a vocabulary\");\n")
    target = edited(TREE, {"src/llama-vocab.cpp": change,
                           "src/llama.cpp": ("#include <cstdio>\n",
                                             "#include <cstdio>\n#include <cstdlib>\n")})
    base, upstream, series = project(tmp_path, target, [
        ("vocab: assert the size", {"src/llama-vocab.cpp": change}),
        ("vocab: two extra", {"src/llama-vocab.cpp": ("n_extra = 0;", "n_extra = 2;")})])
    check, am, rebased = invariant(series, base, upstream, tmp_path / "run", "upstream")
    first, second = am.steps
    assert first.clean and first.before == first.after and second.clean  # the rule
    assert rebased.report.patches[0].output is None, rebased.report.patches[0]
    assert [(v.compared, v.identical) for v in check.verdicts] == [(SEQUENTIAL, True)] * 2
    assert_invariant(check)


def test_the_check_reports_a_carried_patch_that_is_not_git_am_3s(tmp_path, offline_cache):
    """The check itself: a carried patch that leaves other files than git am -3 is a
    disagreement when it is marked unchanged or merged, and when it is marked needs-review
    with a reason naming nothing; marked needs-review naming the file, it is flagged."""
    target = edited(TREE, {"src/llama.cpp": ("    y = y * k;\n    y = y + 1;\n",
                                             "    y *= k;\n    y = y + 1;\n")})
    base, upstream, series = project(tmp_path, target, [
        ("scale: clamp", {"src/llama.cpp": ("    y = y + 1;\n    y = y - 1;\n",
                                            "    y = y + 1;\n    y = y > 99 ? 99 : y;\n"
                                            "    y = y - 1;\n")})])
    am = git_am_3(series, base, upstream, tmp_path / "am")
    rebased = rb.rebase(series, detect(upstream), base=detect(base))
    (patch,) = rebased.series.patches
    off = patch.with_diff(patch.diff.replace("+    y = y > 99 ? 99 : y;\n",
                                             "+    y = y > 98 ? 98 : y;\n"))
    (row,) = rebased.report.patches
    for n, (status, reason, wrong) in enumerate([
            (rb.MERGED, "merged 3-way", True), (rb.NEEDS_REVIEW, "look at this", True),
            (rb.NEEDS_REVIEW, "src/llama.cpp: settled", False),
            (rb.NEEDS_REVIEW, "it uses llama_scale", False)]):
        report = rb.RebaseReport("s", None, "t", None, (rb.RebasedPatch(
            row.file, row.subject, status, reason, row.output),))
        fake = rb.Rebased(report, Series(series.folder, series.kind, (off,),
                                         series.conventions))
        check = check_invariant(series, fake, am, upstream, tmp_path / f"check-{n}", "fake")
        (verdict,) = check.verdicts
        assert verdict.compared == SEQUENTIAL and not verdict.identical
        assert (verdict.problem is not None) == wrong, verdict
        if wrong:
            assert "y = y > 98 ? 98 : y;" in verdict.problem
        else:
            assert verdict.flagged in ("src/llama.cpp", "llama_scale")
    assert_invariant(check_invariant(series, rebased, am, upstream, tmp_path / "real", "real"))


# -- slow: the fork series and the rotation series on registry trees --------------------------


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.3.17", "0.3.19"])
def test_invariant_fork_series_onto_registry_trees(registry_tree, tmp_path, version):
    """The 40-patch fork series (written against 0.3.16) onto a newer registry tree."""
    series = read_series(FORK_SERIES)
    base, target = detect(registry_tree("0.3.16")), detect(registry_tree(version))
    check, am, _ = invariant(series, base.llama_root, target.llama_root, tmp_path,
                             f"fork series 0.3.16 -> {version}", base_tree=base.root,
                             target_tree=target.root)
    assert len(am.steps) == len(series.patches) == len(check.verdicts)
    assert any(v.compared for v in check.verdicts)
    assert_invariant(check)


ROTATION_RUNS = [(old, new) for old in ROTATION_PINS for new in NEWER
                 if NEWER.index(new) > (NEWER.index(old) if old in NEWER else -1)]


@pytest.mark.slow
@pytest.mark.parametrize(("old", "new"), ROTATION_RUNS)
def test_invariant_rotation_series_onto_newer_registry_trees(registry_tree, tmp_path, old, new):
    """The rotation series rendered for one registry tree, onto each newer one."""
    series = read_series(ROTATION / ROTATION_PINS[old])
    base, target = detect(registry_tree(old)), detect(registry_tree(new))
    check, am, _ = invariant(series, base.llama_root, target.llama_root, tmp_path,
                             f"rotation series {old} -> {new}", base_tree=base.root,
                             target_tree=target.root)
    assert len(am.steps) == len(series.patches) == len(check.verdicts)
    assert_invariant(check)
