"""The validation harness against llama-perplexity, side by side, every `--full` configuration.

    .venv/bin/python benchmarks/harness_equality.py [--version 0.3.17 --version 0.3.19]
                                                    [--model smollm2 ...] [--quick]

For each registry tree, the patched copy that `portkit validate` builds is built once more
with llama-perplexity next to the harness (one libllama for both). Then, for each model and
cache configuration (with the rotation on, and off through LLAMA_ATTN_ROT_DISABLE=1), both
programs compute PPL, KLD and top-1 against their own f16-cache base on the same text with
the same chunking, and the table prints what each printed and whether every printed digit
agrees. Exit status 1 when any figure differs. The first run builds the tools (about 20 min
a tree on two cores); later runs reuse the builds but run every configuration again.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from portkit import tree as tree_mod  # noqa: E402
from portkit.checks.kv_rotation import FULL_CONFIGS, QUICK_CONFIGS  # noqa: E402
from portkit.models import FULL_MODEL, QUICK_MODEL  # noqa: E402
from tests.test_validate import perplexity_vs_harness, tools_build  # noqa: E402

FIELDS = ("ppl", "kld", "top1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", action="append",
                    help="llama-cpp-python sdist (repeatable; default 0.3.17 and 0.3.19)")
    ap.add_argument("--model", action="append",
                    help=f"model (repeatable; default {QUICK_MODEL} and {FULL_MODEL})")
    ap.add_argument("--quick", action="store_true", help="only the --quick configurations")
    args = ap.parse_args()
    versions = args.version or ["0.3.17", "0.3.19"]
    models = args.model or [QUICK_MODEL, FULL_MODEL]
    configs = list(QUICK_CONFIGS if args.quick else FULL_CONFIGS)

    print("| tree | model | cache | llama-perplexity PPL / KLD / top-1 "
          "| harness PPL / KLD / top-1 | equal |")
    print("|---|---|---|---|---|---|")
    unequal = 0
    for version in versions:
        tree = tree_mod.fetch(f"pypi:llama-cpp-python=={version}")
        start = time.monotonic()
        bin_dir, harness = tools_build(tree)
        print(f"<!-- {version}: tools ready in {time.monotonic() - start:.0f} s -->",
              file=sys.stderr)
        for model in models:
            with tempfile.TemporaryDirectory(prefix="portkit-equality-") as work:
                figures = perplexity_vs_harness(bin_dir, harness, model, configs, Path(work))
            for config, (theirs, ours) in figures.items():
                keys = [k for k in FIELDS if k in theirs]
                same = all(theirs[k] == ours[k] for k in keys)
                unequal += not same
                print(f"| {version} | {model} | {config} | "
                      f"{' / '.join(theirs[k] for k in keys)} | "
                      f"{' / '.join(ours[k] for k in keys)} | {'yes' if same else 'NO'} |",
                      flush=True)
    print(f"\n{unequal} configuration(s) differ" if unequal else
          "\nevery printed digit agrees")
    return 1 if unequal else 0


if __name__ == "__main__":
    sys.exit(main())
