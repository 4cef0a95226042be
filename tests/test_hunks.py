"""The per-hunk engine: every status, GNU patch's own figures, series order, byte-exact
content, and a hostile series kept inside the scratch copy."""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from portkit import tree as tree_mod
from portkit.errors import InputError
from portkit.hunks import ALREADY, CLEAN, FAILED, FUZZ, OFFSET, apply_hunks
from portkit.series import Patch, Series, parse_patch, read_series

from .test_series import COMMITTED, OLLAMA_OPTIONS, GitRepo, cpp

KV = "src/kv.cpp"


def functions(n: int = 40, name: str = "kv") -> list[bytes]:
    """Lines of a C++ file: n small functions, five lines each (the blank and closing-brace
    lines repeat, as in real code)."""
    lines = [b"#include <cstdint>\n", b"\n"]
    for i in range(n):
        lines += [f"static int {name}_{i}(int x) {{\n".encode(),
                  f"    int y = x * {i};\n".encode(), f"    return y + {i % 7};\n".encode(),
                  b"}\n", b"\n"]
    return lines


def at(i: int, part: int = 0) -> int:
    """Index in functions() of line `part` of function i."""
    return 2 + 5 * i + part


def edited(lines: list[bytes], changes: dict[int, list[bytes]]) -> list[bytes]:
    """Lines with some replaced by others (applied from the bottom, so indexes stay valid)."""
    out = list(lines)
    for index in sorted(changes, reverse=True):
        out[index:index + 1] = changes[index]
    return out


def file_diff(path: str, before: bytes | None, after: bytes | None) -> bytes:
    """A git-style diff of one file (difflib on bytes, so any content goes through)."""
    a = (before or b"").splitlines(keepends=True)
    b = (after or b"").splitlines(keepends=True)
    head = [f"diff --git a/{path} b/{path}\n".encode()]
    if before is None:
        head.append(b"new file mode 100644\n")
    if after is None:
        head.append(b"deleted file mode 100644\n")
    old = f"a/{path}".encode() if before is not None else b"/dev/null"
    new = f"b/{path}".encode() if after is not None else b"/dev/null"
    body = []
    for line in difflib.diff_bytes(difflib.unified_diff, a, b, old, new, n=3):
        body.append(line if line.endswith(b"\n") else line + b"\n\\ No newline at end of file\n")
    if body:
        body[0], body[1] = b"--- " + old + b"\n", b"+++ " + new + b"\n"
    return b"".join(head + body)


def make_patch(name: str, *files: tuple[str, bytes | None, bytes | None]) -> Patch:
    text = (f"From: Tess Ter <tess@example.com>\nSubject: [PATCH] {name}\n\n---\n".encode()
            + b"".join(file_diff(*f) for f in files))
    return parse_patch(f"{name}.patch", text)


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


ORIGINAL = functions()


def change(i: int, part: int, text: str) -> tuple[int, list[bytes]]:
    return at(i, part), [text.encode()]


@pytest.fixture
def drifted(tmp_path: Path) -> Path:
    """The tree a series meets: five lines inserted after kv_5, kv_10 already changed as the
    series changes it, kv_15 rewritten, kv_21's signature touched, a header present."""
    lines = edited(ORIGINAL, dict([
        (at(6), [b"// five\n", b"// new\n", b"// lines\n", b"// of\n", b"// drift\n",
                 ORIGINAL[at(6)]]),
        change(10, 2, "    return y + 30;\n"),
        change(15, 1, "    long y = (long) x * 15;\n"),
        change(15, 2, "    return (int) (y - 1);\n"),
        change(21, 0, "static int kv_21(int x) /* touched */ {\n")]))
    return write_tree(tmp_path / "tree", {KV: b"".join(lines), "src/kv.h": b"#pragma once\n"})


def one_change(name: str, i: int, part: int, text: str) -> Patch:
    return make_patch(name, (KV, b"".join(ORIGINAL),
                             b"".join(edited(ORIGINAL, dict([change(i, part, text)])))))


def test_every_status_is_reported(drifted):
    series = [
        one_change("clean", 2, 2, "    return y + 200;\n"),
        one_change("offset", 30, 2, "    return y + 300;\n"),
        one_change("fuzz", 20, 2, "    return y + 60;\n"),
        one_change("already", 10, 2, "    return y + 30;\n"),
        one_change("context", 15, 1, "    int y = x * 150;\n"),
        make_patch("missing", ("src/missing.cpp", b"int a;\n", b"int b;\n")),
        make_patch("exists", ("src/kv.h", None, b"#pragma twice\n")),
        make_patch("creates", ("src/new.h", None, b"int n;\n")),
    ]
    with apply_hunks(series, drifted) as result:
        got = {p.patch.name: p.hunks[0] for p in result.patches}
        assert got["clean.patch"].status == CLEAN and got["clean.patch"].offset == 0
        assert (got["offset.patch"].status, got["offset.patch"].offset) == (OFFSET, 5)
        assert (got["fuzz.patch"].status, got["fuzz.patch"].fuzz,
                got["fuzz.patch"].offset) == (FUZZ, 1, 5)
        assert (got["already.patch"].status, got["already.patch"].offset) == (ALREADY, 5)
        assert got["already.patch"].line == series[3].hunks[0].new_start + 5
        assert (got["context.patch"].status, got["context.patch"].reason) == (
            FAILED, "context not found")
        assert got["context.patch"].line == series[4].hunks[0].old_start
        assert (got["missing.patch"].status, got["missing.patch"].reason) == (
            FAILED, "file missing")
        assert (got["exists.patch"].status, got["exists.patch"].reason) == (FAILED, "file exists")
        assert got["creates.patch"].status == CLEAN
        applied = {p.patch.name: p.applied for p in result.patches}
        assert applied == {"clean.patch": True, "offset.patch": True, "fuzz.patch": True,
                           "already.patch": True, "context.patch": False,
                           "missing.patch": False, "exists.patch": False,
                           "creates.patch": True}
        assert not result.ok
        assert result.files["src/new.h"] == b"int n;\n"
        assert result.files["src/kv.h"] == b"#pragma once\n"
        assert result.files["src/missing.cpp"] is None
        final = result.files[KV]
        assert final is not None
        for text in (b"return y + 200;", b"return y + 300;", b"return y + 60;"):
            assert final.count(text) == 1
        assert b"x * 150" not in final


GNU_HUNK = re.compile(r"Hunk #(\d+) succeeded at \d+(?: with fuzz (\d+))?"
                      r"(?: \(offset (-?\d+) lines?\))?\.")


def gnu_figures(series_dir: Path, tree: Path) -> dict[tuple[str, str, int], tuple[int, int]]:
    """Plain GNU patch over the series, patch after patch: (offset, fuzz) of every hunk by
    (patch, file, hunk number), read from what it printed."""
    figures = {}
    for patch in sorted(series_dir.glob("*.patch")):
        out = subprocess.run(["patch", "-p1", "--verbose", "--fuzz=2", "-i", str(patch)],
                             cwd=tree, capture_output=True, text=True, check=True,
                             stdin=subprocess.DEVNULL, env={**os.environ, "LC_ALL": "C"})
        current = ""
        for line in out.stdout.splitlines():
            if line.startswith("patching file "):
                current = line[len("patching file "):]
            elif m := GNU_HUNK.match(line):
                figures[(patch.name, current, int(m.group(1)))] = (
                    int(m.group(3) or 0), int(m.group(2) or 0))
    return figures


def test_offsets_and_fuzz_are_gnu_patchs_own(tmp_path):
    """A multi-file, multi-hunk series on a drifted tree: the engine's offset and fuzz for
    every hunk equal what plain GNU patch printed applying the same series."""
    graph = functions(30, "graph")
    kv2 = edited(ORIGINAL, dict([change(3, 2, "    return 3;\n"), change(25, 1, "    int y;\n"),
                                 change(36, 2, "    return 36;\n")]))
    graph2 = edited(graph, dict([change(4, 1, "    int y = 4;\n"),
                                 change(20, 2, "    return 20;\n")]))
    kv3 = edited(kv2, dict([change(12, 2, "    return 12;\n"), change(30, 1, "    int y = 0;\n")]))
    series_dir = tmp_path / "series"
    series_dir.mkdir()
    for n, (subject, files) in enumerate([
            ("kv and graph", [(KV, ORIGINAL, kv2), ("src/graph.cpp", graph, graph2)]),
            ("kv again", [(KV, kv2, kv3)])], 1):
        patch = make_patch(subject, *((p, b"".join(a), b"".join(b)) for p, a, b in files))
        (series_dir / f"000{n}-{subject.replace(' ', '-')}.patch").write_bytes(patch.data)
    drift_kv = edited(ORIGINAL, dict([
        (at(1), [b"// a\n", b"// b\n", ORIGINAL[at(1)]]),
        change(24, 3, "}  // kv_24\n"),
        (at(33), [b"// c\n"] * 7 + [ORIGINAL[at(33)]]),
        change(30, 3, "}  // kv_30\n")]))
    drift_graph = edited(graph, dict([(at(10), [b"// g\n"] * 4 + [graph[at(10)]]),
                                      change(5, 0, "static int graph_5(int x) /* g */ {\n")]))
    tree = write_tree(tmp_path / "tree", {KV: b"".join(drift_kv),
                                          "src/graph.cpp": b"".join(drift_graph)})
    with apply_hunks(read_series(series_dir), tree) as result:
        assert result.ok
        engine = {(h.patch, h.file, h.index + 1): (h.offset, h.fuzz) for h in result.hunks}
        final = dict(result.files)
    gnu_tree = tmp_path / "gnu"
    shutil.copytree(tree, gnu_tree)
    gnu = gnu_figures(series_dir, gnu_tree)
    assert engine == gnu
    assert {o for o, _ in engine.values()} > {0} and {f for _, f in engine.values()} > {0}
    assert final == {rel: (gnu_tree / rel).read_bytes() for rel in final}


def test_a_patch_half_upstream_is_reported_hunk_by_hunk(tmp_path):
    """Its first hunk is in the tree already, its second is not: not 'reversed', not failed."""
    after = edited(ORIGINAL, dict([change(4, 2, "    return y + 40;\n"),
                                   change(30, 2, "    return y + 300;\n")]))
    patch = make_patch("half", (KV, b"".join(ORIGINAL), b"".join(after)))
    upstream = edited(ORIGINAL, dict([change(4, 2, "    return y + 40;\n")]))
    tree = write_tree(tmp_path / "tree", {KV: b"".join(upstream)})
    with apply_hunks([patch], tree) as result:
        (pr,) = result.patches
        assert [h.status for h in pr.hunks] == [ALREADY, CLEAN]
        assert pr.applied and pr.worst == ALREADY
        assert result.files[KV] == b"".join(after)


def test_an_addition_already_upstream_is_not_added_twice(tmp_path):
    """GNU patch would place this added function again (with fuzz), after its own copy;
    its new side is there exactly, so it is already applied."""
    added = [b"static int extra(int x) {\n", b"    return -x;\n", b"}\n", b"\n"]
    after = edited(ORIGINAL, {at(8): added + [ORIGINAL[at(8)]]})
    patch = make_patch("extra", (KV, b"".join(ORIGINAL), b"".join(after)))
    tree = write_tree(tmp_path / "tree", {KV: b"".join(after)})
    with apply_hunks([patch], tree) as result:
        (hunk,) = result.hunks
        assert (hunk.status, hunk.offset, hunk.fuzz) == (ALREADY, 0, 0)
        assert result.files[KV] == b"".join(after)
    plain = subprocess.run(["patch", "-p1", "--force", "--dry-run", "-i", "-"], cwd=tree,
                           input=patch.diff.encode(), capture_output=True, check=False)
    assert re.search(rb"succeeded at \d+ with fuzz", plain.stdout)  # GNU patch alone


def test_deleting_a_file_upstream_added_to_fails(tmp_path):
    """The patch deletes a file to which upstream has added a line: GNU patch takes the
    patch's lines out but keeps the file ("Not deleting file ... as content differs"), and git
    apply refuses: a failed hunk, saying so - not a clean one."""
    old = b"keep\n"
    patch = make_patch("delete", ("src/del.cpp", old, None))
    tree = write_tree(tmp_path / "tree", {"src/del.cpp": old + b"upstream line\n"})
    with apply_hunks([patch], tree) as result:
        (hunk,) = result.hunks
        assert hunk.status == FAILED
        assert hunk.reason == "file differs from the one the patch deletes"
    gone = write_tree(tmp_path / "same", {"src/del.cpp": old})
    with apply_hunks([patch], gone) as result:
        (hunk,) = result.hunks
        assert hunk.status == CLEAN and result.files["src/del.cpp"] is None


def test_a_file_that_is_a_symbolic_link_in_the_tree_is_not_patched_through(tmp_path):
    """The tree has a link where the patch changes a file's text: GNU patch ("not a regular
    file") and git apply ("wrong type") refuse it, and so does the engine - it never patches
    the link's target text, nor the file it names."""
    old = b"int a;\nint b;\nint c;\n"
    patch = make_patch("b", ("src/x.cpp", old, old.replace(b"int b;", b"int b = 1;")))
    tree = write_tree(tmp_path / "tree", {"src/x_real.cpp": old})
    (tree / "src" / "x.cpp").symlink_to("x_real.cpp")
    with apply_hunks([patch], tree) as result:
        (hunk,) = result.hunks
        assert hunk.status == FAILED
        assert hunk.reason == "a symbolic link in the tree, where the patch changes a file"
    assert (tree / "src" / "x_real.cpp").read_bytes() == old


def test_a_failing_hunk_names_its_patch_file_and_place(drifted):
    patch = make_patch("two-hunks", (KV, b"".join(ORIGINAL), b"".join(edited(ORIGINAL, dict([
        change(2, 2, "    return 2000;\n"), change(15, 2, "    return 1500;\n")])))))
    with apply_hunks([patch], drifted) as result:
        (pr,) = result.patches
        assert not pr.applied and pr.worst == FAILED
        (failed,) = pr.failed
        assert (failed.patch, failed.file, failed.index) == ("two-hunks.patch", KV, 1)
        line = failed.describe()
        assert "two-hunks.patch" in line and KV in line and "hunk #2" in line
        assert f"at line {failed.line}" in line and "context not found" in line
        assert result.files[KV] == drifted.joinpath(KV).read_bytes()


def test_later_patches_see_earlier_ones(tmp_path):
    one = edited(ORIGINAL, {at(3, 3): [b"    // added by one\n", ORIGINAL[at(3, 3)]]})
    two = edited(one, {at(3, 3): [b"    // added by one, changed by two\n"]})
    unrelated = edited(ORIGINAL, dict([change(35, 2, "    return 35;\n")]))
    first = make_patch("one", (KV, b"".join(ORIGINAL), b"".join(one)))
    second = make_patch("two", (KV, b"".join(one), b"".join(two)))
    third = make_patch("three", (KV, b"".join(ORIGINAL), b"".join(unrelated)))
    tree = write_tree(tmp_path / "tree", {KV: b"".join(ORIGINAL)})
    with apply_hunks([first, second, third], tree) as result:
        assert [p.worst for p in result.patches] == [CLEAN, CLEAN, OFFSET]
        assert result.patches[2].hunks[0].offset == 1  # the line patch one added
        assert b"changed by two" in (result.files[KV] or b"")
    no_context = b"".join(ORIGINAL).replace(b"return y + 3;", b"return y - 3;")
    broken = write_tree(tmp_path / "broken", {KV: no_context})
    with apply_hunks([first, second, third], broken) as result:
        assert [(p.applied, p.worst) for p in result.patches] == [
            (False, FAILED), (False, FAILED), (True, CLEAN)]
        assert b"return 35;" in (result.files[KV] or b"")
        assert b"added by one" not in (result.files[KV] or b"")


def test_crlf_and_latin1_content_comes_through_byte_for_byte(tmp_path):
    before = b"".join(ORIGINAL).replace(b"\n", b"\r\n") + b"// caf\xe9\r\n"
    after = before.replace(b"return y + 3;\r\n", b"return y + 3; // na\xefve\r\n").replace(
        b"// caf\xe9\r\n", b"// caf\xe9 cr\xe8me\r\n")
    bare = b"int a;\nint b;"  # no newline at end of file
    tree = write_tree(tmp_path / "tree", {"win/kv.cpp": before, "src/bare.h": bare})
    patch = make_patch("bytes", ("win/kv.cpp", before, after),
                       ("src/bare.h", bare, b"int a;\nint c;"))
    assert patch.files[0].hunks[0].old_lines[0].endswith("\r\n")
    with apply_hunks([patch], tree) as result:
        assert result.ok
        assert result.files == {"win/kv.cpp": after, "src/bare.h": b"int a;\nint c;"}
    crlf_mail = parse_patch("crlf.patch", patch.data.replace(b"\n", b"\r\n"))
    lf = make_patch("lf", (KV, b"".join(ORIGINAL), b"".join(edited(ORIGINAL, dict([
        change(7, 2, "    return 7;\n")])))))
    crlf_lf = parse_patch("crlf-lf.patch", lf.data.replace(b"\n", b"\r\n"))
    assert crlf_mail.crlf and crlf_lf.crlf
    with apply_hunks([crlf_lf], write_tree(tmp_path / "lf", {KV: b"".join(ORIGINAL)})) as result:
        assert result.ok and b"return 7;\n" in (result.files[KV] or b"")


def test_creation_rename_and_deletion_from_real_git(tmp_path):
    repo = GitRepo(tmp_path / "repo")
    repo.root.mkdir()
    repo.git("init", "-q", ".")
    base = {"src/a.cpp": cpp("a", 8), "src/old.cpp": cpp("old", 6), "src/gone.cpp": cpp("g", 2)}
    repo.commit("base", dict(base))
    repo.git("tag", "base")
    repo.commit("create", {"src/new.h": b"#pragma once\n"})
    repo.git("mv", "src/old.cpp", "src/renamed.cpp")
    repo.commit("rename and change", {"src/renamed.cpp": cpp("old", 6, {5: "    return 0;\n"})})
    repo.commit("delete and change", {"src/gone.cpp": None, "src/a.cpp": cpp("a", 9)})
    repo.format_patch(tmp_path / "series", *OLLAMA_OPTIONS)
    series = read_series(tmp_path / "series")
    tree = write_tree(tmp_path / "tree", base)
    before = snapshot(tree)
    with apply_hunks(series, tree) as result:
        assert result.ok
        head = {rel: repo.git("show", f"HEAD:{rel}") for rel in
                ("src/a.cpp", "src/new.h", "src/renamed.cpp")}
        assert result.files == {**head, "src/old.cpp": None, "src/gone.cpp": None}
        patched = tmp_path / "patched"
        shutil.copytree(result.scratch, patched)
    assert snapshot(tree) == before
    with apply_hunks(series, patched, reverse=True) as back:
        assert back.ok and [p.patch.name for p in back.patches] == [
            p.name for p in reversed(series.patches)]
        assert back.files == {**{rel: base.get(rel) for rel in back.files}}
    with apply_hunks(series, patched) as again:
        assert {h.status for h in again.hunks} == {ALREADY}


def test_a_quilt_series_applies_with_its_strip_levels(tmp_path):
    quilt = tmp_path / "quilt"
    quilt.mkdir()
    after = b"".join(edited(ORIGINAL, dict([change(9, 2, "    return 9;\n")])))
    p1 = file_diff(KV, b"".join(ORIGINAL), after).replace(b" a/", b" ").replace(b" b/", b" ")
    p2 = file_diff(KV, after, after.replace(b"return 9;", b"return 99;")).replace(
        b" a/", b" x/y/").replace(b" b/", b" x/y/")
    (quilt / "p0.diff").write_bytes(b"Description: strip nothing\n\n" + p1)
    (quilt / "p2.diff").write_bytes(p2)
    (quilt / "series").write_text("p0.diff -p0\np2.diff -p2\n")
    tree = write_tree(tmp_path / "tree", {KV: b"".join(ORIGINAL)})
    with apply_hunks(read_series(quilt), tree) as result:
        assert result.ok and [h.file for h in result.hunks] == [KV, KV]
        assert b"return 99;" in (result.files[KV] or b"")


def test_exact_mode_takes_no_fuzz_and_no_offset(drifted, tmp_path):
    series = [one_change("offset", 30, 2, "    return y + 300;\n"),
              one_change("fuzz", 20, 2, "    return y + 60;\n")]
    with apply_hunks(series, drifted, exact=True) as result:
        assert [(p.applied, p.worst) for p in result.patches] == [(False, FAILED)] * 2
        offset, fuzz = result.hunks
        assert "exact" in offset.reason and offset.offset == 5
        assert fuzz.reason == "context not found"
    pristine = write_tree(tmp_path / "pristine", {KV: b"".join(ORIGINAL)})
    with apply_hunks(series, pristine, exact=True) as result:
        assert result.ok


def test_the_tree_is_never_written_and_the_scratch_goes_away(drifted):
    before = snapshot(drifted)
    series = [one_change("clean", 2, 2, "    return y + 200;\n"),
              one_change("context", 15, 1, "    int y = x * 150;\n")]
    with apply_hunks(series, drifted) as result:
        scratch = result.scratch
        assert (scratch / KV).is_file()
    assert not scratch.exists()
    assert snapshot(drifted) == before


@pytest.mark.parametrize("name", ["a/../../outside.cpp", "a/src/../../outside.cpp"])
def test_a_path_out_of_the_tree_is_refused(tmp_path, name):
    text = (f"--- {name}\n+++ {name.replace('a/', 'b/', 1)}\n@@ -0,0 +1 @@\n+pwned\n").encode()
    tree = write_tree(tmp_path / "tree", {KV: b"".join(ORIGINAL)})
    with pytest.raises(InputError, match=r"evil.patch: refusing .*outside.cpp: a path with"):
        apply_hunks([parse_patch("evil.patch", text)], tree)
    assert not (tmp_path / "outside.cpp").exists()


def test_an_absolute_path_is_refused(tmp_path):
    quilt = tmp_path / "q"
    quilt.mkdir()
    (quilt / "abs.diff").write_bytes(b"--- /tmp/x.c\n+++ /tmp/x.c\n@@ -1 +1 @@\n-a\n+b\n")
    (quilt / "series").write_text("abs.diff -p0\n")
    with pytest.raises(InputError, match="abs.diff: refusing /tmp/x.c: an absolute path"):
        apply_hunks(read_series(quilt), tmp_path)


def test_a_binary_patch_is_a_problem_not_a_crash(tmp_path):
    text = (b"diff --git a/model.bin b/model.bin\nindex 1111111..2222222 100644\n"
            b"Binary files a/model.bin and b/model.bin differ\n")
    with apply_hunks([parse_patch("bin.patch", text)], tmp_path) as result:
        (pr,) = result.patches
        assert not pr.applied and pr.worst == FAILED
        (hunk,) = pr.hunks  # git apply's word: a diff without the data cannot be applied
        assert hunk.reason.startswith("binary patch: ") and "model.bin" in hunk.reason


@pytest.mark.slow
def test_the_committed_rotation_series_on_real_trees(registry_tree):
    series = read_series(COMMITTED)
    root = tree_mod.detect(registry_tree("0.3.16")).llama_root
    started = time.perf_counter()
    with apply_hunks(series, root) as result:
        elapsed = time.perf_counter() - started
        assert result.ok
        assert {h.status for h in result.hunks} == {CLEAN}
        assert len(result.hunks) == sum(len(p.hunks) for p in series.patches)
    print(f"\nengine on the {len(series.patches)}-patch rotation series, 0.3.16: "
          f"{elapsed:.3f}s")
    newer = tree_mod.detect(registry_tree("0.3.17")).llama_root
    with apply_hunks(series, newer) as result:
        assert not result.ok
        failed = [h for h in result.hunks if h.status == FAILED]
        assert failed
        for h in failed:
            assert h.reason and h.file in h.describe() and h.patch in h.describe()
        assert any(h.reason == "file missing" for h in failed)  # llama-kv-cache-unified.cpp
        assert {p.patch.name: p.applied for p in result.patches} == {
            p.name: False for p in series.patches}


def _two_file_series(tmp_path: Path, *changes: tuple[int, list[bytes]]) -> Series:
    """A series of one patch that changes kv.cpp (`changes`) and kv.h in place."""
    header = b"#pragma once\n"
    two = make_patch("two", (KV, b"".join(ORIGINAL), b"".join(edited(ORIGINAL, dict(changes)))),
                     ("src/kv.h", header, header + b"int kv(int);\n"))
    series_dir = tmp_path / "series"
    series_dir.mkdir()
    (series_dir / "0001-two.patch").write_bytes(two.text.encode())
    return read_series(series_dir)


def test_gnu_patch_run_ahead_on_every_file_of_a_patch_reads_as_file_by_file(drifted, tmp_path,
                                                                           monkeypatch):
    """Drift's carry runs GNU patch on the files of a patch that changes several in place all
    at once (`_run_ahead`): each file's verdicts, offsets, fuzz, reasons and bytes are those
    of the runs one file after the other, and those runs are not made a second time."""
    from portkit import hunks as hunks_mod
    from portkit.follow.sequence import _Carry

    series = _two_file_series(tmp_path, change(8, 1, "    int y = x * 80;\n"),
                              change(15, 1, "    int y = x + 15;\n"),
                              change(30, 2, "    return y;\n"))

    def carried() -> tuple[list[tuple[object, ...]], dict[str, bytes | None], int]:
        runs = []
        real = hunks_mod._gnu

        def counted(args, cwd=None):
            runs.append(args)
            return real(args, cwd)

        monkeypatch.setattr(hunks_mod, "_gnu", counted)
        with _Carry.on(series, drifted) as carry:
            result = carry.patch(series.patches[0])
            rows = [(h.file, h.index, h.status, h.offset, h.fuzz, h.line, h.reason)
                    for h in result.hunks]
            return rows, carry.files(), len(runs)

    ahead, ahead_files, ahead_runs = carried()
    monkeypatch.setattr(hunks_mod._Run, "_run_ahead", lambda self, patch: None)
    one_by_one, files, runs = carried()
    assert ahead == one_by_one and ahead_files == files
    assert {row[2] for row in ahead} >= {CLEAN, FAILED} and len(ahead) == 4
    assert ahead_runs < runs  # the files' first runs were made ahead, all at once


def test_a_run_ahead_that_cannot_start_every_run_leaves_none_running(drifted, tmp_path,
                                                                    monkeypatch):
    """GNU patch missing for the second file of a run ahead: the error is the one GNU patch's
    absence gives, the first file's run is over (not left behind), nothing is kept."""
    from portkit import hunks as hunks_mod
    from portkit.errors import ToolMissing
    from portkit.follow.sequence import _Carry

    series = _two_file_series(tmp_path, change(8, 1, "    int y = x * 80;\n"))
    real, started = hunks_mod._gnu_start, []

    def second_fails(args, cwd=None):
        if started:
            raise ToolMissing("GNU patch not found")
        started.append(real(args, cwd))
        return started[-1]

    monkeypatch.setattr(hunks_mod, "_gnu_start", second_fails)
    with _Carry.on(series, drifted) as carry:
        with pytest.raises(ToolMissing):
            carry.patch(series.patches[0])
        assert len(started) == 1 and started[0].poll() is not None and not carry._ahead


def test_a_path_with_a_space_is_found_as_gnu_patch_finds_it(tmp_path):
    """git ends a name with a space by a tab on the --- and +++ lines; without it GNU patch
    reads `a/src/my` and finds no file."""
    spaced = "src/my file.cpp"
    after = edited(ORIGINAL, dict([change(4, 2, "    return y + 40;\n")]))
    patch = make_patch("spaced", (spaced, b"".join(ORIGINAL), b"".join(after)))
    tree = write_tree(tmp_path / "tree", {spaced: b"// one more line\n" + b"".join(ORIGINAL)})
    with apply_hunks([patch], tree) as result:
        (hunk,) = result.hunks
        assert (hunk.status, hunk.offset) == (OFFSET, 1)
        assert result.files[spaced] == b"// one more line\n" + b"".join(after)


def _binary_patch(tmp_path: Path, rel: str = "src/data.bin",
                  *options: str) -> tuple[Patch, bytes, bytes]:
    """A git binary patch that rewrites `rel`: (the patch, the file before, after);
    `options`: git's configuration for the diff (-c name=value...)."""
    before, after = bytes(range(256)) * 2, bytes(reversed(range(256))) * 2
    repo = GitRepo(tmp_path / "repo")
    repo.root.mkdir()
    repo.git("init", "-q", "-b", "main", ".")
    repo.commit("base", {rel: before})
    repo.git("tag", "base")
    repo.commit("new data", {rel: after})
    if options:
        diff = repo.git(*options, "diff", "--binary", "base", "HEAD")
        return parse_patch("x.patch", diff), before, after
    (mail,) = repo.format_patch(tmp_path / "mails", "--binary", *OLLAMA_OPTIONS)
    return parse_patch(mail.name, mail.read_bytes()), before, after


@pytest.mark.parametrize("state", ["before", "after", "other"])
@pytest.mark.parametrize("rel, options", [
    ("src/data.bin", ()), ("src/d\u00e9j\u00e0.bin", ("-c", "core.quotePath=false")),
    ("src/data.bin", ("-c", "diff.mnemonicPrefix=true"))])
def test_a_binary_patch_applies_as_git_applies_it(tmp_path, state, rel, options):
    """GNU patch has no binary patches: git apply's verdict, by the file's blob, however git
    quoted and prefixed the file's names."""
    patch, before, after = _binary_patch(tmp_path, rel, *options)
    held = {"before": before, "after": after, "other": b"\0other"}[state]
    tree = write_tree(tmp_path / "tree", {rel: held})
    with apply_hunks([patch], tree) as result:
        (hunk,) = result.hunks
        assert hunk.status == {"before": CLEAN, "after": ALREADY, "other": FAILED}[state]
        if state == "before":
            assert result.files[rel] == after
        if state == "other":
            assert "binary patch" in hunk.reason
