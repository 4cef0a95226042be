"""`portkit validate`: build the tree unpatched and patched, run real models, prove the port."""

from __future__ import annotations

from pathlib import Path

import click

from portkit import tree as tree_mod
from portkit import validate as validate_mod
from portkit.commands.common import FEATURE_OPTION, TREE_OPTION, fails_cleanly, open_tree
from portkit.features import Feature


@click.command("validate")
@TREE_OPTION
@FEATURE_OPTION
@click.option("--quick", "mode", flag_value="quick", default=True,
              help="SmolLM2-135M, q8_0/q8_0 and q4_0/q4_0 caches (default).")
@click.option("--full", "mode", flag_value="full",
              help="Also Qwen2.5-Coder-0.5B (qwen2) and the q8_0/q4_0, f16/q4_0 caches.")
@click.option("--model", "models", multiple=True,
              help="smollm2, qwen2.5-coder-0.5b, or a .gguf file (repeatable).")
@click.option("--reference",
              help="A tree with the feature upstream (a path or a `tree fetch` spec), built and "
                   "run side by side as the live reference. Default: the feature's own "
                   "(kv-rotation: pypi:llama-cpp-python==0.3.20, upstream's first rotation).")
@click.option("--published", is_flag=True,
              help="Compare with the figures upstream published instead of a live reference "
                   "run (they reproduce exactly on an AVX-512 CPU; other SIMD paths differ "
                   "by a few percent).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]),
              default="text", show_default=True)
@fails_cleanly
def validate_cmd(tree_path: Path, feature: str, mode: str, models: tuple[str, ...],
                 reference: str | None, published: bool, fmt: str) -> None:
    """Build the unpatched and the patched tree, run real models, and prove the port.

    The tree is validated as it stands: with the port applied, "patched" is the tree as you
    have it and "unpatched" a copy with the port taken out; without it, the port is rendered
    into a copy. In an ollama-style fork the vendored subset is built as the fork has it,
    its own patches included. Every copy (and upstream's own feature, the live reference)
    is built in the cache by portkit's own CMake project: ggml (CPU), libllama and portkit's
    harness, which measures everything through llama.h. Nothing is written into the tree.

    \b
    a  rotation off is a no-op (bit-identical logits)
    b  rotation on gives upstream's KLD and top-1 (one base: upstream's f16 cache)
    c  the log reports attn_rot_k / attn_rot_v as configured
    d  a context shift of a rotated cache is right (and a broken port is caught)
    e  what a saved session does across rotation settings

    The first run takes about 11 minutes on two cores (4 builds, 18 runs). Builds, models
    and runs are cached by content: validating an unchanged tree again is quick. Exits 21
    when a check fails (docs/exit-codes.md).
    """
    info = open_tree(tree_path)
    port = Feature.load(feature)
    spec = reference or port.validation.reference
    ref = None if published or spec is None else tree_mod.detect(tree_mod.fetch(spec))
    report = validate_mod.validate(info, port, full=mode == "full",
                                   models=list(models) or None, reference=ref)
    if fmt == "json":
        click.echo(validate_mod.report_json(report))
    elif fmt == "markdown":
        click.echo(report.markdown(), nl=False)
    else:
        click.echo(report.text())
    if not report.passed:
        raise report.failure()
