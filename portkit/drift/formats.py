"""Every way to write a drift report, one function per format, each returning text.

table (the terminal), markdown (a CI job summary), junit (JUnit XML), sarif (SARIF 2.1.0 for
code scanning), github (GitHub Actions annotations), matrix_markdown and matrix_html (patches
by targets at a glance). JSON is DriftReport.to_json(). `fail_on` is what
drift_model.parse_fail_on returns; it decides what "needs attention" means everywhere (in a
fork's report, with `dropped` added: drift_model.effective_fail_on). The sections a fork's
report left out (files it does not vendor) are said once in every format.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import shutil
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import PurePosixPath
from urllib.parse import quote

import click

from portkit import __version__
from portkit.drift.model import (
    ALREADY_APPLIED,
    CLEAN,
    CONFLICT,
    FUZZ,
    OFFSET,
    PRESENT_UPSTREAM,
    RELOCATED,
    SEMANTIC,
    STATUSES,
    Drift,
    DriftReport,
    HunkDrift,
    Moved,
    PatchDrift,
    SemanticChange,
    TargetDrift,
    effective_fail_on,
    failing_statuses,
    needs_attention,
)
from portkit.errors import UsageError
from portkit.report import md_code, valid_data, valid_text

FailOn = frozenset[str]

FORMATS = ("table", "json", "markdown", "junit", "sarif", "github", "matrix-md", "matrix-html")

# Terminal colours per status (click.style names).
TERMINAL_COLOURS = {CLEAN: "green", OFFSET: "cyan", FUZZ: "yellow", RELOCATED: "magenta",
                    CONFLICT: "red", ALREADY_APPLIED: "blue", PRESENT_UPSTREAM: "blue"}
# The HTML heatmap: green to red as a patch drifts further; blue and grey for a change that
# is in the tree already. Each with the text colour that reads on it.
HEAT = {CLEAN: ("#2da44e", "#ffffff"), OFFSET: ("#aceebb", "#0a3622"),
        FUZZ: ("#f5d547", "#3b2e00"), RELOCATED: ("#fb8f44", "#3d1300"),
        CONFLICT: ("#cf222e", "#ffffff"), ALREADY_APPLIED: ("#c8d1da", "#24292f"),
        PRESENT_UPSTREAM: ("#54aeff", "#032563")}
EMOJI = {CLEAN: "🟩", OFFSET: "🟢", FUZZ: "🟨", RELOCATED: "🟧", CONFLICT: "🟥",
         ALREADY_APPLIED: "⬜", PRESENT_UPSTREAM: "🟦"}
SEMANTIC_MARK = "◆"

SARIF_SCHEMA = ("https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/"
                "sarif-schema-2.1.0.json")
# SARIF level per finding; clean hunks are no finding.
SARIF_LEVELS = {CONFLICT: "error", SEMANTIC: "error", RELOCATED: "warning", FUZZ: "warning",
                OFFSET: "note", ALREADY_APPLIED: "note", PRESENT_UPSTREAM: "note"}
RULE_TEXT = {
    CONFLICT: ("PatchHunkConflict", "A hunk of the patch does not apply to the target.",
               "Rework the hunk against the target: its context is gone or changed beyond "
               "fuzz, and no moved copy of its code was found."),
    SEMANTIC: ("PatchSemanticDrift", "A symbol the patch relies on changed in the target.",
               "The patch text may still apply, but a function or type it uses was removed, "
               "renamed or changed signature or type: check that the patched code still "
               "means what it did."),
    RELOCATED: ("PatchHunkRelocated", "A hunk applies only where its code moved to.",
                "The code the hunk changes was renamed or moved (another function or file); "
                "the patch should be refreshed at the new place."),
    FUZZ: ("PatchHunkFuzz", "A hunk applies only by ignoring some context lines.",
           "Refresh the patch so that its context matches the target again."),
    OFFSET: ("PatchHunkOffset", "A hunk applies at a different line.",
             "Nothing to do; refreshing the patch removes the offset."),
    ALREADY_APPLIED: ("PatchHunkAlreadyApplied", "The hunk's change is in the target already.",
                      "The target already has this change; the hunk can be dropped there."),
    PRESENT_UPSTREAM: ("PatchHunkPresentUpstream", "Upstream has the hunk's change.",
                       "Upstream made the same change; the patch can be dropped at the next "
                       "vendor bump."),
}


def render(report: DriftReport, fmt: str, fail_on: FailOn) -> str:
    """The report in one of FORMATS, valid UTF-8 whatever the series' bytes."""
    return valid_text(_render(report, fmt, fail_on))


def _render(report: DriftReport, fmt: str, fail_on: FailOn) -> str:
    writers: dict[str, Callable[[], str]] = {
        "table": lambda: table(report, fail_on=fail_on),
        "json": report.to_json,
        "markdown": lambda: markdown(report, fail_on=fail_on),
        "junit": lambda: junit(report, fail_on=fail_on),
        "sarif": lambda: sarif(report),
        "github": lambda: github(report, fail_on=fail_on),
        "matrix-md": lambda: matrix_markdown(report, fail_on=fail_on),
        "matrix-html": lambda: matrix_html(report, fail_on=fail_on),
    }
    if fmt not in writers:
        raise UsageError(f"unknown drift format {fmt!r}; one of {', '.join(FORMATS)}")
    return writers[fmt]()


# Shared wording.

def _one_line(text: str) -> str:
    return " ".join(text.split())


def _where(h: HunkDrift) -> str:
    return f"{h.file}:{h.old_start}"


def _moved(m: Moved) -> str:
    return f"{m.file}:{m.line}{f' {m.symbol}' if m.symbol else ''} ({m.how})"


def _semantic(s: SemanticChange) -> str:
    return f"{s.symbol} {s.change}: {_one_line(s.detail)}"


def _first_reason(p: PatchDrift) -> str:
    """Why the patch has its status: its first hunk of that status, else its semantic drift."""
    if p.status != CLEAN:
        for h in p.hunks:
            if h.status == p.status:
                return _one_line(h.reason)
    return f"semantic: {_semantic(p.semantic[0])}" if p.semantic else ""


def _status_label(p: PatchDrift) -> str:
    return f"{p.status} +semantic" if p.semantic else p.status


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in counts.items())


def _fail_on_label(fail_on: FailOn) -> str:
    return ", ".join(sorted(fail_on)) or "never"


def _numbered(t: TargetDrift) -> Iterator[tuple[int, PatchDrift]]:
    return enumerate(t.patches, start=1)


def _details(p: PatchDrift) -> list[str]:
    """The patch's hunks and semantic drift as plain text lines."""
    lines = [f"{p.file}: {p.subject}", f"status: {_status_label(p)}"]
    for h in p.hunks:
        where = f" in {h.symbol}" if h.symbol else ""
        shift = f" (offset {h.offset:+d}, fuzz {h.fuzz})" if h.offset or h.fuzz else ""
        lines.append(f"hunk {_where(h)}{where}: {h.status}{shift}: {_one_line(h.reason)}")
        if h.moved_to:
            lines.append(f"  moved to {_moved(h.moved_to)}")
        if h.nearest:
            lines.append(f"  nearest {h.nearest.file}:{h.nearest.line}:")
            lines += [f"    {line}" for line in h.nearest.text.splitlines()]
    lines += [f"semantic: {_semantic(s)}" for s in p.semantic]
    return lines


def _summary_line(t: TargetDrift, fail_on: FailOn) -> str:
    counts = {s: n for s, n in t.summary.items() if n and s != SEMANTIC}
    attention = sum(1 for p in t.patches if needs_attention(p, fail_on))
    n = len(t.patches)
    return (f"{n} patch{'es' if n != 1 else ''}: {_counts(counts) or 'none'}; "
            f"{t.summary[SEMANTIC]} with semantic drift; {attention} need"
            f"{'s' if attention == 1 else ''} attention (--fail-on {_fail_on_label(fail_on)})")


def _target_title(t: TargetDrift) -> str:
    return f"{t.target} (pin {t.pin})" if t.pin else t.target


# Terminal table.

def _fit(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    return text[:max(width - 1, 0)] + "…" if width > 0 else ""


def _hunks_cell(p: PatchDrift) -> str:
    """How many hunks, then how many of each status but clean (the interesting part first)."""
    n = len(p.hunks)
    rest = {s: c for s, c in p.hunk_counts().items() if s != CLEAN}
    return f"{n} hunk{'s' if n != 1 else ''}{': ' + _counts(rest) if rest else ''}"


# Columns cut to fit a narrow terminal, in turn, each down to a floor: the reason first, then
# the hunk counts, then the subject (it names the patch), then the rest of the reason.
_SHRINK = ((4, 24), (3, 18), (1, 20), (4, 0))
_UNCUT = 100_000


def table(report: DriftReport, *, fail_on: FailOn, width: int | None = None,
          colour: bool | None = None) -> str:
    """Per target, one row per patch and a summary line. width defaults to the terminal's
    (COLUMNS where set; not cut at all into a pipe or a CI log, where nothing wraps it),
    colour to whether stdout is a terminal."""
    width = width or (shutil.get_terminal_size().columns
                      if sys.stdout.isatty() or os.environ.get("COLUMNS") else _UNCUT)
    colour = sys.stdout.isatty() if colour is None else colour
    blocks = []
    chosen = fail_on
    for t in report.targets:
        fail_on = effective_fail_on(report, t, chosen)
        rows = [[str(i), _one_line(p.subject or p.file), _status_label(p), _hunks_cell(p),
                 _first_reason(p)]
                for i, p in _numbered(t)]
        headers = ["#", "patch", "status", "hunks", "reason"]
        widths = [max(len(r[c]) for r in [headers, *rows]) for c in range(5)]
        excess = sum(widths) + 2 * 4 - width
        for column, floor in _SHRINK:
            cut = max(min(excess, widths[column] - floor), 0)
            widths[column] -= cut
            excess -= cut
        lines = [f"{report.series} on {_target_title(t)}"]
        for r, row in enumerate([headers, *rows]):
            cells = [_fit(c, w) for c, w in zip(row, widths, strict=True)]
            pads = [" " * (w - len(c)) for c, w in zip(cells, widths, strict=True)]
            if colour and r:
                p = t.patches[r - 1]
                cells[2] = click.style(cells[2], fg=TERMINAL_COLOURS[p.status],
                                       bold=needs_attention(p, fail_on))
            elif colour:
                cells = [click.style(c, bold=True) for c in cells]
            lines.append("  ".join(c + pad for c, pad in zip(cells, pads, strict=True)).rstrip())
        lines.append(textwrap.fill(_summary_line(t, fail_on), width, subsequent_indent="  "))
        blocks.append("\n".join(lines))
    if report.not_vendored_line:
        blocks.append(textwrap.fill(report.not_vendored_line, width, subsequent_indent="  "))
    return "\n\n".join(blocks) + "\n"


# Markdown for a CI job summary.

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~#])")


def _md(text: str) -> str:
    """Plain text for a Markdown paragraph or table cell."""
    return _MD_SPECIAL.sub(r"\\\1", _one_line(text))


def _md_fence(text: str, path: str) -> list[str]:
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    lang = "cpp" if PurePosixPath(path).suffix in {".c", ".cc", ".cpp", ".h", ".hpp", ".cu",
                                                    ".cuh", ".m"} else ""
    return [f"{fence}{lang}", *text.splitlines(), fence]


def markdown(report: DriftReport, *, fail_on: FailOn) -> str:
    """The summary table (patches per status, per target) first, then the details of every
    patch that needs attention."""
    out = [f"## portkit drift of {md_code(report.series, cell=False)}", "",
           "| target | pin | patches | " + " | ".join(STATUSES) + " | semantic | attention |",
           "|---|---|---:|" + "---:|" * (len(STATUSES) + 2)]
    for t in report.targets:
        s = t.summary
        attention = sum(1 for p in t.patches
                        if needs_attention(p, effective_fail_on(report, t, fail_on)))
        out.append(f"| {md_code(t.target)} | {md_code(t.pin) if t.pin else '—'} | "
                   f"{len(t.patches)} | " + " | ".join(str(s[k]) for k in STATUSES) +
                   f" | {s[SEMANTIC]} | {attention} |")
    out += ["", f"A patch needs attention when `--fail-on` catches it (here: "
                f"{_fail_on_label(fail_on)})."]
    if report.fork:
        out += ["", "In a fork, a patch whose change is there already needs attention on "
                    "every target but the fork's own tree: it leaves the fork's series at "
                    "the move."]
    if report.not_vendored_line:
        out += ["", _md(report.not_vendored_line) + "."]
    flagged = [(t, i, p) for t in report.targets for i, p in _numbered(t)
               if needs_attention(p, effective_fail_on(report, t, fail_on))]
    if not flagged:
        out += ["", "No patch needs attention."]
    else:
        out += ["", "### Patches that need attention"]
    for t, i, p in flagged:
        out += ["", f"#### {md_code(t.target, cell=False)}: {i}. "
                    f"{md_code(p.file, cell=False)}: {_status_label(p)}",
                "", _md(p.subject), "",
                "| status | hunk | symbol | offset | fuzz | moved to | reason |",
                "|---|---|---|---:|---:|---|---|"]
        for h in p.hunks:
            out.append(f"| {h.status} | {md_code(_where(h))} | "
                       f"{md_code(h.symbol) if h.symbol else '—'} | {h.offset:+d} | {h.fuzz} | "
                       f"{md_code(_moved(h.moved_to)) if h.moved_to else '—'} | "
                       f"{_md(h.reason)} |")
        for h in p.hunks:
            if h.nearest:
                out += ["", f"Nearest match for hunk {md_code(_where(h))} at "
                            f"{md_code(f'{h.nearest.file}:{h.nearest.line}')}:", "",
                        *_md_fence(h.nearest.text, h.nearest.file)]
        if p.semantic:
            out += ["", "Semantic drift:", ""]
            out += [f"- {md_code(s.symbol, cell=False)} {s.change}: {_md(s.detail)}"
                    for s in p.semantic]
    return "\n".join(out) + "\n"


# JUnit XML.

# XML 1.0 has no way to write most control characters, even escaped.
_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml(text: str) -> str:
    return _XML_INVALID.sub("\ufffd", text)


def _properties(parent: ET.Element, values: dict[str, str]) -> None:
    props = ET.SubElement(parent, "properties")
    for name, value in values.items():
        ET.SubElement(props, "property", name=name, value=_xml(value))


def junit(report: DriftReport, *, fail_on: FailOn) -> str:
    """One test suite per target, one test case per patch (classname the target, name the
    patch file); a patch that needs attention is a failure (type its status, or `semantic`
    when only its semantic drift fails); nothing is skipped."""
    root = ET.Element("testsuites", name="portkit drift")
    total = failed = 0
    chosen = fail_on
    for t in report.targets:
        fail_on = effective_fail_on(report, t, chosen)
        suite = ET.SubElement(root, "testsuite", name=_xml(t.target))
        _properties(suite, {"series": report.series, "target": t.target, "pin": t.pin or "",
                            "fail-on": _fail_on_label(fail_on)})
        suite_failed = 0
        for p in t.patches:
            case = ET.SubElement(suite, "testcase", classname=_xml(t.target), name=_xml(p.file),
                                 time="0")
            _properties(case, {"subject": p.subject, "status": p.status,
                               "semantic": str(len(p.semantic))})
            if needs_attention(p, fail_on):
                suite_failed += 1
                by_status = p.status in failing_statuses(fail_on)
                failure = ET.SubElement(case, "failure", type=p.status if by_status else SEMANTIC,
                                        message=_xml(_first_reason(p) if by_status else
                                                     f"semantic: {_semantic(p.semantic[0])}"))
                failure.text = _xml("\n".join(_details(p)))
            ET.SubElement(case, "system-out").text = _xml("\n".join(_details(p)))
        suite.attrib.update(tests=str(len(t.patches)), failures=str(suite_failed), errors="0",
                            skipped="0", time="0")
        total += len(t.patches)
        failed += suite_failed
    if report.not_vendored_line:
        for suite in root:
            props = suite.find("properties")
            if props is not None:
                ET.SubElement(props, "property", name="not-vendored",
                              value=_xml(report.not_vendored_line))
    root.attrib.update(tests=str(total), failures=str(failed), errors="0", skipped="0", time="0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"


# SARIF 2.1.0.

def _patch_path(series: str, file: str) -> PurePosixPath:
    """The patch file, relative to where portkit ran when the series was given so."""
    return PurePosixPath(series.replace("\\", "/")) / file


def _patch_uri(series: str, file: str) -> str:
    path = _patch_path(series, file)
    return path.as_uri() if path.is_absolute() else quote(str(path), safe="/")


def _rule_id(kind: str) -> str:
    return f"drift/{kind}"


def _fingerprint(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def sarif(report: DriftReport) -> str:
    """One run of tool `portkit`, a rule per drift status and one for semantic drift, a result
    per hunk that is not clean (at its @@ line in the patch file) and per semantic change (at
    the patch's first line: it is about the whole patch)."""
    kinds = list(RULE_TEXT)
    rules = [{"id": _rule_id(k), "name": RULE_TEXT[k][0],
              "shortDescription": {"text": RULE_TEXT[k][1]},
              "fullDescription": {"text": RULE_TEXT[k][2]},
              "help": {"text": RULE_TEXT[k][2]},
              "defaultConfiguration": {"level": SARIF_LEVELS[k]},
              "properties": {"tags": ["drift", "patch-series"]}} for k in kinds]
    results = []
    for t in report.targets:
        for p in t.patches:
            uri = _patch_uri(report.series, p.file)
            for n, h in enumerate(p.hunks):
                if h.status == CLEAN:
                    continue
                text = f"{t.target}: hunk {_where(h)} {h.status}: {_one_line(h.reason)}"
                if h.moved_to:
                    text += f"; moved to {_moved(h.moved_to)}"
                if h.nearest:
                    text += f"; nearest match at {h.nearest.file}:{h.nearest.line}"
                results.append(_sarif_result(
                    kinds, h.status, text, uri, h.patch_line,
                    _fingerprint(t.target, p.file, str(n), h.status),
                    {"target": t.target, "pin": t.pin, "patch": p.file, "hunk": _where(h),
                     "symbol": h.symbol, "offset": h.offset, "fuzz": h.fuzz}))
            for n, s in enumerate(p.semantic):
                results.append(_sarif_result(
                    kinds, SEMANTIC, f"{t.target}: {_semantic(s)}", uri, 1,
                    _fingerprint(t.target, p.file, f"semantic {n}", s.symbol, s.change),
                    {"target": t.target, "pin": t.pin, "patch": p.file, "symbol": s.symbol,
                     "change": s.change}))
    log = {"$schema": SARIF_SCHEMA, "version": "2.1.0",
           "runs": [{"tool": {"driver": {"name": "portkit", "version": __version__,
                                         "rules": rules}},
                     "results": results,
                     "properties": {"series": report.series,
                                    "targets": [t.target for t in report.targets]}}]}
    if report.not_vendored_line:
        log["runs"][0]["invocations"] = [{  # type: ignore[index]
            "executionSuccessful": True,
            "toolExecutionNotifications": [{"level": "note", "message": {
                "text": report.not_vendored_line}}]}]
    return json.dumps(valid_data(log), indent=2) + "\n"


def _sarif_result(kinds: list[str], kind: str, text: str, uri: str, line: int,
                  fingerprint: str, properties: dict[str, object]) -> dict[str, object]:
    return {"ruleId": _rule_id(kind), "ruleIndex": kinds.index(kind),
            "level": SARIF_LEVELS[kind], "message": {"text": text},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": uri},
                                                "region": {"startLine": line}}}],
            # Code scanning tracks an alert by its fingerprint: one per target, patch and hunk.
            "partialFingerprints": {"portkitDrift/v1": fingerprint},
            "properties": properties}


# GitHub Actions workflow commands.

def _gh_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_property(text: str) -> str:
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


def _annotation(level: str, file: str, line: int, title: str, message: str) -> str:
    return (f"::{level} file={_gh_property(file)},line={line},title={_gh_property(title)}"
            f"::{_gh_data(message)}")


def github(report: DriftReport, *, fail_on: FailOn) -> str:
    """Annotations on the patch files: `error` for what fails --fail-on, `warning` for any
    other conflict, relocation, fuzz or semantic drift; offsets and changes already in the
    tree are left out (GitHub shows only the first few annotations of a step)."""
    lines = []
    chosen = fail_on
    for t in report.targets:
        fail_on = effective_fail_on(report, t, chosen)
        failing = failing_statuses(fail_on)
        for p in t.patches:
            file = str(_patch_path(report.series, p.file))
            if p.status in (ALREADY_APPLIED, PRESENT_UPSTREAM) and p.status in failing:
                lines.append(_annotation("error", file, 1, f"{p.file}: {p.status} on {t.target}",
                                         f"{_first_reason(p)}; it leaves the fork's series "
                                         "at the move"))
            for h in p.hunks:
                if h.status not in (CONFLICT, RELOCATED, FUZZ):
                    continue
                message = "\n".join(_details_of_hunk(h))
                lines.append(_annotation("error" if h.status in failing else "warning", file,
                                         h.patch_line, f"{p.file}: {h.status} on {t.target}",
                                         message))
            for s in p.semantic:
                lines.append(_annotation("error" if SEMANTIC in fail_on else "warning", file, 1,
                                         f"{p.file}: semantic drift on {t.target}",
                                         _semantic(s)))
    if report.not_vendored_line:
        lines.append(f"::notice title=portkit drift::{_gh_data(report.not_vendored_line)}")
    return "".join(f"{line}\n" for line in lines)


def _details_of_hunk(h: HunkDrift) -> list[str]:
    lines = [f"hunk {_where(h)}{f' in {h.symbol}' if h.symbol else ''}: {_one_line(h.reason)}"]
    if h.moved_to:
        lines.append(f"moved to {_moved(h.moved_to)}")
    if h.nearest:
        lines.append(f"nearest match at {h.nearest.file}:{h.nearest.line}:")
        lines += h.nearest.text.splitlines()
    return lines


# The drift matrix: patches by targets, targets oldest first as given.

def _matrix_rows(report: DriftReport) -> list[tuple[str, str]]:
    """(file, subject) of every patch, in series order, over all targets."""
    seen: dict[str, str] = {}
    for t in report.targets:
        for p in t.patches:
            seen.setdefault(p.file, p.subject)
    return list(seen.items())


def _cell(t: TargetDrift, file: str) -> tuple[int, PatchDrift] | None:
    return next(((i, p) for i, p in _numbered(t) if p.file == file), None)


def first_broken(report: DriftReport, file: str, fail_on: FailOn) -> TargetDrift | None:
    """The first target (in the order given, oldest first) where the patch needs attention."""
    for t in report.targets:
        cell = _cell(t, file)
        if cell and needs_attention(cell[1], effective_fail_on(report, t, fail_on)):
            return t
    return None


def matrix_markdown(report: DriftReport, *, fail_on: FailOn) -> str:
    """A table of patches (rows) by targets (columns) with each patch's status there and the
    first target where it broke."""
    legend = " · ".join(f"{EMOJI[s]} {s}" for s in STATUSES)
    out = [f"## portkit drift matrix of {md_code(report.series, cell=False)}", "",
           f"{legend} · {SEMANTIC_MARK} semantic drift", "",
           "| # | patch | " + " | ".join(md_code(t.target) for t in report.targets) +
           " | first broke |",
           "|---:|---|" + "---|" * (len(report.targets) + 1)]
    for n, (file, subject) in enumerate(_matrix_rows(report), start=1):
        cells = []
        for t in report.targets:
            cell = _cell(t, file)
            cells.append("—" if cell is None else
                         f"{EMOJI[cell[1].status]} {cell[1].status}"
                         f"{f' {SEMANTIC_MARK}' if cell[1].semantic else ''}")
        broke = first_broken(report, file, fail_on)
        out.append(f"| {n} | {md_code(file)} {_md(subject)} | " + " | ".join(cells) +
                   f" | {md_code(broke.target) if broke else '—'} |")
    out += ["", f"First broke: the first target where `--fail-on` catches the patch (here: "
                f"{_fail_on_label(fail_on)})."]
    if report.not_vendored_line:
        out += ["", _md(report.not_vendored_line) + "."]
    return "\n".join(out) + "\n"


_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328;
       margin: 24px auto; max-width: 1180px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 32px 0 8px; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 15px; margin: 0 0 6px; }
code, pre { font: 12.5px/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
.lead { color: #59636e; margin: 0 0 14px; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 14px; margin: 0 0 14px; }
.legend span { display: inline-flex; align-items: center; gap: 6px; }
.swatch { display: inline-block; width: 16px; height: 16px; border-radius: 3px; }
table { border-collapse: separate; border-spacing: 3px; }
.matrix th { font-weight: 600; text-align: left; vertical-align: bottom; padding: 4px 6px; }
.matrix thead th.target { text-align: center; min-width: 160px; max-width: 200px;
                          overflow-wrap: anywhere; }
.matrix thead th small { display: block; font-weight: 400; color: #59636e; }
.matrix td.num { text-align: right; color: #59636e; padding-right: 6px; }
.matrix th.patch { font-weight: 400; max-width: 380px; }
.matrix th.patch code { display: block; color: #59636e; font-size: 11.5px; }
.matrix td.cell { padding: 0; min-width: 160px; border-radius: 4px; white-space: nowrap; }
.matrix td.cell a { display: block; padding: 9px 8px; text-align: center; font-weight: 600;
                    text-decoration: none; color: inherit; border-radius: 4px; }
.matrix td.cell a:hover { outline: 2px solid #1f2328; }
.matrix td.attn a { box-shadow: inset 0 0 0 3px #1f2328; }
.matrix td.missing { text-align: center; color: #8c959f; }
.matrix td.broke { padding-left: 10px; overflow-wrap: anywhere; max-width: 160px; }
.matrix tfoot td { color: #59636e; text-align: center; font-size: 12.5px; }
.mark { margin-left: 4px; }
section.patch { border: 1px solid #d0d7de; border-radius: 6px; padding: 12px 14px;
                margin: 12px 0; }
section.patch:target { border-color: #0969da; box-shadow: 0 0 0 3px #b6d7ff; }
.chip { display: inline-block; padding: 1px 8px; border-radius: 10px; font-weight: 600;
        font-size: 12.5px; }
.hunks { border-collapse: collapse; width: 100%; margin: 8px 0; }
.hunks th, .hunks td { border-bottom: 1px solid #d8dee4; padding: 4px 6px; text-align: left;
                       vertical-align: top; }
.hunks td:nth-child(2) code { white-space: nowrap; }
.attention { color: #cf222e; font-size: 13px; margin-left: 6px; }
pre { background: #f6f8fa; border-radius: 6px; padding: 8px 10px; overflow-x: auto; }
.back { font-size: 12.5px; }
"""


def _chip(status: Drift) -> str:
    bg, fg = HEAT[status]
    return f'<span class="chip" style="background:{bg};color:{fg}">{status}</span>'


def _anchor(ti: int, i: int) -> str:
    """The id of the details of target ti's i-th patch (numbers, so any file name works)."""
    return f"t{ti + 1}-p{i}"


def _html(text: str) -> str:
    # Control characters are parse errors in HTML too.
    return html.escape(_xml(text))


def matrix_html(report: DriftReport, *, fail_on: FailOn) -> str:
    """One self-contained page (inline CSS, no script, nothing fetched): a heatmap of patches
    by targets with a legend, the first target where each patch broke, and a details section
    for every cell, each cell linking to its own."""
    e = _html
    rows = _matrix_rows(report)
    legend = "".join(f'<span><i class="swatch" style="background:{HEAT[s][0]}"></i>{s}</span>'
                     for s in STATUSES)
    legend += (f'<span><b class="mark">{SEMANTIC_MARK}</b> semantic drift</span>'
               f'<span><i class="swatch" style="box-shadow:inset 0 0 0 3px #1f2328"></i>'
               f'needs attention (--fail-on {e(_fail_on_label(fail_on))})</span>')
    head = "".join(f'<th class="target">{e(t.target)}'
                   f'<small>{e(t.pin) if t.pin else "no pin"}</small></th>'
                   for t in report.targets)
    body = []
    for n, (file, subject) in enumerate(rows, start=1):
        tds = []
        for ti, t in enumerate(report.targets):
            cell = _cell(t, file)
            if cell is None:
                tds.append('<td class="missing" title="not in this target\'s series">—</td>')
                continue
            i, p = cell
            bg, fg = HEAT[p.status]
            attn = " attn" if needs_attention(p, effective_fail_on(report, t, fail_on)) else ""
            mark = f'<span class="mark">{SEMANTIC_MARK}</span>' if p.semantic else ""
            tip = e(f"{t.target}: {_status_label(p)}; {_counts(p.hunk_counts())}")
            tds.append(f'<td class="cell{attn}" style="background:{bg};color:{fg}">'
                       f'<a href="#{_anchor(ti, i)}" title="{tip}">{p.status}{mark}</a></td>')
        broke = first_broken(report, file, fail_on)
        body.append(f'<tr><td class="num">{n}</td><th class="patch" scope="row">{e(subject)}'
                    f'<code>{e(file)}</code></th>{"".join(tds)}'
                    f'<td class="broke">{e(broke.target) if broke else "—"}</td></tr>')
    foot = "".join(f"<td>{sum(1 for p in t.patches if needs_attention(p, fo))} of "
                   f"{len(t.patches)} need attention</td>" for t in report.targets
                   if (fo := effective_fail_on(report, t, fail_on)) is not None)
    sections = [_html_details(ti, t, effective_fail_on(report, t, fail_on))
                for ti, t in enumerate(report.targets)]
    n_targets = len(report.targets)
    unvendored = (f'\n<p class="lead">{e(report.not_vendored_line)}.</p>'
                  if report.not_vendored_line else "")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>portkit drift: {e(report.series)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1 id="matrix">Drift of <code>{e(report.series)}</code></h1>
<p class="lead">{len(rows)} patch{"es" if len(rows) != 1 else ""} on {n_targets} \
target{"s" if n_targets != 1 else ""}, oldest first. Each cell links to its details.</p>
<div class="legend">{legend}</div>{unvendored}
<table class="matrix">
<thead><tr><th></th><th>patch</th>{head}<th>first broke</th></tr></thead>
<tbody>
{chr(10).join(body)}
</tbody>
<tfoot><tr><td></td><td></td>{foot}<td></td></tr></tfoot>
</table>
<h2>Details</h2>
{chr(10).join(sections)}
</body>
</html>
"""


def _html_details(ti: int, t: TargetDrift, fail_on: FailOn) -> str:
    e = _html
    out = []
    for i, p in _numbered(t):
        attention = needs_attention(p, fail_on)
        parts = [f'<section class="patch" id="{_anchor(ti, i)}">',
                 f"<h3>{e(t.target)} · {i}. <code>{e(p.file)}</code> {_chip(p.status)}"
                 f"{'<span class=attention>needs attention</span>' if attention else ''}</h3>",
                 f"<div>{e(p.subject)}</div>",
                 '<table class="hunks"><tr><th>status</th><th>hunk</th><th>symbol</th>'
                 "<th>offset</th><th>fuzz</th><th>moved to</th><th>reason</th></tr>"]
        for h in p.hunks:
            moved = f"<code>{e(_moved(h.moved_to))}</code>" if h.moved_to else "—"
            parts.append(f"<tr><td>{_chip(h.status)}</td><td><code>{e(_where(h))}</code></td>"
                         f"<td>{f'<code>{e(h.symbol)}</code>' if h.symbol else '—'}</td>"
                         f"<td>{h.offset:+d}</td><td>{h.fuzz}</td><td>{moved}</td>"
                         f"<td>{e(h.reason)}</td></tr>")
        parts.append("</table>")
        for h in p.hunks:
            if h.nearest:
                parts.append(f"<div>Nearest match for hunk <code>{e(_where(h))}</code> at "
                             f"<code>{e(h.nearest.file)}:{h.nearest.line}</code>:</div>"
                             f"<pre>{e(h.nearest.text)}</pre>")
        if p.semantic:
            items = "".join(f"<li><code>{e(s.symbol)}</code> {s.change}: {e(s.detail)}</li>"
                            for s in p.semantic)
            parts.append(f"<div>Semantic drift:</div><ul>{items}</ul>")
        parts.append('<a class="back" href="#matrix">↑ matrix</a></section>')
        out.append("\n".join(parts))
    return "\n".join(out)
