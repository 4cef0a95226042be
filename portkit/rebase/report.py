"""What a rebase says: each patch's status (unchanged, merged, relocated, dropped,
needs-human, needs-review) and why, the report (schema portkit-rebase/2) and its formats.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from portkit.drift import model as dm
from portkit.errors import UsageError
from portkit.fork import (
    not_vendored_line,
)
from portkit.report import md_code, valid_data, valid_text
from portkit.series import (
    Series,
)

SCHEMA = "portkit-rebase/2"


class Verdict(StrEnum):
    """What became of one patch of a rebased series, from least to most attention."""

    UNCHANGED = "unchanged"  # carried as it is (its lines may have moved)
    MERGED = "merged"  # carried, merged three ways or without hunks upstream has already
    RELOCATED = "relocated"  # a hunk went where drift followed its code
    DROPPED = "dropped"  # upstream has it: left out of the carried series
    NEEDS_HUMAN = "needs-human"  # not carried (or only in part): a side file holds the rest
    NEEDS_REVIEW = "needs-review"  # carried, with something a person must check


UNCHANGED, MERGED, RELOCATED, DROPPED, NEEDS_HUMAN, NEEDS_REVIEW = Verdict
STATUSES = tuple(Verdict)


ATTENTION = (NEEDS_HUMAN, NEEDS_REVIEW)


ATTENTION_EXIT = dm.ATTENTION_EXIT  # as drift: the series needs a person, portkit ran fine


CONFLICTS = "needs-human"  # the side files' folder in --out


FORMATS = ("table", "json", "markdown")


@dataclass(frozen=True)
class RebasedPatch:
    """One patch of the series on the target: what became of it and why."""

    file: str
    subject: str
    status: Verdict
    reason: str
    output: str | None  # its file name in the carried series; None when left out
    conflict: str | None = None  # the side file (relative to --out) of a needs-human patch

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {', '.join(STATUSES)}")
        object.__setattr__(self, "status", Verdict(self.status))


@dataclass(frozen=True)
class RebaseReport:
    """The series carried onto one target, patches in series order."""

    series: str
    base: str | None  # the base's pin
    target: str
    pin: str | None  # the target's pin
    patches: tuple[RebasedPatch, ...]
    fork: bool = False  # a fork's series: a dropped patch leaves it, and needs attention
    not_vendored: tuple[tuple[str, str], ...] = ()  # (patch, file): sections not checked
    base_tree: str | None = None  # the base as it was given (--base), when it was

    @property
    def summary(self) -> dict[str, int]:
        counts = Counter(p.status for p in self.patches)
        return {s: counts[s] for s in STATUSES}

    def needs_attention(self, p: RebasedPatch) -> bool:
        """A patch needs a human or a review; in a fork, also a patch it drops."""
        return p.status in ATTENTION or (self.fork and p.status == DROPPED)

    @property
    def attention(self) -> list[RebasedPatch]:
        return [p for p in self.patches if self.needs_attention(p)]

    @property
    def exit_code(self) -> int:
        """ATTENTION_EXIT when a patch needs attention, else 0."""
        return ATTENTION_EXIT if self.attention else 0

    @property
    def not_vendored_line(self) -> str | None:
        if not self.not_vendored:
            return None
        files = sorted({f for _, f in self.not_vendored})
        return f"{not_vendored_line(len(self.not_vendored))} ({', '.join(files)})"

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "series": self.series, "base": self.base,
                "base_tree": self.base_tree, "target": self.target, "pin": self.pin,
                "fork": self.fork,
                "summary": self.summary,
                "attention": [p.file for p in self.attention],
                "not_vendored": [{"patch": p, "file": f} for p, f in self.not_vendored],
                "patches": [{"file": p.file, "subject": p.subject, "status": p.status,
                             "reason": p.reason, "output": p.output, "conflict": p.conflict}
                            for p in self.patches]}

    def to_json(self) -> str:
        return json.dumps(valid_data(self.to_dict()), indent=2) + "\n"


@dataclass
class Rebased:
    """A finished rebase: the report, the carried series and the side files (by path
    relative to --out), ready to be written."""

    report: RebaseReport
    series: Series
    side_files: dict[str, bytes] = field(default_factory=dict)
    # the target's files the carried series changes, as it leaves them (by series path)
    carried: dict[str, bytes | None] = field(default_factory=dict)

    def files(self) -> dict[str, bytes]:
        """Every file of --out, by relative path."""
        out = {p.name: p.data for p in self.series.patches}
        if self.series.kind == "quilt":
            out["series"] = self.series.listing()
        return {**out, **self.side_files}


def render(report: RebaseReport, fmt: str) -> str:
    """The report as text: table, json or markdown (valid UTF-8, whatever the series'
    bytes)."""
    return valid_text(_render(report, fmt))


def _render(report: RebaseReport, fmt: str) -> str:
    if fmt == "json":
        return report.to_json()
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    counts = ", ".join(f"{n} {s}" for s, n in report.summary.items() if n)
    title = (f"{report.series} onto {report.target}"
             + (f" ({report.pin[:12]})" if report.pin else "") + f": {counts}")
    attention = report.attention
    needing = (f"{len(attention)} patch{'es' if len(attention) != 1 else ''} need"
               f"{'s' if len(attention) == 1 else ''} attention")
    notes = [needing + (f": {', '.join(p.file for p in attention)}" if attention else "")]
    if report.fork and any(p.status == DROPPED for p in report.patches):
        notes.append("in a fork a dropped patch needs attention: its file leaves "
                     "llama/patches with the move")
    if report.not_vendored_line:
        notes.append(report.not_vendored_line)
    mark = {True: "!", False: " "}
    if fmt == "markdown":
        lines = [f"### portkit rebase: {_md(title)}", "",
                 "| # | patch | status | attention | output | reason |",
                 "|---|---|---|---|---|---|"]
        lines += [f"| {i} | {md_code(p.file)} | {p.status} | "
                  f"{'yes' if report.needs_attention(p) else '-'} | "
                  f"{md_code(p.output) if p.output else '-'} | "
                  f"{_md(p.reason)}{' (' + md_code(p.conflict) + ')' if p.conflict else ''} |"
                  for i, p in enumerate(report.patches, 1)]
        said = [needing + (": " + ", ".join(md_code(p.file, cell=False) for p in attention)
                           if attention else ""), *(_md(n) for n in notes[1:])]
        lines += [""] + [f"{n}." for n in said]
        return "\n".join(lines) + "\n"
    width = max((len(p.file) for p in report.patches), default=5)
    lines = [title, ""]
    lines += [f"{i:>3} {mark[report.needs_attention(p)]}{p.file:<{width}}  {p.status:<12}  "
              f"{p.reason}" + (f" (written as {p.output})" if p.output and p.output != p.file
                               else "") for i, p in enumerate(report.patches, 1)]
    lines += [""] + notes
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
