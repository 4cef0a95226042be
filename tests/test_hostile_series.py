"""Series written to hurt, and odd ones written by real tools, through the CLI (apply
--series, drift, rebase): no patch reaches .git or .portkit, no input gives a traceback, and
`drift --output` never replaces an input."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from portkit.cli import cli
from portkit.errors import TreeError
from portkit.transaction import TreeFiles, Write, transaction

from .conftest import tree_bytes

GRAPH = "src/llama-graph.cpp"
FIXTURE = Path(__file__).parent / "fixtures" / "trees" / "old"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def one_line(result: Result) -> str:
    """The failure's one `portkit:` line (never a traceback, never an internal error)."""
    assert result.exit_code != 70 and "Traceback" not in result.output, result.output
    assert "internal error" not in result.output, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("portkit: "), result.stderr
    return lines[0]


def everything(root: Path) -> dict[str, bytes]:
    """Every file under `root`, .git and .portkit included."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def series_of(folder: Path, patches: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in patches.items():
        (folder / name).write_bytes(data)
    return folder


def creation(path: bytes, line: bytes = b"fsmonitor = \"touch /tmp/pwned\"") -> bytes:
    return (b"diff --git a/" + path + b" b/" + path + b"\nnew file mode 100644\n"
            b"--- /dev/null\n+++ b/" + path + b"\n@@ -0,0 +1 @@\n+" + line + b"\n")


def edit_of(path: bytes, old: bytes, new: bytes) -> bytes:
    """A diff that makes the first line of the fixture file `path`, `old`, into `new`, with
    git's three lines of context."""
    after = (FIXTURE / os.fsdecode(path)).read_bytes().split(b"\n")[1:4]
    assert (FIXTURE / os.fsdecode(path)).read_bytes().startswith(old + b"\n")
    context = b"".join(b" " + line + b"\n" for line in after)
    return (b"diff --git a/" + path + b" b/" + path + b"\n--- a/" + path + b"\n+++ b/" + path
            + b"\n@@ -1,4 +1,4 @@\n-" + old + b"\n+" + new + b"\n" + context)


def mail(subject: bytes, diff: bytes, sender: bytes = b"Fork Maintainer <fork@example.org>"
         ) -> bytes:
    return (b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
            b"From: " + sender + b"\nDate: Tue, 8 Apr 2025 15:34:37 -0700\nSubject: [PATCH] "
            + subject + b"\n\n---\n" + diff)


def first_line(root: Path, rel: str) -> bytes:
    return (root / rel).read_bytes().split(b"\n", 1)[0]


# -- no patch reaches .git or .portkit --------------------------------------------------------


OWNED = [
    b".git/config", b".git/hooks/post-checkout", b".git/index", b".portkit/.journal",
    b".portkit/hostile/state.json", b".GIT/config", b".git./config", b".git /config",
    b"git~1/config", b"src/.Git/config", b".portkit./x", "\u200c.git/config".encode(),
]


@pytest.mark.parametrize("path", OWNED, ids=[p.decode() for p in OWNED])
def test_apply_series_never_writes_into_git_or_portkit(fixture_git_tree, tmp_path, path):
    tree = fixture_git_tree("old")
    folder = series_of(tmp_path / "hostile", {"0001-evil.patch": mail(b"evil", creation(path))})
    before = everything(tree)
    result = invoke("apply", "--force", "--tree", str(tree), "--series", str(folder))
    line = one_line(result)
    assert result.exit_code == 12
    assert "0001-evil.patch" in line and "refusing" in line and "no patch may touch" in line
    assert everything(tree) == before


@pytest.mark.parametrize("how", ["rename-target", "rename-source", "copy-target", "symlink"])
def test_renames_copies_and_links_into_git_are_refused(fixture_git_tree, tmp_path, how):
    tree = fixture_git_tree("old")
    diff = {
        "rename-target": b"diff --git a/src/llama.cpp b/.git/config\nsimilarity index 100%\n"
                         b"rename from src/llama.cpp\nrename to .git/config\n",
        "rename-source": b"diff --git a/.git/config b/src/config\nsimilarity index 100%\n"
                         b"rename from .git/config\nrename to src/config\n",
        "copy-target": b"diff --git a/src/llama.cpp b/.git/hooks/post-checkout\n"
                       b"similarity index 100%\ncopy from src/llama.cpp\n"
                       b"copy to .git/hooks/post-checkout\n",
        "symlink": b"diff --git a/src/cfg b/src/cfg\nnew file mode 120000\n--- /dev/null\n"
                   b"+++ b/src/cfg\n@@ -0,0 +1 @@\n+../.git/config\n"
                   b"\\ No newline at end of file\n",
    }[how]
    folder = series_of(tmp_path / "hostile", {"0001-evil.patch": mail(b"evil", diff)})
    before = everything(tree)
    result = invoke("apply", "--force", "--tree", str(tree), "--series", str(folder))
    assert result.exit_code == 12 and "0001-evil.patch: refusing" in one_line(result)
    assert everything(tree) == before
    assert not (tree / "src" / "cfg").is_symlink()


KINDS = [b".git/config", b".git/hooks/post-checkout", b".git/index", b".portkit/.journal",
         b".portkit/s/state.json"]


@pytest.mark.parametrize("path", KINDS, ids=[p.decode() for p in KINDS])
def test_drift_reports_a_patch_into_git_as_that_patchs_verdict(fixture_git_tree, tmp_path,
                                                               path):
    tree = fixture_git_tree("old")
    graph = first_line(tree, GRAPH)
    good = mail(b"good", edit_of(GRAPH.encode(), graph, graph + b" // good"))
    folder = series_of(tmp_path / "s", {
        "0001-good.patch": good,
        "0002-evil.patch": mail(b"evil", creation(path))})
    before = everything(tree)
    result = invoke("drift", "--series", str(folder), "--tree", str(tree), "--base", str(tree),
                    "--format", "json")
    assert result.exit_code == 20, result.output
    patches = json.loads(result.stdout)["targets"][0]["patches"]
    assert [(p["file"], p["status"]) for p in patches] == [
        ("0001-good.patch", "clean"), ("0002-evil.patch", "conflict")]
    assert f"refusing {path.decode()}" in patches[1]["hunks"][0]["reason"]
    assert everything(tree) == before


@pytest.mark.parametrize("path", KINDS, ids=[p.decode() for p in KINDS])
def test_rebase_never_carries_a_patch_into_git(fixture_git_tree, tmp_path, path):
    """rebase reads a series leniently: the patch is that patch's needs-human verdict,
    naming the path, and nothing of it is carried (its file is kept in --out as it was)."""
    tree = fixture_git_tree("old")
    evil = mail(b"evil", creation(path))
    folder = series_of(tmp_path / "s", {"0001-evil.patch": evil})
    before = everything(tree)
    result = invoke("rebase", "--series", str(folder), "--base", str(tree), "--onto", str(tree),
                    "--out", str(tmp_path / "out"), "--format", "json")
    assert result.exit_code == 20, result.output
    (row,) = json.loads(result.stdout)["patches"]
    assert row["status"] == "needs-human" and f"refusing {path.decode()}" in row["reason"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["0001-evil.patch"]
    assert (tmp_path / "out" / "0001-evil.patch").read_bytes() == evil
    assert everything(tree) == before


@pytest.mark.parametrize("rel", [".git/config", ".git/hooks/post-checkout", ".git/index",
                                 ".portkit/.journal", ".portkit/x/state.json", "a/.GIT./b"])
def test_the_transaction_never_writes_there_whatever_asks(fixture_git_tree, rel):
    tree = fixture_git_tree("old")
    (tree / ".portkit").mkdir()
    before = everything(tree)
    with pytest.raises(TreeError, match="portkit does not write there"), \
            transaction(tree, "test", [Write(GRAPH, b"changed\n"), Write(rel, b"x\n")]):
        pass
    assert everything(tree) == before
    with TreeFiles(tree) as files, pytest.raises(TreeError):
        files.remove(rel)


def test_portkits_own_record_is_still_written(fixture_tree):
    tree = fixture_tree("old")
    (tree / ".portkit").mkdir()
    with transaction(tree, "test", [Write(".portkit/x/state.json", b"{}\n", record=True)]):
        pass
    assert (tree / ".portkit/x/state.json").read_bytes() == b"{}\n"


# -- odd input: one clear line or the right result, never exit 70 ------------------------------


def test_a_non_utf8_added_line_is_carried_byte_for_byte(fixture_tree, tmp_path):
    base, target = fixture_tree("old"), fixture_tree("old")
    graph = first_line(base, GRAPH)
    folder = series_of(tmp_path / "s", {"0001-latin1.patch": mail(
        b"latin-1", edit_of(GRAPH.encode(), graph, graph + b" // caf\xe9"))})
    drifted = invoke("drift", "--series", str(folder), "--tree", str(target), "--base",
                     str(base))
    assert drifted.exit_code == 0, drifted.output
    out = tmp_path / "out"
    rebased = invoke("rebase", "--series", str(folder), "--base", str(base), "--onto",
                     str(target), "--out", str(out))
    assert rebased.exit_code == 0, rebased.output
    assert b"+" + graph + b" // caf\xe9\n" in (out / "0001-latin1.patch").read_bytes()
    applied = invoke("apply", "--force", "--tree", str(target), "--series", str(folder))
    assert applied.exit_code == 0, applied.output
    assert first_line(target, GRAPH) == graph + b" // caf\xe9"


def test_a_non_utf8_path_is_no_traceback(fixture_tree, tmp_path):
    base, target = fixture_tree("old"), fixture_tree("old")
    folder = series_of(tmp_path / "s", {"0001-path.patch": mail(
        b"a Latin-1 name", creation(b"src/caf\xe9.c", b"int cafe;"))})
    drifted = invoke("drift", "--series", str(folder), "--tree", str(target), "--base",
                     str(base))
    assert drifted.exit_code == 0, drifted.output
    out = tmp_path / "out"
    rebased = invoke("rebase", "--series", str(folder), "--base", str(base), "--onto",
                     str(target), "--out", str(out))
    assert rebased.exit_code == 0, rebased.output
    applied = invoke("apply", "--force", "--tree", str(target), "--series", str(folder))
    assert applied.exit_code == 0, applied.output
    assert (target / os.fsdecode(b"src/caf\xe9.c")).read_bytes() == b"int cafe;\n"


COVER = (b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
         b"From: Fork Maintainer <fork@example.org>\nDate: Tue, 8 Apr 2025 15:34:37 -0700\n"
         b"Subject: [PATCH 0/1] the fork's series\n\nWhy these patches.\n\n"
         b"Fork Maintainer (1):\n  a comment\n\n src/llama-graph.cpp | 2 +-\n"
         b" 1 file changed, 1 insertion(+), 1 deletion(-)\n\n-- \n2.43.0\n\n")


def test_a_cover_letter_is_kept_in_its_place_and_is_no_fault(fixture_tree, tmp_path):
    """format-patch --cover-letter's 0000-cover-letter.patch has no diff: drift gives it no
    row, rebase keeps it in --out byte for byte and says so, apply --series applies the
    patches around it; none of them calls it a patch that cannot be read."""
    base, target = fixture_tree("old"), fixture_tree("old")
    graph = first_line(base, GRAPH)
    folder = series_of(tmp_path / "s", {
        "0000-cover-letter.patch": COVER,
        "0001-a-comment.patch": mail(b"a comment", edit_of(GRAPH.encode(), graph,
                                                          graph + b" // fork"))})
    drifted = invoke("drift", "--series", str(folder), "--tree", str(target), "--base",
                     str(base), "--format", "json")
    assert drifted.exit_code == 0, drifted.output
    (row,) = json.loads(drifted.stdout)["targets"][0]["patches"]
    assert row["file"] == "0001-a-comment.patch" and row["status"] == "clean"
    out = tmp_path / "out"
    rebased = invoke("rebase", "--series", str(folder), "--base", str(base), "--onto",
                     str(target), "--out", str(out), "--format", "json")
    assert rebased.exit_code == 0, rebased.output
    cover, patch = json.loads(rebased.stdout)["patches"]
    assert cover["file"] == "0000-cover-letter.patch" and cover["status"] == "unchanged"
    assert "cover letter" in cover["reason"] and patch["status"] == "unchanged"
    assert (out / "0000-cover-letter.patch").read_bytes() == COVER
    assert sorted(os.listdir(out)) == sorted(os.listdir(folder))
    applied = invoke("apply", "--force", "--tree", str(target), "--series", str(folder))
    assert applied.exit_code == 0, applied.output
    assert first_line(target, GRAPH) == graph + b" // fork"


@pytest.mark.parametrize("command", ["drift", "rebase", "apply"])
def test_a_quoted_path_with_nul_is_one_line(fixture_tree, tmp_path, command):
    tree = fixture_tree("old")
    diff = (b'diff --git "a/src/x\\000y.c" "b/src/x\\000y.c"\nnew file mode 100644\n'
            b'--- /dev/null\n+++ "b/src/x\\000y.c"\n@@ -0,0 +1 @@\n+int x;\n')
    folder = series_of(tmp_path / "s", {"0001-nul.patch": mail(b"nul", diff)})
    before = everything(tree)
    result = _run(command, folder, tree, tmp_path)
    _one_verdict_or_line(result, command, "a NUL byte in the path")
    assert everything(tree) == before


@pytest.mark.parametrize("command", ["drift", "rebase", "apply"])
def test_a_quilt_series_with_absolute_p0_paths_is_one_line(fixture_tree, tmp_path, command):
    tree = fixture_tree("old")
    graph = first_line(tree, GRAPH)
    absolute = str(tree / GRAPH).encode()
    folder = series_of(tmp_path / "q", {"abs.diff": b"--- " + absolute + b"\n+++ " + absolute
                       + b"\n@@ -1 +1 @@\n-" + graph + b"\n+" + graph + b" // x\n"})
    (folder / "series").write_text("abs.diff -p0\n")
    before = everything(tree)
    result = _run(command, folder, tree, tmp_path)
    _one_verdict_or_line(result, command, "an absolute path")
    assert everything(tree) == before


def _run(command: str, folder: Path, tree: Path, tmp_path: Path) -> Result:
    if command == "drift":
        return invoke("drift", "--series", str(folder), "--tree", str(tree), "--base",
                      str(tree), "--format", "json")
    if command == "rebase":
        return invoke("rebase", "--series", str(folder), "--base", str(tree), "--onto",
                      str(tree), "--out", str(tmp_path / "out"))
    return invoke("apply", "--force", "--tree", str(tree), "--series", str(folder))


def _one_verdict_or_line(result: Result, command: str, reason: str) -> None:
    """drift and rebase report an unreadable patch as its verdict (conflict, needs-human);
    apply refuses the series in one line (exit 12)."""
    if command == "drift":
        assert result.exit_code == 20, result.output
        (patch,) = json.loads(result.stdout)["targets"][0]["patches"]
        assert patch["status"] == "conflict" and reason in patch["hunks"][0]["reason"]
    elif command == "rebase":
        assert result.exit_code == 20, result.output
        assert re.search(rf"needs-human +it cannot be read: .*{reason}", result.stdout)
    else:
        assert result.exit_code == 12 and reason in one_line(result)


# -- drift --output never replaces an input ----------------------------------------------------


@pytest.fixture
def drift_job(fixture_tree, tmp_path) -> tuple[Path, Path, Path]:
    base, target = fixture_tree("old"), fixture_tree("renamed")
    graph = first_line(base, GRAPH)
    folder = series_of(tmp_path / "s", {"0001-one.patch": mail(
        b"one", edit_of(GRAPH.encode(), graph, graph + b" // one"))})
    return folder, base, target


@pytest.mark.parametrize("onto", ["patch", "target-file", "target-new-file", "base-by-link",
                                  "series-folder"])
def test_drift_output_never_replaces_an_input(drift_job, tmp_path, onto):
    folder, base, target = drift_job
    link = tmp_path / "report.md"
    link.symlink_to(base / GRAPH)
    output = {"patch": folder / "0001-one.patch", "target-file": target / GRAPH,
              "target-new-file": target / "src" / "report.md", "base-by-link": link,
              "series-folder": folder}[onto]
    before = tree_bytes(folder), tree_bytes(base), tree_bytes(target)
    result = invoke("drift", "--series", str(folder), "--tree", str(target), "--base",
                    str(base), "--output", str(output))
    assert result.exit_code == 2 and "an input of this report" in one_line(result)
    assert (tree_bytes(folder), tree_bytes(base), tree_bytes(target)) == before


def test_drift_output_is_written_by_rename(drift_job, tmp_path):
    folder, base, target = drift_job
    output = tmp_path / "reports" / "drift.md"
    output.parent.mkdir()
    output.write_text("an old report\n")
    inode = output.stat().st_ino
    result = invoke("drift", "--series", str(folder), "--tree", str(target), "--base",
                    str(base), "--format", "markdown", "--output", str(output))
    assert result.exit_code in (0, 20), result.output
    assert output.read_text().startswith(f"## portkit drift of `{folder}`")
    assert output.stat().st_ino != inode  # a new file renamed onto it, not rewritten in place
    assert sorted(p.name for p in output.parent.iterdir()) == ["drift.md"]


@pytest.mark.parametrize("into", ["target", "base", "series", "here"])
def test_rebase_out_never_goes_into_an_input_and_fails_before_the_run(drift_job, tmp_path,
                                                                      monkeypatch, into):
    """--out inside the onto tree, the base tree or the series (which rebase promises never
    to modify), or the current folder itself: refused at once, nothing written anywhere."""
    folder, base, target = drift_job
    out = {"target": target / "outx", "base": base / "outx", "series": folder / "outx",
           "here": Path(".")}[into]
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")  # an empty folder, named as "."
    before = tree_bytes(folder), tree_bytes(base), tree_bytes(target)
    result = invoke("rebase", "--series", str(folder), "--base", str(base), "--onto",
                    str(target), "--out", str(out))
    assert result.exit_code == 2, result.output
    assert ("an input of this rebase" if into != "here" else "is the current folder") in \
        one_line(result)
    assert (tree_bytes(folder), tree_bytes(base), tree_bytes(target)) == before
    assert not list((tmp_path / "empty").iterdir()) and (into == "here" or not out.exists())


def test_rebase_dry_run_with_a_series_writes_nothing(drift_job, tmp_path):
    folder, base, target = drift_job
    out = tmp_path / "out"
    for extra in (["--out", str(out)], []):
        result = invoke("rebase", "--series", str(folder), "--base", str(base), "--onto",
                        str(target), *extra, "--dry-run", "--format", "json")
        assert result.exit_code in (0, 20), result.output
        assert json.loads(result.stdout)["patches"][0]["file"] == "0001-one.patch"
        assert not out.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_rebase_out_is_made_as_any_folder_there(drift_job, tmp_path):
    """--out gets the mode the umask gives a new folder (not a private temporary folder's
    0700); an empty --out given keeps its own mode."""
    folder, base, target = drift_job
    old = os.umask(0o022)
    try:
        fresh, given = tmp_path / "fresh", tmp_path / "given"
        given.mkdir()
        given.chmod(0o2775)
        for out in (fresh, given):
            result = invoke("rebase", "--series", str(folder), "--base", str(base), "--onto",
                            str(target), "--out", str(out))
            assert result.exit_code in (0, 20), result.output
        assert fresh.stat().st_mode & 0o7777 == 0o755
        assert given.stat().st_mode & 0o7777 == 0o2775
        assert sorted(p.name for p in fresh.iterdir()) == ["0001-one.patch"]
    finally:
        os.umask(old)


def test_git_refuses_what_portkit_refuses(tmp_path):
    """The spellings refused above are git's own: git apply refuses them as well."""
    subprocess.run(["git", "init", "-q", str(tmp_path / "r")], check=True)
    for path in (b".GIT/config", b".git./config", b"git~1/config"):
        patch = tmp_path / "p.diff"
        patch.write_bytes(creation(path))
        done = subprocess.run(["git", "-c", "core.protectNTFS=true", "-c", "core.protectHFS=true",
                               "apply", "--check", str(patch)], cwd=tmp_path / "r",
                              capture_output=True, env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1",
                                                        "GIT_CONFIG_GLOBAL": "/dev/null"})
        assert done.returncode != 0, path


# -- reports never read through a link that leaves the tree ------------------------------------


def test_reports_never_read_through_a_link_out_of_the_target(fixture_tree, tmp_path):
    """A target whose src/llama-graph.cpp is a symbolic link to a file outside it: neither
    drift's Markdown nor rebase's report and side files carry that file's text."""
    base = fixture_tree("old")
    target = tmp_path / "target"
    shutil.copytree(base, target, symlinks=True)
    secret = tmp_path / "outside" / "secret.cpp"
    secret.parent.mkdir()
    graph = first_line(base, GRAPH)
    # upstream's line changed right where the patch edits: the hunk fails, and a report
    # would show the nearest match, the file's own lines, if it read through the link
    secret.write_bytes((base / GRAPH).read_bytes().replace(
        graph, graph + b" // SECRET-OUTSIDE-THE-TREE", 1))
    (target / GRAPH).unlink()
    (target / GRAPH).symlink_to(secret)
    kept = secret.read_bytes()
    folder = series_of(tmp_path / "s", {"0001-one.patch": mail(
        b"one", edit_of(GRAPH.encode(), graph, graph + b" // one"))})
    drift = invoke("drift", "--series", str(folder), "--base", str(base), "--tree",
                   str(target), "--format", "markdown")
    assert drift.exit_code in (0, 20), drift.output
    assert "SECRET-OUTSIDE-THE-TREE" not in drift.output
    out = tmp_path / "out"
    rebase = invoke("rebase", "--series", str(folder), "--base", str(base), "--onto",
                    str(target), "--out", str(out), "--format", "markdown")
    assert rebase.exit_code in (0, 20), rebase.output
    assert "SECRET-OUTSIDE-THE-TREE" not in rebase.output
    written = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file())
    assert b"SECRET-OUTSIDE-THE-TREE" not in written
    assert secret.read_bytes() == kept  # and nothing wrote through it
