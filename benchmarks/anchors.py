"""Resolve the whole kv-rotation anchor set on a real tree: cold, warm, and raw parse baseline.

    .venv/bin/python benchmarks/anchors.py [--version 0.3.17] [--repeat 9] [--instructions]

Prints the median of each, and the ratios the foundation issue targets:
cold <= 1.5x the raw tree-sitter parse of the same files; warm <= 0.3 s.
The three are measured in turn within each round, so that a busy machine weighs on all alike.
Each resolution builds a new index, and with it a new parse cache: a warm run has only the
on-disk index, as a new process would.

With --instructions (needs valgrind), the same phases are also counted in executed
instructions under callgrind, which no neighbour on a shared machine can disturb: each phase
runs in a process of its own, and the process that only sets up is subtracted.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import tree_sitter_cpp
from tree_sitter import Language, Parser

from portkit import tree as tree_mod
from portkit.anchors import require, resolve_all
from portkit.features import load_anchors
from portkit.index import Index, source_files

PHASES = ("setup", "raw", "cold", "warm")  # each counted phase runs everything before it but raw
ENVIRON = dict(os.environ)  # for the counted processes: the trees' cache, not a scratch one


class Bench:
    def __init__(self, version: str) -> None:
        self.info = tree_mod.detect(tree_mod.fetch(f"pypi:llama-cpp-python=={version}"))
        self.anchor_set = load_anchors("kv-rotation")
        self.root = self.info.llama_root
        self.files = source_files(self.root, self.anchor_set.patterns())
        self.scratch = Path(tempfile.mkdtemp(prefix="portkit-bench-"))
        os.environ["PORTKIT_CACHE"] = str(self.scratch)

    def raw_parse(self) -> None:
        parser = Parser(Language(tree_sitter_cpp.language()))
        for rel in self.files:
            parser.parse((self.root / rel).read_bytes())

    def resolve(self) -> None:
        require(resolve_all(Index.build(self.root, self.anchor_set.patterns()), self.anchor_set))

    def forget_index(self) -> None:
        shutil.rmtree(self.scratch / "index", ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def timed(fn: Callable[[], object], setup: Callable[[], object] | None = None) -> float:
    if setup is not None:
        setup()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_phase(bench: Bench, phase: str) -> None:
    """What the process counted for `phase` executes after the common setup."""
    if phase == "raw":
        bench.raw_parse()
    elif phase in {"cold", "warm"}:
        bench.resolve()
        if phase == "warm":
            bench.resolve()


def count_instructions(version: str, phase: str) -> int:
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
           sys.executable, __file__, "--version", version, "--phase", phase]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=ENVIRON)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from callgrind for {phase}: {proc.stderr[-300:]}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="0.3.17", help="llama-cpp-python sdist version")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--instructions", action="store_true",
                    help="also count each phase's instructions under valgrind's callgrind")
    ap.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)  # one counted process
    args = ap.parse_args()

    bench = Bench(args.version)
    try:
        if args.phase:
            run_phase(bench, args.phase)
            return
        bench.resolve()  # imports, first-use caches
        samples: dict[str, list[float]] = {"raw": [], "cold": [], "warm": []}
        for _ in range(args.repeat):
            samples["raw"].append(timed(bench.raw_parse))
            samples["cold"].append(timed(bench.resolve, bench.forget_index))
            samples["warm"].append(timed(bench.resolve))
    finally:
        bench.close()
    t_raw, t_cold, t_warm = (statistics.median(samples[k]) for k in ("raw", "cold", "warm"))

    size = sum((bench.root / f).stat().st_size for f in bench.files)
    print(f"tree: llama-cpp-python {args.version} (llama.cpp {bench.info.pin})")
    print(f"files: {len(bench.files)} ({size / 1024:.0f} KiB), "
          f"anchors: {len(bench.anchor_set.anchors)}")
    print(f"raw tree-sitter parse (baseline): {t_raw * 1000:8.1f} ms")
    print(f"cold index + resolve:             {t_cold * 1000:8.1f} ms   "
          f"{t_cold / t_raw:5.2f}x baseline (target <= 1.5x)")
    print(f"warm index + resolve:             {t_warm * 1000:8.1f} ms   "
          f"{t_warm / t_raw:5.2f}x baseline (target <= 0.3 s)")
    if args.instructions:
        counts = {phase: count_instructions(args.version, phase) for phase in PHASES}
        raw = counts["raw"] - counts["setup"]
        cold = counts["cold"] - counts["setup"]
        warm = counts["warm"] - counts["cold"]
        print("instructions (callgrind, setup subtracted):")
        print(f"  raw tree-sitter parse (baseline): {raw / 1e6:8.1f} M")
        print(f"  cold index + resolve:             {cold / 1e6:8.1f} M   {cold / raw:5.2f}x")
        print(f"  warm index + resolve:             {warm / 1e6:8.1f} M   {warm / raw:5.2f}x")


if __name__ == "__main__":
    main()
