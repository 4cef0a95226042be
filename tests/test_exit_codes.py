"""Every failure leaves with its documented code, and none with 1 (docs/exit-codes.md).

The table in docs/exit-codes.md and the classes in portkit/errors.py agree; every `raise` in
portkit/ names one of those classes (read from the source with `ast`, through the helpers
that build the error); each class, raised in a command, leaves with its code; and the
commands that used to exit 1 (`tree fetch bogus:xyz`, a PyPI version that does not exist,
`drift --series /nonexistent`, a checksum mismatch) exit with theirs.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from portkit import errors
from portkit.commands.common import fails_cleanly
from portkit.series import split_author
from portkit.validate import FAIL, PASS, Check, Report

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "portkit"
TABLE = ROOT / "docs" / "exit-codes.md"
PORTKIT = str(Path(sys.executable).with_name("portkit"))

# The only raises of exceptions that are not PortkitErrors, and why each is right.
NOT_PORTKIT_ERRORS = {
    ("portkit/drift/model.py", "_require", "ValueError"):
        "a value check of the report's constructors; the reader turns it into an InputError "
        "naming the place, from portkit's own code it is a bug (70)",
    ("portkit/series.py", "_quilt_names", "ValueError"):
        "caught by _quilt_entries and raised again as an InputError",
    ("portkit/rebase/report.py", "__post_init__", "ValueError"):
        "guards portkit's own status values: a bug, exit 70",
    ("portkit/cache.py", "_raise_on_sigterm", "SystemExit"):
        "SIGTERM as exit 143 (128+N) where no command installed its handler",
    ("portkit/commands/common.py", "exit_for", "exc"):
        "passes click's own exits and SystemExit through, and a bug's traceback under "
        "PORTKIT_DEBUG=1",
}


def error_classes() -> dict[str, type[errors.PortkitError]]:
    return {name: cls for name, cls in vars(errors).items()
            if isinstance(cls, type) and issubclass(cls, errors.PortkitError)}


def code_of(cls: type[errors.PortkitError]) -> str:
    return "128+N" if cls is errors.Interrupted else str(cls.exit_code)


def documented() -> list[tuple[str, str, str]]:
    """(code, class or -, meaning) of each row of the table in docs/exit-codes.md."""
    rows = []
    for line in TABLE.read_text().splitlines():
        m = re.fullmatch(r"\| (\d+|128\+N) \| (`\w+`|-) \| (.+) \|", line)
        if m:
            rows.append((m.group(1), m.group(2).strip("`"), m.group(3)))
    return rows


# -- the table and errors.py ------------------------------------------------------------


def test_the_table_and_errors_py_agree():
    rows = documented()
    by_class = {cls: code for code, cls, _ in rows if cls != "-"}
    classes = error_classes()
    assert set(by_class) == set(classes), "every class has its row, every row its class"
    for name, cls in classes.items():
        assert by_class[name] == code_of(cls), name
    codes = [code for code, _, _ in rows]
    assert "1" not in codes and all(cls.exit_code != 1 for cls in classes.values())
    assert {"0", "20", "70", "128+N"} <= set(codes)
    # One code, one meaning: only a subclass may share its parent's code (GitMissing is a
    # ToolMissing), each on a row of its own.
    for a, ca in classes.items():
        for b, cb in classes.items():
            if a < b and code_of(ca) == code_of(cb):
                assert issubclass(ca, cb) or issubclass(cb, ca), (a, b)
    # The base class is not a kind of failure: raised as it is, it is a bug.
    assert errors.PortkitError.exit_code == 70


def test_the_readme_lists_every_code():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("listed in [docs/exit-codes.md](docs/exit-codes.md):")
    sentence = " ".join(readme[start:readme.index("\n\n", start)].split())
    for code, _, _ in documented():
        if code != "0":
            assert re.search(rf"(?<![\d+]){re.escape(code)} ", sentence), code
    assert "no command exits 1" in sentence
    assert not re.search(r"(?<![\d+])1 ", sentence.replace("exits 1.", ""))


# -- every raise site -------------------------------------------------------------------


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), str(path))


def functions() -> dict[str, list[ast.FunctionDef]]:
    """Every function and method of the package by name (helpers that build an error)."""
    out: dict[str, list[ast.FunctionDef]] = {}
    for _, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                out.setdefault(node.name, []).append(node)
    return out


def called_name(node: ast.expr) -> str | None:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


def built_by(name: str, defs: dict[str, list[ast.FunctionDef]]) -> set[str]:
    """The classes the helper `name` returns (each `return Class(...)` in its body)."""
    found: set[str] = set()
    for fn in defs.get(name, []):
        for node in ast.walk(fn):
            if isinstance(node, ast.Return) and node.value is not None:
                made = called_name(node.value)
                assert made is not None and made in error_classes(), (
                    f"{name} returns {ast.unparse(node.value)[:60]}: not an error class")
                found.add(made)
    return found


class _Raises(ast.NodeVisitor):
    """Every raise of a module with its innermost enclosing function."""

    def __init__(self) -> None:
        self.owner = ["<module>"]
        self.found: list[tuple[int, str, ast.expr]] = []

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.owner.append(node.name)
        self.generic_visit(node)
        self.owner.pop()

    def visit_Raise(self, node: ast.Raise) -> None:
        if node.exc is not None:  # a bare `raise` re-raises what an except clause holds
            self.found.append((node.lineno, self.owner[-1], node.exc))
        self.generic_visit(node)


def raise_sites() -> list[tuple[str, int, str, str]]:
    """(file, line, enclosing function, class) of every raise in portkit/, a helper that
    builds the error (`raise self.bad(...)`, `raise report.failure()`) resolved to the
    classes it builds."""
    defs = functions()
    classes = error_classes()
    sites = []
    for rel, tree in modules():
        walker = _Raises()
        walker.visit(tree)
        for line, owner, exc in walker.found:
            name = called_name(exc)
            assert name is not None, f"{rel}:{line}: raise {ast.unparse(exc)}"
            if name in classes or (rel, owner, name) in NOT_PORTKIT_ERRORS or name not in defs:
                sites.append((rel, line, owner, name))
            else:
                sites += [(rel, line, owner, made) for made in sorted(built_by(name, defs))]
    return sites


def test_every_raise_names_a_documented_kind_of_failure():
    classes = error_classes()
    table = {cls: code for code, cls, _ in documented()}
    sites = raise_sites()
    # the walk finds every raise there is (about 190): each line that starts with one
    lines = {(path.relative_to(ROOT).as_posix(), number)
             for path in PACKAGE.rglob("*.py")
             for number, text in enumerate(path.read_text().splitlines(), 1)
             if re.match(r"\s*raise \S", text)}
    assert {(rel, line) for rel, line, _, _ in sites} == lines and len(lines) > 150
    allowed_seen = set()
    wrong = []
    for rel, line, owner, name in sites:
        if (rel, owner, name) in NOT_PORTKIT_ERRORS:
            allowed_seen.add((rel, owner, name))
            continue
        cls = classes.get(name)
        if cls is None or cls is errors.PortkitError or cls.exit_code == 1 \
                or table.get(name) != code_of(cls):
            wrong.append(f"{rel}:{line} ({owner}): raise {name}")
    assert not wrong, "\n".join(wrong)
    assert allowed_seen == set(NOT_PORTKIT_ERRORS), "an allowance that no longer applies"
    used = {name for _, _, _, name in sites}
    assert {"ChecksumError", "SpecError", "InputError", "ToolFailed", "FetchError",
            "ValidationFailed"} <= used  # the kinds that 1 used to hide are raised


def test_the_allowed_value_errors_are_turned_into_input_errors():
    for rel, _, name in NOT_PORTKIT_ERRORS:
        if name != "ValueError" or rel == "portkit/rebase/report.py":
            continue
        tree = ast.parse((ROOT / rel).read_text())
        handlers = [h for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler)
                    and h.type is not None and "ValueError" in ast.unparse(h.type)]
        raised = {called_name(r.exc) for h in handlers for r in ast.walk(h)
                  if isinstance(r, ast.Raise) and r.exc is not None}
        assert "InputError" in raised, rel


def test_no_failure_is_made_or_exits_without_its_kind():
    for rel, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and called_name(node) == "PortkitError":
                pytest.fail(f"{rel}:{node.lineno}: PortkitError(...) has no kind")
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.exit" \
                    and node.args and isinstance(node.args[0], ast.Constant):
                assert node.args[0].value in (0, 70), f"{rel}:{node.lineno}: {ast.unparse(node)}"
            if isinstance(node, ast.Assign) and ast.unparse(node) == "exit_code = 1":
                pytest.fail(f"{rel}:{node.lineno}: exit_code = 1")


# -- each class, raised in a command ----------------------------------------------------


def run_failing(exc: BaseException) -> tuple[int, str]:
    @click.command()
    @fails_cleanly
    def failing() -> None:
        raise exc

    result = CliRunner().invoke(failing, [])
    return result.exit_code, result.output


@pytest.mark.parametrize("name", sorted(error_classes()))
def test_every_error_class_leaves_with_its_code(name):
    cls = error_classes()[name]
    exc = cls() if cls is errors.Interrupted else cls(f"a {name} for the test")
    code, output = run_failing(exc)
    assert code == exc.exit_code != 1
    assert output.startswith("portkit: ") and output.count("\n") == 1
    if cls is errors.PortkitError:
        assert code == 70 and "internal error" in output


def test_an_os_error_is_a_file_error_and_a_bug_is_70():
    code, output = run_failing(OSError(28, "No space left on device", "/x/y"))
    assert (code, output) == (errors.FileError.exit_code, "portkit: No space left on device: "
                                                          "/x/y\n")
    assert code == 13
    code, output = run_failing(PermissionError(13, "Permission denied"))
    assert (code, output) == (13, "portkit: Permission denied\n")
    code, output = run_failing(click.FileError("/x/z", "gone"))
    assert code == 13 and output.startswith("portkit: ") and output.count("\n") == 1
    code, output = run_failing(KeyError("x"))
    assert code == 70 and output.startswith("portkit: internal error (KeyError")


def test_a_failed_validation_check_is_21_naming_the_check():
    checks = [Check("a", "rotation off is a no-op", PASS),
              Check("d", "context shift of a rotated cache", FAIL)]
    report = Report("/t", None, "quick", ["smollm2"], checks, {}, None)
    failure = report.failure()
    assert isinstance(failure, errors.ValidationFailed) and failure.exit_code == 21
    assert failure.message == ("validation failed: check d (context shift of a rotated cache) "
                               "of /t")
    assert run_failing(failure) == (21, f"portkit: {failure.message}\n")


def test_any_author_is_kept_as_it_is_not_refused():
    """Real series carry `nobody <>` and names without an address: kept, never a refusal."""
    assert split_author("nobody at all") == ("nobody at all", "")
    assert split_author("nobody <>") == ("nobody", "")


# -- the commands that used to exit 1 ---------------------------------------------------


def portkit(*args: str, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PORTKIT_", "PIP_"))}
    environ.update(PORTKIT_CACHE=str(cache), **env)
    return subprocess.run([PORTKIT, *args], capture_output=True, text=True, env=environ,
                          timeout=300, check=False)


def one_line(run: subprocess.CompletedProcess[str], code: int, start: str) -> None:
    lines = [ln for ln in run.stderr.splitlines()
             if not ln.startswith("portkit: downloading ")]
    assert run.returncode == code, run.stderr
    assert len(lines) == 1 and lines[0].startswith(f"portkit: {start}"), run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""


def test_an_unknown_tree_spec_is_9(tmp_path):
    run = portkit("tree", "fetch", "bogus:xyz", cache=tmp_path)
    one_line(run, errors.SpecError.exit_code, "unknown tree spec: bogus:xyz")
    assert run.returncode == 9


def offline_pip(tmp_path: Path) -> dict[str, str]:
    """pip with no index but an empty folder of links, and no configuration: a real pip run
    that finds nothing, without the network."""
    links = tmp_path / "links"
    links.mkdir()
    return {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)}


def test_a_pypi_version_the_index_does_not_have_is_9_offline(tmp_path):
    run = portkit("tree", "fetch", "pypi:llama-cpp-python==9.9.9", cache=tmp_path / "cache",
                  **offline_pip(tmp_path))
    one_line(run, errors.SpecError.exit_code, "llama-cpp-python==9.9.9 (source distribution) "
                                              "from PyPI: no such distribution")
    assert "No matching distribution found for llama-cpp-python==9.9.9" in run.stderr
    assert not list((tmp_path / "cache" / "sdists").iterdir())


def test_an_index_that_does_not_answer_is_15_not_9(tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    run = portkit("tree", "fetch", "pypi:llama-cpp-python==9.9.9", cache=tmp_path / "cache",
                  PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL="http://127.0.0.1:9/simple",
                  PIP_RETRIES="1", PIP_FIND_LINKS=str(links))
    one_line(run, errors.FetchError.exit_code, "cannot download llama-cpp-python==9.9.9")
    assert run.returncode == 15


@pytest.mark.slow
def test_a_pypi_version_that_does_not_exist_is_9(tmp_path):
    """The same against PyPI itself, with the machine's own pip configuration."""
    environ = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    run = portkit("tree", "fetch", "pypi:llama-cpp-python==9.9.9", cache=tmp_path, **environ)
    one_line(run, errors.SpecError.exit_code, "llama-cpp-python==9.9.9 (source distribution) "
                                              "from PyPI: no such distribution")


def test_drift_with_a_series_that_does_not_exist_is_12(fixture_tree, tmp_path):
    old, renamed = fixture_tree("old"), fixture_tree("renamed")
    run = portkit("drift", "--series", "/nonexistent", "--tree", str(renamed), "--base", str(old),
                  cache=tmp_path / "cache")
    one_line(run, errors.InputError.exit_code, "/nonexistent: ")
    assert run.returncode == 12


def test_drift_from_a_saved_report_that_does_not_exist_is_12(tmp_path):
    path = tmp_path / "report.json"
    run = portkit("drift", "--from-json", str(path), cache=tmp_path / "cache")
    one_line(run, errors.InputError.exit_code, f"--from-json {path} cannot be read: ")


def test_a_checksum_mismatch_is_8(tmp_path):
    cache = tmp_path / "cache"
    sdists = cache / "sdists"
    sdists.mkdir(parents=True)
    # 0.3.17's sha256 is in portkit/data/sources.toml: these bytes are not it
    known = sdists / "llama_cpp_python-0.3.17.tar.gz"
    known.write_bytes(b"not the sdist of llama-cpp-python 0.3.17\n")
    run = portkit("tree", "fetch", "pypi:llama-cpp-python==0.3.17", cache=cache)
    one_line(run, errors.ChecksumError.exit_code, "checksum mismatch for "
                                                  "llama_cpp_python-0.3.17.tar.gz: got ")
    assert "39c31948d234ff351bf638f1e468d893dd29282dd4d47716a39c6a0a1e63b123" in run.stderr
    assert not known.exists()
    # a version that sources.toml does not list: checked against its first download's record
    unlisted = sdists / "llama_cpp_python-9.9.8.tar.gz"
    unlisted.write_bytes(b"a download that changed\n")
    (sdists / "llama_cpp_python-9.9.8.tar.gz.sha256").write_text("0" * 64 + "\n")
    run = portkit("tree", "fetch", "pypi:llama-cpp-python==9.9.8", cache=cache)
    one_line(run, errors.ChecksumError.exit_code, "checksum mismatch for "
                                                  "llama_cpp_python-9.9.8.tar.gz: got ")
    assert run.returncode == 8 and not unlisted.exists()


def test_a_git_spec_naming_nothing_is_9_and_an_unreachable_remote_15(tmp_path):
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    cache = tmp_path / "cache"
    run = portkit("tree", "fetch", f"git:{tmp_path}/missing@abc", cache=cache)
    one_line(run, errors.SpecError.exit_code, f"cannot fetch abc from {tmp_path}/missing: "
                                              f"repository '{tmp_path}/missing' does not exist")
    run = portkit("tree", "fetch", f"git:{repo}@no-such-rev", cache=cache)
    one_line(run, errors.SpecError.exit_code, f"cannot fetch no-such-rev from {repo}: no such "
                                              "revision")
    run = portkit("tree", "fetch", "git:http://127.0.0.1:9/x.git@abc", cache=cache)
    one_line(run, errors.FetchError.exit_code, "cannot fetch abc from http://127.0.0.1:9/x.git: ")
    assert run.returncode == 15


def test_gitpythons_no_git_program_is_git_missing(capsys):
    """GitPython is loaded only where a git repository is read; its "no git program" is
    still GitMissing's one line and code, not a bug's 70."""
    from git.exc import GitCommandNotFound

    from portkit.commands.common import exit_for
    from portkit.errors import GitMissing

    with pytest.raises(SystemExit) as done:
        exit_for(GitCommandNotFound("git", "not found"))
    assert done.value.code == GitMissing.exit_code != 70
    assert capsys.readouterr().err.strip() == \
        "portkit: git not found: install git, or put it on PATH"
