"""Patch series as data: format-patch, quilt and plain series read from real git output,
written back byte for byte, and new patches rendered exactly as git format-patch renders them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from portkit.errors import PortkitError
from portkit.series import (
    OLLAMA,
    PORTKIT,
    MailPatch,
    Series,
    file_name,
    format_patch_name,
    git_diff,
    new_patch,
    parse_patch,
    read_series,
)

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "patches" / "kv-rotation" / "4227c9be4268ac844921b90f31595f81236bd317"
GIT_ENV = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}
# ollama's Makefile.sync
OLLAMA_OPTIONS = ["--no-signature", "--no-numbered", "--zero-commit"]


@dataclass
class GitRepo:
    """A throw-away repository, sealed from the user's git configuration."""

    root: Path

    def git(self, *args: str, author: str = "Tess Ter <tess@example.com>") -> bytes:
        name, email = re.fullmatch(r"(.*) <(.*)>", author).groups()  # type: ignore[union-attr]
        env = {**os.environ, **GIT_ENV, "GIT_AUTHOR_DATE": "2025-04-08T15:34:37-0700",
               "GIT_COMMITTER_DATE": "2025-04-08T15:34:37-0700"}
        return subprocess.run(["git", "-c", f"user.name={name}", "-c", f"user.email={email}",
                               *args], cwd=self.root, env=env, check=True,
                              capture_output=True, stdin=subprocess.DEVNULL).stdout

    def commit(self, message: str, files: dict[str, bytes | None],
               author: str = "Tess Ter <tess@example.com>") -> str:
        for rel, data in files.items():
            path = self.root / rel
            if data is None:
                self.git("rm", "-q", rel)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            self.git("add", rel)
        self.git("commit", "-q", "-m", message, author=author)
        return self.git("rev-parse", "HEAD").decode().strip()

    def format_patch(self, out: Path, *options: str, since: str = "base") -> list[Path]:
        self.git("format-patch", "-q", "-o", str(out), *options, f"{since}..HEAD")
        return sorted(out.glob("*.patch"))


def cpp(name: str, n: int, tweak: dict[int, str] | None = None) -> bytes:
    """A small C++ file of n distinct functions, some lines replaced."""
    lines = [f"// {name}\n", "#include <cstdio>\n", "\n"]
    for i in range(n):
        lines += [f"int {name}_{i}(int x) {{\n", f"    return x * {i} + {len(name)};\n", "}\n",
                  "\n"]
    for k, text in (tweak or {}).items():
        lines[k] = text
    return "".join(lines).encode()


def make_history(repo: GitRepo) -> None:
    """27 commits in the shapes a fork's series has: long and odd subjects, bodies with `---`,
    created, deleted, renamed and mode-changed files, CRLF and Latin-1 content, no newline at
    end of file, non-ASCII authors."""
    repo.git("init", "-q", "-b", "main", ".")
    repo.commit("initial", {"src/llama.cpp": cpp("llama", 30), "src/graph.cpp": cpp("graph", 20),
                            "src/old-name.cpp": cpp("old", 5), "ggml/ggml.c": cpp("ggml", 10),
                            "win/crlf.cpp": cpp("crlf", 6).replace(b"\n", b"\r\n"),
                            "src/latin.cpp": cpp("latin", 4) + b"// caf\xe9\n",
                            "src/gone.cpp": cpp("gone", 3)})
    repo.git("tag", "base")
    for i in range(14):
        repo.commit(f"llama: tweak function {i} so that the graph keeps its order when the cache"
                    f" is rotated ({i})" if i % 3 == 0 else f"tweak {i}",
                    {"src/llama.cpp": cpp("llama", 30, {4 + 4 * k: f"    return x * {k} + {i};\n"
                                                        for k in range(i + 1)})})
    repo.commit("body with separators\n\nThe message has a line of three dashes:\n---\n"
                "and goes on after it.\n---\nTwice.", {"src/graph.cpp": cpp("graph", 21)})
    repo.commit("create and delete", {"src/new.h": b"#pragma once\nint f();\n",
                                      "src/gone.cpp": None})
    repo.git("mv", "src/old-name.cpp", "src/new-name.cpp")
    repo.commit("rename with a change", {"src/new-name.cpp": cpp("old", 5, {4: "    return 0;\n"})})
    (repo.root / "ggml/ggml.c").chmod(0o755)
    repo.git("add", "ggml/ggml.c")
    repo.commit("mode change", {})
    repo.commit("crlf content", {"win/crlf.cpp": cpp("crlf", 6, {5: "    return -1;\n"})
                                 .replace(b"\n", b"\r\n")})
    repo.commit("latin-1 content", {"src/latin.cpp": cpp("latin", 4) + b"// na\xefve caf\xe9\n"})
    repo.commit("no newline at end of file", {"src/new.h": b"#pragma once\nint f();\nint g();"})
    repo.commit("sübject wïth ümlauts, and long enough that git encodes and folds it twice",
                {"src/graph.cpp": cpp("graph", 22)}, author="José Müller <jose@example.com>")
    repo.commit("quoted author", {"src/graph.cpp": cpp("graph", 23)},
                author="Doe, John <john@example.com>")
    repo.commit("Averyveryverylongfirstwordthatdoesnotfitonthesubjectlineatallbecauseitislong",
                {"src/graph.cpp": cpp("graph", 24)})
    repo.commit("many files at once [ggml] ... a=b?", {
        "ggml/ggml.c": cpp("ggml", 11),
        "src/a/very/deep/folder/that/makes/the/diffstat/name/too/long/to/fit/in/it.cpp":
            cpp("deep", 40),
        "src/llama.cpp": cpp("llama", 31)})
    repo.commit("one more", {"src/graph.cpp": cpp("graph", 25)})


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> GitRepo:
    repo = GitRepo(tmp_path_factory.mktemp("history"))
    make_history(repo)
    return repo


OPTION_SETS = {
    "ollama": OLLAMA_OPTIONS,
    "default": [],
    "no-stat-signature": ["-p", "--signature=fork 1.0"],
    "rfc-numbered": ["--subject-prefix=RFC PATCH", "--numbered", "--zero-commit"],
}


@pytest.fixture(scope="module", params=sorted(OPTION_SETS))
def exported(request: pytest.FixtureRequest, history: GitRepo,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp(request.param)
    history.format_patch(out, *OPTION_SETS[request.param])
    return request.param, out


def test_an_ollama_style_series_round_trips_byte_for_byte(history, tmp_path):
    written = history.format_patch(tmp_path / "patches", *OLLAMA_OPTIONS)
    assert len(written) >= 26
    series = read_series(tmp_path / "patches")
    assert series.kind == "format-patch"
    assert [p.name for p in series.patches] == [p.name for p in written]
    copies = series.write(tmp_path / "copy")
    assert [c.read_bytes() for c in copies] == [p.read_bytes() for p in written]
    assert sorted(os.listdir(tmp_path / "copy")) == sorted(os.listdir(tmp_path / "patches"))


def test_conventions_are_read_from_the_series(exported):
    options, folder = exported
    conv = read_series(folder).conventions
    flags = OPTION_SETS[options]
    assert conv.style == "format-patch"
    assert conv.numbered == ("--no-numbered" not in flags)
    assert conv.zero_commit == ("--zero-commit" in flags)
    expected_signature = (None if "--no-signature" in flags
                          else "fork 1.0" if "--signature=fork 1.0" in flags
                          else git_version())
    assert conv.signature == expected_signature
    assert conv.diffstat == ("-p" not in flags)
    assert conv.index_lines
    assert conv.subject_prefix == ("RFC PATCH" if "--subject-prefix=RFC PATCH" in flags
                                   else "PATCH")
    assert conv.numbered_names
    assert conv.next_number == len(list(folder.glob("*.patch"))) + 1


def git_version() -> str:
    out = subprocess.run(["git", "--version"], capture_output=True, text=True, check=True)
    return out.stdout.split()[2]


def test_a_new_patch_is_what_git_format_patch_writes(history, exported):
    """Subject, body, author and date from git log, the diff from git show: the mail and its
    file name equal format-patch's, byte for byte, for every commit and option set."""
    options, folder = exported
    series = read_series(folder)
    commits = history.git("rev-list", "--reverse", "base..HEAD").decode().split()
    assert len(commits) == len(series.patches)
    for number, (sha, original) in enumerate(zip(commits, series.patches, strict=True), 1):
        fields = history.git("log", "-1", "--format=%s%x00%b%x00%an <%ae>%x00%aD", sha)
        subject, body, author, date = fields.decode("utf-8", "surrogateescape").split("\0")
        diff = history.git("show", "--format=", sha).decode("utf-8", "surrogateescape")
        made = new_patch(series.conventions, subject=subject, body=body, author=author,
                         date=date.strip(), diff=diff, number=number,
                         total=len(series.patches), commit=sha)
        assert made.name == original.name
        assert made.data == original.data, original.name


def test_patches_say_what_their_mail_says(history, tmp_path):
    patches = read_series(history_patches(history, tmp_path)).patches
    by_subject = {p.subject: p for p in patches}
    dashes = by_subject["body with separators"]
    assert dashes.body == ("The message has a line of three dashes:\n---\nand goes on after it."
                           "\n---\nTwice.")
    assert dashes.stat is not None and "1 file changed" in dashes.stat
    assert dashes.commit == "0" * 40 and dashes.number is None and dashes.subject_prefix == "PATCH"
    assert dashes.date == "Tue, 8 Apr 2025 15:34:37 -0700"
    assert dashes.author == "Tess Ter <tess@example.com>"
    assert by_subject["quoted author"].author == '"Doe, John" <john@example.com>'
    umlauts = next(p for p in patches if p.subject.startswith("sübject"))
    assert umlauts.author == "José Müller <jose@example.com>"
    assert umlauts.subject == ("sübject wïth ümlauts, and long enough that git encodes and folds"
                               " it twice")
    assert {(f.status, f.old_path, f.new_path) for f in
            by_subject["create and delete"].files} == {("created", None, "src/new.h"),
                                                       ("deleted", "src/gone.cpp", None)}
    (renamed,) = by_subject["rename with a change"].files
    assert (renamed.status, renamed.old_path, renamed.new_path) == (
        "renamed", "src/old-name.cpp", "src/new-name.cpp")
    (mode,) = by_subject["mode change"].files
    assert (mode.header("old mode"), mode.header("new mode"), mode.hunks) == (
        "100644", "100755", ())


def history_patches(history: GitRepo, tmp_path: Path) -> Path:
    history.format_patch(tmp_path / "patches", *OLLAMA_OPTIONS)
    return tmp_path / "patches"


def test_hunks_hold_the_files_lines_byte_for_byte(history, tmp_path):
    """Each hunk's old and new lines are the file's lines before and after the commit at the
    hunk's place: CRLF, Latin-1 and a missing last newline included."""
    series = read_series(history_patches(history, tmp_path))
    commits = history.git("rev-list", "--reverse", "base..HEAD").decode().split()
    checked = 0
    for sha, patch in zip(commits, series.patches, strict=True):
        for n, h in enumerate(patch.hunks):
            assert h.patch_index == n
            f = next(f for f in patch.files if h in f.hunks)
            before = blob(history, f"{sha}^", f.old_path)
            after = blob(history, sha, f.new_path)
            assert "".join(h.old_lines) == lines_at(before, h.old_start, h.old_len)
            assert "".join(h.new_lines) == lines_at(after, h.new_start, h.new_len)
            assert len(h.added) - len(h.removed) == h.new_len - h.old_len
            assert h.text.startswith(f"@@ -{h.old_start}")
            checked += 1
    assert checked >= 25


def blob(repo: GitRepo, rev: str, path: str | None) -> str:
    if path is None:
        return ""
    return repo.git("show", f"{rev}:{path}").decode("utf-8", "surrogateescape")


def lines_at(text: str, start: int, length: int) -> str:
    lines = text.split("\n")
    lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    first = start - 1 if length else start
    return "".join(lines[first:first + length])


def test_a_crlf_mail_reads_like_the_lf_one(history, tmp_path):
    folder = history_patches(history, tmp_path)
    original = read_series(folder).patches[15]
    crlf = parse_patch(original.name, original.data.replace(b"\n", b"\r\n"))
    assert crlf.crlf and not original.crlf
    assert (crlf.subject, crlf.body, crlf.author) == (original.subject, original.body,
                                                       original.author)
    assert crlf.hunks == original.hunks
    assert crlf.data == original.data.replace(b"\n", b"\r\n")


def test_a_quilt_folder_follows_its_series_file(history, tmp_path):
    quilt = tmp_path / "debian" / "patches"
    mails = history.format_patch(tmp_path / "mails", *OLLAMA_OPTIONS)
    (quilt / "fixes").mkdir(parents=True)
    shutil.copy(mails[2], quilt / "fixes" / "third.patch")
    shutil.copy(mails[0], quilt / "first.patch")
    plain = history.git("diff", "base~0", "HEAD", "--", "src/graph.cpp")
    (quilt / "graph.diff").write_bytes(b"Description: the graph, as a plain diff\n"
                                       b"Author: Deb Ian <deb@example.org>\n---\n" + plain)
    listing = (b"# applied in this order\nfirst.patch\n\nfixes/third.patch -p1 # a comment\n"
               b"graph.diff\n")
    (quilt / "series").write_bytes(listing)
    (quilt / "unlisted.patch").write_bytes(mails[1].read_bytes())
    series = read_series(quilt)
    assert series.kind == "quilt"
    assert [p.name for p in series.patches] == ["first.patch", "fixes/third.patch", "graph.diff"]
    graph = series.patches[2]
    assert not graph.commit and graph.subject == "the graph, as a plain diff"
    assert graph.author == "Deb Ian <deb@example.org>"
    assert [f.path for f in graph.files] == ["src/graph.cpp"]
    written = series.write(tmp_path / "copy")
    assert {p.relative_to(tmp_path / "copy").as_posix(): p.read_bytes() for p in written} == {
        name: (quilt / name).read_bytes()
        for name in ["first.patch", "fixes/third.patch", "graph.diff", "series"]}


@pytest.mark.parametrize("end", ["---\n", "\n"])
def test_a_dep3_description_is_a_synopsis_and_a_long_description(end):
    """DEP-3: the Description's first line is the subject, its continuation lines (one space
    in, ` .` an empty line) the message; the `---` that may end the header is neither."""
    data = (b"Description: make the graph louder\n Longer text.\n .\n A second paragraph.\n"
            b"Author: Deb Ian <deb@example.org>\nForwarded: no\n" + end.encode()
            + b"--- a/src/graph.cpp\n+++ b/src/graph.cpp\n@@ -1 +1 @@\n-a\n+b\n")
    patch = parse_patch("louder.patch", data)
    assert patch.subject == "make the graph louder"
    assert patch.body == "Longer text.\n\nA second paragraph."
    assert patch.author == "Deb Ian <deb@example.org>" and patch.data == data
    short = parse_patch("short.patch", data.replace(
        b" Longer text.\n .\n A second paragraph.\n", b""))
    assert (short.subject, short.body) == ("make the graph louder", "")


def test_a_dep3_subject_is_read_as_a_description_is():
    data = (b"Subject: make the graph louder\n Longer text.\n .\n A second paragraph.\n"
            b"Author: Deb Ian <deb@example.org>\n\n"
            b"--- a/src/graph.cpp\n+++ b/src/graph.cpp\n@@ -1 +1 @@\n-a\n+b\n")
    patch = parse_patch("louder.patch", data)
    assert (patch.subject, patch.body) == ("make the graph louder",
                                           "Longer text.\n\nA second paragraph.")


GRAPH_DIFF = b"--- a/src/graph.cpp\n+++ b/src/graph.cpp\n@@ -1 +1 @@\n-a\n+b\n"
QUILT_INDEX = b"Index: src/graph.cpp\n" + b"=" * 67 + b"\n"


def test_a_dep3_header_after_a_leading_blank_line_is_read():
    patch = parse_patch("x.patch", b"\nDescription: louder\nAuthor: Deb <d@e.org>\n\n"
                        + GRAPH_DIFF)
    assert (patch.subject, patch.body, patch.author) == ("louder", "", "Deb <d@e.org>")


@pytest.mark.parametrize("gap", [b"", b"\n"])
def test_quilts_index_lines_are_the_diffs_not_the_message(gap):
    """quilt writes `Index:` and a rule of `=` before each file; with or without a blank
    line after the DEP-3 header, they are no header field and no part of the message."""
    patch = parse_patch("x.patch", b"Description: louder\nAuthor: Deb <d@e.org>\n" + gap
                        + QUILT_INDEX + GRAPH_DIFF)
    assert (patch.subject, patch.body, patch.author) == ("louder", "", "Deb <d@e.org>")
    assert [f.path for f in patch.files] == ["src/graph.cpp"]


def test_a_plain_diffs_own_diff_line_is_no_part_of_its_message():
    patch = parse_patch("x.diff", b"Why it is louder.\n\ndiff -Naur a/src/graph.cpp "
                        b"b/src/graph.cpp\n" + GRAPH_DIFF)
    assert patch.body == "Why it is louder."


def test_free_text_after_the_dashes_that_end_a_dep3_header_is_no_part_of_the_message():
    patch = parse_patch("x.patch", b"Description: louder\n Because.\nAuthor: Deb <d@e.org>\n"
                        b"---\nNotes for whoever reads the file.\n\n" + GRAPH_DIFF)
    assert (patch.subject, patch.body) == ("louder", "Because.")


def test_a_mails_message_ends_at_its_first_dashes_as_git_am_reads_it():
    diff = b"--- a/src/graph.cpp\n+++ b/src/graph.cpp\n@@ -1 +1 @@\n-a\n+b\n"
    bare = parse_patch("x.patch", b"From: A <a@example.org>\nSubject: [PATCH] x\n\n---\n"
                       + diff)
    assert bare.body == "" and bare.subject == "x"
    noted = parse_patch("y.patch", b"From: A <a@example.org>\nSubject: [PATCH] y\n\nWhy.\n"
                        b"---\nA note for the reviewer.\n\n" + diff)
    assert noted.body == "Why."


def test_quilt_strip_levels_name_tree_paths(history, tmp_path):
    quilt = tmp_path / "q"
    quilt.mkdir()
    diff = history.git("diff", "--no-prefix", "base", "HEAD", "--", "src/graph.cpp")
    (quilt / "p0.diff").write_bytes(diff)
    (quilt / "series").write_text("p0.diff -p0\n")
    patch = read_series(quilt).patches[0]
    assert patch.strip == 0 and [f.path for f in patch.files] == ["src/graph.cpp"]


def test_a_plain_diff_patches_one_file_whatever_its_two_names():
    """Without git's header, `--- x.c.orig` / `+++ x.c` is no rename: GNU patch patches x.c."""
    patch = parse_patch("orig.diff", b"--- src/x.c.orig\t2020-01-01\n+++ src/x.c\t2020-01-02\n"
                        b"@@ -1 +1 @@\n-a\n+b\n", strip=0)
    (f,) = patch.files
    assert (f.status, f.old_path, f.new_path, f.git) == ("modified", "src/x.c", "src/x.c", False)


def test_plain_diffs_make_a_plain_series(history, tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "01-graph.diff").write_bytes(history.git("diff", "base", "HEAD", "--",
                                                       "src/graph.cpp"))
    (folder / "02-llama.diff").write_bytes(history.git("diff", "base", "HEAD", "--",
                                                       "src/llama.cpp"))
    (folder / "README").write_text("not a patch\n")
    series = read_series(folder)
    assert series.kind == "plain"
    assert [(p.name, p.subject, p.author) for p in series.patches] == [
        ("01-graph.diff", "", None), ("02-llama.diff", "", None)]
    assert not series.conventions.numbered_names


def test_binary_patches_are_reported_not_parsed(tmp_path):
    repo = GitRepo(tmp_path / "repo")
    repo.root.mkdir()
    repo.git("init", "-q", ".")
    repo.commit("initial", {"a.cpp": cpp("a", 2)})
    repo.git("tag", "base")
    repo.commit("a blob", {"model.bin": bytes(range(256)) * 4, "a.cpp": cpp("a", 3)})
    for options in (["--binary"], ["--no-binary"]):
        out = tmp_path / options[0]
        (mail,) = repo.format_patch(out, *options)
        patch = parse_patch(mail.name, mail.read_bytes())
        binary = next(f for f in patch.files if f.path == "model.bin")
        assert binary.binary and not binary.hunks
        assert [f.path for f in patch.files if not f.binary] == ["a.cpp"]


@pytest.mark.parametrize("content,message", [
    (b"", "empty patch"),
    (b"   \n\n", "empty patch"),
    (b"\x00\xff garbage \x89PNG\r\n", "no diff in it"),
    (b"From: someone\nSubject: [PATCH] words only\n\nno diff here\n", "no diff in it"),
    (b"--- a/x.c\n+++ b/x.c\n@@ -1,3 +1,3 @@\n a\n-b\n", "malformed diff"),
    (b"--- a/x.c\n+++ b/x.c\n@@ -1,2 +1,2 @@\n a\n?b\n", "malformed diff"),
])
def test_hostile_patch_files_are_one_line_errors(tmp_path, content, message):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "0001-bad.patch").write_bytes(content)
    with pytest.raises(PortkitError) as err:
        read_series(folder)
    assert message in err.value.message and "0001-bad.patch" in err.value.message
    assert "\n" not in err.value.message


@pytest.mark.parametrize("listing,message", [
    ("../outside.patch\n", "outside the series folder"),
    ("/etc/passwd\n", "outside the series folder"),
    ("link.patch\n", "outside the series folder"),
    ("missing.patch\n", "does not exist"),
    ("ok.patch -R\n", "unsupported option -R"),
])
def test_hostile_quilt_series_files_are_one_line_errors(history, tmp_path, listing, message):
    (tmp_path / "outside.patch").write_bytes(b"")
    folder = tmp_path / "q"
    folder.mkdir()
    (folder / "link.patch").symlink_to(tmp_path / "outside.patch")
    shutil.copy(history_patches(history, tmp_path)
                / sorted(os.listdir(tmp_path / "patches"))[0], folder / "ok.patch")
    (folder / "series").write_text(listing)
    with pytest.raises(PortkitError) as err:
        read_series(folder)
    assert message in err.value.message and str(folder / "series") in err.value.message


def test_a_folder_without_patches_is_an_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(PortkitError, match="no patches"):
        read_series(tmp_path)
    with pytest.raises(PortkitError, match="not a patch series folder"):
        read_series(tmp_path / "nowhere")


def test_portkit_conventions_reproduce_the_committed_series():
    """MailPatch.render stays what it was: the committed series re-render byte for byte."""
    series = read_series(COMMITTED)
    assert series.conventions.style == "portkit"
    assert series.conventions.signature == PORTKIT.signature
    total = len(series.patches)
    for n, patch in enumerate(series.patches, 1):
        assert patch.author is not None and patch.date is not None
        made = new_patch(series.conventions, subject=patch.subject, body=patch.body,
                         author=patch.author, date=patch.date, diff=patch.diff, number=n,
                         total=total)
        assert made.data == patch.data and made.name == patch.name
        legacy = MailPatch(patch.subject, patch.body, patch.diff, patch.author, patch.date)
        assert legacy.render(n, total).encode() == patch.data
        assert file_name(n, patch.subject) == patch.name


def test_format_patch_names_follow_git(tmp_path):
    repo = GitRepo(tmp_path / "repo")
    repo.root.mkdir()
    repo.git("init", "-q", ".")
    repo.commit("initial", {"a.cpp": cpp("a", 2)})
    repo.git("tag", "base")
    subjects = ["fix: the...dots..and--dashes", "  leading spaces and trailing dots...",
                "x" * 51 + " y", "x" * 52 + "-" + "y", "ümlaut [tag] (paren) a_b", "..."]
    for i, subject in enumerate(subjects):
        repo.commit(subject, {"a.cpp": cpp("a", 3 + i)})
    written = repo.format_patch(tmp_path / "out")
    assert [p.name for p in written] == [format_patch_name(n, s)
                                         for n, s in enumerate(subjects, 1)]


def test_a_new_patch_in_ollama_style_reads_back(tmp_path):
    diff = ("diff --git a/src/x.cpp b/src/x.cpp\nindex 1111111..2222222 100644\n"
            "--- a/src/x.cpp\n+++ b/src/x.cpp\n@@ -1,2 +1,3 @@\n int a;\n+int b;\n int c;\n")
    patch = new_patch(OLLAMA, subject="add b", body="Why b.", author="Me <me@example.com>",
                      date="Tue, 8 Apr 2025 15:34:37 -0700", diff=diff, number=27)
    assert patch.name == "0027-add-b.patch"
    assert patch.subject == "add b" and patch.body == "Why b." and patch.diff == diff
    assert patch.commit == "0" * 40 and patch.total is None and patch.signature is None
    assert patch.text.startswith("From 0000000000000000000000000000000000000000 Mon Sep 17 ")
    assert "Subject: [PATCH] add b\n" in patch.text
    assert Series(tmp_path, "format-patch", (patch,), OLLAMA).write(tmp_path / "o")[0] \
        .read_bytes() == patch.data


def test_the_40_patch_fork_series_reads_and_writes_back_byte_for_byte(tmp_path):
    source = Path(__file__).parent / "data" / "fork-series" / "series"
    series = read_series(source)
    assert len(series.patches) == 40
    assert series.conventions.numbered is False and series.conventions.zero_commit
    assert series.conventions.signature is None
    written = series.write(tmp_path)
    assert [p.name for p in written] == sorted(p.name for p in source.glob("*.patch"))
    assert all(p.read_bytes() == (source / p.name).read_bytes() for p in written)


# -- lenient reading of real series (issue 17) and writing back (issue 19) --------------------


DIFF = (b"diff --git a/src/x.c b/src/x.c\nindex 1111111..2222222 100644\n--- a/src/x.c\n"
        b"+++ b/src/x.c\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n")


def a_mail(sender: bytes | None, subject: bytes | None, date: bytes = b"Tue, 8 Apr 2025 "
           b"15:34:37 -0700") -> bytes:
    head = b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
    head += b"From: " + sender + b"\n" if sender is not None else b""
    head += b"Date: " + date + b"\n"
    head += b"Subject: [PATCH] " + subject + b"\n" if subject is not None else b""
    stat = b" src/x.c | 2 +-\n 1 file changed, 1 insertion(+), 1 deletion(-)\n"
    return head + b"\nWhy.\n---\n" + stat + b"\n" + DIFF


@pytest.mark.parametrize("sender,author", [
    (b"nobody <>", "nobody <>"),
    (b"<bare@example.org>", "<bare@example.org>"),
    (b"bare@example.org", "bare@example.org"),
    (b"Just A Name", "Just A Name"),
    (b"Jos\xc3\xa9 M\xc3\xbcller <jose@example.com>", "José Müller <jose@example.com>"),
])
def test_any_from_is_read_and_written_back(sender, author):
    patch = parse_patch("0001-x.patch", a_mail(sender, b"x"))
    assert patch.author == author and patch.is_mail
    again = patch.with_diff(DIFF.decode().replace("+c", "+d"))
    assert again.author == author
    assert again.data == patch.data.replace(b"+c", b"+d")
    mail = new_patch(OLLAMA, subject="x", body="", author=author, date=patch.date or "",
                     diff=DIFF.decode())
    assert mail.author is not None


def test_a_mail_without_subject_is_named_by_its_file():
    patch = parse_patch("0007-ggml-No-alloc-mode.patch", a_mail(b"nobody <>", None))
    assert patch.subject == "ggml No alloc mode"


@pytest.mark.parametrize("date", [b"yesterday", b"", b"Tue, 8 Apr 2025 15:34:37 +9999"])
def test_odd_dates_are_kept_as_they_are(date):
    patch = parse_patch("0001-x.patch", a_mail(b"nobody <>", b"x", date))
    assert patch.with_diff(patch.diff).data == patch.data


def test_a_crlf_mail_is_read_and_written_back_with_crlf():
    data = a_mail(b"nobody <>", b"crlf").replace(b"\n", b"\r\n")
    patch = parse_patch("0001-crlf.patch", data)
    assert patch.crlf and patch.subject == "crlf" and patch.files[0].path == "src/x.c"
    assert patch.with_diff(patch.diff).data == data


def test_an_unreadable_patch_is_its_own_verdict_not_the_series_refusal(tmp_path):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "0001-good.patch").write_bytes(a_mail(b"nobody <>", b"good"))
    (folder / "0002-cover.patch").write_bytes(b"From: someone\nSubject: words only\n\nhi\n")
    (folder / "0003-evil.patch").write_bytes(DIFF.replace(b"src/x.c", b".git/config"))
    (folder / "0004-also-good.patch").write_bytes(a_mail(b"nobody <>", b"also good"))
    with pytest.raises(PortkitError, match="0002-cover.patch: no diff in it") as err:
        read_series(folder)
    assert err.value.exit_code == 12
    series = read_series(folder, lenient=True)
    assert [p.name for p in series.patches] == ["0001-good.patch", "0004-also-good.patch"]
    assert [(u.name, u.position) for u in series.unreadable] == [
        ("0002-cover.patch", 1), ("0003-evil.patch", 2)]
    assert "no diff in it" in series.unreadable[0].reason
    assert "refusing .git/config" in series.unreadable[1].reason
    assert [p.name for p in series.in_order()] == sorted(os.listdir(folder))
    series.write(tmp_path / "back")
    assert {p.name: p.read_bytes() for p in (tmp_path / "back").iterdir()} == {
        p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("options", [[], ["--subject-prefix=RFC PATCH", "-v2"]],
                         ids=["plain", "rfc-v2"])
def test_a_cover_letter_is_kept_in_its_place_not_read_as_a_patch(history, tmp_path, options):
    """git format-patch --cover-letter's first mail has no diff: it is no patch of the
    series and no fault of it either (also when not lenient), and is written back as it
    was, in its place."""
    folder = tmp_path / "s"
    cover, *mails = history.format_patch(folder, "--cover-letter", *options)
    assert b"\ndiff --git " not in cover.read_bytes()
    series = read_series(folder)
    assert [p.name for p in series.patches] == [m.name for m in mails]
    (kept,) = series.unreadable
    assert kept.cover and (kept.name, kept.position) == (cover.name, 0)
    assert [p.name for p in series.in_order()] == [cover.name, *(m.name for m in mails)]
    series.write(tmp_path / "back")
    assert {p.name: p.read_bytes() for p in (tmp_path / "back").iterdir()} == {
        p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("name, data", [
    ("0002-notes.patch", b"From: a <a@b.c>\nSubject: [PATCH 2/3] notes\n\nno diff\n"),
    ("0000-cover-letter.patch", b"just some notes, not a mail\n")],
    ids=["numbered-not-0", "not-a-mail"])
def test_a_mail_without_a_diff_is_a_cover_letter_only_when_it_is_one(tmp_path, name, data):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "0001-good.patch").write_bytes(a_mail(b"nobody <>", b"good"))
    (folder / name).write_bytes(data)
    with pytest.raises(PortkitError, match="no diff in it"):
        read_series(folder)
    (bad,) = read_series(folder, lenient=True).unreadable
    assert not bad.cover and "no diff in it" in bad.reason


def test_a_folder_with_only_a_cover_letter_has_no_patches(history, tmp_path):
    folder = tmp_path / "s"
    cover, *mails = history.format_patch(folder, "--cover-letter")
    for mail in mails:
        mail.unlink()
    with pytest.raises(PortkitError, match="no patches in it"):
        read_series(folder, lenient=True)


def test_a_raw_byte_in_a_subject_is_kept_when_written_back():
    data = a_mail(b"nobody <>", b"caf\xff bytes").replace(
        b"Subject:", b"MIME-Version: 1.0\nContent-Type: text/plain; charset=UTF-8\nSubject:")
    patch = parse_patch("0001-raw.patch", data)
    again = patch.with_diff(DIFF.decode().replace("+c", "+d"))
    assert b"Subject: [PATCH] caf\xff bytes\n" in again.data and b"=FF" not in again.data
    fresh = new_patch(OLLAMA, subject=patch.subject, body="", author="A <a@b>",
                      date=patch.date or "", diff=DIFF.decode())
    assert b"Subject: [PATCH] caf\xff bytes\n" in fresh.data


def test_each_patch_of_a_mixed_series_keeps_its_own_style():
    plain = parse_patch("0001-x.patch", a_mail(b"nobody <>", b"x"))
    bare = parse_patch("0002-y.patch", re.sub(
        rb"---\n src.*?\n\n", b"\n", a_mail(b"nobody <>", b"y"), flags=re.S).replace(
        b"index 1111111..2222222 100644\n", b""))
    assert plain.conventions.diffstat and plain.conventions.index_lines
    assert not bare.conventions.diffstat and not bare.conventions.index_lines
    changed = DIFF.decode().replace(" a\n", " a\n+new\n").replace("-1,2 +1,2", "-1,2 +1,3")
    kept = plain.with_diff(changed)
    assert kept.stat == " src/x.c | 3 ++-\n 1 file changed, 2 insertions(+), 1 deletion(-)\n"
    assert kept.files[0].header("index") == "1111111..2222222 100644"
    assert bare.with_diff(changed).stat is None
    assert bare.with_diff(changed).files[0].header("index") is None


def test_git_diff_quotes_unusual_paths_as_git_does(tmp_path):
    """A path with non-ASCII bytes is C-quoted in every line git writes it on (git's
    default, core.quotePath): portkit's diff of the change is git's own, byte for byte."""
    repo = GitRepo(tmp_path / "repo")
    repo.root.mkdir()
    repo.git("init", "-q", "-b", "main", ".")
    before = {"src/tést.c": b"int a;\n" * 8, "src/gönë.h": b"#pragma once\n" + b"int b;\n" * 8}
    repo.commit("before", dict(before))
    after = {"src/tést.c": b"int a;\n" * 7 + b"int c;\n", "src/gönë.h": None,
             "src/nëw.h": b"#pragma once\n" + b"int b;\n" * 8}
    repo.commit("after", dict(after))
    for renames in (False, True):
        expected = repo.git("diff", "-M" if renames else "--no-renames", "HEAD~1", "HEAD")
        made = git_diff(before, after, renames=renames)
        assert made.encode("utf-8", "surrogateescape") == expected
        assert '"a/src/t\\303\\251st.c"' in made


def test_git_diff_names_paths_holding_a_side_prefix_as_git_does(tmp_path):
    """A path with a space before `a/` or `b/` in it (`docs/x a/y.c`) is split on the
    `diff --git` line as git wrote it: both names whole, a/ and b/ only in front of them,
    with and without prefixes."""
    repo = GitRepo(tmp_path / "repo")
    repo.root.mkdir()
    repo.git("init", "-q", "-b", "main", ".")
    before = {"docs/x a/y.c": b"int a;\n" * 8, "n b/m.h": b"int b;\n" * 8}
    repo.commit("before", dict(before))
    after = {"docs/x a/y.c": b"int a;\n" * 7 + b"int c;\n", "n b/m.h": None,
             "t b/a b/n.h": b"int n;\n"}
    repo.commit("after", dict(after))
    expected = repo.git("diff", "--no-renames", "HEAD~1", "HEAD").decode()
    assert git_diff(before, after) == expected
    bare = repo.git("diff", "--no-renames", "--no-prefix", "HEAD~1", "HEAD").decode()
    assert git_diff(before, after, prefix=False) == bare


def test_a_git_patch_of_paths_holding_a_side_prefix_reads_whole(tmp_path):
    """git's own patch of files whose names hold ` b/` (changed, created, mode changed, one
    C-quoted too) reads with each file's whole path, its text as it was."""
    repo = GitRepo(tmp_path / "repo")
    repo.root.mkdir()
    repo.git("init", "-q", "-b", "main", ".")
    repo.commit("before", {"src/x b/z.c": b"int a;\n", "tool b/run.sh": b"echo\n",
                           "src/t\u00e9st b/q.c": b"int q;\n"})
    repo.git("update-index", "--chmod=+x", "tool b/run.sh")
    repo.commit("after", {"src/x b/z.c": b"int b;\n", "n b/m.h": b"int m;\n",
                          "src/t\u00e9st b/q.c": b"int r;\n"})
    text = repo.git("diff", "HEAD~1", "HEAD")
    patch = parse_patch("0001-spaces.patch", text)
    assert sorted((f.status, f.path) for f in patch.files) == [
        ("created", "n b/m.h"), ("modified", "src/t\u00e9st b/q.c"), ("modified", "src/x b/z.c"),
        ("modified", "tool b/run.sh")]
    assert patch.diff.encode() == text


@pytest.mark.parametrize("stamp", ["1970-01-01 00:00:00.000000000 +0000",
                                   "1969-12-31 16:00:00.000000000 -0800"])
def test_diff_n_marks_an_absent_file_by_the_epoch_as_gnu_patch_reads_it(stamp):
    """`diff -ruN` writes a deleted file's new side (a created file's old side) with the
    Epoch as its time, in the writer's zone: the file is deleted (created), not emptied."""
    gone = parse_patch("gone.diff", f"diff -ruN a/src/x.h b/src/x.h\n"
                       f"--- a/src/x.h\t2025-01-01 10:00:00.000000000 +0100\n"
                       f"+++ b/src/x.h\t{stamp}\n@@ -1,2 +0,0 @@\n-a\n-b\n".encode())
    (f,) = gone.files
    assert (f.status, f.old_path, f.new_path) == ("deleted", "src/x.h", None)
    made = parse_patch("made.diff", f"--- a/src/y.h\t{stamp}\n"
                       f"+++ b/src/y.h\t2025-01-01 10:00:00.000000000 +0100\n"
                       f"@@ -0,0 +1 @@\n+c\n".encode())
    (f,) = made.files
    assert (f.status, f.old_path, f.new_path) == ("created", None, "src/y.h")
    emptied = parse_patch("emptied.diff", b"--- a/src/x.h\t2025-01-01 10:00:00 +0100\n"
                          b"+++ b/src/x.h\t2025-01-02 10:00:00 +0100\n@@ -1,2 +0,0 @@\n-a\n-b\n")
    assert emptied.files[0].status == "modified"  # emptied, as GNU patch leaves it
