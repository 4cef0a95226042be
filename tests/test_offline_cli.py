"""What a user sees around an apply: every command knows the tree's record, `apply` says where
the series is kept, and any series applies all or nothing like a feature."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from portkit.cli import cli
from portkit.render import render, write_series
from portkit.tree import detect

from .conftest import tree_bytes


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_after_apply_every_command_knows_the_record(fixture_tree, tmp_path):
    root = fixture_tree("renamed")
    before_anchors = invoke("anchors", "--tree", str(root), "--format", "json")
    applied = invoke("apply", "--force", "--tree", str(root))
    assert applied.exit_code == 0, applied.output
    assert f"the series is kept in {root / '.portkit' / 'kv-rotation'}" in applied.stdout

    info = invoke("tree", "info", str(root))
    assert info.exit_code == 0
    assert "applied:     kv-rotation: 5 patch(es) to 4 file(s)" in info.stdout
    data = json.loads(invoke("tree", "info", str(root), "--format", "json").stdout)
    assert [a["name"] for a in data["applied"]] == ["kv-rotation"]

    anchors = invoke("anchors", "--tree", str(root), "--format", "json")
    assert anchors.exit_code == 0, anchors.output
    assert anchors.stderr.startswith("portkit: kv-rotation is applied by portkit")
    assert json.loads(anchors.stdout)["anchors"] == json.loads(before_anchors.stdout)["anchors"]

    out = tmp_path / "series"
    rendered = invoke("render", "--tree", str(root), "--out", str(out))
    assert rendered.exit_code == 0, rendered.output
    assert "present upstream" not in rendered.stdout
    assert sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in (root / ".portkit" / "kv-rotation").glob("*.patch"))


def test_any_series_applies_all_or_nothing_and_comes_out_again(fixture_tree, tmp_path):
    old = fixture_tree("old")
    series = tmp_path / "my-series"
    write_series(render(detect(old), "kv-rotation"), series)
    target = fixture_tree("old")
    before = tree_bytes(target)
    applied = invoke("apply", "--force", "--tree", str(target), "--series", str(series))
    assert applied.exit_code == 0, applied.output
    assert (target / ".portkit" / "my-series" / "state.json").is_file()
    again = invoke("apply", "--force", "--tree", str(target), "--series", str(series))
    assert "my-series is already applied" in again.stdout
    back = invoke("apply", "--force", "--tree", str(target), "--series", str(series),
                  "--reverse")
    assert back.exit_code == 0, back.output
    assert tree_bytes(target) == before


def test_a_series_that_does_not_apply_names_the_hunk_and_changes_nothing(fixture_tree, tmp_path):
    series = tmp_path / "old-series"
    write_series(render(detect(fixture_tree("old")), "kv-rotation"), series)
    target = fixture_tree("renamed")
    before = tree_bytes(target)
    result = invoke("apply", "--force", "--tree", str(target), "--series", str(series))
    assert result.exit_code == 5
    assert result.stderr.startswith("portkit: the series does not apply: 0001-")
    assert "hunk #" in result.stderr and result.stderr.count("\n") == 1
    assert tree_bytes(target) == before


def test_help_says_the_pin_is_required():
    text = invoke("apply", "--help").stdout
    assert "--pin SHA" in text and "Required (or --force)" in text


def test_paths_in_a_saved_series_are_taken_as_given(tmp_path: Path):
    # a tree path in a series must stay inside the tree: the engine refuses `..`
    series = tmp_path / "evil"
    series.mkdir()
    (series / "0001-x.patch").write_text(
        "--- a/../outside.txt\n+++ b/../outside.txt\n@@ -0,0 +1 @@\n+x\n")
    root = tmp_path / "tree"
    (root / "src").mkdir(parents=True)
    (root / "src" / "llama.cpp").write_text("int x;\n")
    result = invoke("apply", "--force", "--tree", str(root), "--series", str(series))
    assert result.exit_code != 0 and result.stderr.count("\n") == 1
    assert not (tmp_path / "outside.txt").exists()


def test_rebase_writes_the_carried_series_and_reports_every_patch(fixture_tree, tmp_path):
    old = fixture_tree("old")
    series = tmp_path / "series"
    write_series(render(detect(old), "kv-rotation"), series)
    source = {p.name: p.read_bytes() for p in series.iterdir()}
    out = tmp_path / "carried"
    result = invoke("rebase", "--series", str(series), "--base", str(old), "--onto",
                    str(fixture_tree("renamed")), "--out", str(out), "--format", "json")
    assert result.exit_code in (0, 20), result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "portkit-rebase/2"
    assert [p["file"] for p in report["patches"]] == sorted(source)
    written = {p["output"] for p in report["patches"] if p["output"]}
    assert written == {p.name for p in out.glob("*.patch")}
    assert result.exit_code == (20 if any(p["status"] in ("needs-human", "needs-review")
                                          for p in report["patches"]) else 0)
    assert {p.name: p.read_bytes() for p in series.iterdir()} == source  # never modified


def test_rebase_of_a_series_needs_its_base_and_an_out_folder(fixture_tree, tmp_path):
    result = invoke("rebase", "--series", str(tmp_path), "--onto", str(fixture_tree("renamed")))
    assert result.exit_code == 2
    assert result.stderr.startswith("portkit: with --series, give --out DIR")



def test_validate_in_a_fork_whose_subset_cannot_be_built_says_what_it_lacks(fixture_fork):
    fork = fixture_fork("old")  # the fixture vendors ggml's headers, not ggml/src
    before = tree_bytes(fork.root)
    result = invoke("validate", "--tree", str(fork.root), "--published")
    assert result.exit_code == 10, result.output
    lacks = fork.root / "ml" / "backend" / "ggml" / "ggml" / "src" / "CMakeLists.txt"
    assert result.output.endswith(f"it has no CMake project and the vendored subset lacks "
                                  f"{lacks}\n"), result.output
    assert [line for line in result.output.splitlines() if line.startswith("portkit: ")
            and "validate:" not in line] == [result.output.splitlines()[-1]]
    assert tree_bytes(fork.root) == before


def test_the_program_collects_cycles_less_often_and_the_library_leaves_it_alone():
    """portkit the program raises the cyclic collector's thresholds (its symbol tables live
    to the end of a run); imported as a library it changes nothing of the host's."""
    import subprocess
    import sys
    probe = ("import gc, json, sys; before = gc.get_threshold(); {argv}import portkit; "
             "print(json.dumps([before, gc.get_threshold()]))")

    def thresholds(argv: str) -> list[list[int]]:
        out = subprocess.run([sys.executable, "-c", probe.format(argv=argv)],
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)

    assert thresholds("sys.argv = ['/usr/bin/portkit']; ")[1] == [20_000, 20, 20]
    before, after = thresholds("")
    assert before == after
