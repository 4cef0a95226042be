"""`apply --series` with the series a user really has: any file names (a plain `fix.diff`, an
unnumbered patch, a quilt folder with subfolders), a series that only deletes, two series of
one name, two series on the same files, and in a fork the copies written as the fork's own
mails. Each is applied, recorded, shown by `tree info` and taken out again byte for byte."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from portkit.cli import cli
from portkit.series import detect_conventions, read_series

from .conftest import commit_all, git, tree_bytes

GRAPH = "src/llama-graph.h"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def _diff(root: Path, rel: str, old: str, new: str | None) -> str:
    """A -p1 diff (git's own, `git diff --no-index`) of `rel` under `root` with `old`
    replaced by `new`; new=None: the file deleted."""
    work = root.parent / f".diff-{os.getpid()}-{abs(hash((rel, old, new)))}"
    for side in ("a", "b"):
        (work / side / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / side / rel).write_text((root / rel).read_text())
    if new is None:
        (work / "b" / rel).unlink()
    else:
        text = (work / "b" / rel).read_text()
        assert text.count(old) == 1, (rel, old)
        (work / "b" / rel).write_text(text.replace(old, new))
    done = subprocess.run(["git", "diff", "--no-index", "--no-prefix", f"a/{rel}",
                           f"b/{rel}" if new is not None else "/dev/null"],
                          cwd=work, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    return done.stdout


def _apply(tree: Path, series: Path, *more: str) -> Result:
    return invoke("apply", "--force", "--tree", str(tree), "--series", str(series), *more)


def _round_trip(tree: Path, series: Path, name: str) -> None:
    before = tree_bytes(tree)
    applied = _apply(tree, series)
    assert applied.exit_code == 0, applied.output
    info = invoke("tree", "info", str(tree), "--format", "json")
    assert info.exit_code == 0, info.output
    assert [a["name"] for a in json.loads(info.stdout)["applied"]] == [name]
    again = _apply(tree, series)
    assert again.exit_code == 0 and f"{name} is already applied" in again.stdout
    back = _apply(tree, series, "--reverse")
    assert back.exit_code == 0, back.output
    assert tree_bytes(tree) == before


@pytest.mark.parametrize("layout", ["plain diff", "unnumbered patch", "quilt subfolder",
                                    "quilt -p0"])
def test_a_series_of_any_file_names_is_recorded_and_comes_out_again(fixture_tree, tmp_path,
                                                                   layout):
    tree = fixture_tree("old")
    diff = _diff(tree, GRAPH, "struct ggml_cgraph;\n", "struct ggml_cgraph;\n// a note\n")
    series = tmp_path / "fixes"
    if layout == "quilt subfolder":
        (series / "graph").mkdir(parents=True)
        (series / "graph" / "note").write_text(diff)
        (series / "series").write_text("graph/note\n")
    elif layout == "quilt -p0":
        series.mkdir()
        plain = re.sub(r"(?m)^(diff --git|index) .*\n", "", diff)  # a plain unified diff
        (series / "note.diff").write_text(re.sub(r"(?m)^(---|\+\+\+) [ab]/", r"\1 ", plain))
        (series / "series").write_text("note.diff -p0\n")
    else:
        series.mkdir()
        (series / ("fix.diff" if layout == "plain diff" else "vector.patch")).write_text(diff)
    _round_trip(tree, series, "fixes")


def test_patches_whose_names_flatten_alike_are_each_kept_under_their_own(fixture_tree,
                                                                        tmp_path):
    tree = fixture_tree("old")
    series = tmp_path / "alike"
    series.mkdir()
    files = ["src/llama-graph.h", "src/llama-hparams.h", "src/llama-kv-cache-unified.h"]
    for name, rel in zip(["0003-a_b.patch", "a b.patch", "a_b.patch"], files, strict=True):
        (series / name).write_text(_diff(tree, rel, "#pragma once\n", "#pragma once\n// x\n"))
    _round_trip(tree, series, "alike")
    assert not (tree / ".portkit").exists()


def test_a_series_that_only_deletes_files_is_recorded_and_puts_them_back(fixture_tree,
                                                                         tmp_path):
    tree = fixture_tree("old")
    series = tmp_path / "drop-hparams"
    series.mkdir()
    (series / "0001-drop.patch").write_text(_diff(tree, "src/llama-hparams.h", "", None))
    applied = _apply(tree, series)
    assert applied.exit_code == 0, applied.output
    assert not (tree / "src/llama-hparams.h").exists()
    state = json.loads((tree / ".portkit/drop-hparams/state.json").read_text())
    assert state["files"] == [{"path": "src/llama-hparams.h", "sha256": None}]
    back = _apply(tree, series, "--reverse")
    assert back.exit_code == 0, back.output
    assert (tree / "src/llama-hparams.h").read_bytes() == (
        Path(__file__).parent / "fixtures/trees/old/src/llama-hparams.h").read_bytes()


@pytest.mark.parametrize("other", ["other lines", "the same lines elsewhere"])
def test_another_series_of_the_same_name_is_refused_not_called_applied(fixture_tree,
                                                                      tmp_path, other):
    tree = fixture_tree("old")
    first, second = tmp_path / "one" / "fixes", tmp_path / "two" / "fixes"
    after = "struct ggml_tensor;\n" if other == "the same lines elsewhere" else \
        "struct ggml_cgraph;\n"
    line = "// one\n" if other == "the same lines elsewhere" else "// two\n"
    for folder, at, note in ((first, "struct ggml_cgraph;\n", "// one\n"), (second, after, line)):
        folder.mkdir(parents=True)
        (folder / "0001-note.patch").write_text(_diff(tree, GRAPH, at, at + note))
    assert _apply(tree, first).exit_code == 0
    applied = tree_bytes(tree)
    again = _apply(tree, second)
    assert again.exit_code == 4 and again.stderr.count("\n") == 1
    assert "another series named fixes is applied" in again.stderr
    gone = _apply(tree, second, "--reverse")
    assert gone.exit_code == 4 and "another series named fixes" in gone.stderr
    assert tree_bytes(tree) == applied


def test_a_series_named_like_a_feature_never_stands_for_the_feature(fixture_tree, tmp_path):
    """A folder named kv-rotation applied with --series is that series' record, not the
    feature's: the feature is not "already applied" by it, its --reverse does not take the
    series out, and the other way round; each refusal is one line, the tree untouched."""
    tree = fixture_tree("old")
    before = tree_bytes(tree)
    series = tmp_path / "kv-rotation"
    series.mkdir()
    (series / "0001-note.patch").write_text(
        _diff(tree, GRAPH, "struct ggml_cgraph;\n", "struct ggml_cgraph;\n// a note\n"))
    assert _apply(tree, series).exit_code == 0
    with_series = tree_bytes(tree)
    for more in ([], ["--reverse"], ["--reverse", "--dry-run"]):
        feature = invoke("apply", "--force", "--tree", str(tree), *more)
        assert feature.exit_code == 4 and feature.stderr.count("\n") == 1, feature.output
        assert "a series named kv-rotation is applied to this tree (by `portkit apply " \
               "--series`), not the feature kv-rotation" in feature.stderr
        assert tree_bytes(tree) == with_series
    assert _apply(tree, series, "--reverse").exit_code == 0
    assert tree_bytes(tree) == before
    # the feature applied: a series folder of its name neither is it nor takes it out
    assert invoke("apply", "--force", "--tree", str(tree)).exit_code == 0
    with_feature = tree_bytes(tree)
    refused = _apply(tree, series)
    assert refused.exit_code == 4 and refused.stderr.count("\n") == 1
    assert f"the feature kv-rotation is applied to this tree, not the series in {series}" \
        in refused.stderr
    gone = tmp_path / "elsewhere" / "kv-rotation"  # the folder is no more: its name alone
    out = _apply(tree, gone, "--reverse")
    assert out.exit_code == 4 and "leave out --series to take the feature out" in out.stderr
    assert tree_bytes(tree) == with_feature
    assert invoke("apply", "--force", "--tree", str(tree), "--reverse").exit_code == 0
    assert tree_bytes(tree) == before


@pytest.mark.parametrize("how", ["--force", "--pin", "--pin, a feature"])
def test_the_command_apply_prints_to_see_the_change_works_as_printed(fixture_git_tree,
                                                                     tmp_path, monkeypatch,
                                                                     how):
    """The hint after an apply is a command that works when pasted (from another folder than
    the tree's): with the pin or --force the apply had, the series folder (a series comes
    out only by --series) and the tree; without --dry-run it takes the change out."""
    tree = fixture_git_tree("old")
    before = tree_bytes(tree)
    pin = git(tree, "rev-parse", "HEAD").strip()[:12]
    series = tmp_path / "fixes"
    series.mkdir()
    (series / "0001-note.patch").write_text(
        _diff(tree, GRAPH, "struct ggml_cgraph;\n", "struct ggml_cgraph;\n// a note\n"))
    monkeypatch.chdir(tmp_path)
    given = ["--force"] if how == "--force" else ["--pin", pin]
    what = [] if how.endswith("feature") else ["--series", str(series)]
    done = invoke("apply", *given, "--tree", str(tree), *what)
    assert done.exit_code == 0, done.output
    hint = re.search(r"or `(portkit apply [^`]*)` \(without --dry-run: take it out\)",
                     done.stdout)
    assert hint is not None, done.stdout
    argv = shlex.split(hint.group(1))
    assert argv[:4] == ["portkit", "apply", "--reverse", "--dry-run"] and given[0] in argv
    shown = invoke(*argv[1:])
    assert shown.exit_code == 0, shown.output
    assert "patch(es) would be reversed" in shown.stderr
    assert ("// a note" in shown.stdout) == bool(what)  # else the feature's series
    out = invoke(*[a for a in argv[1:] if a != "--dry-run"])
    assert out.exit_code == 0, out.output
    assert tree_bytes(tree) == before


@pytest.mark.parametrize("order", ["recorded", "not recorded"])
def test_a_series_comes_out_only_from_under_no_later_one_on_its_files(fixture_tree, tmp_path,
                                                                      order):
    """Records keep the apply order. Where they have none (written before portkit kept it,
    or edited by hand), the series whose recorded checksum a shared file has now wrote it
    last, and the other does not come out from under it either."""
    tree = fixture_tree("old")
    before = tree_bytes(tree)
    earlier, later = tmp_path / "earlier", tmp_path / "later"
    earlier.mkdir()
    (earlier / "0001-a.patch").write_text(
        _diff(tree, GRAPH, "struct ggml_cgraph;\n", "struct ggml_cgraph;\n// earlier\n"))
    assert _apply(tree, earlier).exit_code == 0
    later.mkdir()
    (later / "0001-b.patch").write_text(
        _diff(tree, GRAPH, "// earlier\n", "// earlier\n// later\n"))
    assert _apply(tree, later).exit_code == 0
    if order == "not recorded":
        for name in ("earlier", "later"):
            state = tree / ".portkit" / name / "state.json"
            data = json.loads(state.read_text())
            del data["order"]
            state.write_text(json.dumps(data))
    both = tree_bytes(tree)
    refused = _apply(tree, earlier, "--reverse")
    assert refused.exit_code == 4 and refused.stderr.count("\n") == 1
    assert "earlier cannot come out from under later" in refused.stderr
    assert GRAPH in refused.stderr and tree_bytes(tree) == both
    assert _apply(tree, later, "--reverse").exit_code == 0
    assert _apply(tree, earlier, "--reverse").exit_code == 0
    assert tree_bytes(tree) == before


@pytest.mark.parametrize("kind", ["plain diff", "plain unified -p0 diff",
                                  "mail of another style"])
def test_in_a_fork_the_copies_are_written_as_the_forks_own_mails(fixture_fork, tmp_path, kind):
    fork = fixture_fork("old")
    llama = fork.root / "llama" / "llama.cpp"
    git(fork.root, "config", "user.name", "Fork Dev")
    git(fork.root, "config", "user.email", "dev@fork.invalid")
    diff = _diff(llama, GRAPH, "struct ggml_cgraph;\n", "struct ggml_cgraph;\n// a note\n")
    series = tmp_path / "fixes"
    series.mkdir()
    if kind == "plain diff":
        (series / "graph-note.diff").write_text(diff)
    elif kind == "plain unified -p0 diff":  # as `diff -u` writes it: written as git's diff
        plain = re.sub(r"(?m)^(diff --git|index) .*\n", "", diff)
        (series / "graph-note.diff").write_text(
            re.sub(r"(?m)^(---|\+\+\+) [ab]/", r"\1 ", plain))
        (series / "series").write_text("graph-note.diff -p0\n")
    else:
        (series / "v2-0007-graph-note.patch").write_text(
            "From 1234567890abcdef1234567890abcdef12345678 Mon Sep 17 00:00:00 2001\n"
            "From: Some One <one@example.invalid>\nDate: Tue, 3 Mar 2026 09:00:00 +0100\n"
            "Subject: [PATCH v2 7/9] graph: a note\n\nWhy the note.\n---\n" + diff
            + "-- \n2.43.0\n\n")
    patches = fork.root / "llama" / "patches"
    own = read_series(patches)
    applied = invoke("apply", "--force", "--tree", str(fork.root), "--series", str(series))
    assert applied.exit_code == 0, applied.output
    now = read_series(patches)
    added = [p for p in now.patches if p.name not in {q.name for q in own.patches}]
    assert len(added) == 1
    copy = added[0]
    plain = kind.startswith("plain")
    assert copy.name == ("0003-graph-note.patch" if plain else "0003-graph-a-note.patch")
    mine = detect_conventions([copy])
    theirs = own.conventions
    assert (mine.style, mine.numbered, mine.zero_commit, mine.signature, mine.diffstat) == (
        theirs.style, theirs.numbered, theirs.zero_commit, theirs.signature, theirs.diffstat)
    assert copy.author == ("Fork Dev <dev@fork.invalid>" if plain
                           else "Some One <one@example.invalid>")
    # the fork's own tooling (git am in its vendor checkout) takes it as it takes the others,
    # and git format-patch of the commit it makes writes the very same diff
    git(fork.upstream, "checkout", "--quiet", "fork")
    git(fork.upstream, "am", "--quiet", str(patches / copy.name))
    assert "// a note" in (fork.upstream / GRAPH).read_text()
    again = git(fork.upstream, "format-patch", "--no-signature", "--no-numbered",
                "--zero-commit", "--stdout", "-1")
    assert copy.diff == again[again.index("diff --git"):]
    commit_all(fork.root, "the note")
    back = invoke("apply", "--force", "--tree", str(fork.root), "--series", str(series),
                  "--reverse")
    assert back.exit_code == 0, back.output
    assert sorted(p.name for p in read_series(patches).patches) == sorted(
        p.name for p in own.patches)


def test_plain_diffs_on_one_file_are_each_written_as_gits_diff_after_the_one_before(
        fixture_fork, tmp_path):
    """The second plain diff edits what the first adds: each copy is git's diff of its own
    change, made on the file as the one before it left it."""
    fork = fixture_fork("old")
    llama = fork.root / "llama" / "llama.cpp"
    git(fork.root, "config", "user.name", "Fork Dev")
    git(fork.root, "config", "user.email", "dev@fork.invalid")
    series = tmp_path / "notes"
    series.mkdir()
    (series / "a.diff").write_text(
        _diff(llama, GRAPH, "struct ggml_cgraph;\n", "struct ggml_cgraph;\n// a note\n"))
    later = tmp_path / "later" / "src"
    later.mkdir(parents=True)
    (later / GRAPH.split("/")[1]).write_text((llama / GRAPH).read_text().replace(
        "struct ggml_cgraph;\n", "struct ggml_cgraph;\n// a note\n"))
    (series / "b.diff").write_text(_diff(later.parent, GRAPH, "// a note\n",
                                         "// a longer note\n"))
    (series / "series").write_text("a.diff\nb.diff\n")
    patches = fork.root / "llama" / "patches"
    own = {p.name for p in patches.glob("*.patch")}
    applied = invoke("apply", "--force", "--tree", str(fork.root), "--series", str(series))
    assert applied.exit_code == 0, applied.output
    added = sorted(p for p in patches.glob("*.patch") if p.name not in own)
    assert len(added) == 2
    git(fork.upstream, "checkout", "--quiet", "fork")
    for copy in added:
        git(fork.upstream, "am", "--quiet", str(copy))
    assert "// a longer note" in (fork.upstream / GRAPH).read_text()
    again = git(fork.upstream, "format-patch", "--no-signature", "--no-numbered",
                "--zero-commit", "--stdout", "-2")
    diffs = [part[part.index("diff --git"):] for part in again.split("\nFrom ")]
    by_name = {p.name: p for p in read_series(patches).patches}
    assert [by_name[p.name].diff for p in added] == [
        d[:d.index("-- \n")] if "-- \n" in d else d for d in diffs]


def test_a_record_listing_a_file_its_patches_do_not_touch_is_refused(fixture_tree, tmp_path):
    """--reverse writes back every file a record lists: one its patches never touch (an
    executable made a plain file) is no file of the record's."""
    tree = fixture_tree("old")
    series = tmp_path / "fixes"
    series.mkdir()
    (series / "0001-a.patch").write_text(
        _diff(tree, GRAPH, "struct ggml_cgraph;\n", "struct ggml_cgraph;\n// a note\n"))
    assert _apply(tree, series).exit_code == 0
    state = tree / ".portkit" / "fixes" / "state.json"
    data = json.loads(state.read_text())
    data["files"].append({"path": "src/llama.cpp", "sha256": "0" * 64})
    state.write_text(json.dumps(data))
    before = tree_bytes(tree)
    refused = _apply(tree, series, "--reverse")
    assert refused.exit_code == 6 and refused.stderr.count("\n") == 1
    assert "src/llama.cpp, which none of its patches touches" in refused.stderr
    assert tree_bytes(tree) == before


def test_a_subject_of_no_letters_gives_the_copy_gits_name_and_it_comes_out(fixture_fork,
                                                                             tmp_path):
    """git format-patch names a mail whose subject has no letters or digits 0003-.patch."""
    fork = fixture_fork("old")
    llama = fork.root / "llama" / "llama.cpp"
    series = tmp_path / "odd"
    series.mkdir()
    (series / "0001-.patch").write_text(
        "From: Some One <one@example.invalid>\nDate: Tue, 3 Mar 2026 09:00:00 +0100\n"
        "Subject: [PATCH] !!!\n\n---\n"
        + _diff(llama, GRAPH, "struct ggml_cgraph;\n", "struct ggml_cgraph;\n// a note\n"))
    before = tree_bytes(fork.root)
    assert _apply(fork.root, series).exit_code == 0
    patches = fork.root / "llama" / "patches"
    assert (patches / "0003-.patch").is_file()
    info = invoke("tree", "info", str(fork.root))
    assert info.exit_code == 0, info.output
    back = _apply(fork.root, series, "--reverse")
    assert back.exit_code == 0, back.output
    assert tree_bytes(fork.root) == before


@pytest.mark.parametrize("where", ["GIT_CONFIG_GLOBAL", "GIT_CONFIG_COUNT", "nowhere"])
def test_a_plain_diffs_author_is_the_one_git_names(fixture_fork, tmp_path, monkeypatch, where):
    """The author of a plain diff's copy is `git var GIT_AUTHOR_IDENT`'s: the configuration
    GIT_CONFIG_GLOBAL names, not ~/.gitconfig; where git names none, a one-line refusal."""
    fork = fixture_fork("old")
    llama = fork.root / "llama" / "llama.cpp"
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[user]\n\tname = Home File\n\temail = home@example.com\n")
    chosen = tmp_path / "chosen.gitconfig"
    chosen.write_text("[user]\n\tname = Global Via Env\n\temail = env@example.com\n"
                      if where == "GIT_CONFIG_GLOBAL" else "[user]\n\tuseConfigOnly = true\n")
    if where == "GIT_CONFIG_COUNT":  # git's configuration given in the environment
        for k, (key, value) in enumerate([("user.name", "Global Via Env"),
                                          ("user.email", "env@example.com")]):
            monkeypatch.setenv(f"GIT_CONFIG_KEY_{k}", key)
            monkeypatch.setenv(f"GIT_CONFIG_VALUE_{k}", value)
        monkeypatch.setenv("GIT_CONFIG_COUNT", "2")
    for name in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "EMAIL", "GIT_CONFIG_NOSYSTEM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(chosen))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    series = tmp_path / "fixes"
    series.mkdir()
    (series / "note.diff").write_text(
        _diff(llama, GRAPH, "struct ggml_cgraph;\n", "struct ggml_cgraph;\n// a note\n"))
    before = tree_bytes(fork.root)
    done = _apply(fork.root, series)
    if where == "nowhere":
        assert done.exit_code == 2 and done.stderr.count("\n") == 1, done.output
        assert "note.diff is a plain diff" in done.stderr and "git names none" in done.stderr
        assert tree_bytes(fork.root) == before
        return
    assert done.exit_code == 0, done.output
    (copy,) = [p for p in read_series(fork.root / "llama" / "patches").patches
               if p.name.endswith("-note.patch")]
    assert copy.author == "Global Via Env <env@example.com>"


def test_a_file_diff_ruN_deletes_is_deleted_and_comes_back(fixture_tree, tmp_path):
    """`diff -ruN` writes a deleted file against the Epoch, not /dev/null: GNU patch deletes
    it, and so does apply; --reverse puts it back."""
    tree = fixture_tree("old")
    before = tree_bytes(tree)
    rel = "src/llama-hparams.h"
    work = tmp_path / "work"
    (work / "a" / "src").mkdir(parents=True)
    (work / "b" / "src").mkdir(parents=True)
    (work / "a" / rel).write_bytes((tree / rel).read_bytes())
    done = subprocess.run(["diff", "-ruN", "a", "b"], cwd=work, capture_output=True, text=True,
                          env={**os.environ, "TZ": "America/Los_Angeles"})
    assert done.returncode == 1 and ("1969-12-31" in done.stdout  # the zone's, where known
                                     or "1970-01-01" in done.stdout), done.stdout[:300]
    series = tmp_path / "drop"
    series.mkdir()
    (series / "0001-drop-hparams.diff").write_text(done.stdout)
    applied = _apply(tree, series)
    assert applied.exit_code == 0, applied.output
    assert not (tree / rel).exists()
    assert _apply(tree, series, "--reverse").exit_code == 0
    assert tree_bytes(tree) == before


def test_a_record_naming_the_forks_own_patch_as_its_copy_is_refused(fixture_fork, tmp_path):
    """A reverse deletes a record's copies: a copy must be one of the record's own patches,
    with its checksum, never another patch of the fork's series."""
    fork = fixture_fork("old")
    llama, patches = fork.root / "llama" / "llama.cpp", fork.root / "llama" / "patches"
    series = tmp_path / "fixes"
    series.mkdir()
    (series / "0001-note.patch").write_text(
        "From: Some One <one@example.invalid>\nDate: Tue, 3 Mar 2026 09:00:00 +0100\n"
        "Subject: [PATCH] graph: a note\n\n---\n"
        + _diff(llama, GRAPH, "struct ggml_cgraph;\n", "struct ggml_cgraph;\n// a note\n"))
    assert invoke("apply", "--force", "--tree", str(fork.root), "--series",
                  str(series)).exit_code == 0
    own = sorted(patches.glob("0001-*.patch"))[0]
    state_file = fork.root / ".portkit" / "fixes" / "state.json"
    state = json.loads(state_file.read_text())
    state["series_copies"].append({"path": f"llama/patches/{own.name}",
                                   "sha256": hashlib.sha256(own.read_bytes()).hexdigest()})
    state_file.write_text(json.dumps(state))
    before = tree_bytes(fork.root)
    back = invoke("apply", "--force", "--tree", str(fork.root), "--series", str(series),
                  "--reverse")
    assert back.exit_code == 6 and back.stderr.count("\n") == 1
    assert f"series copy llama/patches/{own.name} is not one of its patches" in back.stderr
    assert tree_bytes(fork.root) == before


@pytest.mark.parametrize("folder", ["my series", ".my-series"])
def test_a_series_folder_whose_name_cannot_name_a_record_is_told_so(fixture_tree, tmp_path,
                                                                    folder):
    """The folder's name is the record's: a name that cannot be one is refused as the
    folder's (never as a "feature name" the user did not give), saying which names can,
    and --help says it before."""
    tree = fixture_tree("old")
    before = tree_bytes(tree)
    series = tmp_path / folder
    series.mkdir()
    (series / "0001-note.patch").write_text(
        _diff(tree, GRAPH, "struct ggml_cgraph;\n", "struct ggml_cgraph;\n// a note\n"))
    for more in ([], ["--reverse"]):
        done = _apply(tree, series, *more)
        assert done.exit_code == 2 and done.stderr.count("\n") == 1, done.output
        assert "feature" not in done.stderr
        assert f"the name of the --series folder {series} is the name its record is kept " \
               f"under, and {folder!r} cannot be one: rename the folder" in done.stderr
        assert "letters, digits, '.', '_' and '-'" in done.stderr
        assert tree_bytes(tree) == before
    helped = " ".join(invoke("apply", "--help").stdout.split())
    assert "recorded under the folder's name (letters, digits, '.', '_', '-', starting with " \
           "a letter or digit: rename the folder otherwise)" in helped
