"""`portkit validate --quick` end to end on a real registry tree, a real model and real text.

Builds llama-cpp-python 0.3.17's llama.cpp unpatched, patched, and patched with a
deliberately broken template, plus upstream's own rotation (0.3.20) as the reference;
the first run on a machine takes a while, later runs reuse the cached workspace.
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from portkit.cli import cli


def test_quick_validation_proves_the_port_on_0_3_17(registry_tree):
    result = CliRunner().invoke(
        cli, ["validate", "--tree", str(registry_tree("0.3.17")), "--format", "json"])
    report = json.loads(result.stdout)
    checks = {c["id"]: c for c in report["checks"]}
    verdicts = {k: checks[k]["verdict"] for k in "abcde"}
    assert verdicts == {"a": "pass", "b": "pass", "c": "pass", "d": "pass",
                        "e": "documented"}, json.dumps(checks, indent=1)
    assert result.exit_code == 0 and report["passed"]
    assert checks["a"]["figures"]["f16/f16"] == "bit-identical"
    assert checks["a"]["figures"]["q8_0/q8_0 LLAMA_ATTN_ROT_DISABLE=1"] == "bit-identical"
    assert "broken port fails as it must" in checks["d"]["figures"]["q8_0/q8_0"]
    assert "upstream's build, same run" in checks["b"]["figures"]["q4_0/q4_0"]
