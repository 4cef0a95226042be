"""Stage 6, validate: build the tree unpatched and patched, and prove a feature in numbers.

The tree is validated as it stands: when portkit applied the feature, "patched" is the tree
as the user has it and "unpatched" is a copy with the recorded series reversed; a tree that
does not carry the feature yet gets it rendered and applied in a copy. A third copy,
"broken", carries the feature rendered from deliberately broken templates: the checks must
catch it. The tree may be a whole llama.cpp tree or the subset an ollama-style fork vendors
(portkit's build handles both). Which checks run is the feature's own business (its
manifest's [validation] names a module of portkit.checks, a harness that measures everything
through llama.h, and the tree with the feature upstream that serves as the live reference);
this module prepares the copies, builds them, runs the harness and reports.

Every copy lives in the cache under the key of its content (the tree's files and, through
them, the series applied): copies of equal content are one copy, with one build and one set
of runs, whichever tree they came from. validate/builds/<key>/ holds the copy (llama.cpp/,
and ggml/ when the tree keeps ggml apart), its build/ and the logs of its runs/;
validate/trees/<key of the tree's path>/ links the variants of the last validation of a tree.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from portkit.apply import patched_contents, read_record
from portkit.build import Sources, build_harness, check_buildable, harness_binary, pending_steps
from portkit.cache import cache_dir, exclusive, lay_down, publish, scratch, sweep
from portkit.errors import (
    RecordError,
    SpecError,
    ToolFailed,
    ToolMissing,
    TreeError,
    ValidationFailed,
)
from portkit.features import Feature
from portkit.models import model_path
from portkit.proc import run
from portkit.render import Rendered, render
from portkit.tree import Tree, detect

TEXT = Path("/usr/share/common-licenses/GPL-3")

PASS, FAIL, DOCUMENTED, AS_UPSTREAM, OWN_NUMERICS = (
    "pass", "fail", "documented", "as upstream", "own numerics")
UNPATCHED, PATCHED, BROKEN, UPSTREAM = "unpatched", "patched", "broken", "upstream"

_SKIP = {".git", ".portkit", "__pycache__"}
_SKIP_TOP = {"models", "docs", "media"}  # big folders of a llama.cpp tree that no build reads


# -- the report -----------------------------------------------------------------------------


@dataclass
class Check:
    id: str
    title: str
    verdict: str
    figures: dict[str, Any] = field(default_factory=dict)
    detail: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)  # a table for the summary


@dataclass
class Report:
    tree: str
    pin: str | None
    mode: str
    models: list[str]
    checks: list[Check]
    workspace: str
    reference: str | None = None  # "upstream 0.3.20 (llama.cpp f49e9178...)", or None

    @property
    def passed(self) -> bool:
        return all(c.verdict != FAIL for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}

    def failure(self) -> ValidationFailed:
        """What a command raises, once it has shown the report, when a check fails: one line
        naming the failing checks, exit 21 (docs/exit-codes.md)."""
        failing = [f"{c.id} ({c.title})" for c in self.checks if c.verdict == FAIL]
        return ValidationFailed(f"validation failed: check {', '.join(failing)} "
                                f"of {self.tree}")

    def _head(self) -> str:
        return (f"validation of {self.tree} (llama.cpp {(self.pin or '?')[:12]}), "
                f"{self.mode}, models: {', '.join(self.models)}")

    def text(self) -> str:
        """Every check with its figures, then the one-screen summary."""
        lines = [self._head()]
        for c in self.checks:
            lines.append(f"[{c.verdict.upper():>12}] {c.id}: {c.title}")
            lines += [f"               {k}: {v}" for k, v in c.figures.items()]
            if c.detail:
                lines.append(f"               {c.detail}")
        return "\n".join(lines) + "\n\n" + self.summary()

    def summary(self) -> str:
        """PASS/FAIL per check, the KLD table, where the logs are: one screen."""
        lines = [f"{'PASSED' if self.passed else 'FAILED'}: {self._head()}"]
        if self.reference:
            lines.append(f"reference: {self.reference}, built and run side by side")
        for c in self.checks:
            lines.append(f"  {c.id}  {c.verdict.upper():<12} {c.title}")
        for c in self.checks:
            if c.rows:
                lines += ["", *_kld_table(c.rows)]
        lines.append(f"logs: {self.workspace}")
        return "\n".join(lines)

    def markdown(self) -> str:
        out = [f"### portkit validate: {'passed' if self.passed else 'FAILED'}", "",
               f"Tree `{self.tree}` (llama.cpp `{(self.pin or '?')[:12]}`), {self.mode}, "
               f"models: {', '.join(self.models)}."
               + (f" Reference: {self.reference}." if self.reference else ""), "",
               "| check | verdict | figures | why |", "|---|---|---|---|"]
        for c in self.checks:
            figs = "<br>".join(f"{k}: {v}" for k, v in c.figures.items())
            out.append(f"| {c.id}: {c.title} | {c.verdict} | {figs} | {c.detail} |")
        for c in self.checks:
            if c.rows:
                out += ["", "```", *_kld_table(c.rows), "```"]
        out += ["", f"Logs: `{self.workspace}`"]
        return "\n".join(out) + "\n"


def _kld_table(rows: list[dict[str, Any]]) -> list[str]:
    """Rows of {model, config, and per column a (KLD, top-1) pair or None}, a block per
    model."""
    columns = [k for k in rows[0] if k not in ("model", "config")]
    lines: list[str] = []
    for model in dict.fromkeys(row["model"] for row in rows):
        lines += [f"{model}: KLD, top-1 % against the base (f16-cache logits)",
                  (f"  {'K/V cache':<10}" + "".join(f" {c:<17}" for c in columns)).rstrip()]
        for row in rows:
            if row["model"] == model:
                cells = [f"{row[c][0]:9.6f} {row[c][1]:7.3f}" if row[c] else "-"
                         for c in columns]
                lines.append((f"  {row['config']:<10}" + "".join(f" {c:<17}" for c in cells))
                             .rstrip())
    return lines


# -- progress --------------------------------------------------------------------------------

COLD_BUILD_STEPS = 175  # ninja steps of a build from nothing, near enough for an estimate
# First guesses of how long a step takes (seconds), replaced by what this machine measured:
# a first validation on two cores (4 builds, two of them mostly from ccache: 0.45 s a step
# on average; SmolLM2 runs) took 10.7 min.
_GUESS = {"build-step": 0.45, "base": 17.0, "kld": 22.0, "shift": 2.0, "state": 9.0}


class Progress:
    """Numbered steps with an estimate of the time left, on stderr."""

    def __init__(self) -> None:
        self.file = cache_dir("validate") / "timings.json"
        try:
            read = json.loads(self.file.read_text())
        except (OSError, ValueError):
            read = {}
        # the file is only a cache of estimates: anything but names and positive numbers
        # in it is ignored, never trusted
        self.timings: dict[str, float] = {
            k: float(v) for k, v in (read.items() if isinstance(read, dict) else ())
            if isinstance(k, str) and isinstance(v, int | float) and 0 < v < 1e6}
        self.done = 0
        self.ahead: list[tuple[str, str, float]] = []  # (kind, model, units) of steps to come

    def say(self, message: str) -> None:
        sys.stderr.write(f"portkit validate: {message}\n")
        sys.stderr.flush()

    def guess(self, kind: str, model: str = "", units: float = 1.0) -> float:
        key = f"{kind}:{model}" if model else kind
        return units * self.timings.get(
            key, _GUESS[kind] * (2.5 if model and "qwen" in model else 1.0))

    def learn(self, kind: str, model: str, seconds: float) -> None:
        key = f"{kind}:{model}" if model else kind
        old = self.timings.get(key)
        self.timings[key] = seconds if old is None else 0.5 * old + 0.5 * seconds
        with contextlib.suppress(OSError):  # estimates are a nicety
            self.file.write_text(json.dumps(self.timings, indent=1))

    def left(self) -> float:
        return sum(self.guess(kind, model, units) for kind, model, units in self.ahead)

    def plan(self, steps: list[tuple[str, str, float]], what: str) -> None:
        """Announce the steps to come: (kind, model, units) each, for the estimate."""
        self.ahead = list(steps)
        if steps:
            self.say(f"{what}: {len(steps)} step(s), about {_minutes(self.left())}")

    def step(self, message: str) -> None:
        """The next planned step begins (one that was not planned is numbered too)."""
        self.done += 1
        total = self.done + max(0, len(self.ahead) - 1)
        self.say(f"[{self.done}/{total}] {message} (about {_minutes(self.left())} left)")
        self.ahead = self.ahead[1:]


def _minutes(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds / 60))} min"


# -- copies of a tree, keyed by their content ---------------------------------------------------


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    """The files under `root` a build may read (relative posix path, path), in order."""
    for dirpath, dirnames, filenames in os.walk(root):
        top = Path(dirpath) == root
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP and not (
            top and (d.startswith("build") or d in _SKIP_TOP)))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            yield path.relative_to(root).as_posix(), path


def _ignore(root: Path) -> Callable[[str, list[str]], set[str]]:
    """copytree's ignore: what _walk leaves out."""
    def ignore(folder: str, names: list[str]) -> set[str]:
        top = Path(folder) == root
        return {n for n in names if n in _SKIP or (top and (n in _SKIP_TOP or (
            n.startswith("build") and (Path(folder) / n).is_dir())))}
    return ignore


@dataclass(frozen=True)
class Overlay:
    """A tree's sources with some files of its llama.cpp root changed (None: deleted):
    what one variant compiles."""

    llama_root: Path
    ggml_root: Path
    changes: dict[str, bytes | None] = field(default_factory=dict)  # relative to llama_root

    @property
    def ggml_apart(self) -> bool:
        return not self.ggml_root.resolve().is_relative_to(self.llama_root.resolve())

    def parts(self) -> list[tuple[str, Path]]:
        return [("llama.cpp", self.llama_root)] + (
            [("ggml", self.ggml_root)] if self.ggml_apart else [])

    def key(self) -> str:
        digest = hashlib.sha256()
        for name, root in self.parts():
            changes = self.changes if name == "llama.cpp" else {}
            entries = {rel: path for rel, path in _walk(root)}
            for rel in sorted(set(entries) | {r for r, d in changes.items() if d is not None}):
                data = changes[rel] if rel in changes else entries[rel].read_bytes()
                if data is None:
                    continue
                digest.update(f"{name}/{rel}\0".encode())
                digest.update(hashlib.sha256(data).digest())
        return digest.hexdigest()[:20]


@dataclass(frozen=True)
class Variant:
    """One build of validation: a copy of a tree in the cache, its build and its runs."""

    name: str  # unpatched, patched, broken, upstream
    label: str  # how progress and reports call it ("upstream 0.3.20")
    folder: Path

    @property
    def key(self) -> str:
        return self.folder.name

    @property
    def sources(self) -> Sources:
        llama = self.folder / "llama.cpp"
        ggml = self.folder / "ggml"
        return Sources(llama, ggml if ggml.is_dir() else llama / "ggml")

    @property
    def build(self) -> Path:
        return self.folder / "build"

    @property
    def runs(self) -> Path:
        path = self.folder / "runs"
        path.mkdir(exist_ok=True)
        return path


def _materialize(overlay: Overlay, what: str, progress: Progress) -> Path:
    """The copy of `overlay` in the cache (made once per content)."""
    builds = cache_dir("validate", "builds")
    key = overlay.key()
    folder = builds / key
    if (folder / "made").is_file():
        return folder
    with exclusive(f"validate-{key}", f"copying {what}"):
        if (folder / "made").is_file():
            return folder
        sweep(builds)
        progress.say(f"copying {what} into {folder}")
        with scratch(builds, ".copy-") as tmp:
            for name, root in overlay.parts():
                shutil.copytree(root, tmp / name, symlinks=True, ignore=_ignore(root))
            lay_down(tmp / "llama.cpp", overlay.changes)
            (tmp / "made").write_text(f"{what}\n{overlay.llama_root}\n")
            publish(tmp, folder)
    return folder


def _series_changes(root: Path, rendered: Rendered) -> dict[str, bytes | None]:
    series = [(name, text.encode()) for name, text in rendered.mails()]
    return patched_contents(root, rendered.files(), series)


def _render(unpatched: Path, feature: Feature) -> Rendered:
    rendered = render(detect(unpatched), feature.name, feature.folder.parent)
    if rendered.present_upstream or not rendered.patches:
        raise TreeError(f"{feature.name} is present upstream in this tree: there is no "
                        f"port to validate (compare it with the tree it came from)")
    return rendered


def reference_label(reference: Tree) -> str:
    m = re.fullmatch(r"llama-cpp-python-(.+)", reference.root.name)
    return f"upstream {m.group(1) if m else (reference.pin or '?')[:12]}"


def prepare_variants(tree: Tree, feature: Feature, reference: Tree | None,
                     progress: Progress | None = None) -> dict[str, Variant]:
    """The copies validation builds: the tree unpatched, patched and broken, and the
    reference tree (variant "upstream") when there is one."""
    progress = progress or Progress()
    record = read_record(tree, feature.name)
    as_is = Overlay(tree.llama_root, tree.ggml_root)
    if record is not None:  # the user's tree carries the port: validate it as it stands
        reversed_ = patched_contents(tree.llama_root, record.files, record.series, reverse=True,
                                     strips=record.levels)
        unpatched = _materialize(Overlay(tree.llama_root, tree.ggml_root, reversed_),
                                 "the tree with the port taken out", progress)
        patched = _materialize(as_is, "the tree as it is (patched)", progress)
    else:
        unpatched = _materialize(as_is, "the tree as it is (unpatched)", progress)
        root = unpatched / "llama.cpp"
        patched = _materialize(
            Overlay(tree.llama_root, tree.ggml_root, _series_changes(root, _render(root, feature))),
            "the tree with the port applied", progress)
    with scratch(cache_dir("scratch"), ".copy-") as templates:
        broken_feature = feature.broken(templates)
        root = unpatched / "llama.cpp"
        changes = _series_changes(root, _render(root, broken_feature))
    copy = Variant(UNPATCHED, UNPATCHED, unpatched).sources
    broken = _materialize(Overlay(copy.llama_root, copy.ggml_root, changes),
                          "the tree with the broken port", progress)
    variants = {UNPATCHED: Variant(UNPATCHED, UNPATCHED, unpatched),
                PATCHED: Variant(PATCHED, PATCHED, patched),
                BROKEN: Variant(BROKEN, "broken port", broken)}
    if reference is not None:
        up = _materialize(Overlay(reference.llama_root, reference.ggml_root),
                          reference_label(reference), progress)
        variants[UPSTREAM] = Variant(UPSTREAM, reference_label(reference), up)
    return variants


def _link(tree: Tree, variants: dict[str, Variant]) -> Path:
    """validate/trees/<key of the tree's path>/: a link to each variant's folder."""
    key = hashlib.sha256(str(tree.root.resolve()).encode()).hexdigest()[:16]
    folder = cache_dir("validate", "trees", key)
    (folder / "tree").write_text(f"{tree.root}\n")
    for name, variant in variants.items():
        link = folder / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path("..") / ".." / "builds" / variant.key)
    return folder


# -- runs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """A harness run: its key=value results and its log (the library's log included)."""

    values: dict[str, str]
    log: Path

    def __getitem__(self, key: str) -> float:
        try:
            # + 0.0: a figure printed as -0.000000 (a sum of rounding errors) reads as 0
            return float(self.values[key]) + 0.0
        except (KeyError, ValueError):
            raise RecordError(f"the run log {self.log} has no figure {key!r} (damaged? "
                              f"delete it and validate again)") from None

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def flag(self, name: str) -> int | None:
        m = re.search(rf"{name} = (\d)", self.log.read_text(errors="replace"))
        return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Quality:
    """Perplexity, KLD and top-1 against a base, as printed; rotation flags from the log."""

    ppl: float
    kld: float
    top1: float
    digest: str
    tokens: int
    vocab: int
    rot_k: int | None
    rot_v: int | None
    log: Path

    @classmethod
    def of(cls, r: Result) -> Quality:
        return cls(r["ppl"], r["kld"], r["top1"], r.get("digest") or "", int(r["tokens"]),
                   int(r["vocab"]), r.flag("attn_rot_k"), r.flag("attn_rot_v"), r.log)


@dataclass(frozen=True)
class Run:
    """One harness run to make: mode on a variant, model, cache types, the rotation disabled
    by the environment or not, and for `kld` the variant whose `base` run it compares with."""

    variant: str
    mode: str
    model: str
    config: str
    disable: bool = False
    base: str | None = None


_PLACEHOLDER = {"ppl": "1", "kld": "0", "top1": "0", "tokens": "0", "vocab": "0", "digest": "",
                "shift.kld": "0", "shift.top1": "0", **{f"state_{c}.{m}": "0" for c in (
                    "on_on", "off_on", "on_off") for m in ("kld", "top1")}}


def _slug(model: str) -> str:
    path = Path(model)
    if path.suffix == ".gguf":
        return f"{path.stem}-{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]}"
    return model


class Runner:
    """Builds the variants and runs the harness on them, each run once per build: a run's
    log names the build it ran on and the build of the base it compared with (fingerprints
    of their harness and libraries), and is kept while both are still what they were.

    Planning first: with `planning` set, a run is recorded instead of made and answers
    placeholders, so that a feature's checks, run once that way, tell every run they need;
    `execute` then builds and runs them as numbered steps, and the checks run again on the
    results."""

    def __init__(self, variants: dict[str, Variant], harness: Path, progress: Progress) -> None:
        self.variants = variants
        self.harness_source = harness
        self.progress = progress
        self.planning = False
        self.planned: list[Run] = []
        self.built: set[str] = set()
        self.prints: dict[str, str | None] = {}

    # the checks' side

    def quality(self, variant: str, model: str, config: str, *, disable: bool = False,
                base: str) -> Quality:
        """KLD, top-1 and perplexity of a run against `base`'s f16-cache logits."""
        return Quality.of(self.result(Run(variant, "kld", model, config, disable, base)))

    def base(self, variant: str, model: str) -> Result:
        """`variant`'s f16-cache run that writes the base file."""
        return self.result(Run(variant, "base", model, "f16/f16"))

    def harness(self, variant: str, model: str, mode: str, config: str) -> Result:
        return self.result(Run(variant, mode, model, config))

    def result(self, spec: Run) -> Result:
        if self.planning:
            if spec.base is not None:
                self.result(Run(spec.base, "base", spec.model, "f16/f16"))
            if spec not in self.planned:
                self.planned.append(spec)
            return Result(_PLACEHOLDER, Path(os.devnull))
        if self._stale(spec):
            self._make(spec)
        return self._read(spec)

    def _lock(self, spec: Run) -> contextlib.AbstractContextManager[Path]:
        """One process at a time makes a given run (another then finds it made)."""
        return exclusive(f"run-{self.variants[spec.variant].key}-{self._name(spec)}",
                         f"the run {self._name(spec)}")

    # files

    def binary(self, variant: str) -> Path:
        return self.variants[variant].build / "bin" / harness_binary(self.harness_source)

    def _name(self, spec: Run) -> str:
        ctk, ctv = spec.config.split("/")
        name = f"{spec.mode}-{_slug(spec.model)}-{ctk}-{ctv}{'-disabled' if spec.disable else ''}"
        return name + (f"-vs-{self.variants[spec.base].key}" if spec.base else "")

    def log(self, spec: Run) -> Path:
        return self.variants[spec.variant].runs / f"{self._name(spec)}.log"

    def base_file(self, variant: str, model: str) -> Path:
        return self.variants[variant].runs / f"base-{_slug(model)}.base"

    def fingerprint(self, variant: str) -> str | None:
        """What a variant's runs depend on: its harness binary and libraries (None: not
        built yet)."""
        if variant not in self.prints:
            bin_dir = self.binary(variant).parent
            files = sorted(p for p in bin_dir.glob("*") if p.is_file() and not p.is_symlink()
                           and (p.name.startswith("lib") or p == self.binary(variant)))
            if not self.binary(variant).is_file():
                return None
            digest = hashlib.sha256()
            for path in files:
                digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes())
                              .digest())
            self.prints[variant] = digest.hexdigest()[:16]
        return self.prints[variant]

    def _header(self, spec: Run) -> str:
        base = self.fingerprint(spec.base) if spec.base else "-"
        return f"# build {self.fingerprint(spec.variant)} base {base}\n"

    def _stale(self, spec: Run) -> bool:
        log = self.log(spec)
        if not log.is_file() or self.fingerprint(spec.variant) is None:
            return True
        with log.open(errors="replace") as fh:
            if fh.readline() != self._header(spec):
                return True
        if spec.mode == "base":
            return not self.base_file(spec.variant, spec.model).is_file()
        return spec.base is not None and not self.base_file(spec.base, spec.model).is_file()

    def _read(self, spec: Run) -> Result:
        text = self.log(spec).read_text(errors="replace")
        values = dict(line.split("=", 1) for line in text.split("\n--- harness log ---\n")[0]
                      .split("\n")[1:] if "=" in line)
        return Result(values, self.log(spec))

    # making them

    def build(self, variant: str, *, quiet: bool = False) -> None:
        if variant in self.built:
            return
        v = self.variants[variant]
        with exclusive(f"build-{v.key}", f"building {v.label}"):
            build_harness(v.sources, v.build, self.harness_source, v.label,
                          say=(lambda _: None) if quiet else self.progress.say)
        self.built.add(variant)
        self.prints.pop(variant, None)

    def _make(self, spec: Run, *, planned: bool = False) -> None:
        if spec.base is not None and self._stale(Run(spec.base, "base", spec.model, "f16/f16")):
            self._make(Run(spec.base, "base", spec.model, "f16/f16"))
        self.build(spec.variant)
        with self._lock(spec):
            if self._stale(spec):
                self._run(spec, planned)

    def _run(self, spec: Run, planned: bool) -> None:
        v = self.variants[spec.variant]
        what = f"{v.label}: {spec.mode} {_slug(spec.model)} {spec.config}" + (
            " LLAMA_ATTN_ROT_DISABLE=1" if spec.disable else "")
        if planned:
            self.progress.step(what)
        else:
            self.progress.say(what)
        args: list[str | Path] = [self.binary(spec.variant), spec.mode, model_path(spec.model),
                                  TEXT, *spec.config.split("/")]
        written = self.base_file(spec.variant, spec.model).with_suffix(".partial")
        if spec.mode == "base":  # renamed into place when complete: a reader keeps the old
            args.append(written)
        elif spec.base is not None:
            args.append(self.base_file(spec.base, spec.model))
        env = {**os.environ, "LLAMA_ATTN_ROT_DISABLE": "1" if spec.disable else "0"}
        started = time.monotonic()
        proc = run(args, env=env, cwd=v.runs, check=False)
        log = self.log(spec)
        partial = log.with_suffix(".partial")
        partial.write_text(self._header(spec) + proc.stdout + "\n--- harness log ---\n"
                           + proc.stderr)
        if proc.returncode != 0:
            raise ToolFailed(f"the harness failed ({v.label}, {spec.mode} {spec.config}): "
                             f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]} "
                             f"(log: {partial})")
        if spec.mode == "base":
            written.replace(self.base_file(spec.variant, spec.model))
        partial.replace(log)
        self.progress.learn(spec.mode, _slug(spec.model), time.monotonic() - started)

    def execute(self) -> None:
        """Build what the planned runs need, then make the runs that are not fresh, as
        numbered steps."""
        used = list(dict.fromkeys(spec.variant for spec in self.planned))
        pending = {v: pending_steps(self.variants[v].sources, self.variants[v].build,
                                    self.harness_source) for v in used}
        builds = [v for v in used if pending[v] != 0]
        runs = [s for s in self.planned if s.variant in builds or self._stale(s)]
        self.progress.plan([("build-step", "", pending[v] or COLD_BUILD_STEPS) for v in builds]
                           + [(s.mode, _slug(s.model), 1.0) for s in runs],
                           f"{len(builds)} build(s) and {len(runs)} run(s) to do")
        for v in builds:
            steps = pending[v] or COLD_BUILD_STEPS
            self.progress.step(f"building {self.variants[v].label}"
                               + (f" ({pending[v]} steps)" if pending[v] else ""))
            started = time.monotonic()
            self.build(v, quiet=True)
            self.progress.learn("build-step", "", (time.monotonic() - started) / steps)
        for spec in self.planned:
            if self._stale(spec):
                self._make(spec, planned=True)


def speed(variant: Variant, harness: Path, model: str, config: str, *, disable: bool,
          threads: int, n_prompt: int, n_gen: int, reps: int = 1) -> dict[str, float]:
    """Prompt and generation tokens/s of one build (not cached: speed is of the moment)."""
    binary = variant.build / "bin" / harness_binary(harness)
    env = {**os.environ, "LLAMA_ATTN_ROT_DISABLE": "1" if disable else "0"}
    proc = run([binary, "speed", model_path(model), TEXT, *config.split("/"), str(threads),
                str(n_prompt), str(n_gen), str(reps)], env=env)
    return {k: float(v) for k, v in (ln.split("=", 1) for ln in proc.stdout.split()
                                     if "=" in ln)}


# -- validate -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What a feature's checks get: the runner (variants unpatched, patched, broken and, when
    `live`, upstream), the mode, the models asked for, and upstream's published figures."""

    runner: Runner
    live: bool
    full: bool
    models: list[str] | None
    published: dict[str, Any]
    reference: str | None  # the live reference's label ("upstream 0.3.20")


def validate(tree: Tree, feature: Feature, *, full: bool = False,
             models: list[str] | None = None, reference: Tree | None = None) -> Report:
    if not TEXT.is_file():
        raise ToolMissing(f"{TEXT} is missing (Debian's base-files provides it)")
    checks_module = importlib.import_module(f"portkit.checks.{feature.validation.checks}")
    harness = feature.harness()
    if harness is None:
        raise SpecError(f"feature {feature.name} has no validation harness")
    for buildable in (tree, reference):
        if buildable is not None:
            check_buildable(Sources.of(buildable))
    progress = Progress()
    variants = prepare_variants(tree, feature, reference, progress)
    runner = Runner(variants, harness, progress)
    label = reference_label(reference) if reference is not None else None
    context = Context(runner, reference is not None, full, models, feature.published(), label)
    runner.planning = True
    checks_module.run(context)
    runner.planning = False
    runner.execute()
    chosen, checks = checks_module.run(context)
    folder = _link(tree, variants)
    ref = f"{label} (llama.cpp {(reference.pin or '?')[:12]})" if reference and label else None
    report = Report(str(tree.root), tree.pin, "full" if full else "quick", chosen, checks,
                    str(folder), ref)
    (folder / "report.json").write_text(report_json(report))
    return report


def report_json(report: Report) -> str:
    return json.dumps(report.as_json(), indent=2, default=str)

