"""A fork laid out as ollama lays out its own (tests/conftest.py lay_out_real_fork): its series
applied to a full upstream tree and the vendored folders made by real rsync under
.rsync-filter rules merged by a Makefile.sync rsync line; the series touches files the fork
does not vendor (other backends, CMake files). drift and rebase run there with no --base,
leave those sections out (said once), read the rules as rsync does (checked against rsync
itself), refuse by name what they do not read, and treat a dropped patch as news."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from portkit import fork as fk
from portkit.cli import cli
from portkit.drift.formats import FORMATS
from portkit.errors import TreeError
from portkit.series import git_diff, parse_patch, read_series
from portkit.tree import detect
from tests.conftest import (
    GGML_FILTER,
    LLAMA_FILTER,
    REAL_LAYOUT_SERIES,
    RealFork,
    commit_all,
    git,
    rsync_vendor,
    sync_makefile,
    tree_bytes,
)

NOT_VENDORED = "4 sections touch files this fork does not vendor: not checked"
SIDES = ("llama/llama.cpp", "ml/backend/ggml/ggml")


MAIL_HEAD = "From: Some One <one@example.invalid>\nDate: Tue, 3 Mar 2026 09:00:00 +0100\n"


def _mails(folder: Path, *patches: tuple[str, str, str]) -> Path:
    """A series folder of mails as git format-patch writes them: (file name, subject, diff)."""
    folder.mkdir()
    for name, subject, diff in patches:
        (folder / name).write_text(f"{MAIL_HEAD}Subject: [PATCH] {subject}\n\n---\n{diff}")
    return folder


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def _vendored(fork: Path) -> dict[str, bytes]:
    """The fork's vendored files in llama.cpp's layout, its own (Go, rules) left out."""
    out = {}
    for folder, prefix in zip(SIDES, ("", "ggml/"), strict=True):
        for rel, data in tree_bytes(fork / folder).items():
            if not rel.endswith((".go", fk.FILTER)):
                out[prefix + rel] = data
    return out


def test_the_fork_reads_its_rules_as_rsync_sends_them(real_fork: RealFork, tmp_path: Path):
    fork = detect(real_fork.root)
    vendoring = fk.Vendoring.of(fork)
    git(real_fork.upstream, "checkout", "--quiet", "fork")
    seen = {p: s.read_bytes() for p, s in vendoring.layout_files(detect(real_fork.upstream))
            .items()}
    assert seen == _vendored(real_fork.root)  # what rsync made of the patched upstream
    # and of the target: rsync it into a copy of the fork
    copy = tmp_path / "copy"
    shutil.copytree(real_fork.root, copy)
    rsync_vendor(real_fork.target, copy)
    assert {p: s.read_bytes() for p, s in vendoring.layout_files(detect(real_fork.target))
            .items()} == _vendored(copy)
    assert (copy / "llama/llama.cpp/llama.go").is_file()  # protected on the receiving side
    assert vendoring.sides[0].singles == ("LICENSE",)


def test_drift_in_the_fork_needs_no_base_and_says_what_it_left_out_once(real_fork: RealFork):
    args = ["drift", "--fork", str(real_fork.root), "--tree", str(real_fork.target)]
    code, out, err = _run(*args, "--format", "json")
    assert code == 20 and not err
    report = json.loads(out)
    assert report["fork"] is True
    assert [(n["patch"][:4], n["file"]) for n in report["not_vendored"]] == [
        ("0001", "ggml/src/ggml-cann/ggml-cann.cpp"), ("0001", "ggml/src/ggml-sycl/ggml-sycl.cpp"),
        ("0002", "src/CMakeLists.txt"), ("0003", "ggml/src/ggml-cann/ggml-cann.cpp")]
    (target,) = report["targets"]
    status = {p["file"][:4]: p["status"] for p in target["patches"]}
    assert status["0001"] in ("clean", "offset") and status["0002"] in ("clean", "offset")
    assert [p["hunks"] for p in target["patches"] if p["file"].startswith("0003")] == [[]]
    assert status["0004"] in ("already-applied", "present-upstream")  # dropped: news
    for fmt in FORMATS:
        code, out, _ = _run(*args, "--format", fmt)
        assert code == 20, fmt
        assert out.count(NOT_VENDORED) == (0 if fmt == "json" else 1), fmt
    code, out, _ = _run(*args, "--format", "junit")
    assert '<failure type="' in out and "0004-ggml-a-helper" in out
    code, out, _ = _run(*args, "--format", "github")
    assert "::error file=" in out and "title=0004-ggml-a-helper-upstream-adds-later.patch" in out
    # against the fork's own tree, a patch that is there is what it should be: no news
    code, out, _ = _run("drift", "--fork", str(real_fork.root), "--format", "json")
    assert code == 0 and json.loads(out)["targets"][0]["own"] is True


def _pristine(fork: Path, series: Path, dest: Path) -> Path:
    """The base as ../shared/bench builds it: the vendored tree in llama.cpp's layout with
    the series reverse-applied by `git apply -R`, excluding what the tree does not have."""
    for rel, data in _vendored(fork).items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
    git(dest, "init", "--quiet")
    for patch in sorted(read_series(series).patches, key=lambda p: p.name, reverse=True):
        absent = [f"--exclude={p}" for p in patch.paths if not (dest / p).exists()]
        git(dest, "apply", "-R", *absent, str(series / patch.name))
    shutil.rmtree(dest / ".git")
    return dest


def test_drift_verdicts_equal_those_against_the_bench_pristine_base(real_fork: RealFork,
                                                                    tmp_path: Path):
    base = _pristine(real_fork.root, real_fork.root / "llama" / "patches", tmp_path / "p")
    args = ["drift", "--fork", str(real_fork.root), "--tree", str(real_fork.target),
            "--format", "json"]
    derived = json.loads(_run(*args)[1])
    given = json.loads(_run(*args, "--base", str(base))[1])
    assert derived["targets"][0]["patches"] == given["targets"][0]["patches"]
    assert derived["not_vendored"] == given["not_vendored"]


def test_the_move_keeps_what_it_does_not_vendor_and_drops_the_upstreamed_patch(
        real_fork: RealFork, tmp_path: Path):
    root = real_fork.root
    patches = root / "llama" / "patches"
    before = tree_bytes(root)
    code, out, err = _run("rebase", "--fork", str(root), "--onto", str(real_fork.target),
                          "--dry-run")
    assert code == 20 and tree_bytes(root) == before
    assert "dropped from llama/patches with the move (1):" in err
    assert "llama/patches/0004-ggml-a-helper-upstream-adds-later.patch" in err
    assert out.count(NOT_VENDORED) == 1 and "1 patch needs attention: 0004-" in out
    code, out, err = _run("rebase", "--fork", str(root), "--onto", str(real_fork.target))
    assert code == 20, err
    names = sorted(p.name for p in read_series(patches).patches)
    assert [n[:4] for n in names] == ["0001", "0002", "0003"]
    # what is not vendored goes on unchanged; a patch of only such sections byte for byte
    assert (patches / names[2]).read_bytes() == before[f"llama/patches/{names[2]}"]
    first = (patches / names[0]).read_text()
    assert "ggml/src/ggml-cann/ggml-cann.cpp" in first and "ggml-sycl.cpp" in first
    # the fork is what ollama's own sync makes of the target with the carried series
    full = tmp_path / "full"
    shutil.copytree(real_fork.target, full)
    for name in names:
        git(full, "apply", str(patches / name))
    expect = tmp_path / "expect"
    shutil.copytree(root, expect, ignore=shutil.ignore_patterns(".git"))
    rsync_vendor(full, expect)
    assert _vendored(root) == _vendored(expect)
    pin = git(real_fork.target, "rev-parse", "HEAD").strip()
    assert f"FETCH_HEAD={pin}" in (root / "Makefile.sync").read_text()
    assert (root / "llama/llama.cpp/llama.go").read_text() == "package llama\n"


def test_the_move_changes_only_the_pin_in_the_fork_files_byte_for_byte(real_fork: RealFork):
    """Makefile.sync and build-info.cpp are the fork's: a CRLF file, or one with a byte that
    is not UTF-8, keeps every byte but the commit it names."""
    root = real_fork.root
    sync, info = root / "Makefile.sync", root / "llama" / "build-info.cpp"
    sync.write_bytes(b"# vendored by J\xf6rg\r\n" + sync.read_bytes().replace(b"\n", b"\r\n"))
    info.write_bytes(info.read_bytes().replace(b"\n", b"\r\n"))
    commit_all(root, "the fork's files as a Windows editor leaves them")
    before = {p: p.read_bytes() for p in (sync, info)}
    code, _, err = _run("rebase", "--fork", str(root), "--onto", str(real_fork.target))
    assert code == 20, err
    pin = git(real_fork.target, "rev-parse", "HEAD").strip().encode()
    for path, old in before.items():
        assert path.read_bytes() == old.replace(real_fork.base.encode(), pin), path.name


def test_the_move_keeps_the_targets_links_and_execute_bits_as_rsync_a_does(
        real_fork: RealFork):
    target, root = real_fork.target, real_fork.root
    (target / "ggml/src/ggml-cpu/alias.cpp").symlink_to("ggml-cpu.cpp")
    (target / "ggml/src/CMakeLists.txt").chmod(0o755)
    commit_all(target, "a link and an executable file")
    code, _, err = _run("rebase", "--fork", str(root), "--onto", str(target))
    assert code == 20, err
    side = root / "ml/backend/ggml/ggml/src"
    link = side / "ggml-cpu" / "alias.cpp"
    assert link.is_symlink() and link.readlink() == Path("ggml-cpu.cpp")
    assert (side / "CMakeLists.txt").stat().st_mode & 0o111
    assert not (side / "ggml-cpu" / "ggml-cpu.cpp").stat().st_mode & 0o111


def test_a_series_folder_that_is_a_link_is_refused_in_one_line_not_read_again(
        real_fork: RealFork):
    root = real_fork.root
    (root / "llama" / "patches").rename(root / "llama" / "own-patches")
    (root / "llama" / "patches").symlink_to("own-patches")
    commit_all(root, "the series kept elsewhere")
    before = tree_bytes(root)
    code, out, err = _run("rebase", "--fork", str(root), "--onto", str(real_fork.target))
    assert code == TreeError.exit_code and err.count("\n") == 1, err
    assert "llama/patches is a symbolic link" in err and "run it again" in err
    assert tree_bytes(root) == before


def test_a_target_link_out_of_the_tree_is_refused_in_one_line(real_fork: RealFork):
    (real_fork.target / "src" / "llama-host.h").symlink_to("/etc/hostname")
    commit_all(real_fork.target, "a link out of the tree")
    before = tree_bytes(real_fork.root)
    code, out, err = _run("rebase", "--fork", str(real_fork.root), "--onto",
                          str(real_fork.target))
    assert code == TreeError.exit_code and err.count("\n") == 1, err
    assert "src/llama-host.h" in err and "outside the tree" in err
    assert tree_bytes(real_fork.root) == before


def test_the_move_numbers_the_series_again_when_a_patch_in_its_middle_drops(
        real_fork: RealFork):
    """ollama makes its series again with git format-patch: no gap where a patch dropped."""
    root, patches = real_fork.root, real_fork.root / "llama" / "patches"
    names = sorted(p.name for p in patches.glob("*.patch"))
    upstreamed = names[3]  # the helper upstream adds later: put second, it drops
    order = [names[0], upstreamed, names[1], names[2]]
    for n, name in enumerate(order, 1):
        (patches / name).rename(patches / f"x{n:04d}{name[4:]}")
    for path in patches.glob("x*"):
        path.rename(patches / path.name[1:])
    commit_all(root, "the helper second")
    old = {p.name[5:]: p.read_bytes() for p in patches.glob("*.patch")}
    code, _, err = _run("rebase", "--fork", str(root), "--onto", str(real_fork.target))
    assert code == 20, err
    now = sorted(p.name for p in patches.glob("*.patch"))
    assert now == [f"{n:04d}-{name[5:]}" for n, name in
                   enumerate([order[0], order[2], order[3]], 1)]
    assert (patches / now[2]).read_bytes() == old[now[2][5:]]  # not vendored: as it was


def test_a_patch_the_move_cannot_read_is_named_by_its_path_in_the_fork(real_fork: RealFork):
    root = real_fork.root
    (root / "llama" / "patches" / "0002-zjunk.patch").write_text("not a patch\n")
    commit_all(root, "a stray file")
    code, _, err = _run("rebase", "--fork", str(root), "--onto", str(real_fork.target))
    assert code == 12 and err.count("\n") == 1
    assert f"portkit: {root}/llama/patches/0002-zjunk.patch: no diff in it" in err


def test_the_move_carries_the_record_of_a_series_apply_added(real_fork: RealFork,
                                                              tmp_path: Path):
    """A series `apply` added to the fork is carried by the move like the fork's own patches:
    its record follows its copy (numbered again after the patch that drops), so --reverse
    takes out what the fork now holds, and its copy with it."""
    from tests.test_apply_series import GRAPH, _diff

    root, patches = real_fork.root, real_fork.root / "llama" / "patches"
    series = _mails(tmp_path / "myfix", ("0001-note.patch", "graph: a note", _diff(
        root / "llama" / "llama.cpp", GRAPH, "struct ggml_cgraph;\n",
        "struct ggml_cgraph;\n// a note\n")))
    assert _run("apply", "--force", "--tree", str(root), "--series", str(series))[0] == 0
    assert (patches / "0005-graph-a-note.patch").is_file()
    commit_all(root, "a note, by portkit")
    code, _, err = _run("rebase", "--fork", str(root), "--onto", str(real_fork.target))
    assert code == 20, err
    moved = patches / "0004-graph-a-note.patch"  # 0004 dropped: upstream has it
    state = json.loads((root / ".portkit" / "myfix" / "state.json").read_text())
    assert state["series_copies"] == [{"path": "llama/patches/0004-graph-a-note.patch",
                                       "sha256": hashlib.sha256(moved.read_bytes()).hexdigest()}]
    assert sorted(p.name for p in (root / ".portkit" / "myfix").iterdir()) == [
        "0004-graph-a-note.patch", "state.json"]
    assert state["pin"] == git(real_fork.target, "rev-parse", "HEAD").strip()
    commit_all(root, "moved")
    vendored = root / "llama" / "llama.cpp" / GRAPH
    assert "// a note" in vendored.read_text()
    code, out, err = _run("apply", "--force", "--tree", str(root), "--series", str(series),
                          "--reverse")
    assert code == 0, err
    assert not moved.exists() and "// a note" not in vendored.read_text()
    assert vendored.read_bytes() == (real_fork.target / GRAPH).read_bytes()
    assert not (root / ".portkit" / "myfix").exists()


def test_a_record_whose_copy_keeps_its_name_through_the_move_is_of_the_new_tree(
        real_fork: RealFork, tmp_path: Path):
    """The applied series' copy keeps its name and bytes through the move (the patch that
    drops comes after it): its record still says the new pin, and the checksums the vendored
    files have now."""
    from tests.test_apply_series import _diff

    header = "include/llama.h"  # the same in both trees: the copy is carried byte for byte

    root, patches = real_fork.root, real_fork.root / "llama" / "patches"
    series = _mails(tmp_path / "myfix", ("0001-note.patch", "graph: a note", _diff(
        root / "llama" / "llama.cpp", header, "struct llama_model;\n",
        "struct llama_model;\n// a note\n")))
    assert _run("apply", "--force", "--tree", str(root), "--series", str(series))[0] == 0
    copy = (patches / "0005-graph-a-note.patch").read_bytes()
    helper = next(patches.glob("0004-*.patch"))
    helper.rename(patches / ("0006" + helper.name[4:]))  # upstream's helper last: it drops
    commit_all(root, "a note, by portkit; the helper last")
    code, _, err = _run("rebase", "--fork", str(root), "--onto", str(real_fork.target))
    assert code == 20, err
    assert (patches / "0005-graph-a-note.patch").read_bytes() == copy
    assert not list(patches.glob("0006-*.patch"))
    state = json.loads((root / ".portkit" / "myfix" / "state.json").read_text())
    assert state["pin"] == git(real_fork.target, "rev-parse", "HEAD").strip()
    vendored = root / "llama" / "llama.cpp" / header
    assert {f["path"]: f["sha256"] for f in state["files"]}[header] == hashlib.sha256(
        vendored.read_bytes()).hexdigest()
    commit_all(root, "moved")
    code, _, err = _run("apply", "--force", "--tree", str(root), "--series", str(series),
                        "--reverse")
    assert code == 0, err
    assert vendored.read_bytes() == (real_fork.target / header).read_bytes()


def test_a_series_on_ggml_is_applied_where_the_fork_vendors_ggml(real_fork: RealFork,
                                                                 tmp_path: Path):
    """ollama vendors ggml apart (ml/backend/ggml/ggml): a patch's ggml/ path is there, as
    the fork's own series has it; --reverse puts it back byte for byte."""
    from tests.test_apply_series import _diff

    root = real_fork.root
    rel = "ggml/src/ggml-cpu/ggml-cpu.cpp"
    vendored = root / "ml" / "backend" / "ggml" / rel
    upstream = tmp_path / "upstream-view"
    (upstream / rel).parent.mkdir(parents=True)
    (upstream / rel).write_bytes(vendored.read_bytes())
    series = _mails(tmp_path / "cpu", ("0001-cpu.patch", "ggml-cpu: a note", _diff(
        upstream, rel, "int ggml_cpu_threads", "// a note\nint ggml_cpu_threads")))
    before = tree_bytes(root)
    code, out, err = _run("apply", "--force", "--tree", str(root), "--series", str(series))
    assert code == 0, err
    assert "// a note\nint ggml_cpu_threads" in vendored.read_text()
    assert not (root / "llama" / "llama.cpp" / "ggml").exists()
    state = json.loads((root / ".portkit" / "cpu" / "state.json").read_text())
    assert [f["path"] for f in state["files"]] == [rel]
    commit_all(root, "a note, by portkit")
    assert _run("tree", "info", str(root))[0] == 0
    code, out, err = _run("apply", "--force", "--tree", str(root), "--series", str(series),
                          "--reverse")
    assert code == 0, err
    commit_all(root, "taken out")
    assert {k: v for k, v in tree_bytes(root).items() if not k.startswith(".git/")} == {
        k: v for k, v in before.items() if not k.startswith(".git/")}


def test_a_moved_record_leaves_out_the_files_only_a_dropped_patch_touched(real_fork: RealFork,
                                                                         tmp_path: Path):
    """The series' first patch (on src/llama-graph.h) is upstream's now and drops; its
    second (on include/llama.h) moves. The record lists only the file its patches touch,
    and reads back: tree info, and --reverse."""
    from tests.test_apply_series import GRAPH, _diff

    root = real_fork.root
    llama = root / "llama" / "llama.cpp"
    series = _mails(
        tmp_path / "two",
        ("0001-decl.patch", "graph: declare it",
         _diff(llama, GRAPH, "class llama_memory_hybrid_context;\n",
               "class llama_memory_hybrid_context;\nclass llama_memory_hybrid_iswa_context;\n")),
        ("0002-note.patch", "llama.h: a note",
         _diff(llama, "include/llama.h", "struct llama_model;\n",
               "struct llama_model;\n// a note\n")))
    assert _run("apply", "--force", "--tree", str(root), "--series", str(series))[0] == 0
    commit_all(root, "two, by portkit")
    assert _run("rebase", "--fork", str(root), "--onto", str(real_fork.target))[0] == 20
    state = json.loads((root / ".portkit" / "two" / "state.json").read_text())
    assert [f["path"] for f in state["files"]] == ["include/llama.h"]
    commit_all(root, "moved")
    assert _run("tree", "info", str(root))[0] == 0
    code, _, err = _run("apply", "--force", "--tree", str(root), "--series", str(series),
                        "--reverse")
    assert code == 0, err
    assert (llama / "include/llama.h").read_bytes() == (
        real_fork.target / "include/llama.h").read_bytes()


def test_the_record_of_a_copy_taken_out_by_hand_stays_as_it_was(real_fork: RealFork,
                                                               tmp_path: Path):
    from tests.test_apply_series import _diff

    root, patches = real_fork.root, real_fork.root / "llama" / "patches"
    series = _mails(tmp_path / "note", ("0001-note.patch", "llama.h: a note", _diff(
        root / "llama" / "llama.cpp", "include/llama.h", "struct llama_model;\n",
        "struct llama_model;\n// a note\n")))
    assert _run("apply", "--force", "--tree", str(root), "--series", str(series))[0] == 0
    (copy,) = [p for p in patches.glob("*.patch") if p.name.endswith("-a-note.patch")]
    copy.unlink()
    commit_all(root, "the note taken out of the series by hand")
    record = {p.name: p.read_bytes() for p in (root / ".portkit" / "note").iterdir()}
    assert _run("rebase", "--fork", str(root), "--onto", str(real_fork.target))[0] == 20
    assert {p.name: p.read_bytes() for p in (root / ".portkit" / "note").iterdir()} == record


def test_a_moved_series_with_a_patch_upstream_took_is_still_that_series(real_fork: RealFork,
                                                                         tmp_path: Path):
    """The move drops the patch of an applied series that upstream took: the record keeps the
    rest, and `apply --series` of the folder given then is still "already applied" and
    --reverse takes out what is left."""
    from tests.test_apply_series import GRAPH, _diff

    root = real_fork.root
    llama = root / "llama" / "llama.cpp"
    decl = ("class llama_memory_hybrid_context;\n",
            "class llama_memory_hybrid_context;\nclass llama_memory_hybrid_iswa_context;\n")
    series = tmp_path / "two"
    series.mkdir()
    head = "From: Some One <one@example.invalid>\nDate: Tue, 3 Mar 2026 09:00:00 +0100\n"
    (series / "0001-decl.patch").write_text(
        head + "Subject: [PATCH] graph: declare it\n\n---\n" + _diff(llama, GRAPH, *decl))
    later = tmp_path / "later" / "src"
    later.mkdir(parents=True)
    (later / GRAPH.split("/")[1]).write_text((llama / GRAPH).read_text().replace(*decl))
    (series / "0002-note.patch").write_text(
        head + "Subject: [PATCH] graph: a note\n\n---\n" + _diff(
            later.parent, GRAPH, "struct ggml_cgraph;\n", "struct ggml_cgraph;\n// a note\n"))
    assert _run("apply", "--force", "--tree", str(root), "--series", str(series))[0] == 0
    commit_all(root, "two, by portkit")
    assert _run("rebase", "--fork", str(root), "--onto", str(real_fork.target))[0] == 20
    state = json.loads((root / ".portkit" / "two" / "state.json").read_text())
    assert [p["name"] for p in state["patches"]] == ["0004-graph-a-note.patch"]
    commit_all(root, "moved")
    code, out, err = _run("apply", "--force", "--tree", str(root), "--series", str(series))
    assert code == 0 and "two is already applied" in out, err
    code, out, err = _run("apply", "--force", "--tree", str(root), "--series", str(series),
                          "--reverse")
    assert code == 0, err
    assert (llama / GRAPH).read_bytes() == (real_fork.target / GRAPH).read_bytes()


@pytest.mark.parametrize("line, named", [
    ("merge other.rules", "merge rule 'merge other.rules'"),
    (". other.rules", "merge rule '. other.rules'"),
    ("dir-merge .rules", "dir-merge rule 'dir-merge .rules' (per-directory filter files)"),
    (": .rules", "dir-merge rule ': .rules'"),
    ("-! *.o", "the modifier '!' of '-'"),
    ("+/ /src/x", "the modifier '/' of '+'"),
    ("include,s x", "the modifier 's' of 'include'"),
    ("exclude-if-present .nosync", "does not read the rsync rule 'exclude-if-present"),
])
def test_rules_portkit_does_not_read_are_refused_by_name(real_fork: RealFork, line, named):
    rules = real_fork.root / "ml/backend/ggml/ggml" / fk.FILTER
    rules.write_text(rules.read_text().replace("hide *\n", f"{line}\nhide *\n"))
    commit_all(real_fork.root, "a rule portkit does not read")
    code, out, err = _run("drift", "--fork", str(real_fork.root), "--tree",
                          str(real_fork.target))
    assert code == 4 and not out
    assert err.count("\n") == 1 and err.startswith("portkit: ") and named in err
    assert f"{fk.FILTER}:" in err  # the file and its line


def test_per_directory_rules_on_the_rsync_line_are_refused(real_fork: RealFork):
    sync = real_fork.root / "Makefile.sync"
    sync.write_text(sync.read_text().replace("rsync -arvzc", "rsync -arvzcF", 1))
    with pytest.raises(TreeError, match="does not follow rsync's -F"):
        fk.Vendoring.of(detect(real_fork.root))


# The rules as rsync itself applies them: a source and a receiving folder, one rsync
# --delete, and what portkit says is sent and deleted.
RSYNC_CASES = [
    ("hide is the sender's: a hidden file on the receiver is deleted, a protected one kept",
     "protect *.go\nhide *.txt\n", ["a.txt", "b.cpp"], ["a.txt", "old.txt", "own.go"]),
    ("exclude is both sides': an excluded file on the receiver is kept",
     "exclude *.txt\n", ["a.txt", "b.cpp"], ["old.txt"]),
    ("a folder hidden is not entered; anchored and trailing-slash patterns",
     "include /src/\ninclude /src/*.cpp\nhide /src/*\nhide docs/\n",
     ["src/a.cpp", "src/a.h", "docs/x.cpp", "x/docs", "x/docs.cpp"], ["src/z.h"]),
    ("** crosses folders, * and ? do not, classes and escapes",
     "include **/keep.*\ninclude [ab]?.c\nhide \\*star\nhide */*.c\n",
     ["d/e/keep.c", "ab.c", "d/ab.c", "*star", "xstar", "d/x.c"], []),
    ("dir/*** is the folder and all it holds; risk undoes a protect",
     "protect *.go\nrisk old.go\ninclude /m/***\nhide *\n",
     ["m/a/b.txt", "n/c.txt"], ["old.go", "own.go", "stale.txt"]),
]


@pytest.mark.parametrize("what, rules, sources, received", RSYNC_CASES,
                         ids=[c[0][:40] for c in RSYNC_CASES])
def test_rules_as_rsync_applies_them(tmp_path: Path, what, rules, sources, received):
    src, dst = tmp_path / "src", tmp_path / "dst"
    for root, names in ((src, sources), (dst, received)):
        root.mkdir()
        for name in names:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(name)
    (tmp_path / "rules").write_text(rules)
    parsed = fk.read_filter(tmp_path / "rules")
    said = set(fk.files(src, parsed))
    said |= {r for r in received if r not in said and not fk.deleted(parsed, r)}
    subprocess.run(["rsync", "-r", "--delete", "-f", f"merge {tmp_path / 'rules'}",
                    f"{src}/", f"{dst}/"], check=True, capture_output=True)
    assert said == set(tree_bytes(dst)), what


def test_the_series_is_cut_and_put_back_section_by_section(real_fork: RealFork):
    series = read_series(real_fork.root / "llama" / "patches")
    scoped = fk.scope(series, fk.Vendoring.of(detect(real_fork.root)))
    assert scoped.untouched == {series.patches[2].name}
    first = series.patches[0]
    cut = fk.sections(first)
    assert cut is not None and "".join(t for _, t in cut) == first.diff
    mine = next(p for p in scoped.series.patches if p.name == first.name)
    assert [f.path for f in mine.files] == ["ggml/src/ggml-cpu/ggml-cpu.cpp"]
    assert fk.put_back(mine.diff, first, scoped.left_out[first.name]) == first.diff
    assert len(REAL_LAYOUT_SERIES) == len(series.patches)


@pytest.mark.parametrize("first", ["src/x a/y.c", "src/t\u00e9st b/z.c"])
def test_a_left_out_section_goes_back_where_it_was_whatever_the_names_hold(first):
    """A section left out (a file the fork does not vendor) is put back between the carried
    ones where the patch had it, also when a carried file's name is C-quoted or holds ` a/`
    or ` b/` (the name on its `diff --git` line is read whole)."""
    before = {first: b"int a;\n", "ggml/src/ggml-cann/c.cpp": b"int b;\n", "src/w.c": b"int c;\n"}
    after = {rel: data + b"int d;\n" for rel, data in before.items()}
    whole = git_diff(before, after)
    cut = re.split(r"(?m)^(?=diff --git )", whole)[1:]
    order = sorted(before)  # git's order: the left-out file in the middle
    away = order.index("ggml/src/ggml-cann/c.cpp")
    original = parse_patch("0001-x.patch", whole.encode())
    carried = "".join(t for k, t in enumerate(cut) if k != away)
    assert fk.put_back(carried, original, [("ggml/src/ggml-cann/c.cpp", cut[away])]) == whole


# -- slow: a registry tree laid out as a real fork ------------------------------------------

REGISTRY_SERIES = [  # (subject, file, a line that is once in it, the line(s) it becomes)
    ("llama: name the fork in the system info", "src/llama.cpp",
     "    s.clear(); // Clear the string", '    s = "FORK = fixture | "; // Clear the string'),
    ("ggml: the commit string names the fork", "ggml/src/ggml.c",
     "    return GGML_COMMIT;\n", '    return GGML_COMMIT "+fork";\n'),
]
NOT_VENDORED_BACKENDS = ("ggml/src/ggml-cann/ggml-cann.cpp", "ggml/src/ggml-vulkan/ggml-vulkan.cpp",
                         "ggml/src/ggml-sycl/ggml-sycl.cpp")


@pytest.mark.slow
def test_a_registry_tree_laid_out_as_a_real_fork_drifts_and_moves_with_no_base(
        registry_tree, tmp_path: Path, offline_cache: Path):
    """0.3.17's llama.cpp as ollama vendors it: the series (two vendored changes, and one
    patch touching three backends the fork does not vendor besides ggml.c) applied to the
    full tree, then synced by rsync under the fixture's rules. drift onto 0.3.19 with no
    --base gives the verdicts it gives against the bench's pristine base; rebase --dry-run
    names every patch's status."""
    llama = detect(registry_tree("0.3.17")).llama_root
    upstream, root = tmp_path / "upstream", tmp_path / "fork"
    upstream.mkdir()
    for part in ("src", "include", "common", "tools", "vendor", "ggml", "LICENSE",
                 "CMakeLists.txt"):
        (shutil.copytree if (llama / part).is_dir() else shutil.copy2)(llama / part,
                                                                       upstream / part)
    base = commit_all(upstream, "llama-cpp-python 0.3.17's llama.cpp")
    git(upstream, "checkout", "--quiet", "-b", "fork")
    edits = [(s, [(f, old, new)]) for s, f, old, new in REGISTRY_SERIES]
    first_lines = [(f, (upstream / f).read_text().splitlines(keepends=True)[0])
                   for f in NOT_VENDORED_BACKENDS]
    edits.insert(1, ("ggml: the backends say they are the fork's",
                     [(f, line, line + "// built by the fork\n") for f, line in first_lines]
                     + [("ggml/src/ggml.c", "#include", "// the fork's ggml\n#include")]))
    for subject, changes in edits:
        for rel, old, new in changes:
            text = (upstream / rel).read_text()
            (upstream / rel).write_text(text.replace(old, new, 1))
        git(upstream, "commit", "--quiet", "--all", "--message", subject)
    series = root / "llama" / "patches"
    series.mkdir(parents=True)
    git(upstream, "format-patch", "--quiet", "--no-signature", "--no-numbered", "--zero-commit",
        "--output-directory", str(series), f"{base}..fork")
    for folder, rules in zip(SIDES, (LLAMA_FILTER, GGML_FILTER), strict=True):
        (root / folder).mkdir(parents=True)
        (root / folder / fk.FILTER).write_text(rules)
    rsync_vendor(upstream, root)
    pin = detect(registry_tree("0.3.17")).pin
    (root / "Makefile.sync").write_text(sync_makefile(pin or base))
    commit_all(root, "vendored as ollama does")
    target = "pypi:llama-cpp-python==0.3.19"
    code, out, err = _run("drift", "--fork", str(root), "--tree", target, "--format", "json")
    assert code in (0, 20), err
    derived = json.loads(out)
    assert [n["file"] for n in derived["not_vendored"]] == sorted(NOT_VENDORED_BACKENDS)
    pristine = _pristine(root, series, tmp_path / "pristine")
    code, out, err = _run("drift", "--fork", str(root), "--tree", target, "--base",
                          str(pristine), "--format", "json")
    assert code in (0, 20), err
    assert json.loads(out)["targets"][0]["patches"] == derived["targets"][0]["patches"]
    before = tree_bytes(root)
    code, out, err = _run("rebase", "--fork", str(root), "--onto", target, "--dry-run")
    assert code in (0, 20) and tree_bytes(root) == before, err
    for patch in read_series(series).patches:
        assert re.search(rf"{re.escape(patch.name)}\s+(unchanged|merged|relocated|dropped|"
                         rf"needs-human|needs-review)\s", out), patch.name
    assert out.count("3 sections touch files this fork does not vendor: not checked") == 1
    assert f"move {root}" in err


NEW_FILE = "--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+int extra;\n"


@pytest.mark.parametrize("path", [
    "llama/llama.cpp/src/llama-extra.cpp",  # `git diff` at the fork's root: -p1 names this
    "ggml/CMakeLists.txt",  # ggml's .rsync-filter: hide /CMakeLists.txt
    "src/NOTE.txt",  # llama.cpp's: only src/llama.* and src/llama-*.*, then hide *
    "tools/mytool/mytool.cpp"])
def test_apply_series_refuses_a_file_the_fork_does_not_vendor(real_fork: RealFork,
                                                             tmp_path: Path, path: str):
    """What the fork's rsync rules do not bring in, the next sync deletes: a series that
    writes there is refused, naming the patch and the path, before anything is written
    (a dry run too); a new file the rules do bring in is applied."""
    root = real_fork.root
    assert not fk.Vendoring.of(detect(root)).sends(path)
    series = _mails(tmp_path / "extra", ("0001-extra.patch", "an extra file",
                                          NEW_FILE.format(path=path)))
    before = tree_bytes(root)
    for more in ([], ["--dry-run"]):
        code, out, err = _run("apply", "--force", "--tree", str(root), "--series", str(series),
                              *more)
        assert code == 12 and out == "" and err.count("\n") == 1, err
        assert f"{series / '0001-extra.patch'} changes {path}, which this fork does not " \
               f"vendor" in err
        assert ("a patch made at the fork's root?" in err) == path.startswith("llama/")
        assert tree_bytes(root) == before
    sent = _mails(tmp_path / "sent", ("0001-extra.patch", "an extra file",
                                      NEW_FILE.format(path="src/llama-extra.cpp")))
    code, out, err = _run("apply", "--force", "--tree", str(root), "--series", str(sent))
    assert code == 0, err
    assert (root / "llama/llama.cpp/src/llama-extra.cpp").read_text() == "int extra;\n"
