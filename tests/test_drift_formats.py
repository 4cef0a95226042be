"""The drift report model and every output format, on reports built by hand.

The reports are test data of the formats (the analysis that computes them is tested apart):
three targets, oldest first, and a series whose patches between them take every status,
with semantic drift, and text that each format must escape.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import jsonschema
import junitparser
import pytest

from portkit.drift import formats as fmt
from portkit.drift.model import (
    ALREADY_APPLIED,
    ATTENTION_EXIT,
    CLEAN,
    CONFLICT,
    DEFAULT_FAIL_ON,
    FAIL_ON_CHOICES,
    FUZZ,
    OFFSET,
    PRESENT_UPSTREAM,
    RELOCATED,
    SEMANTIC,
    STATUSES,
    DriftReport,
    HunkDrift,
    Moved,
    Nearest,
    PatchDrift,
    SemanticChange,
    TargetDrift,
    exit_code,
    needs_attention,
    parse_fail_on,
    worst,
)
from portkit.errors import PortkitError

DATA = Path(__file__).parent / "data" / "drift"
SERIES = "patches/fork"
P1 = "0001-kv-cache-add-rotation-fields.patch"
P2 = "0002-graph-rotate-K-on-store.patch"
P3 = "0003-server-expose-the-rotation-flag.patch"
P4 = "0004-ggml-fix-the-Hadamard-transform.patch"
P5 = "0005-common-parse-rotation-options.patch"
NEAREST = "ggml_tensor * k = layer.k;\n// `rotated` in ```markdown``` fences\x01\nreturn k;"


def hunk(status: str, *, file: str = "src/llama-kv-cache.cpp", old_start: int = 120,
         patch_line: int = 22, **more: Any) -> HunkDrift:
    return HunkDrift(file=file, old_start=old_start, status=status,
                     reason=more.pop("reason", f"{status} at the expected place"),
                     patch_line=patch_line, **more)


def target_a() -> TargetDrift:
    """The pin: everything applies."""
    return TargetDrift("llama.cpp@b6700", "7049736b", (
        PatchDrift(P1, "kv-cache: add rotation fields", (hunk(CLEAN), hunk(CLEAN, old_start=300,
                                                                            patch_line=40))),
        PatchDrift(P2, "graph: rotate K on store", (hunk(CLEAN, file="src/llama-graph.cpp"),)),
        PatchDrift(P3, "server: expose the rotation | flag <T>", (hunk(CLEAN),)),
        PatchDrift(P4, "ggml: fix the Hadamard transform", (hunk(CLEAN),)),
        PatchDrift(P5, "common: parse rotation options", (hunk(CLEAN),)),
    ))


def target_b() -> TargetDrift:
    """Six months on: offsets, fuzz, a rename that keeps the text, a change taken upstream."""
    return TargetDrift("llama.cpp@b7000", "a1b2c3d4", (
        PatchDrift(P1, "kv-cache: add rotation fields", (
            hunk(OFFSET, offset=14, reason="applies 14 lines later"), hunk(CLEAN))),
        PatchDrift(P2, "graph: rotate K on store", (
            hunk(FUZZ, fuzz=2, symbol="llm_graph_context::build_attn",
                 reason="2 context lines differ: k, v, 50%"),)),
        PatchDrift(P3, "server: expose the rotation | flag <T>", (hunk(CLEAN),), (
            SemanticChange("llama_kv_cache::get_k", "renamed",
                           "now llama_kv_cache::get_k_view; the patch still calls get_k"),)),
        PatchDrift(P4, "ggml: fix the Hadamard transform", (
            hunk(PRESENT_UPSTREAM, reason="upstream commit 744c0c73 has this change"),)),
        PatchDrift(P5, "common: parse rotation options", (
            hunk(ALREADY_APPLIED, reason="the tree already has this hunk"),
            hunk(ALREADY_APPLIED, reason="and this one"))),
    ))


def target_c() -> TargetDrift:
    """The newest upstream: a relocation and a conflict."""
    return TargetDrift("llama.cpp@b7400", None, (
        PatchDrift(P1, "kv-cache: add rotation fields", (
            hunk(OFFSET, offset=-3, reason="applies 3 lines earlier"), hunk(CLEAN))),
        PatchDrift(P2, "graph: rotate K on store", (
            hunk(RELOCATED, symbol="llm_graph_context::build_attn",
                 moved_to=Moved("src/llama-graph-attn.cpp", 40,
                                "llm_graph_context::build_attn_mha", "alias"),
                 reason="build_attn moved to build_attn_mha (alias)"),
            hunk(FUZZ, fuzz=1, patch_line=31))),
        PatchDrift(P3, "server: expose the rotation | flag <T>", (
            hunk(CLEAN),
            hunk(CONFLICT, old_start=512, patch_line=48, symbol="server_context::init",
                 nearest=Nearest("tools/server/server.cpp", 530, NEAREST),
                 reason="context gone: params.cache_type_k no longer read here")), (
            SemanticChange("llama_kv_cache::get_k", "renamed", "now get_k_view"),
            SemanticChange("llama_context_params", "type", "flash_attn is an enum now"))),
        PatchDrift(P4, "ggml: fix the Hadamard transform", (
            hunk(PRESENT_UPSTREAM, reason="upstream has this change"),)),
        PatchDrift(P5, "common: parse rotation options", (
            hunk(PRESENT_UPSTREAM), hunk(CLEAN, patch_line=30))),
    ))


@pytest.fixture
def report() -> DriftReport:
    return DriftReport(SERIES, (target_a(), target_b(), target_c()))


# The model.

def test_a_patch_takes_its_worst_hunks_status() -> None:
    assert worst([CLEAN, OFFSET, FUZZ]) == FUZZ
    assert worst([RELOCATED, CONFLICT, CLEAN]) == CONFLICT
    assert worst([PRESENT_UPSTREAM, PRESENT_UPSTREAM]) == PRESENT_UPSTREAM
    assert worst([ALREADY_APPLIED, ALREADY_APPLIED]) == ALREADY_APPLIED
    # Partly verbatim, partly in upstream's own form: upstream has it, not this patch as is.
    assert worst([PRESENT_UPSTREAM, ALREADY_APPLIED]) == PRESENT_UPSTREAM
    # A change partly in the tree already: the rest decides.
    assert worst([PRESENT_UPSTREAM, OFFSET]) == OFFSET
    assert worst([]) == CLEAN
    patch = target_c().patches[2]
    assert patch.status == CONFLICT
    assert patch.hunk_counts() == {CLEAN: 1, CONFLICT: 1}


def test_summary_counts_patches_per_status_and_semantic_on_top(report: DriftReport) -> None:
    b = report.targets[1]
    assert b.summary == {CLEAN: 1, OFFSET: 1, FUZZ: 1, RELOCATED: 0, CONFLICT: 0,
                         ALREADY_APPLIED: 1, PRESENT_UPSTREAM: 1, SEMANTIC: 1}
    for t in report.targets:
        assert sum(t.summary[s] for s in STATUSES) == len(t.patches)


def test_json_round_trip_keeps_everything(report: DriftReport) -> None:
    text = report.to_json()
    assert DriftReport.from_json(text) == report
    data = json.loads(text)
    assert list(data) == ["schema", "series", "fork", "not_vendored", "targets"]
    assert data["schema"] == "portkit-drift/2"
    target = data["targets"][2]
    assert list(target) == ["target", "pin", "own", "summary", "patches"]
    assert target["pin"] is None
    patch = target["patches"][2]
    assert list(patch) == ["file", "subject", "status", "hunks", "semantic"]
    assert patch["status"] == CONFLICT
    assert patch["semantic"][1] == {"symbol": "llama_context_params", "change": "type",
                                    "detail": "flash_attn is an enum now"}
    conflict = patch["hunks"][1]
    assert list(conflict) == ["file", "old_start", "patch_line", "status", "offset", "fuzz",
                              "symbol", "moved_to", "reason", "nearest"]
    assert conflict["nearest"] == {"file": "tools/server/server.cpp", "line": 530,
                                   "text": NEAREST}
    assert data["targets"][2]["patches"][1]["hunks"][0]["moved_to"] == {
        "file": "src/llama-graph-attn.cpp", "line": 40,
        "symbol": "llm_graph_context::build_attn_mha", "how": "alias"}


def _edit(report: DriftReport, change: Any) -> str:
    data = report.to_dict()
    change(data)
    return json.dumps(data)


def _hunk0(d: dict[str, Any]) -> dict[str, Any]:
    hunk: dict[str, Any] = d["targets"][0]["patches"][0]["hunks"][0]
    return hunk


BAD_INPUTS: list[tuple[str, Any, str]] = [
    ("not json", "{", "drift report: not JSON (Expecting property name"),
    ("a list", "[]", "drift report: expected an object, got a list"),
    ("other schema", lambda d: d.update(schema="portkit-drift/3"),
     "drift report: schema: 'portkit-drift/3' is not portkit-drift/1 or portkit-drift/2"),
    ("missing key", lambda d: d["targets"][0]["patches"][1].pop("subject"),
     "drift report: targets[0].patches[1]: missing key 'subject'"),
    ("unknown key", lambda d: _hunk0(d).update(ofset=3),
     "drift report: targets[0].patches[0].hunks[0]: unknown key 'ofset'"),
    ("string for int", lambda d: _hunk0(d).update(old_start="12"),
     "drift report: targets[0].patches[0].hunks[0].old_start: expected an integer, got a string"),
    ("bool for int", lambda d: _hunk0(d).update(fuzz=True),
     "drift report: targets[0].patches[0].hunks[0].fuzz: expected an integer, got a boolean"),
    ("unknown status", lambda d: _hunk0(d).update(status="moved"),
     "drift report: targets[0].patches[0].hunks[0].status: 'moved' is not one of clean, "),
    ("negative fuzz", lambda d: _hunk0(d).update(fuzz=-1),
     "drift report: targets[0].patches[0].hunks[0].fuzz: -1 is negative"),
    ("bad move", lambda d: d["targets"][2]["patches"][1]["hunks"][0]["moved_to"].update(
        how="guess"), "drift report: targets[2].patches[1].hunks[0].moved_to.how: 'guess'"),
    ("bad change", lambda d: d["targets"][1]["patches"][2]["semantic"][0].update(change="x\ny"),
     "drift report: targets[1].patches[2].semantic[0].change: 'x\\ny' is not one of removed"),
    ("null subject", lambda d: d["targets"][0]["patches"][0].update(subject=None),
     "drift report: targets[0].patches[0].subject: expected a string, got null"),
    ("status not worst", lambda d: d["targets"][2]["patches"][2].update(status="clean"),
     "drift report: targets[2].patches[2].status: 'clean' is not its worst hunk's status "
     "'conflict'"),
    ("summary off", lambda d: d["targets"][1]["summary"].update(clean=5),
     "drift report: targets[1].summary: does not match the patches (expected {\"clean\":1,"),
    ("nested too deep", "[" * 100_000, "drift report: not JSON (maximum recursion depth"),
    ("5000 digits", '{"schema": ' + "9" * 5000 + "}",
     "drift report: not JSON (Exceeds the limit (4300 digits)"),
    ("line out of range", lambda d: _hunk0(d).update(patch_line=10**30),
     "drift report: targets[0].patches[0].hunks[0].patch_line: 1e+30 is out of range"),
    ("offset out of range", lambda d: _hunk0(d).update(offset=-(10**400)),
     "drift report: targets[0].patches[0].hunks[0].offset: out of range"),
]


@pytest.mark.parametrize(("text", "message"), [(t, m) for _, t, m in BAD_INPUTS],
                         ids=[name for name, _, _ in BAD_INPUTS])
def test_bad_json_gives_one_line_naming_the_place(report: DriftReport, text: Any,
                                                  message: str) -> None:
    with pytest.raises(PortkitError) as caught:
        DriftReport.from_json(text if isinstance(text, str) else _edit(report, text))
    assert caught.value.message.startswith(message)
    assert "\n" not in caught.value.message


def test_fail_on_values() -> None:
    assert parse_fail_on([]) == DEFAULT_FAIL_ON == {CONFLICT, SEMANTIC}
    assert parse_fail_on(["fuzz", "semantic"]) == {FUZZ, SEMANTIC}
    assert parse_fail_on(["never"]) == frozenset()
    with pytest.raises(PortkitError, match="cannot be combined"):
        parse_fail_on(["never", "conflict"])
    with pytest.raises(PortkitError, match="'offset' is not one of conflict, semantic"):
        parse_fail_on(["offset"])


@pytest.mark.parametrize(("fail_on", "flagged"), [
    ([], {(1, P3), (2, P3)}),
    (["conflict"], {(2, P3)}),
    (["semantic"], {(1, P3), (2, P3)}),
    (["relocated"], {(2, P2), (2, P3)}),
    (["fuzz"], {(1, P2), (2, P2), (2, P3)}),
    (["fuzz", "semantic"], {(1, P2), (1, P3), (2, P2), (2, P3)}),
    (["never"], set()),
])
def test_which_patches_need_attention(report: DriftReport, fail_on: list[str],
                                      flagged: set[tuple[int, str]]) -> None:
    chosen = parse_fail_on(fail_on)
    found = {(ti, p.file) for ti, t in enumerate(report.targets) for p in t.patches
             if needs_attention(p, chosen)}
    assert found == flagged
    assert exit_code(report, chosen) == (ATTENTION_EXIT if flagged else 0)


def test_a_clean_series_exits_zero() -> None:
    assert exit_code(DriftReport(SERIES, (target_a(),)), DEFAULT_FAIL_ON) == 0


def test_render_knows_every_format(report: DriftReport) -> None:
    for name in fmt.FORMATS:
        assert fmt.render(report, name, DEFAULT_FAIL_ON).endswith("\n")
    assert fmt.render(report, "json", DEFAULT_FAIL_ON) == report.to_json()
    with pytest.raises(PortkitError, match="unknown drift format 'xml'"):
        fmt.render(report, "xml", DEFAULT_FAIL_ON)


# Terminal table.

def test_table_rows_fit_the_width_without_colour(report: DriftReport) -> None:
    text = fmt.table(report, fail_on=DEFAULT_FAIL_ON, width=80, colour=False)
    assert "\x1b[" not in text
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    blocks = text.split("\n\n")
    assert len(blocks) == 3
    newest = blocks[2].splitlines()
    assert newest[0] == "patches/fork on llama.cpp@b7400"
    assert newest[1].split() == ["#", "patch", "status", "hunks", "reason"]
    row = newest[2 + 2]
    assert row.startswith("3  server: expose the …  conflict +semantic  2 hunks: 1 confli…")
    # The summary wraps rather than run past the width.
    assert " ".join(newest[-2:]).replace("   ", " ") == (
        "5 patches: 1 clean, 1 offset, 1 relocated, 1 conflict, 1 present-upstream; 1 with "
        "semantic drift; 1 needs attention (--fail-on conflict, semantic)")
    wide = fmt.table(report, fail_on=DEFAULT_FAIL_ON, width=400, colour=False).splitlines()
    assert re.split(r"\s{2,}", wide[-4]) == [
        "3", "server: expose the rotation | flag <T>", "conflict +semantic", "2 hunks: 1 conflict",
        "context gone: params.cache_type_k no longer read here"]
    assert wide[-1].startswith("5 patches: ")


def test_table_into_a_pipe_or_a_ci_log_is_not_cut(report: DriftReport, monkeypatch) -> None:
    """Nothing wraps a pipe or a CI log: without a terminal (and without COLUMNS) the rows
    are whole, as wide as they need; COLUMNS, where set, is the width."""
    monkeypatch.delenv("COLUMNS", raising=False)
    whole = fmt.table(report, fail_on=DEFAULT_FAIL_ON, colour=False)
    assert whole == fmt.table(report, fail_on=DEFAULT_FAIL_ON, width=400, colour=False)
    assert "…" not in whole
    monkeypatch.setenv("COLUMNS", "80")
    assert fmt.table(report, fail_on=DEFAULT_FAIL_ON, colour=False) == fmt.table(
        report, fail_on=DEFAULT_FAIL_ON, width=80, colour=False)


def test_table_names_a_patch_without_a_subject_by_its_file(report: DriftReport) -> None:
    """A quilt patch or a plain diff has no subject: its row shows the file name."""
    target = report.targets[0]
    quiet = replace(target, patches=(replace(target.patches[0], subject=""),
                                     *target.patches[1:]))
    text = fmt.table(replace(report, targets=(quiet,)), fail_on=DEFAULT_FAIL_ON, width=400,
                     colour=False)
    row = next(line for line in text.splitlines() if line.startswith("1  "))
    assert re.split(r"\s{2,}", row)[1] == target.patches[0].file


def test_markdown_headings_show_a_name_as_it_is(report: DriftReport) -> None:
    """Outside a table a pipe needs no escape (the backslash would show): a flagged patch's
    heading writes its file name as it is, inside a code span."""
    odd = "0003-a|b`c.patch"
    targets = tuple(replace(t, patches=tuple(replace(p, file=odd) if p.file.startswith("0003")
                                             else p for p in t.patches))
                    for t in report.targets)
    text = fmt.render(replace(report, targets=targets), "markdown", fail_on=DEFAULT_FAIL_ON)
    headings = [line for line in text.splitlines() if line.startswith("#### ")]
    assert headings and all("\\|" not in line for line in headings)
    assert any(f": 3. ``{odd}``: " in line for line in headings), headings


@pytest.mark.parametrize("name", fmt.FORMATS)
def test_every_format_is_valid_utf8_whatever_the_series_bytes(report: DriftReport,
                                                               name: str) -> None:
    """A subject with bytes that are not UTF-8 (read with surrogateescape: Latin-1 `caf\xe9`,
    `\xff`) comes out as U+FFFD in every format alike: text a strict reader (a CI summary,
    a JSON parser that refuses lone surrogates) takes."""
    target = report.targets[0]
    odd = b"caf\xe9 \xff".decode("utf-8", "surrogateescape")
    bytes_in = replace(report, targets=(replace(target, patches=(
        replace(target.patches[0], subject=odd), *target.patches[1:])), *report.targets[1:]))
    text = fmt.render(bytes_in, name, fail_on=DEFAULT_FAIL_ON)
    text.encode("utf-8")  # no lone surrogate left
    if name == "json":
        assert json.loads(text)["targets"][0]["patches"][0]["subject"] == "caf\ufffd \ufffd"
    elif name in ("table", "matrix-md"):  # formats that list every patch by its subject
        assert "caf\ufffd \ufffd" in text


def test_table_colours_only_when_asked_or_on_a_terminal(report: DriftReport) -> None:
    coloured = fmt.table(report, fail_on=DEFAULT_FAIL_ON, width=100, colour=True)
    assert "\x1b[31m" in coloured  # conflict in red
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == fmt.table(
        report, fail_on=DEFAULT_FAIL_ON, width=100, colour=False)
    # Under pytest stdout is no terminal: the default is no colour.
    assert "\x1b[" not in fmt.table(report, fail_on=DEFAULT_FAIL_ON, width=100)


# Markdown.

def test_markdown_summary_first_then_only_patches_that_need_attention(
        report: DriftReport) -> None:
    text = fmt.markdown(report, fail_on=DEFAULT_FAIL_ON)
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| target |"))
    details = lines.index("### Patches that need attention")
    assert header < details
    assert lines[header + 2] == ("| `llama.cpp@b6700` | `7049736b` | 5 | 5 | 0 | 0 | 0 | 0 | 0 | "
                                 "0 | 0 | 0 |")
    assert lines[header + 4] == ("| `llama.cpp@b7400` | — | 5 | 1 | 1 | 0 | 1 | 1 | 0 | 1 | 1 | "
                                 "1 |")
    headings = [line for line in lines if line.startswith("#### ")]
    assert headings == [f"#### `llama.cpp@b7000`: 3. `{P3}`: clean +semantic",
                        f"#### `llama.cpp@b7400`: 3. `{P3}`: conflict +semantic"]
    assert P1 not in text and P2 not in text  # fuzz and relocation do not fail by default
    # The subject's pipe and angle brackets are escaped, the nearest text fenced with a fence
    # longer than the backticks in it.
    assert "server: expose the rotation \\| flag \\<T\\>" in text
    assert "````cpp\nggml_tensor * k = layer.k;\n// `rotated` in ```markdown``` fences" in text
    assert ("| conflict | `src/llama-kv-cache.cpp:512` | `server_context::init` | +0 | 0 | — | "
            "context gone: params.cache\\_type\\_k no longer read here |") in text
    assert "- `llama_context_params` type: flash\\_attn is an enum now" in text


def test_markdown_says_when_nothing_needs_attention(report: DriftReport) -> None:
    text = fmt.markdown(report, fail_on=frozenset())
    assert "No patch needs attention." in text
    assert "####" not in text


# JUnit XML.

def test_junit_reads_back_with_junitparser(report: DriftReport, tmp_path: Path) -> None:
    path = tmp_path / "drift.xml"
    path.write_text(fmt.junit(report, fail_on=parse_fail_on(["fuzz", "semantic"])),
                    encoding="utf-8")
    xml = junitparser.JUnitXml.fromfile(str(path))
    suites = list(xml)
    assert [s.name for s in suites] == [t.target for t in report.targets]
    assert xml.tests == 15 and xml.failures == 4 and xml.skipped == 0 and xml.errors == 0
    assert [(s.tests, s.failures) for s in suites] == [(5, 0), (5, 2), (5, 2)]
    cases = {(c.classname, c.name): c for s in suites for c in s}
    assert len(cases) == 15
    fuzz = cases[("llama.cpp@b7000", P2)].result[0]
    assert isinstance(fuzz, junitparser.Failure)
    assert fuzz.type == FUZZ and fuzz.message == "2 context lines differ: k, v, 50%"
    semantic = cases[("llama.cpp@b7000", P3)].result[0]
    assert semantic.type == SEMANTIC
    assert semantic.message == ("semantic: llama_kv_cache::get_k renamed: now "
                                "llama_kv_cache::get_k_view; the patch still calls get_k")
    conflict = cases[("llama.cpp@b7400", P3)]
    assert conflict.result[0].type == CONFLICT
    out = conflict.system_out
    assert "nearest tools/server/server.cpp:530:" in out and "\ufffd" in out  # \x01 replaced
    assert cases[("llama.cpp@b6700", P1)].is_passed
    assert dict((p.name, p.value) for p in suites[1].properties()) == {
        "series": SERIES, "target": "llama.cpp@b7000", "pin": "a1b2c3d4",
        "fail-on": "fuzz, semantic"}


# SARIF.

def test_sarif_validates_against_the_official_schema(report: DriftReport) -> None:
    schema = json.loads((DATA / "sarif-schema-2.1.0.json").read_text(encoding="utf-8"))
    log = json.loads(fmt.sarif(report))
    jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker()).validate(log)
    (run,) = log["runs"]
    assert run["tool"]["driver"]["name"] == "portkit"
    rules = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert set(rules) == {f"drift/{s}" for s in STATUSES if s != CLEAN} | {"drift/semantic"}
    findings = [(t.target, h) for t in report.targets for p in t.patches for h in p.hunks
                if h.status != CLEAN]
    semantic = [s for t in report.targets for p in t.patches for s in p.semantic]
    assert len(run["results"]) == len(findings) + len(semantic)
    for result in run["results"]:
        assert rules[result["ruleIndex"]] == result["ruleId"]
    levels = {r["ruleId"]: r["level"] for r in run["results"]}
    assert levels == {"drift/conflict": "error", "drift/semantic": "error",
                      "drift/relocated": "warning", "drift/fuzz": "warning",
                      "drift/offset": "note", "drift/already-applied": "note",
                      "drift/present-upstream": "note"}
    conflict = next(r for r in run["results"] if r["ruleId"] == "drift/conflict")
    location = conflict["locations"][0]["physicalLocation"]
    assert location == {"artifactLocation": {"uri": f"patches/fork/{P3}"},
                        "region": {"startLine": 48}}
    fingerprints = [r["partialFingerprints"]["portkitDrift/v1"] for r in run["results"]]
    assert len(set(fingerprints)) == len(fingerprints)


def test_sarif_uri_of_an_absolute_series_is_a_file_uri() -> None:
    log = json.loads(fmt.sarif(DriftReport("/srv/my fork/patches", (target_c(),))))
    uri = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert uri == {"uri": f"file:///srv/my%20fork/patches/{P1}"}


# GitHub Actions annotations.

def _unescape(text: str) -> str:
    for code, char in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")):
        text = text.replace(code, char)
    return text


def _parse_annotation(line: str) -> tuple[str, dict[str, str], str]:
    match = re.fullmatch(r"::(\w+) ([^:]*)::(.*)", line)
    assert match, line
    props = dict(p.split("=", 1) for p in match[2].split(","))
    return match[1], {k: _unescape(v) for k, v in props.items()}, _unescape(match[3])


def test_github_annotations_escape_and_levels(report: DriftReport) -> None:
    text = fmt.github(report, fail_on=DEFAULT_FAIL_ON)
    lines = text.splitlines()
    parsed = [_parse_annotation(line) for line in lines]
    # Fuzz (twice), relocation, conflict, and three semantic changes.
    assert [(level, props["title"]) for level, props, _ in parsed] == [
        ("warning", f"{P2}: fuzz on llama.cpp@b7000"),
        ("error", f"{P3}: semantic drift on llama.cpp@b7000"),
        ("warning", f"{P2}: relocated on llama.cpp@b7400"),
        ("warning", f"{P2}: fuzz on llama.cpp@b7400"),
        ("error", f"{P3}: conflict on llama.cpp@b7400"),
        ("error", f"{P3}: semantic drift on llama.cpp@b7400"),
        ("error", f"{P3}: semantic drift on llama.cpp@b7400"),
    ]
    fuzz_level, fuzz_props, fuzz_message = parsed[0]
    assert fuzz_props == {"file": f"patches/fork/{P2}", "line": "22",
                          "title": f"{P2}: fuzz on llama.cpp@b7000"}
    assert fuzz_message == ("hunk src/llama-kv-cache.cpp:120 in llm_graph_context::build_attn: "
                            "2 context lines differ: k, v, 50%")
    assert "50%25" in lines[0] and "title=0002-graph-rotate-K-on-store.patch%3A fuzz" in lines[0]
    _, conflict_props, conflict_message = parsed[4]
    assert conflict_props["line"] == "48"
    assert conflict_message.endswith("nearest match at tools/server/server.cpp:530:\n"
                                     + NEAREST)
    assert "\n" not in text.rstrip("\n").replace("\n::", "")  # one line per annotation
    strict = [level for level, _, _ in (_parse_annotation(x) for x in
                                        fmt.github(report, fail_on=frozenset({FUZZ})).splitlines())]
    assert strict == ["error", "warning", "error", "error", "error", "warning", "warning"]


# The drift matrix.

def test_matrix_markdown_rows_are_patches_columns_targets(report: DriftReport) -> None:
    text = fmt.matrix_markdown(report, fail_on=DEFAULT_FAIL_ON)
    rows = [line for line in text.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == 5
    assert rows[2] == (f"| 3 | `{P3}` server: expose the rotation \\| flag \\<T\\> | 🟩 clean | "
                       "🟩 clean ◆ | 🟥 conflict ◆ | `llama.cpp@b7000` |")
    assert rows[1].endswith("| 🟩 clean | 🟨 fuzz | 🟧 relocated | — |")
    fuzz_first = fmt.matrix_markdown(report, fail_on=frozenset({FUZZ}))
    assert "| 🟩 clean | 🟨 fuzz | 🟧 relocated | `llama.cpp@b7000` |" in fuzz_first
    header = next(line for line in text.splitlines() if line.startswith("| # |"))
    assert header == ("| # | patch | `llama.cpp@b6700` | `llama.cpp@b7000` | `llama.cpp@b7400` | "
                      "first broke |")


class _Page(HTMLParser):
    """The links, ids and outside references of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.tags: set[str] = set()
        self.outside: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
        href = values.get("href")
        if href and href.startswith("#"):
            self.links.append(href[1:])
        for name in ("src", "href"):
            value = values.get(name)
            if value and not value.startswith("#"):
                self.outside.append(value)


def test_matrix_html_cells_link_to_their_details(report: DriftReport) -> None:
    page = _Page()
    page.feed(fmt.matrix_html(report, fail_on=DEFAULT_FAIL_ON))
    assert not page.outside and "script" not in page.tags and "link" not in page.tags
    cell_links = [link for link in page.links if link != "matrix"]
    assert len(cell_links) == 15 == len(set(cell_links))
    assert set(cell_links) <= page.ids


def _png_pixels(data: bytes) -> tuple[int, int, Counter[tuple[int, int, int]]]:
    """Width, height and how many pixels of each colour an 8-bit RGB or RGBA PNG has."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks += body
        pos += 12 + length
    width, height, depth, colour_type = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour_type in (2, 6)
    step = 3 if colour_type == 2 else 4
    raw = zlib.decompress(chunks)
    stride = width * step
    previous = bytearray(stride)
    colours: Counter[tuple[int, int, int]] = Counter()
    for y in range(height):
        kind = raw[y * (stride + 1)]
        row = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = row[x - step] if x >= step else 0
            b = previous[x]
            c = previous[x - step] if x >= step else 0
            if kind == 1:
                row[x] = (row[x] + a) & 0xFF
            elif kind == 2:
                row[x] = (row[x] + b) & 0xFF
            elif kind == 3:
                row[x] = (row[x] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[x] = (row[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        colours.update((row[x], row[x + 1], row[x + 2]) for x in range(0, stride, step))
        previous = row
    return width, height, colours


def test_matrix_html_screenshot_shows_the_heatmap(report: DriftReport, tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    assert chromium, "chromium is missing: apt-get install -y chromium"
    page = tmp_path / "drift.html"
    page.write_text(fmt.matrix_html(report, fail_on=DEFAULT_FAIL_ON), encoding="utf-8")
    shot = tmp_path / "drift.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                    "--force-color-profile=srgb", f"--user-data-dir={tmp_path / 'profile'}",
                    f"--screenshot={shot}", "--window-size=1200,900", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    width, height, colours = _png_pixels(shot.read_bytes())
    assert (width, height) == (1200, 900)
    # Every status occurs in the matrix, each in cells far larger than a legend swatch.
    for status, (bg, _) in fmt.HEAT.items():
        rgb = (int(bg[1:3], 16), int(bg[3:5], 16), int(bg[5:7], 16))
        assert colours[rgb] > 2000, f"{status} ({bg}) covers {colours[rgb]} pixels"


# The CI documentation names what the code has.

def test_ci_docs_and_workflow_name_real_formats_and_values() -> None:
    docs = Path(__file__).parent.parent / "docs"
    guide = (docs / "drift-ci.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `([a-z-]+)`", guide, re.MULTILINE))
    assert rows == set(fmt.FORMATS) | set(FAIL_ON_CHOICES)
    assert f"| {ATTENTION_EXIT} | at least one patch" in guide
    workflow = (docs / "github-workflow-drift.yml").read_text(encoding="utf-8")
    rendered = set(re.findall(r"^\s+render ([a-z-]+)", workflow, re.MULTILINE))
    assert rendered == {"markdown", "junit", "sarif", "matrix-html", "github"}
    assert f"[ $? -eq {ATTENTION_EXIT} ]" in workflow
    assert set(re.findall(r"--format ([a-z-]+)", workflow)) <= set(fmt.FORMATS)
