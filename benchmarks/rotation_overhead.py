"""Prompt and generation speed with the rotation on vs off, q8_0/q8_0 cache, both models.

    .venv/bin/python benchmarks/rotation_overhead.py [--version 0.3.17] [--reference 0.3.20]
                                                     [--rounds 9] [--threads 1]

Runs the validation harness's speed mode (pp256 / tg64, as llama-bench measures them) on the
patched build of `portkit validate` and, side by side, on upstream's own rotation (the
reference tree), each built on first use: each with LLAMA_ATTN_ROT_DISABLE=1 (the baseline)
and with the rotation on. The four runs alternate within each round so that a busy machine
weighs on all alike. Printed, for the port and for upstream: the best speed of the rounds
(noise only ever slows a run down) and their on/off ratio (goal: >= 0.97x), then the median
and the spread of each round's paired on/off ratio, which tell how noisy the machine was.
One thread by default: on a 2-core virtual machine, two threads that wait on each other
mostly measure the neighbours.
"""

from __future__ import annotations

import argparse
import statistics

from portkit import tree as tree_mod
from portkit.features import Feature
from portkit.models import FULL_MODEL, QUICK_MODEL
from portkit.validate import PATCHED, UPSTREAM, Progress, Runner, prepare_variants, speed

TESTS = ("prompt", "generation")
KEYS = {"prompt": "pp.ts", "generation": "tg.ts"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="0.3.17", help="llama-cpp-python sdist to port onto")
    ap.add_argument("--reference", default="0.3.20",
                    help="llama-cpp-python sdist with upstream's own rotation")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    tree = tree_mod.detect(tree_mod.fetch(f"pypi:llama-cpp-python=={args.version}"))
    reference = tree_mod.detect(tree_mod.fetch(f"pypi:llama-cpp-python=={args.reference}"))
    feature = Feature.load("kv-rotation")
    harness = feature.harness()
    assert harness is not None
    variants = prepare_variants(tree, feature, reference)
    runner = Runner(variants, harness, Progress())
    builds = {"port": variants[PATCHED], "upstream": variants[UPSTREAM]}
    for variant in builds.values():
        runner.build(variant.name)
    print(f"port onto llama-cpp-python {args.version} (llama.cpp {(tree.pin or '?')[:12]}), "
          f"upstream {args.reference} ({(reference.pin or '?')[:12]}); q8_0/q8_0 cache, "
          f"{args.threads} thread(s), pp256 / tg64, {args.rounds} rounds")
    print(f"{'model':<22} {'test':<11} {'build':<9} {'best off':>9} {'best on':>9} {'on/off':>7}"
          f"  {'paired median':>13} {'spread':>13}")
    for model in (QUICK_MODEL, FULL_MODEL):
        samples: dict[tuple[str, bool, str], list[float]] = {}
        for _ in range(args.rounds):
            for build, variant in builds.items():
                for disable in (True, False):
                    result = speed(variant, harness, model, "q8_0/q8_0", disable=disable,
                                   threads=args.threads, n_prompt=256, n_gen=64)
                    for test in TESTS:
                        samples.setdefault((build, disable, test), []).append(result[KEYS[test]])
        for test in TESTS:
            for build in builds:
                offs, ons = samples[(build, True, test)], samples[(build, False, test)]
                ratios = [b / a for a, b in zip(offs, ons, strict=True)]
                print(f"{model:<22} {test:<11} {build:<9} {max(offs):9.2f} {max(ons):9.2f} "
                      f"{max(ons) / max(offs):6.3f}x  {statistics.median(ratios):12.3f}x "
                      f"{min(ratios):6.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
