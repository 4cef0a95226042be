"""`--compile`: the units a carried series touches compiled on the target, and a patch
whose lines do not compile marked needs-review, naming the error and its author.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from portkit.errors import ToolMissing
from portkit.follow import tree_view
from portkit.proc import run
from portkit.rebase.report import NEEDS_REVIEW, Rebased, RebasedPatch
from portkit.rebase.run import _scratch
from portkit.series import (
    Patch,
)
from portkit.tree import Tree

_UNITS = (".c", ".cc", ".cpp")


_DIAGNOSTIC = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: "
                         r"(?P<message>.*)$", re.M)


# Where llama.cpp's sources find their headers (relative to the llama.cpp root).
INCLUDE_DIRS = ("include", "src", "common", "ggml/include", "ggml/src", "ggml/src/ggml-cpu")


@dataclass(frozen=True)
class CompileError:
    file: str  # relative to the llama.cpp root
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


def compile_errors(root: Path, unit: str) -> list[CompileError]:
    """The errors of compiling `unit` (syntax and types only) in the llama.cpp tree at
    `root`, with the layout's include paths."""
    c = unit.endswith(".c")
    compiler = shutil.which("cc" if c else "c++")
    if compiler is None:
        raise ToolMissing("no C/C++ compiler (apt-get install g++)")
    flags = ["-std=gnu11"] if c else ["-std=gnu++17"]
    includes = [f"-I{d}" for d in INCLUDE_DIRS if (root / d).is_dir()]
    done = run([compiler, *flags, "-fsyntax-only", "-w", "-fmax-errors=20",
                "-fno-diagnostics-color", *includes, unit], cwd=root, check=False)
    return [CompileError(os.path.normpath(m["file"]), int(m["line"]), m["message"].strip())
            for m in _DIAGNOSTIC.finditer(done.stderr)]


def _overlay(source: Path, files: dict[str, bytes | None], dest: Path) -> Path:
    """`dest` made to read as `source` with `files` in place of its own: symbolic links to
    everything else, real folders only along the paths of `files`."""
    def populate(real: Path, src: Path) -> None:
        for entry in src.iterdir():
            (real / entry.name).symlink_to(entry)

    dest.mkdir(parents=True, exist_ok=True)
    populate(dest, source)
    for rel, data in files.items():
        here, there = dest, source
        for part in rel.split("/")[:-1]:
            here, there = here / part, there / part
            if here.is_symlink():
                here.unlink()
            if not here.exists():
                here.mkdir()
                if there.is_dir():
                    populate(here, there)
        path = dest / rel
        if path.is_symlink() or path.exists():
            path.unlink()
        if data is not None:
            path.write_bytes(data)
    return dest


def compile_check(rebased: Rebased, target: Tree) -> Rebased:
    """Compile the translation units the carried series touches, on the target without and
    with it. Each error only the carried tree has is charged to the patch that wrote its
    line (else to the last patch that changed its file, else its unit), which is then
    needs-review, with the error."""
    units = sorted(rel for rel, data in rebased.carried.items()
                   if rel.endswith(_UNITS) and data is not None)
    charged: dict[str, list[str]] = {}
    with tree_view(target) as view, _scratch("portkit-compile-") as tmp:
        carried = _overlay(view, rebased.carried, tmp / "tree")
        for unit in units:
            before = {(e.file, e.message) for e in compile_errors(view, unit)
                      if (view / unit).is_file()}
            for error in compile_errors(carried, unit):
                if (error.file, error.message) in before:
                    continue
                text = _line(carried / error.file, error.line)
                patch = _author(rebased.series.patches, error.file, text, unit)
                if patch is not None:
                    charged.setdefault(patch, []).append(str(error))
    rows = []
    for row in rebased.report.patches:
        errors = charged.get(row.output) if row.output is not None else None
        if errors:  # charged to the carried patch, by its name in the carried series
            row = RebasedPatch(row.file, row.subject, NEEDS_REVIEW,
                               f"it does not compile: {'; '.join(errors[:3])}; {row.reason}",
                               row.output, row.conflict)
        rows.append(row)
    report = replace(rebased.report, patches=tuple(rows))  # all else as it was
    return Rebased(report, rebased.series, rebased.side_files, rebased.carried)


def _line(path: Path, number: int) -> str:
    try:
        lines = path.read_bytes().decode("utf-8", "surrogateescape").splitlines()
    except OSError:
        return ""
    return lines[number - 1].strip() if 0 < number <= len(lines) else ""


def _author(patches: Sequence[Patch], file: str, text: str, unit: str) -> str | None:
    """The carried patch that wrote the line `text` of `file`: the last one that adds it;
    else the last that changes the file, else the last that changes the unit."""
    for patch in reversed(patches):
        if text and any(h.path == file and any(a.strip() == text for a in h.added)
                        for h in patch.hunks):
            return patch.name
    for path in (file, unit):
        for patch in reversed(patches):
            if path in patch.paths:
                return patch.name
    return None
