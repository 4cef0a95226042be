"""Resolve the whole kv-rotation anchor set on a real tree: cold, warm, and raw parse baseline.

    python benchmarks/anchors.py [--version 0.3.17] [--repeat 5]

Prints the median of each, and the ratios the foundation issue targets:
cold <= 1.5x the raw tree-sitter parse of the same files; warm <= 0.3 s.
The three are measured in turn within each round, so that a busy machine weighs on all alike.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import tree_sitter_cpp
from tree_sitter import Language, Parser

from portkit import index as index_mod
from portkit import tree as tree_mod
from portkit.anchors import require, resolve_all
from portkit.features import load_anchors
from portkit.index import Index, source_files


def timed(fn: Callable[[], object], setup: Callable[[], object] | None = None) -> float:
    if setup is not None:
        setup()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="0.3.17", help="llama-cpp-python sdist version")
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()

    info = tree_mod.detect(tree_mod.fetch(f"pypi:llama-cpp-python=={args.version}"))
    anchor_set = load_anchors("kv-rotation")
    root = info.llama_root
    files = source_files(root, anchor_set.patterns())
    size = sum((root / f).stat().st_size for f in files)

    def raw_parse() -> None:
        parser = Parser(Language(tree_sitter_cpp.language()))
        for rel in files:
            parser.parse((root / rel).read_bytes())

    def resolve() -> None:
        require(resolve_all(Index.build(root, anchor_set.patterns()), anchor_set))

    scratch = Path(tempfile.mkdtemp(prefix="portkit-bench-"))
    os.environ["PORTKIT_CACHE"] = str(scratch)

    def forget_all() -> None:
        shutil.rmtree(scratch / "index", ignore_errors=True)
        index_mod._recent_trees.clear()

    def forget_parses() -> None:
        index_mod._recent_trees.clear()  # as in a new process: only the disk cache is warm

    samples: dict[str, list[float]] = {"raw": [], "cold": [], "warm": []}
    try:
        resolve()  # imports, first-use caches
        for _ in range(args.repeat):
            samples["raw"].append(timed(raw_parse))
            samples["cold"].append(timed(resolve, forget_all))
            samples["warm"].append(timed(resolve, forget_parses))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    t_raw, t_cold, t_warm = (statistics.median(samples[k]) for k in ("raw", "cold", "warm"))

    print(f"tree: llama-cpp-python {args.version} (llama.cpp {info.pin})")
    print(f"files: {len(files)} ({size / 1024:.0f} KiB), anchors: {len(anchor_set.anchors)}")
    print(f"raw tree-sitter parse (baseline): {t_raw * 1000:8.1f} ms")
    print(f"cold index + resolve:             {t_cold * 1000:8.1f} ms   "
          f"{t_cold / t_raw:5.2f}x baseline (target <= 1.5x)")
    print(f"warm index + resolve:             {t_warm * 1000:8.1f} ms   "
          f"{t_warm / t_raw:5.2f}x baseline (target <= 0.3 s)")


if __name__ == "__main__":
    main()
