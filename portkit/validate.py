"""Stage 6, validate: build the unpatched and the patched tree and prove the port in numbers.

Checks (docs/rotation.md, "What a correct port must show"):

  a  rotation off is a no-op: f16 cache, and q8_0 with LLAMA_ATTN_ROT_DISABLE=1, give logits
     bit-identical to the unpatched build;
  b  rotation on: KLD and top-1 against the f16 run equal upstream's own rotation;
  c  the log says attn_rot_k / attn_rot_v as the cache configuration predicts;
  d  context shift: a shifted rotated cache behaves like one filled fresh at the shifted
     positions, as well as the unpatched tree's does; a port without the un-rotate/re-rotate
     steps (a deliberately broken template) fails the same check;
  e  saved state: the rotation is not recorded in a saved session; what loading it with the
     other setting gives is measured and pinned down.

Everything lives in a workspace in the cache keyed by the tree's content: copies of the tree
(unpatched, patched, broken), their builds, and the logs of every run, reused while valid.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tomllib
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from portkit.apply import git_apply, read_record
from portkit.build import build_tools
from portkit.cache import cache_dir
from portkit.errors import PortkitError
from portkit.features import feature_dir
from portkit.models import FULL_MODEL, QUICK_MODEL, model_path
from portkit.proc import run
from portkit.render import render, write_series
from portkit.tree import Tree, detect

TEXT = Path("/usr/share/common-licenses/GPL-3")
DEFAULT_REFERENCE = "pypi:llama-cpp-python==0.3.20"  # the first tree with upstream's rotation
TOOLS = ["llama-perplexity", "llama-bench"]
QUICK_CONFIGS = ("q8_0/q8_0", "q4_0/q4_0")
FULL_CONFIGS = ("q8_0/q8_0", "q8_0/q4_0", "f16/q4_0", "q4_0/q4_0")
KLD_TOLERANCE = 0.01  # relative, against upstream's figure
SHIFT_FACTOR, SHIFT_SLACK = 1.5, 0.005  # patched shift KLD <= factor * unpatched + slack

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


def _reference() -> dict[str, Any]:
    return tomllib.loads(resources.files("portkit.data").joinpath("reference.toml").read_text())


def _progress(message: str) -> None:
    sys.stderr.write(f"portkit validate: {message}\n")
    sys.stderr.flush()


class Workspace:
    """Copies of one tree (unpatched, patched, broken) and their builds, in the cache."""

    def __init__(self, tree: Tree, feature: str) -> None:
        self.tree = tree
        self.feature = feature
        self.folder = cache_dir("validate", _tree_key(tree.llama_root))
        self.runs = self.folder / "runs"
        self.runs.mkdir(exist_ok=True)

    def source(self, variant: str) -> Path:
        return self.folder / variant / "llama.cpp"

    def _fresh_copy(self, variant: str, series_text: str) -> tuple[Path, bool]:
        """The variant's copy of the unpatched tree; False when it is already prepared."""
        root = self.source(variant)
        marker = self.folder / variant / "prepared"
        stamp = hashlib.sha256(series_text.encode()).hexdigest()
        if marker.is_file() and marker.read_text() == stamp and root.is_dir():
            return root, False
        if root.exists():
            shutil.rmtree(root)
        shutil.copytree(self.source("unpatched"), root, symlinks=True,
                        ignore=_ignore(self.source("unpatched")))
        marker.unlink(missing_ok=True)
        return root, True

    def prepare(self) -> None:
        unpatched = self.source("unpatched")
        if not (self.folder / "unpatched" / "prepared").is_file():
            _progress(f"copying the tree into {self.folder}")
            if unpatched.exists():
                shutil.rmtree(unpatched)
            shutil.copytree(self.tree.llama_root, unpatched, symlinks=True,
                            ignore=_ignore(self.tree.llama_root))
            record = read_record(self.tree, self.feature)
            if record is not None:  # the tree carries the port: validate against it taken out
                git_apply(unpatched, list(reversed(record.patches)), reverse=True)
            (self.folder / "unpatched" / "prepared").write_text("")
        self._patch("patched", None)
        self._patch("broken", self._broken_templates())

    def _patch(self, variant: str, templates: Path | None) -> None:
        rendered = render(detect(self.source("unpatched")), self.feature, templates)
        if rendered.present_upstream or not rendered.patches:
            raise PortkitError(f"{self.feature} is present upstream in this tree: there is no "
                               f"port to validate (compare it with the tree it came from)")
        text = "".join(t for _, t in rendered.mails())
        root, fresh = self._fresh_copy(variant, text)
        if fresh:
            series = self.folder / variant / "series"
            shutil.rmtree(series, ignore_errors=True)
            patches = write_series(rendered, series)
            git_apply(root, patches)
            (self.folder / variant / "prepared").write_text(
                hashlib.sha256(text.encode()).hexdigest())

    def _broken_templates(self) -> Path:
        """The feature's templates with the fragments that keep the context shift right blanked:
        the port a careless hand would write."""
        blank = _reference().get("broken_port", {}).get(self.feature, {}).get("blank", [])
        copy = self.folder / "broken-templates"
        if copy.exists():
            shutil.rmtree(copy)
        shutil.copytree(feature_dir(self.feature), copy / self.feature)
        for name in blank:
            (copy / self.feature / "fragments" / name).write_text("")
        return copy

    def tools(self, variant: str) -> Path:
        _progress(f"building {variant} ({', '.join(TOOLS)}, harness)")
        return build_tools(self.source(variant), self.folder / variant / "build", TOOLS, variant)


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
        binary = self.bin(variant) / "portkit-rotation-checks"
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


# -- checks --------------------------------------------------------------------------------


def check_noop(r: Runner, model: str) -> Check:
    figures: dict[str, Any] = {}
    same = True
    for config, disable in (("f16/f16", False), ("q8_0/q8_0", True)):
        a = r.logits_digest("unpatched", model, config, disable=disable)
        b = r.logits_digest("patched", model, config, disable=disable)
        label = config + (" LLAMA_ATTN_ROT_DISABLE=1" if disable else "")
        figures[label] = "bit-identical" if a == b else "DIFFERENT"
        same = same and a == b
    shape = r.harness("patched", model, "logits", "f16/f16")
    figures["logits compared"] = (f"{int(shape['logits.tokens'])} tokens x "
                                  f"{int(shape['logits.vocab'])} (float32)")
    return Check("a", f"rotation off is a no-op ({model})", PASS if same else FAIL, figures)


def _expect(config: str, disable: bool, head_ok: bool = True) -> tuple[int, int]:
    ctk, ctv = config.split("/")
    on = not disable and head_ok
    return int(on and ctk != "f16"), int(on and ctv != "f16")


def check_quality(r: Runner, model: str, configs: tuple[str, ...],
                  live: Runner | None) -> tuple[Check, Check]:
    base = r.ws.runs / f"{model}-f16.kld"
    r.perplexity("unpatched", model, "f16/f16", base=base, write_base=True)
    table = _reference().get(model, {})
    figures: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    ok, flags_ok = True, True
    if live is not None:
        live_base = live.ws.runs / f"{model}-f16.kld"
        live.perplexity("unpatched", model, "f16/f16", base=live_base, write_base=True)
    for config in configs:
        off = r.perplexity("unpatched", model, config, base=base)
        dis = r.perplexity("patched", model, config, base=base, disable=True)
        on = r.perplexity("patched", model, config, base=base)
        ref_kld: float | None = None
        ref_top1: float | None = None
        source = "no reference"
        published = table.get(config, {}).get("on")
        if live is not None:
            ref_on = live.perplexity("unpatched", model, config, base=live_base)
            ref_kld, ref_top1, source = ref_on.kld, ref_on.top1, "upstream's build, same run"
        elif published:
            ref_kld, ref_top1 = published["kld"], published["top1"]
            source = "upstream's published figure"
        rel = abs(on.kld - ref_kld) / ref_kld if on.kld is not None and ref_kld else None
        good = rel is not None and rel <= KLD_TOLERANCE and dis.kld == off.kld
        ok = ok and good
        figures[config] = (
            f"off {off.kld} / {off.top1}%, disabled {dis.kld} / {dis.top1}%, on {on.kld} / "
            f"{on.top1}%; upstream on {ref_kld} / {ref_top1}% ({source})"
            + (f", KLD differs by {rel:.2%}" if rel is not None else "")
            + (f"; published in docs/fixtures.md: {published['kld']} / {published['top1']}%"
               if published and live is not None else ""))
        for label, res, disable in (("on", on, False), ("disabled", dis, True)):
            want = _expect(config, disable)
            got = (res.rot_k, res.rot_v)
            flags[f"{config} {label}"] = f"attn_rot_k = {got[0]}, attn_rot_v = {got[1]}"
            flags_ok = flags_ok and got == want
    f16 = r.perplexity("patched", model, "f16/f16", base=base)
    flags["f16/f16 on"] = f"attn_rot_k = {f16.rot_k}, attn_rot_v = {f16.rot_v}"
    flags_ok = flags_ok and (f16.rot_k, f16.rot_v) == (0, 0)
    return (Check("b", f"rotation on equals upstream's (KLD, top-1 vs f16; {model})",
                  PASS if ok else FAIL, figures,
                  f"tolerance {KLD_TOLERANCE:.0%} relative KLD; 'disabled' must equal 'off'"),
            Check("c", f"log lines report the rotation as configured ({model})",
                  PASS if flags_ok else FAIL, flags))


def check_shift(r: Runner, model: str, configs: tuple[str, ...],
                live: Runner | None) -> Check:
    """Pass: the port's shift is as good as the unpatched tree's and the broken port is
    caught. Where the port fails but upstream's own rotation fails identically, the verdict
    is "as upstream": the port is faithful, and the weakness is upstream's."""
    figures: dict[str, Any] = {}
    verdict = PASS
    for config in configs:
        res = {v: r.harness(v, model, "shift", config) for v in ("unpatched", "patched", "broken")}
        limit = SHIFT_FACTOR * res["unpatched"]["shift.kld"] + SHIFT_SLACK
        good = res["patched"]["shift.kld"] <= limit
        caught = res["broken"]["shift.kld"] > limit
        upstream = live.harness("unpatched", model, "shift", config) if live else None
        same = upstream is not None and upstream["shift.kld"] == res["patched"]["shift.kld"]
        text = ", ".join(f"{v} KLD {res[v]['shift.kld']:.6f} top-1 {res[v]['shift.top1']:.1f}%"
                         for v in res)
        if upstream is not None:
            text += f", upstream KLD {upstream['shift.kld']:.6f}"
        text += (f"; limit {limit:.6f}: patched {'passes' if good else 'FAILS'}"
                 + ("" if good or not same else " exactly as upstream's own rotation does")
                 + f", broken port {'fails as it must' if caught else 'PASSES (check too weak)'}")
        figures[config] = text
        if not caught or (not good and not same):
            verdict = FAIL
        elif not good and verdict == PASS:
            verdict = AS_UPSTREAM
    return Check("d", f"context shift of a rotated quantized K cache ({model})", verdict,
                 figures, "shifted cache vs the same tokens computed fresh at the shifted "
                 "positions")


def check_state(r: Runner, model: str) -> Check:
    res = r.harness("patched", model, "state", "q8_0/q8_0")
    same = res["state_on_on.kld"] == 0.0
    garbage = res["state_off_on.kld"] > 1.0 and res["state_on_off.kld"] > 1.0
    figures = {case: f"KLD {res[f'{case}.kld']:.6f}, top-1 {res[f'{case}.top1']:.1f}%"
               for case in ("state_on_on", "state_off_on", "state_on_off")}
    verdict = DOCUMENTED if same and garbage else (PASS if same else FAIL)
    return Check("e", f"saved state across rotation settings ({model}, q8_0/q8_0)", verdict,
                 figures, "a session carries no rotation flag: saved with rotation off and "
                 "loaded with it on (or the reverse) it is silently wrong, as upstream "
                 "(#28498); keep LLAMA_ATTN_ROT_DISABLE the same when saving and loading")


def reference_runner(reference: Tree, feature: str) -> Runner:
    """Runs of a tree that has the feature upstream: its "unpatched" copy is the reference."""
    ws = Workspace(reference, feature)
    if not ws.source("unpatched").is_dir():
        ws.source("unpatched").parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(reference.llama_root, ws.source("unpatched"), symlinks=True,
                        ignore=_ignore(reference.llama_root))
    return Runner(ws)


def validate(tree: Tree, feature: str, *, full: bool = False, models: list[str] | None = None,
             reference: Tree | None = None) -> Report:
    if not TEXT.is_file():
        raise PortkitError(f"{TEXT} is missing (Debian's base-files provides it)")
    if not (tree.llama_root / "CMakeLists.txt").is_file():
        raise PortkitError(f"{tree.llama_root} has no CMake project to build; validate the "
                           f"llama.cpp tree the fork vendors (e.g. the sdist at its pin)")
    ws = Workspace(tree, feature)
    ws.prepare()
    runner = Runner(ws)
    live = reference_runner(reference, feature) if reference is not None else None
    chosen = models or ([QUICK_MODEL, FULL_MODEL] if full else [QUICK_MODEL])
    checks: list[Check] = []
    for model in chosen:
        configs: tuple[str, ...] = FULL_CONFIGS if full else QUICK_CONFIGS
        table = _reference().get(model, {})
        if live is None and table:
            configs = tuple(c for c in configs if c in table) or configs
        checks.append(check_noop(runner, model))
        checks += check_quality(runner, model, configs, live)
        checks.append(check_shift(runner, model, ("q8_0/q8_0", "q4_0/q4_0") if full
                                  else ("q8_0/q8_0",), live))
        checks.append(check_state(runner, model))
    return Report(str(tree.root), tree.pin, "full" if full else "quick", chosen, checks,
                  str(ws.folder))


def report_json(report: Report) -> str:
    return json.dumps(report.as_json(), indent=2, default=str)
