"""portkit against the plain tools on real vendor bumps: both benchmarks of ../shared/bench.

    OLLAMA_MIRROR=<bare git mirror of ollama/ollama> .venv/bin/python benchmarks/real_history.py

Builds the cases (ollama's llama.cpp vendor bumps, the maintainers' refreshed series as the
truth) with the rebase benchmark's make_cases.py, then scores in the same run:

  rebase  `portkit rebase` against `git am -3` (run_baselines.py): sequential and each patch
          alone, correct / wrong / failed; how portkit marked every patch it got wrong (a
          wrong one must be needs-review or needs-human, never unchanged or merged); wall
          time per case;
  drift   `portkit drift` against GNU patch (score_drift.py): verdicts right, false alarms
          on unchanged patches, false present-upstream calls, flagged hunks located right /
          wrong / none, median wall time per case.

Not in CI: it needs the mirror and a few minutes. --work keeps the cases and every result
(default: a temporary folder, removed at the end); --reuse skips building cases already
there.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ATTENTION = ("needs-review", "needs-human")


def _run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, text=True, capture_output=True)
    if done.returncode != 0:
        sys.exit(f"real_history: {' '.join(argv[:2])} failed:\n{done.stdout[-2000:]}"
                 f"{done.stderr[-2000:]}")


def _cases(work: Path) -> list[Path]:
    return sorted(p for p in (work / "cases").iterdir() if (p / "case.json").is_file())


def rebase_bench(bench: Path, work: Path, portkit: str) -> dict[str, object]:
    reports = work / "portkit-rebase"
    reports.mkdir(exist_ok=True)
    tool = (f"{shlex.quote(portkit)} rebase --series {{series}} --base {{old_tree}} "
            f"--onto {{tree}} --out {{out}} --format json > {shlex.quote(str(reports))}"
            "/{new_pin}.json")
    results = work / "rebase_results"
    _run([sys.executable, "run_baselines.py", str(work), "--baselines", "am3", "--tool", tool,
          "--tool-name", "portkit", "--results", str(results), "--summary",
          str(work / "rebase_summary.md")], bench / "rebase")
    counts: Counter[tuple[str, str, str]] = Counter()
    wrong_marks: Counter[str] = Counter()
    seconds: dict[str, list[float]] = {"am3": [], "portkit": []}
    for case in _cases(work):
        res = json.loads((results / f"{case.name}.json").read_text())
        marks: dict[str, str] = {}
        report = reports / f"{res['new_pin']}.json"
        if report.is_file():
            marks = {p["file"]: p["status"] for p in json.loads(report.read_text())["patches"]}
        for name, base in res["baselines"].items():
            seconds.setdefault(name, []).append(base.get("seconds", 0.0))
            for mode in ("seq", "iso"):
                for row in base[mode]:
                    counts[(name, mode, row["verdict"])] += 1
                    if row["needs_change"]:
                        counts[(name, mode + "-changed", row["verdict"])] += 1
                    if name == "portkit" and mode == "seq" and row["verdict"] == "WRONG":
                        wrong_marks[marks.get(row["old"], "?")] += 1
    return {"counts": counts, "wrong_marks": wrong_marks, "seconds": seconds}


def drift_bench(bench: Path, work: Path, portkit: str) -> dict[str, object]:
    tool = (f"{shlex.quote(portkit)} drift --series {{series}} --base {{old_tree}} "
            "--tree {tree} --format json > {out_json}")
    results = work / "drift_results"
    _run([sys.executable, "score_drift.py", str(work), "--tool", tool, "--tool-name", "portkit",
          "--tool", "python3 baseline_patch.py --series {series} --tree {tree} --out {out_json}",
          "--tool-name", "patch", "--results", str(results), "--summary",
          str(work / "drift_summary.md")], bench / "drift")
    out: dict[str, Counter[str]] = {}
    walls: dict[str, list[float]] = {}
    for case in _cases(work):
        res = json.loads((results / f"{case.name}.json").read_text())
        for name, rec in res["tools"].items():
            c = out.setdefault(name, Counter())
            m = rec["metrics"]
            c["right"] += m["accuracy"][0]
            c["scored"] += m["accuracy"][1]
            c["false_alarm"] += m["false_alarm"][0]
            c["unchanged"] += m["false_alarm"][1]
            c["false_upstream"] += len(rec["false_upstream"])
            for key in ("right", "wrong", "none"):
                c["loc_" + key] += rec["localization"][key]
            walls.setdefault(name, []).append(rec["wall_s"])
    return {"counts": out, "walls": walls}


def _cwf(c: Counter[tuple[str, str, str]], tool: str, mode: str) -> str:
    return " / ".join(str(c[(tool, mode, v)]) for v in ("CORRECT", "WRONG", "FAILED"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mirror", default=os.environ.get("OLLAMA_MIRROR"),
                    help="bare git mirror of ollama/ollama (default $OLLAMA_MIRROR)")
    ap.add_argument("--bench", type=Path, default=REPO.parent / "shared" / "bench",
                    help="the benchmarks' folder (default ../shared/bench)")
    ap.add_argument("--work", type=Path, help="keep cases and results here")
    ap.add_argument("--reuse", action="store_true", help="reuse the cases in --work")
    ap.add_argument("--portkit", default=str(Path(sys.executable).parent / "portkit"),
                    help="the portkit to score (default: this venv's)")
    args = ap.parse_args()
    if not args.mirror:
        sys.exit("real_history: set OLLAMA_MIRROR (or --mirror) to a bare mirror of "
                 "ollama/ollama")
    with tempfile.TemporaryDirectory(prefix="portkit-history-") as tmp:
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        if not (args.reuse and (work / "cases").is_dir()):
            _run([sys.executable, "make_cases.py", str(work), "--mirror", args.mirror],
                 args.bench / "rebase")
        # Byte-compiled first, as pip installs a package: a run never pays for compiling
        # (an editable checkout under PYTHONDONTWRITEBYTECODE would, every time).
        _run([sys.executable, "-m", "compileall", "-q", str(REPO / "portkit")], REPO)
        r = rebase_bench(args.bench.resolve(), work, args.portkit)
        d = drift_bench(args.bench.resolve(), work, args.portkit)
    c = r["counts"]
    assert isinstance(c, Counter)
    marks = r["wrong_marks"]
    assert isinstance(marks, Counter)
    secs = r["seconds"]
    assert isinstance(secs, dict)
    dc, walls = d["counts"], d["walls"]
    assert isinstance(dc, dict) and isinstance(walls, dict)
    pk, gp = dc["portkit"], dc["patch"]
    print("| measure (same run) | portkit | baseline |")
    print("|---|---|---|")
    print(f"| rebase, sequential: correct / wrong / failed | {_cwf(c, 'portkit', 'seq')} | "
          f"`git am -3` {_cwf(c, 'am3', 'seq')} |")
    print("| rebase, sequential: how portkit marked the wrong ones | "
          + ", ".join(f"{n} {s}" for s, n in marks.most_common()) + " | - |")
    print(f"| rebase, each patch alone: correct / wrong / failed | {_cwf(c, 'portkit', 'iso')} "
          f"| `git am -3` {_cwf(c, 'am3', 'iso')} |")
    print("| rebase, each patch alone, patches needing change: correct / wrong / failed | "
          f"{_cwf(c, 'portkit', 'iso-changed')} | `git am -3` {_cwf(c, 'am3', 'iso-changed')} |")
    print(f"| rebase wall time, median per case | {statistics.median(secs['portkit']):.1f} s | "
          f"`git am -3` {statistics.median(secs['am3']):.1f} s |")
    print(f"| drift verdict right | {pk['right']} / {pk['scored']} | GNU patch {gp['right']} / "
          f"{gp['scored']} |")
    print(f"| drift false alarms on unchanged patches | {pk['false_alarm']} / {pk['unchanged']} "
          f"| GNU patch {gp['false_alarm']} / {gp['unchanged']} |")
    print(f"| drift false present-upstream | {pk['false_upstream']} | GNU patch "
          f"{gp['false_upstream']} |")
    print(f"| drift flagged hunks located right / wrong / none | {pk['loc_right']} / "
          f"{pk['loc_wrong']} / {pk['loc_none']} | GNU patch {gp['loc_right']} / "
          f"{gp['loc_wrong']} / {gp['loc_none']} |")
    print(f"| drift wall time, median per case | {statistics.median(walls['portkit']):.2f} s | "
          f"GNU patch {statistics.median(walls['patch']):.2f} s |")


if __name__ == "__main__":
    main()
