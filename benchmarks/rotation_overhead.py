"""Prompt and generation speed with the rotation on vs off, q8_0/q8_0 cache, both models.

    python benchmarks/rotation_overhead.py [--version 0.3.17] [--repeat 3]

Uses the patched build of `portkit validate`'s workspace (built on first use) and runs
llama-bench twice per model in the same run: LLAMA_ATTN_ROT_DISABLE=1 (the baseline) and
rotation on. Prints tokens/s of each and the on/off ratio (goal: >= 0.97x).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from portkit import tree as tree_mod
from portkit.models import FULL_MODEL, QUICK_MODEL, model_path
from portkit.proc import run
from portkit.validate import Runner, Workspace


def bench(binary: Path, model: Path, disable: bool, repeat: int) -> dict[str, float]:
    env = {**os.environ, "LLAMA_ATTN_ROT_DISABLE": "1" if disable else "0"}
    proc = run([binary, "-m", model, "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "1", "-t", "2",
                "-p", "256", "-n", "64", "-r", str(repeat), "-o", "json"], env=env)
    rows = json.loads(proc.stdout)
    return {("prompt" if r["n_prompt"] else "generation"): float(r["avg_ts"]) for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="0.3.17", help="llama-cpp-python sdist version")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    tree = tree_mod.detect(tree_mod.fetch(f"pypi:llama-cpp-python=={args.version}"))
    workspace = Workspace(tree, "kv-rotation")
    workspace.prepare()
    binary = Runner(workspace).bin("patched") / "llama-bench"
    print(f"tree: llama-cpp-python {args.version} (llama.cpp {(tree.pin or '?')[:12]}), "
          f"q8_0/q8_0 cache, 2 threads, pp256 / tg64, {args.repeat} repetitions")
    print(f"{'model':<22} {'test':<11} {'off t/s':>9} {'on t/s':>9} {'on/off':>7}")
    for model in (QUICK_MODEL, FULL_MODEL):
        off = bench(binary, model_path(model), True, args.repeat)
        on = bench(binary, model_path(model), False, args.repeat)
        for test in ("prompt", "generation"):
            print(f"{model:<22} {test:<11} {off[test]:9.2f} {on[test]:9.2f} "
                  f"{on[test] / off[test]:6.3f}x")


if __name__ == "__main__":
    main()
