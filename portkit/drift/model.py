"""The drift report: how each patch of a series fares on each target tree, hunk by hunk.

The model is what `portkit drift` computes and what every output format renders. It
serialises to the JSON schema `portkit-drift/2` and reads it back (and `portkit-drift/1`, the
same without `fork` and `not_vendored`), checking shape and values.

Statuses of a hunk, best to worst: clean, offset, fuzz, relocated, conflict; and two that say
the change is in the tree already: already-applied and present-upstream. A patch takes its
worst hunk's status under the order of RANK, in which the two "already there" statuses rank
below clean: a patch whose hunks are all already there takes one of them (already-applied
when every hunk is there verbatim, else present-upstream), and a patch with some hunks
already there and some not takes the worst of the others (its hunk counts still show the
rest).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from portkit.errors import InputError, PortkitError, UsageError
from portkit.report import valid_data

SCHEMA = "portkit-drift/2"
SCHEMAS = ("portkit-drift/1", SCHEMA)  # what the reader takes (1: no fork, nothing left out)

class Drift(StrEnum):
    """How one hunk of a patch fares on a target. In display order (summary keys, table
    columns): how far a patch has drifted, then the two statuses of a change that is in the
    tree already."""

    CLEAN = "clean"
    OFFSET = "offset"
    FUZZ = "fuzz"
    RELOCATED = "relocated"
    CONFLICT = "conflict"
    ALREADY_APPLIED = "already-applied"
    PRESENT_UPSTREAM = "present-upstream"


CLEAN, OFFSET, FUZZ, RELOCATED, CONFLICT, ALREADY_APPLIED, PRESENT_UPSTREAM = Drift
STATUSES = tuple(Drift)
# Order for worst(): higher is worse. A hunk already in the tree needs nothing, so it ranks
# below clean; already-applied is the narrower claim (the exact patch is there), so a patch
# whose hunks are there partly verbatim and partly in upstream's own form is present-upstream.
RANK = {ALREADY_APPLIED: 0, PRESENT_UPSTREAM: 1, CLEAN: 2, OFFSET: 3, FUZZ: 4, RELOCATED: 5,
        CONFLICT: 6}

# The summary counts patches per status; SEMANTIC counts, on top, the patches with semantic
# drift (a patch with semantic drift is also counted under its status).
SEMANTIC = "semantic"

MOVE_HOWS = ("exact", "alias", "structure", "similarity")
SEMANTIC_CHANGES = ("removed", "renamed", "signature", "type")

# --fail-on: which patches make `portkit drift` exit ATTENTION_EXIT. A status value fails that
# status and every worse one (fuzz: fuzz, relocated, conflict); semantic fails a patch with
# semantic drift whatever its status; never fails nothing and stands alone. offset and the
# "already there" statuses never fail.
# dropped fails a patch whose change is there already (already-applied, present-upstream):
# in a fork's report it always applies (unless never), since the patch would leave its series.
DROPPED = "dropped"
FAIL_ON_CHOICES = (CONFLICT, SEMANTIC, RELOCATED, FUZZ, DROPPED, "never")
DEFAULT_FAIL_ON = frozenset({CONFLICT, SEMANTIC})
# A result, not a failure: apart from every failure's code (docs/exit-codes.md), so that CI
# tells "the series drifted" from "portkit could not run".
ATTENTION_EXIT = 20
_FAILING_STATUSES = {
    CONFLICT: frozenset({CONFLICT}),
    RELOCATED: frozenset({RELOCATED, CONFLICT}),
    FUZZ: frozenset({FUZZ, RELOCATED, CONFLICT}),
    DROPPED: frozenset({ALREADY_APPLIED, PRESENT_UPSTREAM}),
}


def worst(statuses: Iterable[Drift]) -> Drift:
    """The worst of hunk statuses under RANK; clean when there are none."""
    return max(statuses, key=RANK.__getitem__, default=CLEAN)


def _require(ok: bool, message: str) -> None:
    # The constructors check values (a bad one from portkit's own code is a bug, from a
    # JSON file a user error: the reader turns the ValueError into a PortkitError with a path).
    if not ok:
        raise ValueError(message)


def _one_of(value: str, allowed: Iterable[str]) -> str:
    return f"{value[:40]!r} is not one of {', '.join(allowed)}"


@dataclass(frozen=True)
class Moved:
    """Where a hunk's code went in the target: file, line, symbol and how it was found."""

    file: str
    line: int
    symbol: str | None
    how: str

    def __post_init__(self) -> None:
        _require(self.how in MOVE_HOWS, f"how: {_one_of(self.how, MOVE_HOWS)}")
        _require(self.line >= 1, f"line: {self.line} is not a line number")


@dataclass(frozen=True)
class Nearest:
    """The closest text the target has to a hunk that does not apply."""

    file: str
    line: int
    text: str

    def __post_init__(self) -> None:
        _require(self.line >= 1, f"line: {self.line} is not a line number")


@dataclass(frozen=True)
class HunkDrift:
    """One hunk of a patch on one target.

    old_start is the hunk's start in the old file (0 for a new file); offset is how many lines
    the hunk moved (signed); fuzz is how many context lines were ignored; patch_line is the
    1-based line of the hunk's @@ header in the patch file (for SARIF and annotations).
    """

    file: str
    old_start: int
    status: Drift
    reason: str
    patch_line: int
    offset: int = 0
    fuzz: int = 0
    symbol: str | None = None
    moved_to: Moved | None = None
    nearest: Nearest | None = None

    def __post_init__(self) -> None:
        _require(self.status in RANK, f"status: {_one_of(self.status, STATUSES)}")
        object.__setattr__(self, "status", Drift(self.status))  # read from JSON: a str
        _require(self.old_start >= 0, f"old_start: {self.old_start} is negative")
        _require(self.fuzz >= 0, f"fuzz: {self.fuzz} is negative")
        _require(self.patch_line >= 1, f"patch_line: {self.patch_line} is not a line number")


@dataclass(frozen=True)
class SemanticChange:
    """A symbol the patch relies on that changed in the target, though its text may apply."""

    symbol: str
    change: str
    detail: str

    def __post_init__(self) -> None:
        _require(self.change in SEMANTIC_CHANGES,
                 f"change: {_one_of(self.change, SEMANTIC_CHANGES)}")


@dataclass(frozen=True)
class PatchDrift:
    """One patch of the series on one target; its status is its worst hunk's."""

    file: str
    subject: str
    hunks: tuple[HunkDrift, ...]
    semantic: tuple[SemanticChange, ...] = ()

    @property
    def status(self) -> Drift:
        return worst(h.status for h in self.hunks)

    def hunk_counts(self) -> dict[str, int]:
        """Hunks per status, in STATUSES order, statuses with no hunk left out."""
        counts = Counter(h.status for h in self.hunks)
        return {s: counts[s] for s in STATUSES if counts[s]}


@dataclass(frozen=True)
class TargetDrift:
    """The whole series on one target tree, patches in series order."""

    target: str
    pin: str | None
    patches: tuple[PatchDrift, ...]
    own: bool = False  # the fork's own vendored tree: its series is in it already

    @property
    def summary(self) -> dict[str, int]:
        """Patches per status (every status, summing to the number of patches), then how many
        patches have semantic drift."""
        counts = Counter(p.status for p in self.patches)
        summary: dict[str, int] = {s: counts[s] for s in STATUSES}
        summary[SEMANTIC] = sum(1 for p in self.patches if p.semantic)
        return summary


@dataclass(frozen=True)
class NotVendored:
    """A file section of a fork's patch for a file the fork does not vendor: not checked."""

    patch: str
    file: str


@dataclass(frozen=True)
class DriftReport:
    """A series against one or more target trees (targets in the order given). `fork`: the
    series is an ollama-style fork's (a patch already there would leave it: news);
    `not_vendored`: the sections left out, for files the fork does not vendor."""

    series: str
    targets: tuple[TargetDrift, ...]
    fork: bool = False
    not_vendored: tuple[NotVendored, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "series": self.series, "fork": self.fork,
                "not_vendored": [{"patch": n.patch, "file": n.file} for n in self.not_vendored],
                "targets": [_target_dict(t) for t in self.targets]}

    @property
    def not_vendored_line(self) -> str | None:
        """The one line every format says about the sections left out, if any."""
        n = len(self.not_vendored)
        if not n:
            return None
        files = sorted({x.file for x in self.not_vendored})
        return (f"{n} section{'s' if n != 1 else ''} touch{'es' if n == 1 else ''} files "
                f"this fork does not vendor: not checked ({', '.join(files)})")

    def to_json(self) -> str:
        return json.dumps(valid_data(self.to_dict()), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> DriftReport:
        """Read a `portkit-drift/2` (or /1) document; bad shape or values raise a one-line
        PortkitError naming the place (e.g. targets[0].patches[2].hunks[1].status)."""
        return _read_report(data)

    @classmethod
    def from_json(cls, text: str) -> DriftReport:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # bad JSON, 5000 digits, [[[[...
            raise InputError(f"drift report: not JSON ({str(exc)[:120] or 'nested too deep'})"
                             ) from None
        return _read_report(data)


_LARGEST = 10**9


def parse_fail_on(values: Iterable[str]) -> frozenset[str]:
    """The --fail-on values (repeatable) as a set; none given means DEFAULT_FAIL_ON and
    `never` means the empty set."""
    chosen = frozenset(values)
    if not chosen:
        return DEFAULT_FAIL_ON
    unknown = sorted(chosen - set(FAIL_ON_CHOICES))
    if unknown:
        raise UsageError(f"--fail-on: {_one_of(unknown[0], FAIL_ON_CHOICES)}")
    if "never" in chosen:
        if len(chosen) > 1:
            raise UsageError("--fail-on never cannot be combined with other values")
        return frozenset()
    return chosen


def effective_fail_on(report: DriftReport, target: TargetDrift,
                      fail_on: Iterable[str]) -> frozenset[str]:
    """--fail-on as it applies to `target` of `report`: in a fork's report, on a target other
    than the fork's own tree, a patch that is there already (it would be dropped from the
    fork's series at the move) needs attention too, unless never."""
    chosen = frozenset(fail_on)
    return chosen | {DROPPED} if report.fork and chosen and not target.own else chosen


def failing_statuses(fail_on: Iterable[str]) -> frozenset[str]:
    """The patch (and hunk) statuses that --fail-on values fail."""
    return frozenset().union(*(_FAILING_STATUSES.get(v, ()) for v in fail_on))


def needs_attention(patch: PatchDrift, fail_on: Iterable[str] = DEFAULT_FAIL_ON) -> bool:
    """Whether the patch trips --fail-on (values as parse_fail_on returns them)."""
    chosen = frozenset(fail_on)
    return (SEMANTIC in chosen and bool(patch.semantic)) or \
        patch.status in failing_statuses(chosen)


def exit_code(report: DriftReport, fail_on: Iterable[str] = DEFAULT_FAIL_ON) -> int:
    """ATTENTION_EXIT when any patch on any target needs attention, else 0."""
    attention = any(needs_attention(p, effective_fail_on(report, t, fail_on))
                    for t in report.targets for p in t.patches)
    return ATTENTION_EXIT if attention else 0


def _target_dict(t: TargetDrift) -> dict[str, Any]:
    return {"target": t.target, "pin": t.pin, "own": t.own, "summary": t.summary,
            "patches": [_patch_dict(p) for p in t.patches]}


def _patch_dict(p: PatchDrift) -> dict[str, Any]:
    return {"file": p.file, "subject": p.subject, "status": p.status,
            "hunks": [_hunk_dict(h) for h in p.hunks],
            "semantic": [{"symbol": s.symbol, "change": s.change, "detail": s.detail}
                         for s in p.semantic]}


def _hunk_dict(h: HunkDrift) -> dict[str, Any]:
    moved = h.moved_to
    near = h.nearest
    return {"file": h.file, "old_start": h.old_start, "patch_line": h.patch_line,
            "status": h.status, "offset": h.offset, "fuzz": h.fuzz, "symbol": h.symbol,
            "moved_to": None if moved is None else {"file": moved.file, "line": moved.line,
                                                    "symbol": moved.symbol, "how": moved.how},
            "reason": h.reason,
            "nearest": None if near is None else {"file": near.file, "line": near.line,
                                                  "text": near.text}}


# Reading: each reader takes the JSON value and its place in the document, for messages.

T = TypeVar("T")


class _Obj:
    """A JSON object whose keys must be exactly the expected ones, read field by field."""

    def __init__(self, data: Any, where: str, keys: Iterable[str]) -> None:
        if not isinstance(data, dict):
            raise _bad(where, f"expected an object, got {_kind(data)}")
        expected = list(keys)
        missing = [k for k in expected if k not in data]
        if missing:
            raise _bad(where, f"missing key {missing[0]!r}")
        extra = sorted(set(data) - set(expected))
        if extra:
            raise _bad(where, f"unknown key {extra[0]!r}")
        self.data: Mapping[str, Any] = data
        self.where = where

    def at(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def text(self, key: str, *, optional: bool = False) -> Any:
        value = self.data[key]
        if not (isinstance(value, str) or (optional and value is None)):
            raise _bad(self.at(key), f"expected {'a string or null' if optional else 'a string'}"
                                     f", got {_kind(value)}")
        return value

    def integer(self, key: str) -> int:
        value = self.data[key]
        # bool is an int in Python but not a number in JSON.
        if not isinstance(value, int) or isinstance(value, bool):
            raise _bad(self.at(key), f"expected an integer, got {_kind(value)}")
        if abs(value) > _LARGEST:  # a line, an offset or a count no source file has
            raise _bad(self.at(key), f"{value:.3g} is out of range" if abs(value) < 10**300
                       else "out of range")
        return value

    def items(self, key: str, read: Callable[[Any, str], T]) -> tuple[T, ...]:
        value = self.data[key]
        if not isinstance(value, list):
            raise _bad(self.at(key), f"expected a list, got {_kind(value)}")
        return tuple(read(item, f"{self.at(key)}[{i}]") for i, item in enumerate(value))

    def optional(self, key: str, read: Callable[[Any, str], T]) -> T | None:
        value = self.data[key]
        return None if value is None else read(value, self.at(key))

    def build(self, make: Callable[..., T], **fields: Any) -> T:
        try:
            return make(**fields)
        except ValueError as exc:
            raise InputError(f"drift report: {self.where}.{exc}") from None


def _bad(where: str, message: str) -> PortkitError:
    return InputError(": ".join(part for part in ("drift report", where, message) if part))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _read_report(data: Any) -> DriftReport:
    if not isinstance(data, dict):
        raise _bad("", f"expected an object, got {_kind(data)}")
    schema = data.get("schema")
    if schema not in SCHEMAS:
        raise _bad("schema", f"{str(schema)[:40]!r} is not {' or '.join(SCHEMAS)}")
    old = schema == SCHEMAS[0]
    obj = _Obj(data, "", ["schema", "series", "targets"] if old else
               ["schema", "series", "fork", "not_vendored", "targets"])
    fork = False if old else obj.data["fork"]
    if not isinstance(fork, bool):
        raise _bad(obj.at("fork"), f"expected a boolean, got {_kind(fork)}")
    reader = _read_target_1 if old else _read_target
    return DriftReport(series=obj.text("series"), targets=obj.items("targets", reader),
                       fork=fork, not_vendored=() if old else obj.items("not_vendored",
                                                                       _read_not_vendored))


def _read_not_vendored(data: Any, where: str) -> NotVendored:
    obj = _Obj(data, where, ["patch", "file"])
    return NotVendored(patch=obj.text("patch"), file=obj.text("file"))


def _read_target_1(data: Any, where: str) -> TargetDrift:
    return _read_target(data, where, old=True)


def _read_target(data: Any, where: str, *, old: bool = False) -> TargetDrift:
    obj = _Obj(data, where, ["target", "pin", "summary", "patches"] if old else
               ["target", "pin", "own", "summary", "patches"])
    own = False if old else obj.data["own"]
    if not isinstance(own, bool):
        raise _bad(obj.at("own"), f"expected a boolean, got {_kind(own)}")
    target = TargetDrift(target=obj.text("target"), pin=obj.text("pin", optional=True),
                         patches=obj.items("patches", _read_patch), own=own)
    if obj.data["summary"] != target.summary:
        raise _bad(obj.at("summary"), "does not match the patches (expected "
                                      f"{json.dumps(target.summary, separators=(',', ':'))})")
    return target


def _read_patch(data: Any, where: str) -> PatchDrift:
    obj = _Obj(data, where, ["file", "subject", "status", "hunks", "semantic"])
    status = obj.text("status")
    patch = PatchDrift(file=obj.text("file"), subject=obj.text("subject"),
                       hunks=obj.items("hunks", _read_hunk),
                       semantic=obj.items("semantic", _read_semantic))
    if status != patch.status:
        raise _bad(obj.at("status"), f"{status[:40]!r} is not its worst hunk's status "
                                     f"{patch.status.value!r}")
    return patch


def _read_hunk(data: Any, where: str) -> HunkDrift:
    obj = _Obj(data, where, ["file", "old_start", "patch_line", "status", "offset", "fuzz",
                             "symbol", "moved_to", "reason", "nearest"])
    return obj.build(HunkDrift, file=obj.text("file"), old_start=obj.integer("old_start"),
                     patch_line=obj.integer("patch_line"), status=obj.text("status"),
                     offset=obj.integer("offset"), fuzz=obj.integer("fuzz"),
                     symbol=obj.text("symbol", optional=True),
                     moved_to=obj.optional("moved_to", _read_moved), reason=obj.text("reason"),
                     nearest=obj.optional("nearest", _read_nearest))


def _read_moved(data: Any, where: str) -> Moved:
    obj = _Obj(data, where, ["file", "line", "symbol", "how"])
    return obj.build(Moved, file=obj.text("file"), line=obj.integer("line"),
                     symbol=obj.text("symbol", optional=True), how=obj.text("how"))


def _read_nearest(data: Any, where: str) -> Nearest:
    obj = _Obj(data, where, ["file", "line", "text"])
    return obj.build(Nearest, file=obj.text("file"), line=obj.integer("line"),
                     text=obj.text("text"))


def _read_semantic(data: Any, where: str) -> SemanticChange:
    obj = _Obj(data, where, ["symbol", "change", "detail"])
    return obj.build(SemanticChange, symbol=obj.text("symbol"), change=obj.text("change"),
                     detail=obj.text("detail"))
