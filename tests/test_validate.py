"""`portkit validate` on real registry trees, real models and real text; and the verdict
logic of the rotation checks on figures given by hand.

The slow tests build llama-cpp-python 0.3.17's llama.cpp unpatched, patched, and patched with
a deliberately broken template, plus upstream's own rotation (0.3.20) as the reference; the
first run on a machine takes a while, later runs reuse the cached copies, builds and runs.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from portkit import validate as validate_mod
from portkit.build import Sources, build_harness, project_text
from portkit.checks import kv_rotation
from portkit.cli import cli
from portkit.features import Feature
from portkit.models import model_path
from portkit.proc import run
from portkit.tree import detect
from portkit.validate import TEXT, Check, Context, Quality, Report

# -- the harness measures what llama-perplexity measures ------------------------------------


def _fa(perplexity: Path) -> list[str]:
    helptext = run([perplexity, "--help"], check=False).stdout
    return ["-fa", "on"] if "[on|off|auto]" in helptext else ["-fa"]


def _printed(pattern: str, text: str) -> str:
    m = re.search(pattern, text)
    assert m, pattern
    return m.group(1)


def perplexity_vs_harness(bin_dir: Path, harness: str, model: str, configs: list[str],
                          work: Path) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """Per cache configuration (f16/f16: the base run; 'X off': LLAMA_ATTN_ROT_DISABLE=1),
    what llama-perplexity prints and what the harness prints, as printed, both linked to the
    libllama of `bin_dir`: PPL, and against each one's own f16 base KLD and top-1."""
    perplexity = bin_dir / "llama-perplexity"
    common = ["-m", str(model_path(model)), "-f", str(TEXT), "-c", "512", "--chunks", "8",
              "-t", "2", *_fa(perplexity)]
    out: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
    ppl_base, harness_base = work / f"{model}.ppl-base", work / f"{model}.harness-base"
    text = run([perplexity, *common, "-ctk", "f16", "-ctv", "f16", "--kl-divergence-base",
                ppl_base]).stderr
    ours = run([bin_dir / harness, "base", model_path(model), TEXT, "f16", "f16", harness_base])
    out["f16/f16"] = ({"ppl": _printed(r"Final estimate: PPL = ([\d.]+)", text)},
                      {"ppl": _printed(r"ppl=([\d.]+)", ours.stdout)})
    for config in configs:
        for disable in (False, True):
            ctk, ctv = config.split("/")
            env = {**os.environ, "LLAMA_ATTN_ROT_DISABLE": "1" if disable else "0"}
            text = run([perplexity, *common, "-ctk", ctk, "-ctv", ctv, "--kl-divergence-base",
                        ppl_base, "--kl-divergence"], env=env).stdout
            ours = run([bin_dir / harness, "kld", model_path(model), TEXT, ctk, ctv,
                        harness_base], env=env).stdout
            out[config + (" off" if disable else "")] = (
                {"ppl": _printed(r"Mean PPL\(Q\)\s+:\s+([\d.]+)", text),
                 "kld": _printed(r"Mean\s+KLD:\s+(-?[\d.]+)", text),
                 "top1": _printed(r"Same top p:\s+([\d.]+)", text)},
                {"ppl": _printed(r"ppl=([\d.]+)", ours),
                 "kld": _printed(r"kld=(-?[\d.]+)", ours),
                 "top1": _printed(r"top1=([\d.]+)", ours)})
    return out


def tools_build(version_tree: Path) -> tuple[Path, str]:
    """The patched copy of a registry tree built with llama-perplexity next to the harness
    (one libllama for both); its bin folder and the harness's name."""
    feature = Feature.load("kv-rotation")
    harness = feature.harness()
    assert harness is not None
    patched = validate_mod.prepare_variants(detect(version_tree), feature, None)["patched"]
    bin_dir = build_harness(patched.sources, patched.folder / "build-tools", harness,
                            "patched, with llama-perplexity", tools=["llama-perplexity"])
    return bin_dir, "portkit-rotation-checks"


def test_harness_prints_llama_perplexitys_figures_on_0_3_17(registry_tree, tmp_path):
    bin_dir, harness = tools_build(registry_tree("0.3.17"))
    figures = perplexity_vs_harness(bin_dir, harness, "smollm2",
                                    list(kv_rotation.QUICK_CONFIGS), tmp_path)
    for config, (theirs, ours) in figures.items():
        assert ours == theirs, config
    assert float(figures["q4_0/q4_0"][1]["kld"]) < float(figures["q4_0/q4_0 off"][1]["kld"])


# -- end to end ------------------------------------------------------------------------------


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
    assert "upstream 0.3.20, same run" in checks["b"]["figures"]["q4_0/q4_0"]
    assert "on equals upstream's" in checks["b"]["figures"]["q4_0/q4_0"]
    # validating it again builds and runs nothing
    again = CliRunner().invoke(
        cli, ["validate", "--tree", str(registry_tree("0.3.17")), "--format", "markdown"])
    assert again.exit_code == 0
    assert "building" not in again.stderr and "[1/" not in again.stderr, again.stderr
    for check in report["checks"]:
        if check["detail"]:
            assert check["detail"] in again.stdout
    # the harness's speed run, as llama-bench's pp and tg
    feature = Feature.load("kv-rotation")
    patched = validate_mod.prepare_variants(detect(registry_tree("0.3.17")), feature,
                                            None)["patched"]
    speed = validate_mod.speed(patched, feature.harness(), "smollm2", "q8_0/q8_0",
                               disable=False, threads=2, n_prompt=128, n_gen=16)
    assert speed["pp"] == 128 and speed["tg"] == 16
    assert speed["pp.ts"] > speed["tg.ts"] > 0


# -- the verdicts, on figures given by hand -------------------------------------------------


@dataclass
class Figures:
    """A stand-in runner: KLD runs answer (kld, top1, digest) by (variant, config, disable)."""

    quality_of: dict[tuple[str, str, bool], tuple[float, float, str]]
    flags: dict[tuple[str, str, bool], tuple[int, int]] = field(default_factory=dict)

    def quality(self, variant, model, config, *, disable=False, base):
        kld, top1, digest = self.quality_of[(variant, config, disable)]
        ctk, ctv = config.split("/")
        on = variant != "unpatched" and not disable
        return Quality(18.0, kld, top1, digest, 2040, 49152, int(on and ctk != "f16"),
                       int(on and ctv != "f16"), Path(os.devnull))

    def base(self, variant, model):
        return validate_mod.Result({"digest": "f16-upstream"}, Path(os.devnull))


def quality_check(figures: dict[tuple[str, str, bool], tuple[float, float, str]]) -> Check:
    ctx = Context(Figures(figures), True, False, None, {}, "upstream 0.3.20")
    b, _ = kv_rotation.check_quality(ctx, "smollm2", ("q8_0/q8_0",), {}, "upstream")
    return b


def figures_for(own_f16: str, off: tuple[float, float, str], on: tuple[float, float, str],
                up_off: tuple[float, float, str], up_on: tuple[float, float, str]):
    return {("unpatched", "f16/f16", False): (0.0, 100.0, own_f16),
            ("patched", "f16/f16", False): (0.0, 100.0, own_f16),
            ("unpatched", "q8_0/q8_0", False): off, ("patched", "q8_0/q8_0", True): off,
            ("patched", "q8_0/q8_0", False): on,
            ("upstream", "q8_0/q8_0", True): up_off, ("upstream", "q8_0/q8_0", False): up_on}


def test_a_port_on_upstreams_figures_passes():
    b = quality_check(figures_for("f16-upstream", (0.005334, 94.951, "off"),
                                  (0.004231, 95.931, "on"), (0.005334, 94.951, "off"),
                                  (0.004231, 95.931, "up-on")))
    assert b.verdict == validate_mod.PASS
    assert "bit-identical logits" in b.figures["the tree's own f16 run vs upstream's"]
    assert [r["config"] for r in b.rows] == ["f16/f16", "q8_0/q8_0"]


def test_a_port_off_upstreams_figures_fails():
    b = quality_check(figures_for("f16-upstream", (0.005334, 94.951, "off"),
                                  (0.004731, 95.2, "on"), (0.005334, 94.951, "off"),
                                  (0.004231, 95.931, "up-on")))
    assert b.verdict == validate_mod.FAIL
    assert "KLD differs by 11.82%" in b.figures["q8_0/q8_0"]


def test_a_tree_whose_own_numerics_moved_is_said_to_not_failed():
    b = quality_check(figures_for("f16-own", (0.006100, 94.1, "own-off"),
                                  (0.004900, 95.2, "on"), (0.005334, 94.951, "off"),
                                  (0.004231, 95.931, "up-on")))
    assert b.verdict == validate_mod.OWN_NUMERICS
    assert "the tree's own numerics differ" in b.figures["the tree's own f16 run vs upstream's"]
    assert "its numerics differ" in b.figures["q8_0/q8_0"]
    # ... but not when the rotation makes the tree's own figures worse
    worse = quality_check(figures_for("f16-own", (0.006100, 94.1, "own-off"),
                                      (0.006900, 93.2, "on"), (0.005334, 94.951, "off"),
                                      (0.004231, 95.931, "up-on")))
    assert worse.verdict == validate_mod.FAIL


def test_the_summary_fits_a_screen_and_markdown_keeps_every_explanation():
    b = quality_check(figures_for("f16-upstream", (0.005334, 94.951, "off"),
                                  (0.004231, 95.931, "on"), (0.005334, 94.951, "off"),
                                  (0.004231, 95.931, "up-on")))
    e = Check("e", "saved state", validate_mod.DOCUMENTED, {"x": "y"}, "keep it the same")
    report = Report("/t", "49bfddec", "quick", ["smollm2"], [b, e], "/cache/validate/trees/k",
                    "upstream 0.3.20 (llama.cpp f49e9178)")
    summary = report.summary().splitlines()
    assert summary[0].startswith("PASSED") and summary[-1] == "logs: /cache/validate/trees/k"
    assert len(summary) < 24 and max(map(len, summary)) <= 120
    assert any(re.search(r"q8_0/q8_0\s+0\.005334\s+94\.951", line) for line in summary)
    assert report.text().endswith(report.summary())
    markdown = report.markdown()
    assert b.detail in markdown and "keep it the same" in markdown


# -- portkit's CMake project ---------------------------------------------------------------


def test_a_vendored_subset_gets_portkits_own_project_and_a_whole_tree_its_own(tmp_path):
    llama, ggml = tmp_path / "llama" / "llama.cpp", tmp_path / "ml" / "ggml"
    for path in ("src/llama.cpp", "src/llama-graph.cpp", "src/models/qwen2.cpp",
                 "include/llama.h"):
        (llama / path).parent.mkdir(parents=True, exist_ok=True)
        (llama / path).write_text("// llama_flash_attn_type flash_attn_type\n")
    for path in ("src/CMakeLists.txt", "include/ggml.h"):
        (ggml / path).parent.mkdir(parents=True, exist_ok=True)
        (ggml / path).write_text("\n")
    harness = tmp_path / "build" / "project" / "rotation_checks.cpp"
    subset = Sources(llama, ggml)
    assert not subset.has_project
    text = project_text(subset, harness)
    assert f'add_subdirectory("{ggml}/src" ggml)' in text
    units = re.findall(r'^    "(.+)"$', text, re.M)
    assert units == [str(llama / "src" / u) for u in ("llama-graph.cpp", "llama.cpp",
                                                       "models/qwen2.cpp")]
    assert "set(GGML_CPU ON)" in text and "set(GGML_NATIVE ON)" in text
    assert "GGML_CUDA" not in text and "PORTKIT_FLASH_ATTN_BOOL" not in text
    assert f'add_executable(portkit-rotation-checks "{harness}")' in text
    (llama / "CMakeLists.txt").write_text("\n")
    (llama / "ggml" / "src").mkdir(parents=True)
    (llama / "ggml" / "CMakeLists.txt").write_text("\n")
    whole = Sources(llama, llama / "ggml")
    assert whole.has_project
    assert f'add_subdirectory("{llama}" llama.cpp)' in project_text(whole, harness)


def test_estimates_ignore_a_damaged_timings_file(offline_cache):
    timings = offline_cache / "validate" / "timings.json"
    timings.parent.mkdir(parents=True, exist_ok=True)
    for text in ('["kld:smollm2"]', '{"kld:smollm2": "soon", "base": -3, "state": 1e309}',
                 "{not json", '{"kld:smollm2": 40}'):
        timings.write_text(text)
        progress = validate_mod.Progress()
        measured = 40.0 if text == '{"kld:smollm2": 40}' else validate_mod._GUESS["kld"]
        assert progress.guess("kld", "smollm2") == measured
        assert progress.guess("base") == validate_mod._GUESS["base"]
        progress.learn("kld", "smollm2", 20.0)  # and it can write it afresh
        assert json.loads(timings.read_text())["kld:smollm2"] in (20.0, 30.0)


def test_a_damaged_run_log_is_one_clear_error(tmp_path):
    log = tmp_path / "kld-smollm2-q8_0-q8_0.log"
    log.write_text("# build x base y\nppl=18.4\nkld=soon\n")
    result = validate_mod.Result({"ppl": "18.4", "kld": "soon"}, log)
    assert result["ppl"] == 18.4
    for key in ("kld", "top1"):
        with pytest.raises(validate_mod.RecordError) as caught:
            result[key]
        assert str(caught.value) == (f"the run log {log} has no figure {key!r} (damaged? "
                                     f"delete it and validate again)")
