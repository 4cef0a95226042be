"""Stage 6, validate: build the tree unpatched and patched, and prove a feature in numbers.

The tree is validated as it stands: when portkit applied the feature, "patched" is the tree
as the user has it and "unpatched" is a copy with the recorded series reversed; a tree that
does not carry the feature yet gets it rendered and applied in a copy. A third copy,
"broken", carries the feature rendered from deliberately broken templates: the checks must
catch it. Which checks run is the feature's own business (its manifest's [validation] names a
module of portkit.checks, a harness, and the tree with the feature upstream that serves as the
live reference); this module builds, runs and reports.

Everything lives in a workspace in the cache keyed by the tree's content: copies of the tree,
their builds, and the logs of every run, reused while valid.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from portkit.apply import git_apply, read_record
from portkit.build import build_tools, harness_binary
from portkit.cache import cache_dir
from portkit.errors import PortkitError
from portkit.features import Feature
from portkit.models import model_path
from portkit.proc import run
from portkit.render import render, write_series
from portkit.tree import Tree, detect

TEXT = Path("/usr/share/common-licenses/GPL-3")
TOOLS = ["llama-perplexity", "llama-bench"]

PASS, FAIL, DOCUMENTED, AS_UPSTREAM = "pass", "fail", "documented", "as upstream"
_SKIP = {".git", ".portkit", "__pycache__"}


def _ignore(root: Path) -> Any:
    """copytree's ignore: VCS and cache folders anywhere, build folders at the tree's top."""
    def ignore(folder: str, names: list[str]) -> set[str]:
        top = Path(folder) == root
        return {n for n in names if n in _SKIP
                or (top and n.startswith("build") and (Path(folder) / n).is_dir())}
    return ignore


@dataclass
class Check:
    id: str
    title: str
    verdict: str
    figures: dict[str, Any] = field(default_factory=dict)
    detail: str = ""


@dataclass
class Report:
    tree: str
    pin: str | None
    mode: str
    models: list[str]
    checks: list[Check]
    workspace: str

    @property
    def passed(self) -> bool:
        return all(c.verdict != FAIL for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}

    def text(self) -> str:
        lines = [f"validation of {self.tree} (llama.cpp {(self.pin or '?')[:12]}), "
                 f"{self.mode}, models: {', '.join(self.models)}"]
        for c in self.checks:
            lines.append(f"[{c.verdict.upper():>10}] {c.id}: {c.title}")
            lines += [f"             {k}: {v}" for k, v in c.figures.items()]
            if c.detail:
                lines.append(f"             {c.detail}")
        lines.append(f"{'PASSED' if self.passed else 'FAILED'} (logs: {self.workspace})")
        return "\n".join(lines)

    def markdown(self) -> str:
        out = [f"### portkit validate: {'passed' if self.passed else 'FAILED'}", "",
               f"Tree `{self.tree}` (llama.cpp `{(self.pin or '?')[:12]}`), {self.mode}, "
               f"models: {', '.join(self.models)}.", "",
               "| check | verdict | figures |", "|---|---|---|"]
        for c in self.checks:
            figs = "<br>".join(f"{k}: {v}" for k, v in c.figures.items())
            out.append(f"| {c.id}: {c.title} | {c.verdict} | {figs} |")
        return "\n".join(out) + "\n"


# -- the workspace --------------------------------------------------------------------------


def _tree_key(root: Path) -> str:
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        top = Path(dirpath) == root
        dirnames[:] = sorted(d for d in dirnames
                             if d not in _SKIP and not (top and d.startswith("build")))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            digest.update(str(path.relative_to(root)).encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _progress(message: str) -> None:
    sys.stderr.write(f"portkit validate: {message}\n")
    sys.stderr.flush()


class Workspace:
    """Copies of one tree (unpatched, patched, broken) and their builds, in the cache."""

    def __init__(self, tree: Tree, feature: Feature) -> None:
        self.tree = tree
        self.feature = feature
        self.folder = cache_dir("validate", _tree_key(tree.llama_root))
        self.runs = self.folder / "runs"
        self.runs.mkdir(exist_ok=True)

    def source(self, variant: str) -> Path:
        return self.folder / variant / "llama.cpp"

    def _copy(self, variant: str, origin: Path, stamp: str,
              change: Callable[[Path], None]) -> None:
        """The variant's copy of `origin`, changed by `change`, unless it is already there
        with the same stamp (what it was made from)."""
        root = self.source(variant)
        marker = self.folder / variant / "prepared"
        if marker.is_file() and marker.read_text() == stamp and root.is_dir():
            return
        marker.unlink(missing_ok=True)
        if root.exists():
            shutil.rmtree(root)
        _progress(f"preparing the {variant} copy in {self.folder}")
        shutil.copytree(origin, root, symlinks=True, ignore=_ignore(origin))
        change(root)
        marker.write_text(stamp)

    def prepare(self) -> None:
        record = read_record(self.tree, self.feature.name)
        if record is not None:  # the user's tree carries the port: validate it as it stands
            self._copy("unpatched", self.tree.llama_root, "reversed record", lambda root:
                       git_apply(root, list(reversed(record.patches)), reverse=True))
            self._copy("patched", self.tree.llama_root, "as the user has it", lambda _: None)
        else:
            self._copy("unpatched", self.tree.llama_root, "as it is", lambda _: None)
            self._render_into("patched", self.feature)
        self._render_into("broken", self.feature.broken(self.folder / "broken-templates"))

    def _render_into(self, variant: str, feature: Feature) -> None:
        rendered = render(detect(self.source("unpatched")), feature.name, feature.folder.parent)
        if rendered.present_upstream or not rendered.patches:
            raise PortkitError(f"{feature.name} is present upstream in this tree: there is no "
                               f"port to validate (compare it with the tree it came from)")
        text = "".join(t for _, t in rendered.mails())
        series = self.folder / variant / "series"

        def patch(root: Path) -> None:
            shutil.rmtree(series, ignore_errors=True)
            git_apply(root, write_series(rendered, series))

        self._copy(variant, self.source("unpatched"),
                   hashlib.sha256(text.encode()).hexdigest(), patch)

    def tools(self, variant: str) -> Path:
        _progress(f"building {variant} ({', '.join(TOOLS)}, harness)")
        return build_tools(self.source(variant), self.folder / variant / "build", TOOLS, variant,
                           self.feature.harness())


# -- runs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ppl:
    kld: float | None
    top1: float | None
    ppl: float | None
    rot_k: int | None
    rot_v: int | None
    log: Path


def _number(pattern: str, text: str) -> float | None:
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def _flag(name: str, text: str) -> int | None:
    m = re.search(rf"{name} = (\d)", text)
    return int(m.group(1)) if m else None


def _fresh(log: Path, binary: Path) -> bool:
    return log.is_file() and log.stat().st_mtime > binary.stat().st_mtime


class Runner:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.bins: dict[str, Path] = {}

    def bin(self, variant: str) -> Path:
        if variant not in self.bins:
            self.bins[variant] = self.ws.tools(variant)
        return self.bins[variant]

    def _fa(self, variant: str) -> list[str]:
        helptext = run([self.bin(variant) / "llama-perplexity", "--help"], check=False).stdout
        return ["-fa", "on"] if "[on|off|auto]" in helptext else ["-fa"]

    def perplexity(self, variant: str, model: str, config: str, *, disable: bool = False,
                   base: Path, write_base: bool = False) -> Ppl:
        ctk, ctv = config.split("/")
        name = f"ppl-{variant}-{model}-{ctk}-{ctv}{'-disabled' if disable else ''}"
        log = self.ws.runs / f"{name}.log"
        binary = self.bin(variant) / "llama-perplexity"
        if not _fresh(log, binary) or (write_base and not base.is_file()):
            _progress(f"llama-perplexity {variant} {model} {config}"
                      + (" LLAMA_ATTN_ROT_DISABLE=1" if disable else ""))
            args: list[str | Path] = [
                binary, "-m", model_path(model), "-f", TEXT, "-c", "512", "--chunks", "8",
                "-t", "2", *self._fa(variant), "-ctk", ctk, "-ctv", ctv,
                "--kl-divergence-base", base]
            args += [] if write_base else ["--kl-divergence"]
            env = {**os.environ, "LLAMA_ATTN_ROT_DISABLE": "1" if disable else "0"}
            proc = run(args, env=env, check=False)
            log.write_text(proc.stdout + proc.stderr)
            if proc.returncode != 0:
                raise PortkitError(f"llama-perplexity failed ({variant}, {config}); log: {log}")
        text = log.read_text()
        return Ppl(_number(r"Mean\s+KLD:\s+(-?[\d.]+)", text),
                   _number(r"Same top p:\s+([\d.]+)", text),
                   _number(r"Final estimate: PPL = ([\d.]+)", text),
                   _flag("attn_rot_k", text), _flag("attn_rot_v", text), log)

    def harness(self, variant: str, model: str, mode: str, config: str, *,
                disable: bool = False) -> dict[str, float]:
        ctk, ctv = config.split("/")
        name = f"{mode}-{variant}-{model}-{ctk}-{ctv}{'-disabled' if disable else ''}"
        log = self.ws.runs / f"{name}.log"
        source = self.ws.feature.harness()
        if source is None:
            raise PortkitError(f"feature {self.ws.feature.name} has no validation harness")
        binary = self.bin(variant) / harness_binary(source)
        out = self.ws.runs / f"{name}.logits"
        if not _fresh(log, binary):
            _progress(f"harness {mode} {variant} {model} {config}"
                      + (" LLAMA_ATTN_ROT_DISABLE=1" if disable else ""))
            args: list[str | Path] = [binary, mode, model_path(model), TEXT, ctk, ctv]
            args += [out] if mode == "logits" else []
            env = {**os.environ, "LLAMA_ATTN_ROT_DISABLE": "1" if disable else "0"}
            proc = run(args, env=env, cwd=self.ws.runs, check=False)
            if proc.returncode != 0:
                raise PortkitError(f"harness {mode} failed ({variant}, {config}): "
                                   f"{proc.stderr.strip().splitlines()[-1:]}")
            log.write_text(proc.stdout)
        values = dict(line.split("=", 1) for line in log.read_text().split())
        return {k: float(v) for k, v in values.items()}

    def logits_digest(self, variant: str, model: str, config: str, *, disable: bool) -> str:
        self.harness(variant, model, "logits", config, disable=disable)
        ctk, ctv = config.split("/")
        out = self.ws.runs / f"logits-{variant}-{model}-{ctk}-{ctv}" \
                             f"{'-disabled' if disable else ''}.logits"
        return hashlib.sha256(out.read_bytes()).hexdigest()


def reference_runner(reference: Tree, feature: Feature) -> Runner:
    """Runs of a tree that has the feature upstream: its "unpatched" copy is the reference."""
    ws = Workspace(reference, feature)
    if not ws.source("unpatched").is_dir():
        ws.source("unpatched").parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(reference.llama_root, ws.source("unpatched"), symlinks=True,
                        ignore=_ignore(reference.llama_root))
    return Runner(ws)


@dataclass(frozen=True)
class Context:
    """What a feature's checks get: runs of the tree, of the live reference (None when the
    published figures are the reference), the mode, the models asked for, and upstream's
    published figures."""

    runner: Runner
    live: Runner | None
    full: bool
    models: list[str] | None
    published: dict[str, Any]


def validate(tree: Tree, feature: Feature, *, full: bool = False,
             models: list[str] | None = None, reference: Tree | None = None) -> Report:
    if not TEXT.is_file():
        raise PortkitError(f"{TEXT} is missing (Debian's base-files provides it)")
    if not (tree.llama_root / "CMakeLists.txt").is_file():
        raise PortkitError(f"{tree.llama_root} has no CMake project to build; validate the "
                           f"llama.cpp tree the fork vendors (e.g. the sdist at its pin)")
    checks_module = importlib.import_module(f"portkit.checks.{feature.validation.checks}")
    ws = Workspace(tree, feature)
    ws.prepare()
    live = reference_runner(reference, feature) if reference is not None else None
    context = Context(Runner(ws), live, full, models, feature.published())
    chosen, checks = checks_module.run(context)
    return Report(str(tree.root), tree.pin, "full" if full else "quick", chosen, checks,
                  str(ws.folder))


def report_json(report: Report) -> str:
    return json.dumps(report.as_json(), indent=2, default=str)
