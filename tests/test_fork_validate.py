"""`portkit apply --pin 49bfddec --validate` inside an ollama-style fork of a real tree.

The fork vendors llama-cpp-python 0.3.17's llama.cpp the way ollama does: a subset under
llama/llama.cpp (src, include, a few files of common, tools/mtmd, vendor) and ggml under
ml/backend/ggml/ggml (include, src, cmake), with no CMake project of llama.cpp's; a
Makefile.sync names the pin, and llama/patches holds the fork's own series (git format-patch
of a branch on the pinned tree), applied to the vendored copy. Validation builds that subset
with portkit's own CMake project, as the fork has it (its own patches included), unpatched
against patched, with upstream's own rotation (0.3.20) as the live reference.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from portkit import tree as tree_mod
from portkit import validate as validate_mod
from portkit.cli import cli
from portkit.errors import ValidationFailed
from portkit.features import Feature
from portkit.tree import OLLAMA

from .conftest import commit_all, git, vendor_as_fork

PIN = "49bfddeca18e62fa3d39114a23e9fcbdf8a22388"
COMMON_FILES = ("common.h", "common.cpp", "log.h", "log.cpp", "sampling.h", "sampling.cpp")


@dataclass(frozen=True)
class OwnPatch:
    """One of the fork's own changes: `old` (once in `file`) becomes `new`."""

    subject: str
    file: str  # relative to the llama.cpp root, ggml/ included
    old: str
    new: str


# The fork's own series: one change in libllama away from the rotation, one in a file the
# rotation patches too, one in ggml. None of them changes what a model computes.
OWN_PATCHES = [
    OwnPatch("llama: name the fork in the system info", "src/llama.cpp",
             "    s.clear(); // Clear the string",
             '    s = "FORK = fixture | "; // Clear the string'),
    OwnPatch("graph: log each input a graph gets", "src/llama-graph.cpp",
             "    inputs.emplace_back(std::move(input));\n",
             "    inputs.emplace_back(std::move(input));\n"
             '    LLAMA_LOG_DEBUG("%s: graph input %zu\\n", __func__, inputs.size());\n'),
    OwnPatch("ggml: the commit string names the fork", "ggml/src/ggml.c",
             "    return GGML_COMMIT;\n", '    return GGML_COMMIT "+fork";\n'),
]


def lay_out_real_fork(llama: Path, dest: Path, upstream: Path) -> Path:
    """An ollama-style fork at `dest` of the llama.cpp tree at `llama`, with OWN_PATCHES as
    its series (git format-patch in `upstream`, a repository of the vendored subset) and
    applied to its vendored copy; the fork is a git repository with everything committed."""
    for part in ("src", "include", "vendor", "tools/mtmd"):
        if (llama / part).is_dir():
            shutil.copytree(llama / part, upstream / part)
    (upstream / "common").mkdir()
    for name in COMMON_FILES:
        shutil.copy2(llama / "common" / name, upstream / "common" / name)
    for part in ("include", "src", "cmake"):
        shutil.copytree(llama / "ggml" / part, upstream / "ggml" / part)
    base = commit_all(upstream, f"llama.cpp {PIN[:12]}, as the fork vendors it")
    git(upstream, "checkout", "--quiet", "-b", "fork")
    for patch in OWN_PATCHES:
        path = upstream / patch.file
        text = path.read_text()
        assert text.count(patch.old) == 1, (patch.file, patch.old)
        path.write_text(text.replace(patch.old, patch.new))
        git(upstream, "commit", "--quiet", "--all", "--message", patch.subject)
    vendor_as_fork(upstream, base, dest, pin=PIN)
    return dest


@pytest.fixture
def real_fork(registry_tree, tmp_path):
    def make(name: str) -> Path:
        llama = tree_mod.detect(registry_tree("0.3.17")).llama_root
        return lay_out_real_fork(llama, tmp_path / name, tmp_path / f"{name}-upstream")
    return make


def apply_validate(fork: Path) -> tuple[Result, dict]:
    result = CliRunner().invoke(cli, ["apply", "--pin", PIN[:8], "--tree", str(fork),
                                      "--validate"])
    logs = re.search(r"^logs: (.+)$", result.output, re.M)
    assert logs, result.output
    return result, json.loads((Path(logs.group(1)) / "report.json").read_text())


def verdicts(report: dict) -> dict[str, str]:
    return {c["id"]: c["verdict"] for c in report["checks"]}


def test_the_fixture_is_an_ollama_style_fork_of_a_vendored_subset(real_fork):
    fork = real_fork("fork")
    info = tree_mod.detect(fork)
    assert (info.layout, info.pin) == (OLLAMA, PIN)
    assert not (info.llama_root / "CMakeLists.txt").exists()
    assert not (info.ggml_root / "CMakeLists.txt").exists()
    assert sorted(p.name for p in (fork / "llama" / "patches").iterdir()) == [
        "0001-llama-name-the-fork-in-the-system-info.patch",
        "0002-graph-log-each-input-a-graph-gets.patch",
        "0003-ggml-the-commit-string-names-the-fork.patch"]
    assert "FORK = fixture" in (info.llama_root / "src" / "llama.cpp").read_text()


def test_validation_in_the_fork_passes_and_agrees_with_the_registry_tree(real_fork,
                                                                           registry_tree):
    fork = real_fork("fork")
    result, report = apply_validate(fork)
    assert result.exit_code == 0, result.output
    assert "applied 5 patch(es) of kv-rotation" in result.output
    assert verdicts(report) == {"a": "pass", "b": "pass", "c": "pass", "d": "pass",
                                "e": "documented"}, json.dumps(report["checks"], indent=1)
    checks = {c["id"]: c for c in report["checks"]}
    assert "upstream 0.3.20" in report["reference"]
    assert "bit-identical logits" in checks["b"]["figures"]["the tree's own f16 run vs upstream's"]
    assert "broken port fails as it must" in checks["d"]["figures"]["q8_0/q8_0"]
    # the fork was validated as it has it: its own patches are in both builds
    unpatched = Path(report["workspace"]) / "unpatched"
    assert "FORK = fixture" in (unpatched / "llama.cpp" / "src" / "llama.cpp").read_text()
    assert '"+fork"' in (unpatched / "ggml" / "src" / "ggml.c").read_text()
    assert "attn_rot_k" not in (unpatched / "llama.cpp" / "src" / "llama-kv-cache.cpp").read_text()
    # `portkit validate` in the fork afterwards validates the same two builds: nothing to do
    again = CliRunner().invoke(cli, ["validate", "--tree", str(fork), "--format", "json"])
    assert again.exit_code == 0, again.output
    assert "building" not in again.stderr and "[1/" not in again.stderr, again.stderr
    assert json.loads(again.stdout)["checks"] == report["checks"]
    # the same tree as a whole registry tree gives the same figures, digit for digit
    registry = validate_mod.validate(
        tree_mod.detect(registry_tree("0.3.17")), Feature.load("kv-rotation"),
        reference=tree_mod.detect(registry_tree("0.3.20")))
    rows = {c.id: c.rows for c in registry.checks}["b"]
    assert checks["b"]["rows"] == json.loads(json.dumps(rows))


def test_a_broken_template_fails_validation_in_the_fork(real_fork, tmp_path, monkeypatch):
    templates = tmp_path / "templates"
    Feature.load("kv-rotation").broken(templates)
    monkeypatch.setenv("PORTKIT_TEMPLATES", str(templates))
    result, report = apply_validate(real_fork("broken-fork"))
    assert result.exit_code == ValidationFailed.exit_code == 21, result.output
    assert "portkit: validation failed: check d (" in result.output
    assert verdicts(report) == {"a": "pass", "b": "pass", "c": "pass", "d": "fail",
                                "e": "documented"}, json.dumps(report["checks"], indent=1)
    shift = {c["id"]: c for c in report["checks"]}["d"]["figures"]["q8_0/q8_0"]
    assert "patched FAILS" in shift
    assert "the port behaves exactly like the deliberately broken one" in shift
    # the report ends with where the logs are (stdout); the one failure line is stderr's,
    # its last, after what a cold cache prints there (downloads, builds, validate's steps)
    assert result.stdout.rstrip().splitlines()[-1].startswith("logs: ")
    said = result.stderr.strip().splitlines()
    assert said[-1].startswith("portkit: validation failed: check d ("), said
    assert sum(line.startswith("portkit: validation failed") for line in said) == 1, said
    assert "validation failed" not in result.stdout
    assert "FAILED" in result.output
