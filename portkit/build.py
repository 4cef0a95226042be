"""Configure and build llama.cpp trees with CMake + Ninja (CPU only, ccache when installed).

Build folders live in the cache, one per tree and configuration, so that building an
unchanged tree again costs seconds (Ninja's own up-to-date check, ccache for the rest).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from portkit.cache import cache_dir
from portkit.errors import PortkitError
from portkit.proc import run, stream
from portkit.tree import Tree

CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
)
# Virtual machines may advertise AMX (Sapphire Rapids and later) without letting a process
# use its tiles: with -march=native, ggml's AMX kernels then die of SIGILL at the first
# matmul. Validation compares builds with each other, so it loses nothing without them.
# GCC keeps explicit -mno-* flags over what a later -march=native implies.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def cmake_options() -> list[str]:
    options = list(CMAKE_OPTIONS)
    if platform.machine() in ("x86_64", "AMD64"):
        options += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    return options


@dataclass(frozen=True)
class CompileResult:
    units: list[str]  # relative to the llama.cpp root
    method: str  # how they were compiled


def build_dir(tree: Tree, flavour: str = "default") -> Path:
    key = hashlib.sha256(f"{tree.llama_root.resolve()}\n{flavour}".encode()).hexdigest()[:16]
    return cache_dir("builds") / key


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if " error: " in line or line.startswith("error:") or "fatal error:" in line:
            return line.strip()
    return next((ln for ln in reversed(log.strip().splitlines()) if ln.strip()), "").strip()


def _check_tools() -> None:
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            raise PortkitError(f"{tool} is not installed (apt-get install cmake ninja-build)")


def _ccache_env(llama_root: Path) -> dict[str, str]:
    """Paths relative to the folder holding the tree (and, in a workspace, its build), so
    that copies of one tree share their ccache entries."""
    return {**os.environ, "CCACHE_BASEDIR": str(llama_root.resolve().parent),
            "CCACHE_NOHASHDIR": "1"}


def configure(llama_root: Path, folder: Path) -> Path:
    """Configure the tree's CMake project into `folder` (once per set of options; later calls
    are no-ops)."""
    _check_tools()
    options = cmake_options()
    stamp = folder / "portkit-options"
    if not (folder / "build.ninja").is_file() or not stamp.is_file() \
            or stamp.read_text() != "\n".join(options):
        folder.mkdir(parents=True, exist_ok=True)
        proc = run(["cmake", "-S", llama_root, "-B", folder, "-G", "Ninja", *options],
                   check=False, env=_ccache_env(llama_root))
        if proc.returncode != 0:
            log = folder / "configure.log"
            log.write_text(proc.stdout + proc.stderr)
            raise PortkitError(f"cmake configure failed: {_first_error(proc.stderr)} (log: {log})")
        stamp.write_text("\n".join(options))
    return folder


class _Progress:
    """Build progress on stderr: a line every tenth of the way, not every compile."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.shown = -1

    def __call__(self, line: str) -> None:
        m = re.match(r"\[(\d+)/(\d+)\]", line)
        if m:
            done, total = int(m.group(1)), int(m.group(2))
            step = done * 10 // total
            if step != self.shown:
                self.shown = step
                sys.stderr.write(f"  {self.label}: {done}/{total}\n")


def ninja(llama_root: Path, folder: Path, targets: list[str], label: str = "build") -> None:
    log = folder / "portkit-build.log"
    code = stream(["ninja", "-C", folder, *targets], log, on_line=_Progress(label),
                  env=_ccache_env(llama_root))
    if code != 0:
        raise PortkitError(f"build failed: {_first_error(log.read_text())} (log: {log})")


def harness_binary(source: Path) -> str:
    """The name a harness source builds to: rotation_checks.cpp -> portkit-rotation-checks."""
    return "portkit-" + source.stem.replace("_", "-")


def build_tools(llama_root: Path, folder: Path, targets: list[str], label: str,
                harness_source: Path | None = None) -> Path:
    """Configure and build `targets` of the tree, plus a feature's harness (a C++ program
    against the tree's libllama); return the bin dir."""
    configure(llama_root, folder)
    ninja(llama_root, folder, [*targets, "llama"], label)
    bin_dir = folder / "bin"
    if harness_source is None:
        return bin_dir
    harness = bin_dir / harness_binary(harness_source)
    header = (llama_root / "include" / "llama.h").read_text()
    flags = [] if "flash_attn_type" in header else ["-DPORTKIT_FLASH_ATTN_BOOL"]
    compiler = shutil.which("c++") or shutil.which("g++") or "c++"
    if not harness.is_file() or harness.stat().st_mtime < max(
            harness_source.stat().st_mtime, (bin_dir / "libllama.so").stat().st_mtime):
        proc = run([compiler, "-std=c++17", "-O2", *flags, harness_source,
                    f"-I{llama_root / 'include'}", f"-I{llama_root / 'ggml' / 'include'}",
                    f"-L{bin_dir}", "-lllama", "-lggml", "-lggml-base",
                    f"-Wl,-rpath,{bin_dir}", "-o", harness], check=False)
        if proc.returncode != 0:
            raise PortkitError(f"the validation harness does not build against {llama_root}: "
                               f"{_first_error(proc.stderr)}")
    return bin_dir


def compile_units(tree: Tree, files: list[str]) -> CompileResult:
    """Compile the translation units among `files` (paths relative to the llama.cpp root).

    With a CMake project at the llama.cpp root, through its own compile commands (the
    tree's include paths and flags). Without one (an ollama-style fork keeps ggml apart and
    builds from its own top-level project), with the include paths of the layout.
    """
    units = [f for f in files if f.endswith((".cpp", ".c", ".cc"))]
    if not units:
        return CompileResult([], "nothing to compile")
    if (tree.llama_root / "CMakeLists.txt").is_file() and (tree.llama_root / "ggml").is_dir():
        folder = configure(tree.llama_root, build_dir(tree))
        commands = json.loads((folder / "compile_commands.json").read_text())
        by_file = {Path(c["file"]).resolve(): c for c in commands}
        targets = []
        for unit in units:
            entry = by_file.get((tree.llama_root / unit).resolve())
            if entry is None:
                raise PortkitError(f"{unit} is not compiled by the tree's CMake project")
            targets.append(entry.get("output") or _output_of(entry["command"]))
        ninja(tree.llama_root, folder, targets, "compile")
        return CompileResult(units, f"the tree's CMake project ({folder})")
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise PortkitError("no C++ compiler (apt-get install g++)")
    includes = [tree.llama_root / "include", tree.llama_root / "src", tree.ggml_root / "include"]
    for unit in units:
        proc = run([compiler, "-std=c++17", "-fsyntax-only", "-Wall",
                    *[f"-I{i}" for i in includes], tree.llama_root / unit], check=False)
        if proc.returncode != 0:
            raise PortkitError(f"{unit} does not compile: {_first_error(proc.stderr)}")
    return CompileResult(units, "the layout's include paths (no CMake project at the llama.cpp "
                                "root)")


def _output_of(command: str) -> str:
    parts = command.split()
    return parts[parts.index("-o") + 1]
