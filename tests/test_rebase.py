"""`portkit rebase`: a series carried onto a newer tree, patch by patch.

Offline: a small tree, its newer version (a function renamed with its class, a signature
changed, code moved, a function removed, a change made upstream) and a fork series written
by git format-patch against the first, carried onto the second; the rotation series
rendered on the fixture tree shaped like 0.3.16, carried onto the one shaped like 0.3.17.

Slow (real trees): the rotation series rendered for 0.3.16 carried onto 0.3.17, 0.3.19 and
0.3.20, against what portkit renders on those trees directly; the 40-patch fork series of
tests/data/fork-series carried onto 0.3.17 and 0.3.19, against the patches redone by hand.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest

from portkit import rebase as rb
from portkit.errors import ApplyConflict, PortkitError, TreeError, UsageError
from portkit.follow import feature_of, identifiers
from portkit.hunks import apply_hunks
from portkit.rebase import move as move_module
from portkit.render import render, write_series
from portkit.series import Patch, Series, read_series
from portkit.transaction import TreeFiles, Write
from portkit.tree import detect, fetch

from .conftest import commit_all, tree_bytes
from .test_follow_translate import BASE_FN, TARGET_FN
from .test_series import OLLAMA_OPTIONS, GitRepo

REPO = Path(__file__).resolve().parent.parent
FORK_SERIES = REPO / "tests" / "data" / "fork-series"
ROTATION = REPO / "patches" / "kv-rotation"
ROTATION_PINS = {"0.3.16": "4227c9be4268ac844921b90f31595f81236bd317",
                 "0.3.17": "49bfddeca18e62fa3d39114a23e9fcbdf8a22388",
                 "0.3.19": "c0159f9c1f874da15e94f371d136f5920b4b5335"}
GIT_ENV = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "LC_ALL": "C"}


def git_apply(files: dict[str, bytes | None], patches: Iterable[Patch],
              tmp: Path) -> dict[str, bytes | None]:
    """`files` with `patches` applied in order by plain `git apply` (each must apply)."""
    tmp.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        if data is not None:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
    touched = set(files)
    for patch in patches:
        done = subprocess.run(["git", "apply", "-"], cwd=tmp, input=patch.data, env=GIT_ENV,
                              capture_output=True, check=False)
        assert done.returncode == 0, f"{patch.name}: {done.stderr.decode()}"
        touched |= set(patch.paths)
    return {rel: (tmp / rel).read_bytes() if (tmp / rel).is_file() else None
            for rel in sorted(touched)}


def read(root: Path, paths: Iterable[str]) -> dict[str, bytes | None]:
    return {rel: (root / rel).read_bytes() if (root / rel).is_file() else None
            for rel in paths}


# -- offline: a small tree and its newer version ------------------------------------------

HEADER = """\
#pragma once
int llama_helper(int x);
int llama_sum(int a, int b);
"""

LLAMA = """\
#include "llama.h"

int llama_helper(int x) {
    return x + 1;
}

int llama_sum(int a, int b) {
    int s = a + b;
    return s;
}

int llama_twice(int x) {
    int y = x * 2;
    int t = y;
    return t;
}

int llama_gone(int x) {
    int z = x - 1;
    return z;
}

int llama_last(int x) {
    int w = x * 3;
    return w;
}

int llama_end(void) {
    return 0;
}
"""

KV_H = """\
#pragma once
struct llama_kv_cache_unified {
    bool seq_rm(int seq, int p0, int p1);
    int n = 0;
};
"""

KV = """\
#include "llama-kv-cache-unified.h"

bool llama_kv_cache_unified::seq_rm(int seq, int p0, int p1) {
    if (seq < 0) {
        return false;
    }

    n -= p1 - p0;
    return true;
}
"""

BASE = {"include/llama.h": HEADER, "src/llama.cpp": LLAMA,
        "src/llama-kv-cache-unified.h": KV_H, "src/llama-kv-cache-unified.cpp": KV}

# Upstream, later: a block of new code at the top of llama.cpp, llama_helper takes two
# arguments, a line of llama_twice reworded, llama_gone removed, llama_last changed as the
# fork's patch 4 changes it, and the KV cache renamed (class and files) with its code moved.
TARGET = {
    "include/llama.h": HEADER.replace("llama_helper(int x)", "llama_helper(int x, int y)"),
    "src/llama.cpp": LLAMA.replace(
        '#include "llama.h"\n',
        '#include "llama.h"\n\n// version\nstatic int llama_version(void) {\n    return 2;\n}\n')
    .replace("int llama_helper(int x) {\n    return x + 1;",
             "int llama_helper(int x, int y) {\n    return x + y;")
    .replace("    int y = x * 2;\n", "    int y = 2 * x;\n")
    .replace("int llama_gone(int x) {\n    int z = x - 1;\n    return z;\n}\n\n", "")
    .replace("int w = x * 3;", "int w = 3 * x;"),
    "src/llama-kv-cache.h": KV_H.replace("llama_kv_cache_unified", "llama_kv_cache"),
    "src/llama-kv-cache.cpp": KV.replace("llama_kv_cache_unified", "llama_kv_cache")
    .replace("bool llama_kv_cache::seq_rm",
             "int llama_kv_cache::size() const {\n    return n;\n}\n\n"
             "bool llama_kv_cache::seq_rm"),
}

# The fork's series on BASE, in order: (subject, {file: (old text, new text)}), each edit
# made on the file as the patches before left it.
SERIES = [
    ("sum: say that the sum is checked",
     {"src/llama.cpp": ("    int s = a + b;\n", "    int s = a + b;\n    // checked\n")}),
    ("twice: clamp the result",
     {"src/llama.cpp": ("    return t;\n", "    return t > 100 ? 100 : t;\n")}),
    ("kv: an empty range removes nothing",
     {"src/llama-kv-cache-unified.cpp": (
         "    n -= p1 - p0;\n", "    if (p0 == p1) {\n        return true;\n    }\n\n"
                               "    n -= p1 - p0;\n")}),
    ("last: multiply on the left",
     {"src/llama.cpp": ("int w = x * 3;", "int w = 3 * x;")}),
    ("gone: log the value",
     {"src/llama.cpp": ("    int z = x - 1;\n",
                        "    int z = x - 1;\n    llama_gone_logged = z;\n")}),
    ("end: a caller of the helper",
     {"src/llama.cpp": ("int llama_end(void) {\n    return 0;\n}\n",
                        "int llama_end(void) {\n    return 0;\n}\n\n"
                        "int llama_call(int x) {\n    return llama_helper(x);\n}\n")}),
    ("end: read what gone logged",
     {"src/llama.cpp": ("int llama_call(int x) {\n",
                        "int llama_read(void) {\n    return llama_gone_logged;\n}\n\n"
                        "int llama_call(int x) {\n")}),
]

# What a careful maintainer carries, and how portkit must say it.
EXPECTED = [
    (rb.UNCHANGED, {"src/llama.cpp": ("    int s = a + b;\n",
                                      "    int s = a + b;\n    // checked\n")}),
    (rb.MERGED, {"src/llama.cpp": ("    return t;\n", "    return t > 100 ? 100 : t;\n")}),
    # the file upstream renamed (llama-kv-cache-unified.cpp), followed as git does
    (rb.MERGED, {"src/llama-kv-cache.cpp": (
        "    n -= p1 - p0;\n", "    if (p0 == p1) {\n        return true;\n    }\n\n"
                              "    n -= p1 - p0;\n")}),
    (rb.DROPPED, {}),
    (rb.NEEDS_HUMAN, {}),
    (rb.NEEDS_REVIEW, {"src/llama.cpp": ("int llama_end(void) {\n    return 0;\n}\n",
                                         "int llama_end(void) {\n    return 0;\n}\n\n"
                                         "int llama_call(int x) {\n"
                                         "    return llama_helper(x);\n}\n")}),
    (rb.NEEDS_REVIEW, {"src/llama.cpp": ("int llama_call(int x) {\n",
                                         "int llama_read(void) {\n"
                                         "    return llama_gone_logged;\n}\n\n"
                                         "int llama_call(int x) {\n")}),
]


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def project(root: Path, base_files: dict[str, str], target_files: dict[str, str],
            series: list[tuple[str, dict[str, tuple[str, str]]]]) -> tuple[Path, Path, Path]:
    """(base tree, target tree, series folder): the series made by git format-patch, each
    patch a commit of its edits on the base as the patches before left it."""
    base = write_tree(root / "base", base_files)
    target = write_tree(root / "target", target_files)
    repo = GitRepo(write_tree(root / "repo", base_files))
    repo.git("init", "-q", "-b", "main", ".")
    repo.commit("base", {rel: text.encode() for rel, text in base_files.items()})
    repo.git("tag", "base")
    files = dict(base_files)
    for subject, edits in series:
        for rel, (old, new) in edits.items():
            files[rel] = edit(files[rel], old, new)
        repo.commit(f"{subject}\n\nWhy: {subject}.", {rel: files[rel].encode() for rel in edits},
                    author="Fork Maintainer <fork@example.org>")
    repo.format_patch(root / "series", *OLLAMA_OPTIONS)
    return base, target, root / "series"


@pytest.fixture
def small(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(base tree, target tree, series folder) of the small project."""
    return project(tmp_path, BASE, TARGET, SERIES)


def test_each_patch_is_carried_as_a_careful_maintainer_would(small, tmp_path):
    base, target, folder = small
    series = read_series(folder)
    before = tree_bytes(base), tree_bytes(target), tree_bytes(folder)
    done = rb.rebase(series, detect(target), base=detect(base))
    assert [p.status for p in done.report.patches] == [s for s, _ in EXPECTED]
    assert (tree_bytes(base), tree_bytes(target), tree_bytes(folder)) == before
    # Applied in order by plain git apply, the carried series gives, patch by patch, the
    # target with each carried change made by hand.
    state = read(target, TARGET)
    carried = {p.name: p for p in done.series.patches}
    for n, (row, (_, edits)) in enumerate(zip(done.report.patches, EXPECTED, strict=True)):
        want = dict(state)
        for rel, (old, new) in edits.items():
            want[rel] = edit((want[rel] or b"").decode(), old, new).encode()
        got = git_apply(state, [carried[row.output]], tmp_path / f"apply-{n}") \
            if row.output else state
        assert (row.output is not None) == bool(edits) == (row.output in carried), row
        assert got == want, row.file
        state = want


def test_a_series_numbered_without_gaps_is_numbered_again_once_a_patch_drops(small):
    """As `git format-patch` numbers the series made again: the patches after a dropped one
    take the numbers after the one before it, each keeping its slug."""
    base, target, folder = small
    series = read_series(folder)
    done = rb.rebase(series, detect(target), base=detect(base))
    rows = done.report.patches
    assert any(r.status == rb.DROPPED for r in rows)  # the small series has one upstream took
    # a patch left for a human is numbered as the others: its side file has its new number
    # (the human's patch, saved under it, comes back in its place, no number taken twice)
    human = [r for r in rows if r.status == rb.NEEDS_HUMAN and r.output is None]
    assert human and any(r.status == rb.DROPPED for r in rows[:rows.index(human[0])])
    numbered = [r for r in rows if r.status != rb.DROPPED]
    for n, row in enumerate(numbered, 1):
        name = f"{n:04d}-{row.file[5:]}"
        assert row.output is None or row.output == name, row
        assert row.conflict is None or row.conflict == f"needs-human/{Path(name).stem}.conflict"
    assert [p.name for p in done.series.patches] == [r.output for r in rows if r.output]
    assert set(done.side_files) == {r.conflict for r in rows if r.conflict}


def test_a_series_with_gaps_of_its_own_keeps_its_names(small, tmp_path):
    base, target, folder = small
    gapped = tmp_path / "gapped"
    gapped.mkdir()
    for n, patch in enumerate(sorted(folder.glob("*.patch"))):
        (gapped / f"{10 * (n + 1):04d}{patch.name[4:]}").write_bytes(patch.read_bytes())
    done = rb.rebase(read_series(gapped), detect(target), base=detect(base))
    assert all(r.output in (None, r.file) for r in done.report.patches)


def test_the_base_may_be_another_commit_of_the_target_repository(small, offline_cache):
    base, target, folder = small
    repo = GitRepo(target)
    repo.git("init", "-q", "-b", "main", ".")
    repo.commit("upstream, then", {rel: text.encode() for rel, text in BASE.items()})
    old = repo.git("rev-parse", "HEAD").decode().strip()
    repo.commit("upstream, now", {rel: text.encode() for rel, text in TARGET.items()}
                | {rel: None for rel in set(BASE) - set(TARGET)})
    assert rb.base_spec("HEAD~1", target) == f"git:{target.resolve()}@{old}"
    assert rb.base_spec(str(base), target) == str(base)
    fetched = detect(fetch(rb.base_spec("HEAD~1", target)))
    assert fetched.pin == old
    done = rb.rebase(read_series(folder), detect(target), base=fetched)
    assert [p.status for p in done.report.patches] == [s for s, _ in EXPECTED]


def test_reasons_say_why_and_where(small):
    base, target, folder = small
    rows = rb.rebase(read_series(folder), detect(target), base=detect(base)).report.patches
    assert "lines away" in rows[0].reason
    assert "merged 3-way" in rows[1].reason
    assert "src/llama-kv-cache-unified.cpp is src/llama-kv-cache.cpp in the target (git's " \
        "rename rule)" in rows[2].reason
    assert "it reverse-applies" in rows[3].reason  # dropped: the target has it verbatim
    assert "llama_gone" in rows[4].reason and rows[4].conflict is not None
    assert "it uses llama_helper: llama_helper(int) is llama_helper(int, int) now" \
        in rows[5].reason
    assert "it uses llama_gone_logged" in rows[6].reason and rows[4].file in rows[6].reason


def test_carried_patches_keep_their_mail_and_look_like_git(small, tmp_path):
    base, target, folder = small
    series = read_series(folder)
    done = rb.rebase(series, detect(target), base=detect(base))
    by_name = {p.name: p for p in series.patches}
    originals = {r.output: by_name[r.file] for r in done.report.patches if r.output}
    assert done.series.conventions == series.conventions
    for patch in done.series.patches:
        old = originals[patch.name]
        assert (patch.author, patch.date, patch.subject, patch.body, patch.commit) == \
            (old.author, old.date, old.subject, old.body, old.commit)
        assert patch.text.startswith("From 0000000000000000000000000000000000000000 ")
        assert "[PATCH]" in patch.header and patch.stat is not None
        added = sum(len(h.added) for h in patch.hunks)
        assert f"{added} insertion" in patch.stat
        # index <old>..<new> 100644: git's blob ids of the file before and after, cut to
        # the series' seven digits; @@ lines with git's function headings
        for f in patch.files:
            index = f.header("index")
            assert index is not None and re.fullmatch(r"[0-9a-f]{7}\.\.[0-9a-f]{7} 100644",
                                                      index)
        assert all(h.section for h in patch.hunks)
    relocated = next(p for p in done.series.patches if p.name == done.report.patches[2].file)
    (f,) = relocated.files
    before = (target / f.path).read_bytes()
    blob = hashlib.sha1(b"blob %d\0" % len(before) + before).hexdigest()
    assert f.path == "src/llama-kv-cache.cpp" and f.header("index").startswith(blob[:7])
    assert relocated.hunks[0].section == "bool llama_kv_cache::seq_rm(int seq, int p0, int p1) {"


def test_a_patch_that_needs_a_human_leaves_a_side_file_with_both_sides(small, tmp_path):
    base, target, folder = small
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    row = done.report.patches[4]
    assert row.status == rb.NEEDS_HUMAN and row.output is None
    # named by the number it has now (a patch before it dropped out: 0005 is 0004)
    assert row.conflict == f"needs-human/0004{Path(row.file).stem[4:]}.conflict"
    text = done.side_files[row.conflict].decode()
    assert f"Reason: {row.reason}" in text
    assert "+    llama_gone_logged = z;" in text  # the series' side
    assert "--- the target" in text  # and the target's: the nearest match, or none
    assert "git merge-file (target | base | series)" in text  # and the 3-way conflict
    assert "<<<<<<< target" in text and ">>>>>>> series" in text


def test_output_is_written_at_once_and_never_over_something(small, tmp_path):
    base, target, folder = small
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    out = tmp_path / "out"
    rb.write_rebased(done, out)
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert written == {p.name for p in done.series.patches} | set(done.side_files)
    assert read_series(out).patches == done.series.patches
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    with pytest.raises(UsageError, match="exists and is not an empty folder"):
        rb.write_rebased(done, out)
    (tmp_path / "empty").mkdir()
    rb.write_rebased(done, tmp_path / "empty")
    assert tree_bytes(tmp_path / "empty") == tree_bytes(out)


@pytest.mark.parametrize("empty", [True, False])
def test_a_run_that_fills_the_output_first_wins_and_the_other_is_refused(small, tmp_path,
                                                                          monkeypatch, empty):
    """Two runs given one --out: the one that fills it while the other is still writing
    wins; the other is refused as any run given a full --out is (exit 2), its files gone."""
    base, target, folder = small
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    out = tmp_path / "out"
    if empty:
        out.mkdir()
    rename = os.rename

    def other_run_first(src, dst):
        out.mkdir(exist_ok=True)
        (out / "0001-theirs.patch").write_text("the other run's\n")
        rename(src, dst)

    monkeypatch.setattr(os, "rename", other_run_first)
    with pytest.raises(UsageError, match="exists and is not an empty folder"):
        rb.write_rebased(done, out)
    assert [p.name for p in out.iterdir()] == ["0001-theirs.patch"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_what_a_killed_write_left_beside_the_output_is_removed_by_the_next(small, tmp_path):
    """kill -9 while --out was being filled leaves its hidden sibling: the next write removes
    it (unlocked and a minute old: its owner is gone), and leaves a live one alone."""
    base, target, folder = small
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    stale = tmp_path / ".out.portkit-0123abcd"
    (stale / "needs-human").mkdir(parents=True)
    (stale / "0001-half.patch").write_text("half written\n")
    old = time.time() - 120
    os.utime(stale, (old, old))
    fresh = tmp_path / ".out.portkit-fresh000"  # another run's, just made
    fresh.mkdir()
    rb.write_rebased(done, tmp_path / "out")
    assert not stale.exists() and fresh.is_dir()
    assert read_series(tmp_path / "out").patches == done.series.patches


def test_report_formats(small):
    base, target, folder = small
    report = rb.rebase(read_series(folder), detect(target), base=detect(base),
                       series_label="series", target_label="newer", base_label="older").report
    data = json.loads(rb.render(report, "json"))
    assert data["schema"] == "portkit-rebase/2" and data["target"] == "newer"
    assert data["base_tree"] == "older"  # the base as given, also when it has no pin
    assert data["fork"] is False and data["not_vendored"] == []
    assert data["attention"] == [p.file for p in report.patches
                                 if p.status in (rb.NEEDS_HUMAN, rb.NEEDS_REVIEW)]
    assert data["summary"] == {rb.UNCHANGED: 1, rb.MERGED: 2, rb.RELOCATED: 0, rb.DROPPED: 1,
                               rb.NEEDS_HUMAN: 1, rb.NEEDS_REVIEW: 2}
    assert [set(p) for p in data["patches"]] == [
        {"file", "subject", "status", "reason", "output", "conflict"}] * len(SERIES)
    assert [p["output"] for p in data["patches"]] == [p.output for p in report.patches]
    table = rb.render(report, "table")
    assert all(p.file in table and p.status in table for p in report.patches)
    markdown = rb.render(report, "markdown")
    assert markdown.count("\n| ") == len(SERIES) + 1 and "needs-human/" in markdown
    assert report.exit_code == rb.ATTENTION_EXIT
    with pytest.raises(UsageError):
        rb.render(report, "sarif")


def test_a_series_onto_the_tree_it_was_written_for_is_all_there(small):
    base, _, folder = small
    applied = base.parent / "applied"
    write_tree(applied, BASE)
    series = read_series(folder)
    with apply_hunks(series, applied) as result:
        assert result.ok
        for rel, data in result.files.items():
            assert data is not None
            (applied / rel).write_bytes(data)
    done = rb.rebase(series, detect(applied), base=detect(base))
    assert {p.status for p in done.report.patches} == {rb.DROPPED}
    assert not done.series.patches and done.report.exit_code == 0


# -- offline: the fixture trees --------------------------------------------------------------


def test_fixture_rotation_follows_the_rename(fixture_tree, tmp_path):
    """The rotation rendered on the fixture tree shaped like 0.3.16, carried onto the one
    shaped like 0.3.17 (the unified KV cache renamed, with its files): what is carried is
    written in the target's names and files, and applies with plain git apply."""
    old = fixture_tree("old")
    folder = tmp_path / "series"
    write_series(render(detect(old), "kv-rotation"), folder)
    target = fixture_tree("renamed")
    done = rb.rebase(read_series(folder), detect(target), base=detect(old))
    rows = {p.file[:4]: p for p in done.report.patches}
    # git follows the renamed file; the names upstream renamed are written as the target has
    # them (not what git am -3 writes: for review)
    assert rows["0002"].status == rb.NEEDS_REVIEW
    assert "written with the target's names (llama_kv_cache_unified -> llama_kv_cache" \
        in rows["0002"].reason
    assert rows["0001"].status == rb.NEEDS_REVIEW and "it uses n_embd_head_k:" in \
        rows["0001"].reason  # the head sizes are methods in the target
    for patch in done.series.patches:
        assert not [name for name in identifiers(line for h in patch.hunks for line in h.added)
                    if "unified" in name]  # a name, not a comment that tells the history
        assert {f.path for f in patch.files} <= set(tree_bytes(target))
    paths = sorted(set(done.series.paths))
    git_apply(read(target, paths), done.series.patches, tmp_path / "applied")
    for row in done.report.patches:
        assert row.reason
        if row.status == rb.NEEDS_HUMAN:  # a side file; in the series only what merged
            assert row.conflict is not None
            assert (row.output is not None) == row.reason.startswith("carried in part")
        assert (row.conflict is not None) == (row.status == rb.NEEDS_HUMAN)


# -- slow: the rotation series, against the series rendered on the target -------------------


def rotation(version: str) -> Series:
    return read_series(ROTATION / ROTATION_PINS[version])


def definition_above(lines: list[str], at: int) -> str:
    """The name of the definition whose body holds line `at` (0-based): the nearest line
    above that starts a definition at the left margin."""
    for line in reversed(lines[:at + 1]):
        if m := re.match(r"[A-Za-z_][\w:<>*& ]*?\b([\w:~]+)\s*\(", line):
            return m.group(1)
    return ""


@pytest.mark.parametrize("version", ["0.3.17", "0.3.19"])
def test_rotation_onto_newer_trees_differs_from_the_direct_render_only_as_explained(
        registry_tree, tmp_path, version):
    """The series rendered for 0.3.16, rebased, against the one portkit renders on the
    target. Differences, all explained:

    - 0002 needs a human: its context methods went before get_padding, which is gone. Only
      the files of it that merge are carried (for the patches after it), so the test
      compares the other files with the direct render of the patches carried whole.
    - 0005 passes the rotation to build_rope_shift, whose call upstream gave another
      argument (il): the line merge takes both, word by word, for review; it is then the
      direct render's.
    - 0003 and 0004 are merged three ways, and where upstream inserted lines at the very
      place the patch inserts its own (an `// impl` comment, build_attn's first assert),
      the patch's lines go first: for review, and the same lines as the direct render's,
      in another order.
    - the direct render of 0003 covers code 0.3.16 does not have at all (the hybrid-memory
      inputs): what no rebase of the 0.3.16 series can bring. Those hunks are in
      definitions the base tree lacks.
    - 0001 is carried as text, with the head sizes still read as fields: the target made
      them methods, which is why it is needs-review, naming them.
    """
    base = detect(registry_tree("0.3.16"))
    target = detect(registry_tree(version))
    done = rb.rebase(rotation("0.3.16"), target, base=base, target_label=version)
    rows = {p.file[:4]: p for p in done.report.patches}
    assert {k: p.status for k, p in rows.items()} == {
        "0001": rb.NEEDS_REVIEW, "0002": rb.NEEDS_HUMAN, "0003": rb.NEEDS_REVIEW,
        "0004": rb.NEEDS_REVIEW, "0005": rb.NEEDS_REVIEW}
    assert "get_padding, which is not in the target" in rows["0002"].reason
    assert "other words of them: merged word by word" in rows["0005"].reason
    assert "upstream inserted lines where this patch inserts its own" in rows["0004"].reason
    assert "which 0002-kv-cache-rotation-matrices-as-graph-inputs.patch brings" \
        in rows["0003"].reason  # it reads what the left-out patch adds
    flagged = {"n_embd_head_k", "n_embd_head_v", "n_embd_head_k_mla", "n_embd_head_v_mla"}
    assert all(f"it uses {name}:" in rows["0001"].reason for name in flagged)

    whole = {r.file for r in done.report.patches if r.output and r.status != rb.NEEDS_HUMAN}
    direct = [p for p in rotation(version).patches if p.name in whole]
    # a patch that needs a human is carried in part (the files that merged): those files
    # are left out of the comparison, the rest of it is not in either
    partly = {rel for p in done.series.patches if p.name not in whole for rel in p.paths}
    paths = sorted(set(rotation(version).paths) | set(done.series.paths))
    ours = git_apply(read(target.llama_root, paths), done.series.patches, tmp_path / "ours")
    theirs = git_apply(read(target.llama_root, paths), direct, tmp_path / "direct")
    unexplained = []
    for rel in (rel for rel in paths if rel not in partly):
        a = (theirs[rel] or b"").decode().splitlines()
        b = (ours[rel] or b"").decode().splitlines()
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False) \
                .get_opcodes():
            changed = a[i1:i2] + b[j1:j2]
            if op == "equal" or any(re.search(rf"\b{name}\b", line) for line in changed
                                    for name in flagged):
                continue
            if op == "delete" and definition_above(a, i1) in RENDERED_ONLY:
                continue
            unexplained.append((rel, op, definition_above(a, i1), changed))
    # Where upstream inserted lines at the very place a patch inserts its own, the patch's
    # go after them (portkit.merge's same-point rule, for review): the same lines, in another
    # order than the direct render's. A line moved so is explained; any other is not.
    moved = Counter(line for _, op, _, lines in unexplained if op == "insert"
                    for line in lines if line.strip()) & \
        Counter(line for _, op, _, lines in unexplained if op == "delete"
                for line in lines if line.strip())
    unexplained = [u for u in unexplained if any(
        line.strip() and line not in moved for line in u[3])]
    assert not unexplained
    assert all("upstream inserted lines where this patch inserts its own" in
               rows[r.file[:4]].reason for r in done.report.patches if r.file[:4] == "0004")
    graph = (base.llama_root / "src" / "llama-graph.cpp").read_text()
    for name, why in RENDERED_ONLY.items():
        if why == "not in 0.3.16":
            assert name not in graph
    hybrid = graph[graph.index("void llm_graph_input_mem_hybrid::set_input"):]
    assert hybrid[:hybrid.index("\n}\n")].count("inp_attn->set_input(ubatch);") == 1


# Where the rotation rendered on 0.3.17 (and 0.3.19) has hunks the 0.3.16 series has no
# counterpart of, and why.
RENDERED_ONLY = {
    "llm_graph_input_mem_hybrid::set_input":
        "0.3.16 delegates to inp_attn->set_input (which the series patches); the newer trees "
        "set the KV inputs there themselves, so the template sets the matrices there too",
    "llm_graph_input_mem_hybrid_iswa::set_input": "not in 0.3.16",
    "llm_graph_context::build_inp_mem_hybrid_iswa": "not in 0.3.16",
}


def test_rotation_onto_upstreams_own_rotation_is_all_dropped(registry_tree):
    series = rotation("0.3.16")
    assert feature_of(series) is not None
    done = rb.rebase(series, detect(registry_tree("0.3.20")),
                     base=detect(registry_tree("0.3.16")))
    assert {p.status for p in done.report.patches} == {rb.DROPPED}
    assert all("upstream" in p.reason for p in done.report.patches)
    assert not done.series.patches and not done.side_files


# -- slow: the fork series, against the patches redone by hand ------------------------------


def _expected() -> dict[str, dict[str, object]]:
    return tomllib.loads((FORK_SERIES / "expected.toml").read_text())["patches"]


@pytest.mark.parametrize("version", ["0.3.17", "0.3.19"])
def test_fork_series_carries_as_by_hand_or_says_so(registry_tree, tmp_path, version):
    """Patch by patch, on the target with the earlier hand-made patches applied: what
    portkit writes for a patch gives the tree the hand-made patch gives, or the patch is
    reported needs-human or needs-review. And a patch written as by hand is written byte for
    byte as git format-patch wrote the hand-made one."""
    series = read_series(FORK_SERIES / "series")
    target = detect(registry_tree(version))
    done = rb.rebase(series, target, base=detect(registry_tree("0.3.16")),
                     target_label=version)
    hand = {p.name: p for p in read_series(FORK_SERIES / "expected" / version).patches}
    ours = {p.name: p for p in done.series.patches}
    expected = _expected()
    paths = sorted(set(series.paths) | {r for p in hand.values() for r in p.paths}
                   | set(done.series.paths))
    state = read(target.llama_root, paths)
    right, flagged, wrong = [], [], []
    diverged = False  # an earlier patch left the files other than the hand-made one did
    for n, row in enumerate(done.report.patches):
        want = git_apply(state, [hand[row.file]], tmp_path / f"hand-{n}") \
            if row.file in hand else state
        got = git_apply(state, [ours[row.output]], tmp_path / f"ours-{n}") \
            if row.output in ours else state
        if got == want:
            right.append(row.file)
            if row.output in ours:  # byte for byte, but for what names the files before it
                mine, theirs = ours[row.output].data, hand[row.file].data
                if diverged:  # `index` lines and @@ line numbers
                    mine, theirs = (re.sub(rb"\n@@ -\d+(,\d+)? \+\d+(,\d+)? @@", b"\n@@", re.sub(
                        rb"\nindex \S+", b"", x)) for x in (mine, theirs))
                assert mine == theirs, row.file
        elif row.status in rb.ATTENTION:
            flagged.append(row.file)
            diverged = True
        else:
            wrong.append((row.file, row.status))
        state = want
    print(f"fork series onto {version}: {len(right)} as by hand, {len(flagged)} flagged "
          f"(needs-review or needs-human), {len(wrong)} wrong")
    assert not wrong and len(right) + len(flagged) == len(series.patches)
    # The statuses say what the hand-made expectations say: where the hand drops a patch
    # or leaves it for a human, text that carries it anyway (git am -3 would) is for review.
    for row in done.report.patches:
        by_hand = expected[row.file][version]
        assert isinstance(by_hand, dict)
        if by_hand["rebase"] == "dropped":
            assert row.status in (rb.DROPPED, rb.NEEDS_HUMAN, rb.NEEDS_REVIEW), row.file
        if by_hand["rebase"] == "needs-human":
            assert row.status in rb.ATTENTION, row.file
        if by_hand.get("semantic_review"):
            assert row.status == rb.NEEDS_REVIEW, row.file
        if by_hand["rebase"] == "trimmed":
            assert row.status in (rb.MERGED, rb.NEEDS_REVIEW, rb.UNCHANGED), row.file


# -- offline: a fork moved onto a newer tree ------------------------------------------------

LLAMA_RULES = """\
# what the fork vendors of llama.cpp
protect *.go
include /include/
include /include/*.h
include /src/
include /src/**
exclude *
"""
GGML_RULES = "include /include/\ninclude /include/*.h\nexclude *\n"


@pytest.fixture
def fork_and_target(fixture_fork, fixture_git_tree):
    """A fork of the fixture tree shaped like 0.3.16, with vendoring rules, a file of its own
    (Go) among the vendored ones, and the fixture tree shaped like 0.3.17 as a repository."""
    fork = fixture_fork("old")
    llama = fork.root / "llama" / "llama.cpp"
    (llama / rb.FILTER).write_text(LLAMA_RULES)
    (llama / "llama.go").write_text("package llama\n")
    (fork.root / "ml" / "backend" / "ggml" / "ggml" / rb.FILTER).write_text(GGML_RULES)
    commit_all(fork.root, "vendoring rules")
    target = fixture_git_tree("renamed")
    (target / "README.md").write_text("not vendored\n")
    commit_all(target, "a file the rules leave out")
    return fork, target


@pytest.mark.parametrize("meanwhile", [True, False])
def test_a_plan_read_while_another_portkit_wrote_the_fork_says_so(fork_and_target,
                                                                  monkeypatch, meanwhile):
    """A move planned while another portkit was writing the fork (half an apply read) fails
    on that half: it says the fork changed while it was read (a refusal, exit 4, as the
    loser of any race), not that the series is broken. A plan that fails on a fork nobody
    touched says its own reason."""
    fork, target_root = fork_and_target
    def torn(copy, *args):
        if meanwhile:  # the other portkit's write lands as this one plans
            (fork.root / "llama" / "patches" / "0009-other.patch").write_text("half\n")
        raise ApplyConflict("the series does not come out of the fork cleanly")

    monkeypatch.setattr(move_module, "_plan", torn)
    with pytest.raises((TreeError, ApplyConflict)) as caught:
        rb.plan_fork(detect(fork.root), detect(target_root))
    assert isinstance(caught.value, TreeError) == meanwhile
    said = "changed while portkit read it" if meanwhile else "does not come out"
    assert said in caught.value.message


def test_fork_moves_onto_the_target_in_one_go(fork_and_target, tmp_path):
    fork, target_root = fork_and_target
    target = detect(target_root)
    move = rb.plan_fork(detect(fork.root), target)
    assert [p.status for p in move.rebased.report.patches] == [rb.UNCHANGED, rb.UNCHANGED]
    before = tree_bytes(fork.root)
    plan = move.describe()
    assert "write Makefile.sync" in plan and "delete llama/llama.cpp/src/llama-kv-cache-" \
        "unified.cpp" in plan and tree_bytes(fork.root) == before  # a plan writes nothing
    rb.move_fork(move)
    after = tree_bytes(fork.root)
    assert f"FETCH_HEAD={target.pin}" in after["Makefile.sync"].decode()
    assert target.pin in after["llama/build-info.cpp"].decode()
    # the vendored files: the target's under the rules, with the carried series applied
    carried = git_apply(read(target_root, ["src/llama.cpp", "src/llama-graph.cpp"]),
                        read_series(fork.root / "llama" / "patches").patches, tmp_path / "c")
    vendored = {rel.removeprefix("llama/llama.cpp/"): data for rel, data in after.items()
                if rel.startswith("llama/llama.cpp/")}
    upstream = tree_bytes(target_root)
    wanted = {rel: carried.get(rel) or data for rel, data in upstream.items()
              if rel.startswith(("src/", "include/"))}
    assert {rel: data for rel, data in vendored.items() if rel.startswith(("src/", "include/"))} \
        == wanted
    assert "README.md" not in vendored  # the rules leave it out
    assert vendored["llama.go"] == b"package llama\n"  # protected, and not the target's
    assert vendored[rb.FILTER] == LLAMA_RULES.encode()
    ggml = {rel: data for rel, data in after.items() if rel.startswith("ml/backend/ggml/ggml/")}
    assert ggml["ml/backend/ggml/ggml/include/ggml.h"] == upstream["ggml/include/ggml.h"]
    # the series in llama/patches is the carried one
    assert sorted(p.name for p in read_series(fork.root / "llama" / "patches").patches) \
        == fork.own_patches
    assert not (fork.root / ".portkit").exists()


def test_a_fork_move_that_fails_halfway_writes_nothing(fork_and_target, monkeypatch):
    fork, target_root = fork_and_target
    move = rb.plan_fork(detect(fork.root), detect(target_root))
    writes = [c for c in move.changes if isinstance(c, Write)]
    assert len(writes) > 4
    before = tree_bytes(fork.root)
    real = TreeFiles.write
    done: list[str] = []

    def failing(self, rel, data, mode, owner):  # the fifth file cannot be written, once
        done.append(rel)
        if len(done) == 5:
            raise OSError(28, "No space left on device")
        real(self, rel, data, mode, owner)

    monkeypatch.setattr(TreeFiles, "write", failing)
    with pytest.raises(OSError, match="No space left"):
        rb.move_fork(move)
    assert done[:5] == [c.rel for c in writes[:5]]  # four written, then rolled back
    assert tree_bytes(fork.root) == before
    assert not (fork.root / ".portkit").exists()


def test_a_fork_with_a_patch_that_needs_a_human_is_not_moved(fork_and_target):
    fork, target_root = fork_and_target
    graph = target_root / "src" / "llama-graph.cpp"
    text = graph.read_text()
    graph.write_text(text.replace("    inputs.emplace_back(std::move(input));\n"
                                  "    return inputs.back().get();\n",
                                  "    return store(inputs, std::move(input));\n"))
    commit_all(target_root, "upstream rewrites the function the fork's patch changes")
    move = rb.plan_fork(detect(fork.root), detect(target_root))
    assert [p.status for p in move.blocked] == [rb.NEEDS_HUMAN]
    assert "blocked: 1 patch(es) need a human" in move.describe()
    before = tree_bytes(fork.root)
    with pytest.raises(PortkitError, match="need a human"):
        rb.move_fork(move)
    assert tree_bytes(fork.root) == before


def test_rsync_rules_as_rsync_reads_them(tmp_path):
    rules_file = tmp_path / rb.FILTER
    rules_file.write_text("# comment\nprotect *.go\n+ /src/\n+ /src/llama*.*\n- /src/*\n"
                          "include models/***\nhide *.bin\nexclude *\n")
    rules = rb.read_filter(rules_file)
    assert rb.sent(rules, "src/llama.cpp") and rb.sent(rules, "src/llama-graph.h")
    assert not rb.sent(rules, "src/unicode.cpp") and not rb.sent(rules, "README.md")
    assert rb.sent(rules, "models/a/b.txt") and not rb.sent(rules, "docs/x.md")
    assert not rb.deleted(rules, "x.go") and not rb.deleted(rules, "README.md")
    assert rb.deleted(rules, "src/llama-old.cpp")
    rules_file.write_text("merge other\n")
    with pytest.raises(PortkitError, match="does not follow rsync's merge rule 'merge other'"):
        rb.read_filter(rules_file)


def test_compile_charges_an_error_to_the_patch_that_wrote_the_line(tmp_path):
    """A patch that applies cleanly and uses nothing drift tracks (a local variable), on a
    target that renamed that variable: it is written, and --compile finds it broken."""
    scale = ("int llama_scale(int x) {\n    int k = 4;\n    int r = x * k;\n\n    // scale\n"
             "    r = r * 2;\n    r = r + 1;\n    return r;\n}\n")
    base_files = {**BASE, "src/llama.cpp": LLAMA + "\n" + scale}
    target_files = {**BASE, "src/llama.cpp": LLAMA + "\n" + scale.replace(
        "int k = 4;", "int factor = 4;").replace("x * k;", "x * factor;")}
    base, target, folder = project(tmp_path, base_files, target_files, [
        ("scale: count twice", {"src/llama.cpp": ("    r = r * 2;\n",
                                                  "    r = r * 2;\n    r += k;\n")}),
        ("sum: say that the sum is checked", SERIES[0][1])])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    assert [p.status for p in done.report.patches] == [rb.UNCHANGED, rb.UNCHANGED]
    # as a fork's report says it: its dropped patches need attention, a section not checked
    done.report = replace(done.report, fork=True, not_vendored=(("0002-sum.patch", "x.c"),),
                          base_tree="older")
    checked = rb.compile_check(done, detect(target))
    scale_row, sum_row = checked.report.patches
    assert scale_row.status == rb.NEEDS_REVIEW and scale_row.output == done.series.patches[0].name
    assert re.match(r"it does not compile: src/llama.cpp:\d+: .*\bk\b.*not declared",
                    scale_row.reason)
    assert sum_row == done.report.patches[1]
    assert checked.series == done.series
    # all else the report said stays as it was (the fork's flag, what it does not vendor)
    assert replace(checked.report, patches=done.report.patches) == done.report


def test_compile_charges_the_patch_by_its_name_in_the_series_numbered_again(tmp_path):
    """Once an upstreamed patch drops, the broken one is 0001 in the carried series (it was
    0002): the error is still charged to it."""
    scale = ("int llama_scale(int x) {\n    int k = 4;\n    int r = x * k;\n\n    // scale\n"
             "    r = r * 2;\n    r = r + 1;\n    return r;\n}\n")
    renamed = scale.replace("int k = 4;", "int factor = 4;").replace("x * k;", "x * factor;")
    base, target, folder = project(
        tmp_path, {**BASE, "src/llama.cpp": LLAMA + "\n" + scale},
        {**BASE, "src/llama.cpp": LLAMA + "\n" + renamed.replace(
            "    return r;\n", "    // checked\n    return r;\n")}, [
            ("scale: say it is checked", {"src/llama.cpp": (
                "    return r;\n", "    // checked\n    return r;\n")}),
            ("scale: count twice", {"src/llama.cpp": ("    r = r * 2;\n",
                                                      "    r = r * 2;\n    r += k;\n")})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    upstreamed, broken = done.report.patches
    assert upstreamed.status == rb.DROPPED and broken.output is not None
    assert broken.file.startswith("0002-") and broken.output.startswith("0001-")
    checked = rb.compile_check(done, detect(target))
    assert checked.report.patches[1].status == rb.NEEDS_REVIEW
    assert "it does not compile" in checked.report.patches[1].reason


def test_a_hunk_text_lands_in_the_wrong_function_is_carried_for_review(tmp_path):
    """Upstream added a function whose body reads like the one the patch changes, right
    where that one was, and reworded a line of the latter: git apply (and GNU patch) find
    the patch's context whole at its very line, in the newcomer. Text decides what is
    carried, as `git am -3` would; the Locator, which knows where llama_first went, only
    tells the reviewer."""
    first = ("int llama_first(int x) {\n    int a = x;\n    a = a + 1;\n    a = a * 2;\n"
             "    a = a - 3;\n    return a;\n}\n")
    base_files = {**BASE, "src/llama.cpp": LLAMA + "\n" + first}
    target_files = {**BASE, "src/llama.cpp": LLAMA + "\n" + first.replace(
        "llama_first", "llama_zero") + "\n" + first.replace("a + 1;", "a + 10;")}
    base, target, folder = project(tmp_path, base_files, target_files, [
        ("first: divide", {"src/llama.cpp": ("    a = a * 2;\n", "    a = a * 2;\n"
                                                               "    a = a / 5;\n")})])
    with apply_hunks(read_series(folder), target) as gnu:
        assert gnu.patches[0].hunks[0].status == "clean"  # GNU patch would take it
        assert "llama_zero(int x) {\n    int a = x;\n    a = a + 1;\n    a = a * 2;\n" \
            "    a = a / 5;" in (gnu.files["src/llama.cpp"] or b"").decode()
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    (row,) = done.report.patches
    assert row.status == rb.NEEDS_REVIEW and row.output == done.series.patches[0].name
    assert re.search(r"src/llama.cpp:\d+: git puts it at line \d+, but its code in the base "
                     r"is llama_first \(src/llama.cpp:\d+\) in the target", row.reason)
    assert "a = a / 5;" in done.carried["src/llama.cpp"].decode()  # what git am -3 makes


def test_a_quilt_series_stays_a_quilt_series(small, tmp_path):
    base, target, folder = small
    quilt = tmp_path / "quilt"
    quilt.mkdir()
    originals = read_series(folder).patches
    for patch in originals:
        (quilt / patch.name).write_text(f"Description: {patch.subject}\n\n{patch.diff}")
    # the series file as a maintainer keeps it: comments, a blank line, an option
    listing = ["# ollama's patches, in order\n", *(p.name + ("  # the first\n" if k == 0 else
               " -p1\n" if k == 1 else "\n") for k, p in enumerate(originals)), "\n",
               "# end\n"]
    (quilt / "series").write_text("".join(listing))
    series = read_series(quilt)
    assert series.kind == "quilt"
    done = rb.rebase(series, detect(target), base=detect(base))
    kept = [p.file for p in done.report.patches if p.output]
    assert len(kept) < len(originals)  # one is dropped, one left for a human
    # the same file, only the lines of the patches left out taken away
    assert done.files()["series"].decode() == "".join(
        line for line in listing if not line.strip() or line.startswith("#")
        or line.split()[0] in kept)
    for patch in done.series.patches:
        assert patch.header == f"Description: {patch.subject}\n\n" and not patch.is_mail


def test_files_the_series_creates_and_deletes(tmp_path):
    extra = "int llama_extra(void) {\n    return 7;\n}\n"
    base_files = {**BASE, "src/extra.cpp": extra}
    target_files = {**TARGET, "src/extra.cpp": extra}
    base, target, folder = project(tmp_path, base_files, target_files, [])
    repo = GitRepo(tmp_path / "repo")
    repo.commit("fork: its own file", {"src/fork.cpp": b"int fork(void) {\n    return 1;\n}\n"})
    repo.commit("fork: no extra", {"src/extra.cpp": None})
    shutil.rmtree(folder)
    repo.format_patch(folder, *OLLAMA_OPTIONS)
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    assert [p.status for p in done.report.patches] == [rb.UNCHANGED, rb.UNCHANGED]
    created, deleted = done.series.patches
    assert created.files[0].status == "created" and created.files[0].header("new file mode")
    assert deleted.files[0].status == "deleted" and deleted.files[0].header("deleted file mode")
    after = git_apply(read(target, ["src/fork.cpp", "src/extra.cpp"]), done.series.patches,
                      tmp_path / "applied")
    assert after == {"src/fork.cpp": b"int fork(void) {\n    return 1;\n}\n",
                     "src/extra.cpp": None}


def test_a_patch_that_cannot_be_read_is_its_own_verdict_not_the_series_refusal(small, tmp_path):
    """A real series may hold a file portkit cannot read: that patch needs a human (kept in
    --out byte for byte, for them), and every other patch is carried."""
    base, target, folder = small
    intact = rb.rebase(read_series(folder), detect(target), base=detect(base)).report
    broken = folder / "0004-last-multiply-on-the-left.patch"
    garbage = b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n" \
              b"Subject: [PATCH] not a diff at all\n\nno diff here\n"
    broken.write_bytes(garbage)
    out = tmp_path / "out"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "portkit"), "rebase", "--series", str(folder),
         "--base", str(base), "--onto", str(target), "--out", str(out), "--format", "json"],
        capture_output=True, text=True, env=GIT_ENV)
    assert result.returncode == rb.ATTENTION_EXIT, result.stderr
    report = json.loads(result.stdout)
    rows = {p["file"]: p for p in report["patches"]}
    assert len(rows) == len(SERIES)
    bad = rows[broken.name]
    assert bad["status"] == rb.NEEDS_HUMAN and bad["reason"].startswith("it cannot be read: ")
    assert broken.name in bad["reason"] and (out / broken.name).read_bytes() == garbage
    # the others fare as they do in the intact series (0004 changes a line no other touches)
    assert {p.file: p.status for p in intact.patches if p.file != broken.name} == \
        {name: p["status"] for name, p in rows.items() if name != broken.name}


# -- offline: text first ---------------------------------------------------------------------

TOOL = ("int tool_main(void) {\n    int a = 1;\n    int b = 2;\n    int c = 3;\n"
        "    return a + b + c;\n}\n")


def test_text_first_a_file_upstream_moved_is_followed_by_gits_rename_rule(tmp_path):
    """Upstream moved examples/tool/tool.cpp to tools/tool/tool.cpp and changed a line far
    from the patch: git am -3 follows the rename and merges; so does rebase."""
    moved = TOOL.replace("return a + b + c;", "return a + b + c + 1;")
    base, target, folder = project(
        tmp_path, {**BASE, "examples/tool/tool.cpp": TOOL},
        {**BASE, "tools/tool/tool.cpp": moved},
        [("tool: count d", {"examples/tool/tool.cpp": ("    int b = 2;\n",
                                                       "    int b = 2;\n    int d = 4;\n")})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    (row,) = done.report.patches
    assert row.status == rb.MERGED, row.reason
    assert "examples/tool/tool.cpp is tools/tool/tool.cpp in the target" in row.reason
    assert done.carried["tools/tool/tool.cpp"] == moved.replace(
        "    int b = 2;\n", "    int b = 2;\n    int d = 4;\n").encode()
    assert "examples/tool/tool.cpp" not in done.carried


def test_text_first_a_presence_rule_never_drops_a_patch_that_applies(tmp_path):
    """Upstream uses the names the patch brings (tool_flag is there, in another function),
    but not the patch's change: git applies it, and it is carried, not dropped."""
    target_tool = TOOL + "\nint tool_other(int tool_flag) {\n    return tool_flag;\n}\n"
    base, target, folder = project(
        tmp_path, {**BASE, "src/tool.cpp": TOOL}, {**BASE, "src/tool.cpp": target_tool},
        [("tool: a flag", {"src/tool.cpp": ("    int c = 3;\n",
                                            "    int c = 3;\n    int tool_flag = c;\n")})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    (row,) = done.report.patches
    assert row.status == rb.UNCHANGED and row.output is not None, row.reason
    assert b"    int c = 3;\n    int tool_flag = c;\n" in done.carried["src/tool.cpp"]


def test_text_first_a_patch_that_needs_a_human_still_carries_what_merged(tmp_path):
    """Patch 1 changes two files: one merges, the other conflicts. The merged file is carried
    (in part, needs-human, with its side file), so patch 2 on that file finds it as the
    series leaves it; patch 3 on the conflicting file is told an earlier patch was left
    out there."""
    other = "int other(void) {\n    return 1;\n}\n"
    target_tool = TOOL.replace("    int b = 2;\n", "    int b = 20;\n")
    base, target, folder = project(
        tmp_path, {**BASE, "src/tool.cpp": TOOL, "src/other.cpp": other},
        {**BASE, "src/tool.cpp": target_tool, "src/other.cpp": other},
        [("both: two files", {"src/tool.cpp": ("    int b = 2;\n", "    int b = 22;\n"),
                              "src/other.cpp": ("    return 1;\n", "    return 2;\n")}),
         ("other: once more", {"src/other.cpp": ("    return 2;\n", "    return 3;\n")}),
         ("tool: last", {"src/tool.cpp": ("    return a + b + c;\n",
                                          "    return a * b * c;\n")})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    first, second, third = done.report.patches
    assert first.status == rb.NEEDS_HUMAN and first.output is not None
    assert first.reason.startswith("carried in part (only src/other.cpp)")
    assert first.conflict is not None and first.conflict in done.side_files
    assert second.status == rb.UNCHANGED, second.reason
    assert done.carried["src/other.cpp"] == other.replace("return 1;", "return 3;").encode()
    assert third.status == rb.NEEDS_REVIEW
    assert "an earlier patch that was left out changes the same file: src/tool.cpp " \
        "(0001-both-two-files.patch)" in third.reason


STEPS = ("int f(int x) {\n    int alpha = x + 1;\n    int beta = alpha * 2;\n"
         "    int gamma = beta - 3;\n    int delta = gamma + 4;\n    return delta;\n}\n")


def test_a_patch_on_the_file_where_a_hunk_left_for_a_human_belongs_is_for_review(tmp_path):
    """Upstream moved f's code out of a.cpp into steps.cpp (renamed, a line changed, one put
    in among the lines the hunk keeps, so that they are not there one for one): patch 1's
    hunk on it needs a human, and its nearest match is in steps.cpp. Patch 2 changes
    steps.cpp and applies: it is carried, for review, since the change a human is to make
    there comes before it. A patch on a file no such hunk belongs in is not told so."""
    moved = STEPS.replace("int f(int x)", "int steps_run(int x)").replace(
        "gamma = beta - 3", "gamma = beta - 5").replace(
        "    int alpha = x + 1;\n", "    int alpha = x + 1;\n    trace(alpha);\n") + \
        "\nint tail(void) {\n    return 0;\n}\n"
    other = "int other(void) {\n    return 1;\n}\n"
    base, target, folder = project(
        tmp_path, {**BASE, "src/a.cpp": STEPS + "\n" + other, "src/other.cpp": other,
                   "src/steps.cpp": "int tail(void) {\n    return 0;\n}\n"},
        {**BASE, "src/a.cpp": other, "src/steps.cpp": moved, "src/other.cpp": other},
        [("f: count more", {"src/a.cpp": ("    int beta = alpha * 2;\n",
                                          "    int beta = alpha * 2;\n    beta += 10;\n")}),
         ("steps: tail", {"src/steps.cpp": ("    return 0;\n", "    return 7;\n")}),
         ("other: more", {"src/other.cpp": ("    return 1;\n", "    return 2;\n")})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    first, second, third = done.report.patches
    assert first.status == rb.NEEDS_HUMAN, first.reason
    assert second.status == rb.NEEDS_REVIEW, second.reason
    assert "an earlier patch that was left out changes the same file: src/steps.cpp " \
        "(0001-f-count-more.patch)" in second.reason
    assert third.status == rb.UNCHANGED, third.reason


SWITCH = ("int pick(int kind) {\n    int r = 0;\n    switch (kind) {\n"
          "        case KIND_PLAIN:\n            r = 1;\n            break;\n"
          "    }\n    return r;\n}\n")
GPT = ("        case KIND_GPT4O:\n            r = pick_gpt4o_regex(kind, 2);\n"
       "            break;\n")


def test_a_hunk_whose_lines_upstream_added_in_its_own_form_is_for_review(tmp_path):
    """Upstream handles KIND_GPT4O itself now, in its own form: the patch's case still
    applies as text (a few lines away), and is carried, but for review: the switch would
    have the case twice. Where no line the patch adds is new upstream, no note."""
    target_file = SWITCH.replace("    }\n", "        case KIND_GPT4O:\n"
                                 "            r = pick_gpt4o_upstream(kind);\n"
                                 "            break;\n    }\n")
    base, target, folder = project(
        tmp_path, {**BASE, "src/pick.cpp": SWITCH, "src/tool.cpp": TOOL},
        {**BASE, "src/pick.cpp": target_file, "src/tool.cpp": TOOL},
        [("pick: gpt4o", {"src/pick.cpp": ("            break;\n    }\n",
                                           "            break;\n" + GPT + "    }\n")}),
         ("tool: a flag", {"src/tool.cpp": ("    int c = 3;\n",
                                            "    int c = 3;\n    int tool_flag = c;\n")})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    first, second = done.report.patches
    assert first.status == rb.NEEDS_REVIEW, first.reason
    assert "upstream added 1 of the lines it adds (case KIND_GPT4O:)" in first.reason
    assert "case KIND_GPT4O is in that switch already (line 7): the patch's, in its own " \
        "form, carried beside it: twice, it does not compile (the two must become one)" in \
        first.reason, first.reason
    assert second.status == rb.UNCHANGED, second.reason


def test_a_patch_left_for_a_human_is_not_carried_in_part_where_upstream_made_it(tmp_path):
    """Patch 1 conflicts in tool.cpp and adds a case upstream added in its own form in
    pick.cpp: it needs a human, and pick.cpp is not carried in part (the case would be
    there twice), though patch 2 changes pick.cpp too; patch 2 then finds pick.cpp as
    upstream has it, with nothing left out there."""
    target_file = SWITCH.replace("    }\n", "        case KIND_GPT4O:\n"
                                 "            r = pick_gpt4o_upstream(kind);\n"
                                 "            break;\n    }\n")
    target_tool = TOOL.replace("    int b = 2;\n", "    int b = 20;\n")
    base, target, folder = project(
        tmp_path, {**BASE, "src/pick.cpp": SWITCH, "src/tool.cpp": TOOL},
        {**BASE, "src/pick.cpp": target_file, "src/tool.cpp": target_tool},
        [("both: gpt4o", {"src/pick.cpp": ("            break;\n    }\n",
                                           "            break;\n" + GPT + "    }\n"),
                          "src/tool.cpp": ("    int b = 2;\n", "    int b = 22;\n")}),
         ("pick: start", {"src/pick.cpp": ("    int r = 0;\n", "    int r = -1;\n")})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    first, second = done.report.patches
    assert first.status == rb.NEEDS_HUMAN, first.reason
    assert not first.reason.startswith("carried in part"), first.reason
    assert done.carried["src/pick.cpp"] == target_file.replace(
        "    int r = 0;\n", "    int r = -1;\n").encode()
    assert second.status == rb.UNCHANGED, second.reason


PARTS = "".join(f"static int part_{i}(int x) {{\n    return x + {i};\n}}\n\n" for i in range(12))


def test_text_carries_what_it_can_and_structure_only_the_rest(tmp_path):
    """Patch 1 changes tool.cpp (text carries it) and a.m, which upstream split: its steps
    went to a.cpp (git's rename rule finds no file a.m became). Text carries tool.cpp as it
    is, structure only a.m's hunk, where its lines went: the patch is carried whole, for
    review of a.cpp. Patch 2, on tool.cpp, applies onto what text carried: nothing for
    review."""
    steps = STEPS.replace("int f(int x)", "static int f(int x, int y)")
    base, target, folder = project(
        tmp_path, {**BASE, "src/tool.cpp": TOOL, "src/a.m": PARTS + STEPS},
        {**BASE, "src/tool.cpp": TOOL, "src/a.cpp": "// split\n\n" + steps,
         "src/b.cpp": PARTS},
        [("both: two files", {"src/tool.cpp": ("    int b = 2;\n", "    int b = 22;\n"),
                              "src/a.m": ("    int beta = alpha * 2;\n",
                                          "    int beta = alpha * 20;\n")}),
         ("tool: return", {"src/tool.cpp": ("    return a + b + c;\n",
                                            "    return a * b * c;\n")})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    first, second = done.report.patches
    assert first.status == rb.NEEDS_REVIEW, first.reason
    assert first.reason.startswith("text carries src/tool.cpp, not src/a.m"), first.reason
    assert done.carried["src/a.cpp"] == ("// split\n\n" + steps).replace(
        "alpha * 2;", "alpha * 20;").encode()
    assert second.status == rb.UNCHANGED, second.reason
    assert done.carried["src/tool.cpp"] == TOOL.replace("b = 2;", "b = 22;").replace(
        "a + b + c", "a * b * c").encode()


def test_a_patch_carried_onto_a_file_an_earlier_patch_settled_for_review_is_for_review(
        tmp_path):
    """Patch 1 inserts a line where upstream inserted its own (git stops; portkit settles
    it, for review of tool.cpp). Patch 2 changes tool.cpp elsewhere and applies: it stands
    on patch 1's settling there, and is for review too. Patch 3, on another file, is not."""
    target_tool = TOOL.replace("    int b = 2;\n", "    int b = 2;\n    int up = 9;\n")
    other = "int other(void) {\n    return 1;\n}\n"
    base, target, folder = project(
        tmp_path, {**BASE, "src/tool.cpp": TOOL, "src/other.cpp": other},
        {**BASE, "src/tool.cpp": target_tool, "src/other.cpp": other},
        [("tool: d", {"src/tool.cpp": ("    int b = 2;\n", "    int b = 2;\n    int d = 4;\n")}),
         ("tool: return", {"src/tool.cpp": ("    return a + b + c;\n",
                                            "    return a * b * c;\n")}),
         ("other: more", {"src/other.cpp": ("    return 1;\n", "    return 2;\n")})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    first, second, third = done.report.patches
    assert first.status == rb.NEEDS_REVIEW and "src/tool.cpp: upstream inserted" in \
        first.reason, first.reason
    assert second.status == rb.NEEDS_REVIEW, second.reason
    assert "carried onto what an earlier patch, for review there, made of src/tool.cpp " \
        "(0001-tool-d.patch)" in second.reason
    assert third.status == rb.UNCHANGED, third.reason


OPS = ('static const char * OP_NAME[OP_COUNT] = {\n    "NONE",\n    "ADD",\n};\n\n'
       'static_assert(OP_COUNT == 2, "OP_COUNT != 2");\n\nint ops(void) {\n    return 0;\n}\n')


@pytest.mark.parametrize(("table", "count"), [
    # upstream added an operator of its own: the count is upstream's, raised by the patch's
    ('    "NONE",\n    "ADD",\n    "MUL",\n', 4),
    # upstream added the patch's own operator (elsewhere in the table): the count is right
    # as upstream has it
    ('    "NONE",\n    "UNPAD",\n    "ADD",\n', 3),
])
def test_a_count_the_patch_raises_that_upstream_raised_too_is_raised_once_more(
        tmp_path, table, count):
    """The patch adds an operator and raises the assertion 2 -> 3. Upstream asserts 3 too:
    git's merge sees one change on both sides and keeps 3; the tree with the patch has 4
    operators, unless upstream's third is the patch's own."""
    target_ops = OPS.replace('    "NONE",\n    "ADD",\n', table).replace(
        "OP_COUNT == 2, \"OP_COUNT != 2\"", "OP_COUNT == 3, \"OP_COUNT != 3\"")
    base, target, folder = project(
        tmp_path, {**BASE, "src/ops.c": OPS}, {**BASE, "src/ops.c": target_ops},
        [("ops: unpad", {"src/ops.c": (
            '    "ADD",\n};\n\nstatic_assert(OP_COUNT == 2, "OP_COUNT != 2");\n',
            '    "ADD",\n    "UNPAD",\n};\n\nstatic_assert(OP_COUNT == 3, "OP_COUNT != 3");\n')})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    (row,) = done.report.patches
    carried = (done.carried.get("src/ops.c") or target_ops.encode()).decode()
    assert f'static_assert(OP_COUNT == {count}, "OP_COUNT != {count}");' in carried, row.reason
    if count == 4:
        assert row.status == rb.NEEDS_REVIEW and "upstream raised the count it raises" in \
            row.reason, row.reason
        assert '"MUL",\n    "UNPAD",' in carried or '"UNPAD",\n    "MUL",' in carried


SIZES_H = "enum model_type {\n    TYPE_1B,\n    TYPE_537M,\n    TYPE_2B,\n    TYPE_7B,\n};\n"
SIZES = ("int pick_type(int n_layer) {\n    int type = 0;\n    switch (n_layer) {\n"
         "        case 18: type = TYPE_537M; break;\n        case 26: type = TYPE_1B; break;\n"
         "    }\n    return type;\n}\n")


def test_a_change_upstream_made_in_its_own_form_is_dropped_though_settling_carries_a_file(
        tmp_path):
    """The patch types 18 layers as TYPE_270M (with a comment) and drops TYPE_537M. Upstream
    did both its own way: the same line without the comment, and TYPE_537M replaced by
    another size. Text carries sizes.cpp only by settling (word by word: the comment), and
    not sizes.h (a conflict); structure finds the whole change upstream: dropped."""
    target_h = SIZES_H.replace("    TYPE_537M,\n", "    TYPE_270M,\n    TYPE_SMALL_NEW,\n")
    target = SIZES.replace("TYPE_537M; break;", "TYPE_270M;  break;")
    base, target_tree, folder = project(
        tmp_path, {**BASE, "src/sizes.h": SIZES_H, "src/sizes.cpp": SIZES},
        {**BASE, "src/sizes.h": target_h, "src/sizes.cpp": target},
        [("sizes: 270m", {"src/sizes.h": ("    TYPE_537M,\n", "    TYPE_270M,\n"),
                          "src/sizes.cpp": ("TYPE_537M; break;",
                                            "TYPE_270M; break; // the 270m checkpoint")})])
    done = rb.rebase(read_series(folder), detect(target_tree), base=detect(base))
    (row,) = done.report.patches
    assert row.status == rb.DROPPED, row.reason
    assert not done.carried


def test_structure_for_the_rest_writes_the_targets_names_only_in_the_patchs_own_lines(
        tmp_path):
    """Patch 1 is carried in two ways (tool.cpp by text, a.m by structure) and its line in
    tool.cpp uses a name upstream renamed: the line is written with the target's name, and
    upstream's own lines that tell the old name (a comment) stay as upstream wrote them."""
    steps = STEPS.replace("int f(int x)", "static int f(int x, int y)")
    told = "// was llm_graph_input_attn_kv_unified before the rename\n" + TOOL
    base, target, folder = project(
        tmp_path, {**BASE, "src/tool.cpp": TOOL, "src/a.m": PARTS + STEPS,
                   "src/kv.h": "struct llm_graph_input_attn_kv_unified {\n    int n;\n};\n"},
        {**BASE, "src/tool.cpp": told, "src/a.cpp": "// split\n\n" + steps, "src/b.cpp": PARTS,
         "src/kv.h": "struct llm_graph_input_attn_kv {\n    int n;\n};\n"},
        [("both: two files", {
            "src/tool.cpp": ("    int c = 3;\n", "    int c = 3;\n"
                             "    int k = sizeof(llm_graph_input_attn_kv_unified);\n"),
            "src/a.m": ("    int beta = alpha * 2;\n", "    int beta = alpha * 20;\n")})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    (row,) = done.report.patches
    assert row.status == rb.NEEDS_REVIEW, row.reason
    assert done.carried["src/tool.cpp"] == told.replace("    int c = 3;\n", (
        "    int c = 3;\n    int k = sizeof(llm_graph_input_attn_kv);\n")).encode(), row.reason


GRAPH_H = """\
struct graph {
    int build_attn(int inp, float * wo, float * q, float * k, float * kq_b, float scale,
                   int il);
};
"""
MODEL_CPP = """\
#include "graph.h"

struct build_a : graph {
    int run(float * wo, float * q, float * k, int il) {
        return build_attn(0, wo,
                q, k, nullptr, 0.5f, il);
    }
};

struct build_b : graph {
    int run(float * wo, float * q, float * k, int il) {
        return build_attn(1, wo,
                q, k, nullptr, 1.0f, il);
    }
};

struct build_c : graph {
    int run(float * wo, float * q, float * k, float * b, int il) {
        return build_attn(2, wo,
                q, k, b, 0.25f, il);
    }
};
"""
SOLAR = """
struct build_solar : graph {
    int run(float * wo, float * q, float * k, int il) {
        return build_attn(3, wo,
                q, k, nullptr, 0.125f, il);
    }
};
"""


def test_a_call_upstream_changed_the_parameters_of_is_adapted_as_upstream_adapted_its_own(
        tmp_path):
    """Upstream gave build_attn a parameter after kq_b (sinks) and passes nullptr there at
    each of its calls: the patch's call, which would not compile, gets the same nullptr, and
    the patch is for review, saying so."""
    sinks_h = GRAPH_H.replace("float * kq_b, ", "float * kq_b, float * sinks, ")
    sinks_cpp = MODEL_CPP.replace("q, k, nullptr,", "q, k, nullptr, nullptr,").replace(
        "q, k, b,", "q, k, b, nullptr,")
    end = "    }\n};\n"
    base, target, folder = project(
        tmp_path, {"src/graph.h": GRAPH_H, "src/llama.cpp": MODEL_CPP},
        {"src/graph.h": sinks_h, "src/llama.cpp": sinks_cpp},
        [("add solar", {"src/llama.cpp": (MODEL_CPP[-len(end) - 60:],
                                          MODEL_CPP[-len(end) - 60:] + SOLAR)})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    row = done.report.patches[0]
    assert row.status == rb.NEEDS_REVIEW
    assert "1 call(s) in src/llama.cpp adapted as upstream adapted 3 of its own (`nullptr` " \
        "inserted after argument 5)" in row.reason
    got = git_apply(read(target, ["src/llama.cpp"]), done.series.patches, tmp_path / "apply")
    assert got["src/llama.cpp"] == (sinks_cpp + SOLAR.replace(
        "q, k, nullptr,", "q, k, nullptr, nullptr,")).encode()


def test_a_call_upstreams_own_calls_do_not_agree_on_is_left_as_it_was_for_review(tmp_path):
    sinks_h = GRAPH_H.replace("float * kq_b, ", "float * kq_b, float * sinks, ")
    sinks_cpp = MODEL_CPP.replace("0, wo,\n                q, k, nullptr,",
                                  "0, wo,\n                q, k, nullptr, s0,").replace(
        "1, wo,\n                q, k, nullptr,", "1, wo,\n                q, k, nullptr, s1,"
    ).replace("q, k, b,", "q, k, b, s2,")
    end = "    }\n};\n"
    base, target, folder = project(
        tmp_path, {"src/graph.h": GRAPH_H, "src/llama.cpp": MODEL_CPP},
        {"src/graph.h": sinks_h, "src/llama.cpp": sinks_cpp},
        [("add solar", {"src/llama.cpp": (MODEL_CPP[-len(end) - 60:],
                                          MODEL_CPP[-len(end) - 60:] + SOLAR)})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    row = done.report.patches[0]
    assert row.status == rb.NEEDS_REVIEW and "adapted" not in row.reason
    assert "it calls build_attn with 7 argument(s)" in row.reason
    got = git_apply(read(target, ["src/llama.cpp"]), done.series.patches, tmp_path / "apply")
    assert got["src/llama.cpp"] == (sinks_cpp + SOLAR).encode()


def test_a_row_added_to_a_table_upstream_respaced_takes_upstreams_columns(tmp_path):
    """Upstream added a longer name to a table and respaced every row into wider columns.
    The patch's row, written in the old columns, applies as text; it is carried in the new
    columns, as a maintainer realigns it, and for review (git am -3 writes the old ones).
    A row added to a table upstream left alone is carried as it is."""
    def rows(*entries: tuple[str, str], width: int) -> str:
        return "".join(f"    {{ {name + ',':<{width}} {text:<{width - 2}} }},\n"
                       for name, text in entries)
    names = [("KV_NAME", '"%s.name"'), ("KV_SCALE", '"%s.scale"')]
    head, tail = "static const map KV_NAMES = {\n", "};\n"
    old = head + rows(*names, width=12) + tail
    new = head + rows(*names, ("KV_LONGER_NAME_MLA", '"%s.mla"'), width=22) + tail
    mine = rows(("KV_SKIP", '"%s.skip"'), width=12)
    base, target, folder = project(
        tmp_path, {**BASE, "src/arch.cpp": old, "src/keep.cpp": old},
        {**BASE, "src/arch.cpp": new, "src/keep.cpp": old},
        [("arch: skip", {"src/arch.cpp": (tail, mine + tail)}),
         ("keep: skip", {"src/keep.cpp": (tail, mine + tail)})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    first, second = done.report.patches
    assert first.status == rb.NEEDS_REVIEW, first.reason
    assert "src/arch.cpp: 1 line(s) it adds realigned to the columns upstream gave" \
        in first.reason
    assert done.carried["src/arch.cpp"] == new.replace(
        tail, rows(("KV_SKIP", '"%s.skip"'), width=22) + tail).encode()
    assert second.status == rb.UNCHANGED, second.reason
    assert done.carried["src/keep.cpp"] == (old.replace(tail, mine + tail)).encode()


def test_a_hunk_whose_function_upstream_moved_and_reworded_is_written_in_its_words(tmp_path):
    """Upstream made load_vocab a member of vocab::impl, in vocab.cpp, its `m.vocab.` fields
    the member's own. The patch's hunk matches nowhere as text; its lines are there one for
    one in upstream's words: it is written there with upstream's rewording, for review."""
    model = "#include \"model.h\"\n\nint model_size() {\n    return 1;\n}\n\n"
    base, target, folder = project(
        tmp_path, {**BASE, "src/model.cpp": model + BASE_FN},
        {**BASE, "src/model.cpp": model, "src/vocab.cpp": TARGET_FN},
        [("vocab: warn", {"src/model.cpp": (
            '            throw std::runtime_error("unknown pre-tokenizer");\n',
            '            LOG_WARN("unknown pre-tokenizer, using default");\n'
            "            m.vocab.type_pre = PRE_DEFAULT;\n")})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    (only,) = done.report.patches
    assert only.status == rb.NEEDS_REVIEW, only.reason
    assert "in upstream's words: written there as upstream rewrote them " \
        "(m.vocab.type_pre -> pre_type)" in only.reason
    assert done.carried["src/vocab.cpp"] == TARGET_FN.replace(
        '            throw std::runtime_error("unknown pre-tokenizer");\n',
        '            LOG_WARN("unknown pre-tokenizer, using default");\n'
        "            pre_type = PRE_DEFAULT;\n").encode()


ARCH = ("enum llm_arch {\n    LLM_ARCH_GEMMA2,\n    LLM_ARCH_STARCODER2,\n};\n\n"
        "void load(int arch) {\n    switch (arch) {\n"
        "        case LLM_ARCH_GEMMA2:\n            {\n                g2();\n"
        "            } break;\n"
        "        case LLM_ARCH_STARCODER2:\n            {\n                sc2();\n"
        "            } break;\n        default: break;\n    }\n}\n")


def test_a_case_upstream_added_too_is_not_carried_a_second_time(tmp_path):
    """The fork's patch added GEMMA3 (an enumerator, a stub case); upstream added GEMMA3 with
    its own body, and moved things around it. Text carries the patch's case beside upstream's:
    a switch with the same case twice does not compile. The patch's is left out, said, and
    what is left of the patch changes nothing (dropped, the reason saying why); the enum keeps
    one GEMMA3."""
    target_arch = ARCH.replace(
        "    LLM_ARCH_STARCODER2,\n", "    LLM_ARCH_GEMMA3,\n    LLM_ARCH_STARCODER2,\n").replace(
        "        case LLM_ARCH_STARCODER2:\n",
        "        case LLM_ARCH_GEMMA3:\n            {\n                g3(ml);\n"
        "            } break;\n        case LLM_ARCH_STARCODER2:\n").replace(
        "                g2();\n", "                g2(ml);\n")
    base, target, folder = project(
        tmp_path, {**BASE, "src/arch.cpp": ARCH}, {**BASE, "src/arch.cpp": target_arch},
        [("arch: gemma3", {"src/arch.cpp": (
            "    LLM_ARCH_GEMMA2,\n    LLM_ARCH_STARCODER2,\n",
            "    LLM_ARCH_GEMMA2,\n    LLM_ARCH_GEMMA3,\n    LLM_ARCH_STARCODER2,\n")}),
         ("arch: gemma3 case", {"src/arch.cpp": (
             "            } break;\n        case LLM_ARCH_STARCODER2:\n",
             "            } break;\n        case LLM_ARCH_GEMMA3:\n            {\n"
             "            } break;\n        case LLM_ARCH_STARCODER2:\n")})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    carried = (done.carried.get("src/arch.cpp") or target_arch.encode()).decode()
    assert carried.count("case LLM_ARCH_GEMMA3:") == 1 and "g3(ml);" in carried
    assert carried.count("LLM_ARCH_GEMMA3,") == 1
    enum_row, case_row = done.report.patches
    assert case_row.status == rb.DROPPED, case_row.reason
    assert "src/arch.cpp: case LLM_ARCH_GEMMA3 is in that switch already (line 13): the " \
        "patch's, a second one, left out (it would not compile)" in case_row.reason
    assert enum_row.status == rb.DROPPED, enum_row.reason


def test_a_patch_to_a_file_with_crlf_lines_keeps_them(tmp_path):
    """A file written with CRLF line ends (a Windows-only source, a .bat): the carried
    patch's lines keep their CRs, so that it applies with git apply as the original did."""
    crlf = "int a;\r\nint b;\r\nint c;\r\nint d;\r\n"
    base, target, folder = project(
        tmp_path, {**BASE, "src/w.cpp": crlf}, {**BASE, "src/w.cpp": crlf + "// up\r\n"},
        [("w: patched", {"src/w.cpp": ("int b;\r\n", "int b; // patched\r\n")})])
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    (row,) = done.report.patches
    assert row.status == rb.UNCHANGED, row.reason
    (patch,) = done.series.patches
    assert b"+int b; // patched\r\n" in patch.data and b" int a;\r\n" in patch.data
    carried = git_apply(read(target, ["src/w.cpp"]), [patch], tmp_path / "applied")
    assert carried["src/w.cpp"] == (crlf + "// up\r\n").replace(
        "int b;\r\n", "int b; // patched\r\n").encode()


def test_a_binary_file_the_series_adds_is_carried_with_its_data(tmp_path):
    """git format-patch writes a binary file as a `GIT binary patch`: the carried patch
    keeps the data (git's --binary), so that git apply makes the file, byte for byte."""
    blob = bytes(range(256)) * 3
    base, target, folder = project(tmp_path, BASE, TARGET, [])
    repo = GitRepo(tmp_path / "repo")
    repo.commit("add a blob\n\nWhy: a model file.", {"models/blob.bin": blob},
                author="Fork Maintainer <fork@example.org>")
    shutil.rmtree(folder)
    repo.format_patch(folder, *OLLAMA_OPTIONS)
    (patch,) = read_series(folder).patches
    assert b"GIT binary patch" in patch.data
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    (row,) = done.report.patches
    (carried,) = done.series.patches
    assert b"GIT binary patch" in carried.data, carried.data
    made = git_apply({}, [carried], tmp_path / "applied")
    assert made["models/blob.bin"] == blob, row


def test_a_file_the_patch_renames_and_upstream_edited_is_one_merge(tmp_path):
    """The patch renames ren.cpp to renamed.cpp and edits a line; upstream added a line to
    ren.cpp, so that git apply refuses the patch. As git am -3's rename detection does: the
    target's ren.cpp, the base's and the patch's renamed.cpp merged, the result under the new
    name, and ren.cpp gone - written as a rename."""
    text = "one\ntwo\nthree\nfour\nfive\n"
    base, target, folder = project(tmp_path, {**BASE, "src/ren.cpp": text},
                                   {**BASE, "src/ren.cpp": "zero\n" + text}, [])
    repo = GitRepo(tmp_path / "repo")
    repo.commit("ren: renamed\n\nWhy: a better name.",
                {"src/ren.cpp": None, "src/renamed.cpp": text.replace("three", "THREE").encode()},
                author="Fork Maintainer <fork@example.org>")
    shutil.rmtree(folder)
    repo.format_patch(folder, *OLLAMA_OPTIONS)
    (patch,) = read_series(folder).patches
    assert "rename from src/ren.cpp" in patch.diff
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    (row,) = done.report.patches
    assert row.status == rb.MERGED, row.reason
    assert "src/ren.cpp renamed to src/renamed.cpp, with what upstream changed in it" in row.reason
    (carried,) = done.series.patches
    assert "rename from src/ren.cpp\nrename to src/renamed.cpp\n" in carried.diff
    made = git_apply(read(target, ["src/ren.cpp"]), [carried], tmp_path / "applied")
    assert made == {"src/ren.cpp": None,
                    "src/renamed.cpp": ("zero\n" + text.replace("three", "THREE")).encode()}


def test_a_mail_saved_with_crlf_line_ends_is_carried_as_the_same_mail_with_lf(small, tmp_path):
    """A series whose mails a mail client saved with CRLF line ends (every line): git am
    reads them as LF mails, and so does the carry: the same verdicts and, but for the CRs
    the series' own files keep, the same carried patches."""
    base, target, folder = small
    crlf = tmp_path / "crlf-series"
    crlf.mkdir()
    for path in sorted(folder.glob("*.patch")):
        (crlf / path.name).write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    lf_done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    crlf_done = rb.rebase(read_series(crlf), detect(target), base=detect(base))
    assert [(r.status, r.reason) for r in crlf_done.report.patches] == \
        [(r.status, r.reason) for r in lf_done.report.patches]
    assert [p.data.replace(b"\r\n", b"\n") for p in crlf_done.series.patches] == \
        [p.data for p in lf_done.series.patches]
    assert all(p.data.count(b"\n") == p.data.count(b"\r\n") for p in crlf_done.series.patches)


def test_a_file_holding_several_mails_is_that_files_verdict(small, tmp_path):
    """git format-patch --stdout writes a series into one file: read as one patch, its
    second commit's mail would be lost. It is that file's verdict (needs-human, kept as it
    was, saying how to split it); the other patches are carried."""
    base, target, folder = small
    first, second, *rest = sorted(folder.glob("*.patch"))
    first.write_bytes(first.read_bytes() + second.read_bytes())
    second.unlink()
    done = rb.rebase(read_series(folder, lenient=True), detect(target), base=detect(base))
    row = done.report.patches[0]
    assert row.status == rb.NEEDS_HUMAN and "2 mails in one file (split it" in row.reason, row
    assert done.files()[first.name] == first.read_bytes()  # kept for the human as it was
    assert len(done.report.patches) == 1 + len(rest)


def test_hidden_files_are_no_patches_and_a_link_to_nothing_is_a_verdict(small, tmp_path):
    """An editor's or macOS's hidden file (.x.patch, ._0001.patch) in the series folder is
    not a patch of it; a .patch that links to nothing is one that cannot be read (its own
    verdict), not a silent gap in the series."""
    base, target, folder = small
    names = sorted(p.name for p in folder.glob("*.patch"))
    (folder / ".0000-scratch.patch").write_text("notes\n")
    (folder / "._0001-x.patch").write_bytes(b"\x00\x05\x16\x07")
    (folder / "0000-gone.patch").symlink_to(tmp_path / "nowhere.patch")
    done = rb.rebase(read_series(folder, lenient=True), detect(target), base=detect(base))
    rows = done.report.patches
    assert [r.file for r in rows] == ["0000-gone.patch", *names]
    assert rows[0].status == rb.NEEDS_HUMAN and "a symbolic link to nothing" in rows[0].reason
    assert "0000-gone.patch" not in done.files() and rows[0].output is None  # no empty file


def test_a_patch_name_that_is_a_folder_is_a_verdict_not_a_gap(small, tmp_path):
    base, target, folder = small
    (tmp_path / "elsewhere").mkdir()
    (folder / "0000-folder.patch").symlink_to(tmp_path / "elsewhere")
    done = rb.rebase(read_series(folder, lenient=True), detect(target), base=detect(base))
    row = done.report.patches[0]
    assert row.file == "0000-folder.patch" and row.status == rb.NEEDS_HUMAN
    assert "a folder, not a patch file" in row.reason and "0000-folder.patch" not in done.files()


def test_a_file_that_is_a_link_in_the_target_is_that_patchs_verdict(tmp_path):
    """Upstream made src/w.cpp a symbolic link to another file; the patch changes w.cpp's
    text. git apply refuses it ("wrong type"): a patch for a human, saying where the link
    goes - not the whole run's refusal."""
    text = "int a;\nint b;\nint c;\n"
    base, target, folder = project(
        tmp_path, {**BASE, "src/w.cpp": text}, {**BASE, "src/w_impl.cpp": text},
        [("w: b", {"src/w.cpp": ("int b;\n", "int b = 1;\n")})])
    (target / "src" / "w.cpp").symlink_to("w_impl.cpp")
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    (row,) = done.report.patches
    assert row.status == rb.NEEDS_HUMAN, row.reason
    assert "a symbolic link in the target, a file in the base: src/w.cpp (to w_impl.cpp)" in \
        row.reason
    assert not done.series.patches and row.conflict is not None


def test_a_carried_patch_that_cannot_be_written_back_is_that_patchs_verdict(small,
                                                                            monkeypatch):
    """Whatever makes a carried diff unreadable as a patch (a path or a link no patch may
    write), it is that patch's verdict - left for a human with its diff in the side file, the
    target as it was for the patches after it - never the refusal of the whole run."""
    base, target, folder = small
    series = read_series(folder)
    first = series.patches[0].name
    real = rb.run._written

    def refuse(patch: Patch, diff: str) -> Patch:
        if patch.name == first:
            raise rb.run.UnreadablePatch(f"{first}: refusing src/x: a symbolic link to '/'")
        return real(patch, diff)

    monkeypatch.setattr(rb.run, "_written", refuse)
    done = rb.rebase(series, detect(target), base=detect(base))
    row = done.report.patches[0]
    assert row.status == rb.NEEDS_HUMAN and row.output is None
    assert "it cannot be written back as a patch" in row.reason
    assert first not in [p.name for p in done.series.patches]
    assert len(done.series.patches) >= 1 and row.conflict in done.files()


def test_markdown_cells_hold_any_patch_name():
    """A backtick or a pipe in a patch's file name (or its side file's) stays inside its
    code span and its cell: the table keeps its columns."""
    odd = "0001-a `tick` | pipe.patch"
    report = rb.RebaseReport("s", None, "t", None, (
        rb.RebasedPatch(odd, "subject", rb.NEEDS_HUMAN, "why | because", None,
                        "needs-human/0001-a `tick` | pipe.conflict"),))
    markdown = rb.render(report, "markdown").splitlines()
    assert markdown[-1] == "1 patch needs attention: ``0001-a `tick` | pipe.patch``."
    row = markdown[4]
    assert row.startswith("| 1 | ``0001-a `tick` \\| pipe.patch`` | needs-human | yes | - | ")
    assert re.sub(r"``.*?``", "", row).replace("\\|", "").count("|") == 7


OBJC = ("#import <Foundation/Foundation.h>\n\n@implementation GGMLMetalClass\n"
        "- (void)setup {\n    int a = 1;\n    int b = 2;\n    int c = 3;\n    int d = 4;\n"
        "    int e = 5;\n}\n@end\n")


def _objc_series(tmp_path: Path, heading: str) -> tuple[Path, Path, Path]:
    """A one-patch series on an Objective-C file whose @@ line has `heading`, as the fork's
    git wrote it."""
    base, target, folder = project(
        tmp_path, {**BASE, "src/k.m": OBJC}, {**BASE, "src/k.m": "// up\n" + OBJC},
        [("k: d", {"src/k.m": ("    int d = 4;\n", "    int d = 40;\n")})])
    (patch,) = folder.glob("*.patch")
    patch.write_text(re.sub(r"(?m)^(@@ [^@]+ @@).*$", lambda m: m.group(1) + heading,
                            patch.read_text()))
    return base, target, folder


@pytest.mark.parametrize(("heading", "carried"), [
    (" - (void)setup {", "@@ -6,7 +6,7 @@ - (void)setup {"),  # git's objc rule (the fork's)
    ("", "@@ -6,7 +6,7 @@"),  # git's default rule: no heading for these lines
])
def test_headings_are_written_with_the_rule_the_series_was_written_with(tmp_path, heading,
                                                                        carried):
    """The fork's git wrote Objective-C headings (`*.m diff=objc`: `- (void)setup {`,
    `@implementation ...`) that git's default rule never makes: the carried patch's @@ lines
    are made with the same rule, and with the default one where the series shows no other."""
    base, target, folder = _objc_series(tmp_path, heading)
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    (patch,) = done.series.patches
    assert [line for line in patch.diff.splitlines() if line.startswith("@@")] == [carried]


def test_the_users_git_attributes_do_not_change_a_carried_patch(small, tmp_path, monkeypatch):
    """~/.config/git/attributes (core.attributesFile's default) saying `*.cpp binary` or
    naming a diff driver would make git write `Binary files differ` or other headings:
    portkit's git reads none of the user's attributes."""
    base, target, folder = small
    plain = rb.rebase(read_series(folder), detect(target), base=detect(base))
    home = tmp_path / "home"
    (home / ".config" / "git").mkdir(parents=True)
    (home / ".config" / "git" / "attributes").write_text("*.cpp binary\n*.h diff=objc\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    hostile = rb.rebase(read_series(folder), detect(target), base=detect(base))
    assert [p.data for p in hostile.series.patches] == [p.data for p in plain.series.patches]
    assert all(b"Binary files" not in p.data for p in hostile.series.patches)


def test_a_hunk_upstream_made_already_is_said_when_the_merge_leaves_it_out(tmp_path):
    """Upstream made one hunk of the patch itself (the same deletion): git's merge takes
    the rest and the carried patch is without that hunk, as `git am -3` has it; the reason
    says which hunk, so that the patch does not shrink unsaid."""
    body = "".join(f"int f{k}(int x) {{\n    return x + {k};\n}}\n\n" for k in range(12))
    target_body = body.replace("    return x + 9;\n", "")
    base, target, folder = project(
        tmp_path, {**BASE, "src/f.cpp": body}, {**BASE, "src/f.cpp": target_body},
        [("f: two", {"src/f.cpp": ("    return x + 1;\n", "    return x + 1 + A;\n")}),
         ("f: drop", {"src/f.cpp": ("    return x + 9;\n", "")})])
    # one patch of both hunks: squash the two commits' diffs into the first mail
    first, second = sorted(folder.glob("*.patch"))
    both = read_series(folder).patches
    text = first.read_text().replace(both[0].diff, both[0].diff + "".join(
        h.text if h.text.endswith("\n") else h.text + "\n" for h in both[1].hunks))
    first.write_text(text)
    second.unlink()
    (patch,) = read_series(folder).patches
    assert len(patch.hunks) == 2
    done = rb.rebase(read_series(folder), detect(target), base=detect(base))
    (row,) = done.report.patches
    assert row.status == rb.MERGED, row.reason
    assert f"src/f.cpp:{patch.hunks[1].old_start}: upstream made this hunk's change already " \
        "(the carried patch is without it)" in row.reason
    (carried,) = done.series.patches
    assert len(carried.hunks) == 1


def test_a_quilt_patch_keeps_its_own_file_headers(tmp_path):
    """A quilt patch's files come with quilt's headers (`Index:`, `====`, `--- llama.orig/x
    <timestamp>`, `+++ llama/x <timestamp>`), no `diff --git`: carried onto a tree where its
    hunks moved, only the @@ line numbers change."""
    one = "".join(f"int a{k};\n" for k in range(10))
    two = "".join(f"int b{k};\n" for k in range(10))
    base = write_tree(tmp_path / "base", {**BASE, "src/one.cpp": one, "src/two.cpp": two})
    target = write_tree(tmp_path / "target", {**BASE, "src/one.cpp": "// up\n" + one,
                                              "src/two.cpp": "// up\n// up\n" + two})
    stamp = "\t2025-01-01 00:00:00.000000000 +0000\n"

    def section(name: str, text: str, old: str, new: str) -> str:
        lines = text.splitlines(keepends=True)
        at = lines.index(old)
        body = "".join(" " + x for x in lines[at - 3:at]) + "-" + old + "+" + new + "".join(
            " " + x for x in lines[at + 1:at + 4])
        return (f"Index: llama/src/{name}\n" + "=" * 67 + "\n"
                f"--- llama.orig/src/{name}{stamp}+++ llama/src/{name}{stamp}"
                f"@@ -{at - 2},7 +{at - 2},7 @@\n{body}")

    quilt = tmp_path / "quilt"
    quilt.mkdir()
    text = ("Description: two files\nAuthor: Fork Maintainer <fork@example.org>\n\n"
            + section("one.cpp", one, "int a5;\n", "int a5 = 5;\n")
            + section("two.cpp", two, "int b5;\n", "int b5 = 5;\n"))
    (quilt / "two.patch").write_text(text)
    (quilt / "series").write_text("two.patch\n")
    done = rb.rebase(read_series(quilt), detect(target), base=detect(base))
    (row,) = done.report.patches
    assert row.status == rb.UNCHANGED, row.reason
    (carried,) = done.series.patches
    assert carried.text == text.replace("@@ -3,7 +3,7 @@\n int a2", "@@ -4,7 +4,7 @@\n int a2") \
        .replace("@@ -3,7 +3,7 @@\n int b2", "@@ -5,7 +5,7 @@\n int b2")


@pytest.mark.parametrize("fmt", ["table", "json", "markdown"])
def test_a_report_of_non_utf8_names_is_valid_utf8(fmt):
    odd = b"0001-caf\xe9.patch".decode("utf-8", "surrogateescape")
    report = rb.RebaseReport("s", None, "t", None, (
        rb.RebasedPatch(odd, odd, rb.UNCHANGED, "applies as it is", odd),))
    text = rb.render(report, fmt)
    text.encode("utf-8")  # no lone surrogate left, in any format
    assert "0001-caf\ufffd.patch" in (json.loads(text)["patches"][0]["file"] if fmt == "json"
                                      else text)


def test_a_binary_file_both_sides_changed_is_that_patchs_needs_human_not_the_series_end(
        tmp_path):
    """git merge-file does not merge binary files: the patch that changed one upstream
    changed too is left for a human, and the rest of the series is carried."""
    blob = bytes(range(256)) * 2
    base_files = {"src/data.bin": blob, "src/llama.cpp": b"int a = 1;\n"}
    repo = GitRepo(tmp_path / "repo")
    repo.root.mkdir()
    repo.git("init", "-q", "-b", "main", ".")
    repo.commit("base", dict(base_files))
    repo.git("tag", "base")
    repo.commit("new data", {"src/data.bin": blob[::-1]})
    repo.commit("a is two", {"src/llama.cpp": b"int a = 2;\n"})
    repo.git("format-patch", "-q", "--binary", "-o", str(tmp_path / "series"), *OLLAMA_OPTIONS,
             "base..HEAD")
    for name, files in (("base", base_files),
                        ("target", {**base_files, "src/data.bin": blob + b"\0more"})):
        for rel, data in files.items():
            (tmp_path / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / rel).write_bytes(data)
    done = rb.rebase(read_series(tmp_path / "series"), detect(tmp_path / "target"),
                     base=detect(tmp_path / "base"))
    first, second = done.report.patches
    assert first.status == rb.NEEDS_HUMAN and "binary" in first.reason
    assert "src/data.bin" in first.reason
    assert second.status == rb.UNCHANGED and second.output is not None


def test_two_patches_of_one_stem_have_a_side_file_each(small, tmp_path):
    """A quilt series with a/fix.diff and b/fix.diff, both for a human: one side file each."""
    base, target, folder = small
    needs_human = sorted(folder.glob("*.patch"))[4]
    quilt = tmp_path / "quilt"
    for sub in ("a", "b"):
        (quilt / sub).mkdir(parents=True)
        (quilt / sub / "fix.diff").write_bytes(needs_human.read_bytes())
    (quilt / "series").write_text("a/fix.diff\nb/fix.diff\n")
    done = rb.rebase(read_series(quilt), detect(target), base=detect(base))
    rows = done.report.patches
    assert [r.status for r in rows] == [rb.NEEDS_HUMAN, rb.NEEDS_HUMAN]
    assert [r.conflict for r in rows] == ["needs-human/a--fix.diff.conflict",
                                          "needs-human/b--fix.diff.conflict"]
    assert set(done.side_files) == {r.conflict for r in rows}


def test_a_mode_change_on_a_file_the_target_made_a_link_is_for_a_human(tmp_path):
    """A patch that only makes a file executable, where upstream made that file a symbolic
    link: carried, it would put a file where the link was."""
    base_files = {"src/llama.cpp": b"int a = 1;\n", "src/run.sh": b"echo run\n"}
    repo = GitRepo(tmp_path / "repo")
    repo.root.mkdir()
    repo.git("init", "-q", "-b", "main", ".")
    repo.commit("base", dict(base_files))
    repo.git("tag", "base")
    (repo.root / "src/run.sh").chmod(0o755)
    repo.git("add", "src/run.sh")
    repo.git("commit", "-q", "-m", "run is a program")
    repo.format_patch(tmp_path / "series", *OLLAMA_OPTIONS)
    for name in ("base", "target"):
        (tmp_path / name / "src").mkdir(parents=True)
        (tmp_path / name / "src/llama.cpp").write_bytes(base_files["src/llama.cpp"])
    (tmp_path / "base/src/run.sh").write_bytes(base_files["src/run.sh"])
    (tmp_path / "target/src/run.sh").symlink_to("llama.cpp")
    done = rb.rebase(read_series(tmp_path / "series"), detect(tmp_path / "target"),
                     base=detect(tmp_path / "base"))
    (row,) = done.report.patches
    assert row.status == rb.NEEDS_HUMAN and "symbolic link" in row.reason
    assert row.output is None
