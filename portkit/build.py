"""Configure and build llama.cpp trees with CMake + Ninja (CPU only, ccache when installed).

What validation runs is portkit's own harness against the tree's libllama, so a build is
ggml (CPU backend), libllama and the harness, nothing of llama.cpp's tools, common library,
tests or examples. portkit writes the CMake project of a build into the build folder, never
into the tree:

- a tree with llama.cpp's own CMake project (a checkout, an sdist's vendor/llama.cpp) is
  added as a subdirectory, so its own options and flags build libllama;
- a vendored subset (an ollama-style fork: llama/llama.cpp/{src,include,...} and
  ml/backend/ggml/ggml/{include,src,cmake}, no root CMake project, no ggml/CMakeLists.txt)
  gets the options llama.cpp's own project would give ggml (native CPU backend, llamafile,
  OpenMP, repack), ggml from its ggml/src, and libllama from its src/*.cpp.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from portkit.cache import cache_dir
from portkit.errors import BuildError, ToolMissing
from portkit.proc import run, stream
from portkit.tree import Tree

CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
)
# llama.cpp's tools, for a build that also runs them next to the harness (tests compare the
# two); off otherwise, since a project added as a subdirectory builds none by default.
TOOLS_OPTIONS = ("-DLLAMA_BUILD_COMMON=ON", "-DLLAMA_BUILD_TOOLS=ON")
# Virtual machines may advertise AMX (Sapphire Rapids and later) without letting a process
# use its tiles: with -march=native, ggml's AMX kernels then die of SIGILL at the first
# matmul. Validation compares builds with each other, so it loses nothing without them.
# GCC keeps explicit -mno-* flags over what a later -march=native implies.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
LIBRARY = "llama"


def cmake_options() -> list[str]:
    options = list(CMAKE_OPTIONS)
    if platform.machine() in ("x86_64", "AMD64"):
        options += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    return options


@dataclass(frozen=True)
class CompileResult:
    units: list[str]  # relative to the llama.cpp root
    method: str  # how they were compiled


@dataclass(frozen=True)
class Sources:
    """What a build compiles: a llama.cpp root and its ggml, inside it (llama.cpp's own
    layout) or apart (an ollama-style fork's ml/backend/ggml/ggml)."""

    llama_root: Path
    ggml_root: Path

    @classmethod
    def of(cls, tree: Tree) -> Sources:
        return cls(tree.llama_root, tree.ggml_root)

    @property
    def has_project(self) -> bool:
        """Whether llama.cpp's own CMake project builds these sources."""
        return ((self.llama_root / "CMakeLists.txt").is_file()
                and self.ggml_root.resolve() == (self.llama_root / "ggml").resolve()
                and (self.ggml_root / "CMakeLists.txt").is_file())

    def common_parent(self) -> Path:
        return Path(os.path.commonpath([self.llama_root.resolve().parent,
                                        self.ggml_root.resolve().parent]))


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
            raise ToolMissing(f"{tool} is not installed (apt-get install cmake ninja-build)")


def _ccache_env(sources: Sources) -> dict[str, str]:
    """Paths relative to the folder holding the tree (and, in a validation copy, its build),
    so that copies of one tree share their ccache entries."""
    return {**os.environ, "CCACHE_BASEDIR": str(sources.common_parent()),
            "CCACHE_NOHASHDIR": "1"}


# -- the CMake project portkit writes -------------------------------------------------------

# What llama.cpp's top-level and ggml's own CMakeLists.txt set for ggml/src on a native CPU
# build (their option defaults); ggml/src reads them.
_GGML_SETTINGS = (
    ("BUILD_SHARED_LIBS", "ON"), ("GGML_CPU", "ON"), ("GGML_NATIVE", "ON"),
    ("GGML_LLAMAFILE", "ON"), ("GGML_OPENMP", "ON"), ("GGML_CPU_REPACK", "ON"),
    ("GGML_CCACHE", "ON"), ("GGML_ALL_WARNINGS", "ON"), ("GGML_SCHED_MAX_COPIES", "4"),
    ("GGML_LASX", "ON"), ("GGML_LSX", "ON"), ("GGML_RVV", "ON"),
    ("GGML_VERSION", "0.0.0"), ("GGML_VERSION_MAJOR", "0"),
    ("GGML_BUILD_NUMBER", "0"), ("GGML_BUILD_COMMIT", "vendored"),
)


def _cmake_path(path: Path) -> str:
    return json.dumps(path.resolve().as_posix())  # a quoted CMake string


def _harness_target(harness: Path, llama_root: Path) -> list[str]:
    header = (llama_root / "include" / "llama.h").read_text(errors="replace")
    name = harness_binary(harness)
    lines = [f"add_executable({name} {_cmake_path(harness)})",
             f"target_compile_features({name} PRIVATE cxx_std_17)",
             # the harness's float arithmetic is llama-perplexity's, operation for operation
             f"target_compile_options({name} PRIVATE -ffp-contract=off)",
             f"target_link_libraries({name} PRIVATE {LIBRARY})"]
    if "flash_attn_type" not in header:
        lines.append(f"target_compile_definitions({name} PRIVATE PORTKIT_FLASH_ATTN_BOOL)")
    return lines


def _llama_units(llama_root: Path) -> list[Path]:
    """libllama's translation units in a vendored subset: src/*.cpp and src/models/*.cpp
    (listed in the project, so that a unit added later reconfigures it)."""
    src = llama_root / "src"
    return sorted([*src.glob("*.cpp"), *(src / "models").glob("*.cpp")])


def project_text(sources: Sources, harness: Path | None) -> str:
    """The CMakeLists.txt portkit writes into a build folder for `sources`."""
    lines = ["# Written by portkit: ggml (CPU backend), libllama and portkit's validation",
             "# harness, built from the tree named below; nothing is written into the tree.",
             "cmake_minimum_required(VERSION 3.14)",
             "project(portkit_build C CXX)",
             "set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)",
             "set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)"]
    llama = sources.llama_root
    if sources.has_project:
        lines.append(f"add_subdirectory({_cmake_path(llama)} llama.cpp)")
    else:
        lines += ["set(CMAKE_C_STANDARD 11)", "set(CMAKE_C_STANDARD_REQUIRED true)",
                  "set(CMAKE_CXX_STANDARD 17)", "set(CMAKE_CXX_STANDARD_REQUIRED true)",
                  "set(THREADS_PREFER_PTHREAD_FLAG ON)", "find_package(Threads REQUIRED)",
                  "include(GNUInstallDirs)"]
        lines += [f"set({name} {value})" for name, value in _GGML_SETTINGS]
        lines += [f"add_subdirectory({_cmake_path(sources.ggml_root / 'src')} ggml)",
                  'target_compile_definitions(ggml-base PRIVATE GGML_VERSION="0.0.0" '
                  'GGML_COMMIT="vendored")',
                  f"add_library({LIBRARY}",
                  *[f"    {_cmake_path(unit)}" for unit in _llama_units(llama)], ")",
                  f"target_include_directories({LIBRARY} PRIVATE {_cmake_path(llama / 'src')})",
                  f"target_include_directories({LIBRARY} PUBLIC {_cmake_path(llama / 'include')})",
                  f"target_compile_features({LIBRARY} PRIVATE cxx_std_17)",
                  f"target_link_libraries({LIBRARY} PUBLIC ggml)",
                  f"set_target_properties({LIBRARY} PROPERTIES POSITION_INDEPENDENT_CODE ON)",
                  f"target_compile_definitions({LIBRARY} PRIVATE LLAMA_BUILD PUBLIC LLAMA_SHARED)"]
    if harness is not None:
        lines += _harness_target(harness, llama)
    return "\n".join(lines) + "\n"


def check_buildable(sources: Sources) -> None:
    """Refuse, before anything is copied or built, a tree that portkit cannot build: cmake or
    ninja missing, or a vendored subset that lacks what ggml and libllama need."""
    _check_tools()
    if sources.has_project:
        return
    missing = [p for p in (sources.llama_root / "src" / "llama.cpp",
                           sources.llama_root / "include" / "llama.h",
                           sources.ggml_root / "src" / "CMakeLists.txt",
                           sources.ggml_root / "include" / "ggml.h") if not p.is_file()]
    if missing:
        raise BuildError(f"cannot build {sources.llama_root}: it has no CMake project and "
                           f"the vendored subset lacks {missing[0]}")


def _options(tools: bool) -> list[str]:
    return cmake_options() + (list(TOOLS_OPTIONS) if tools else [])


def _stamp(options: list[str], project: str) -> str:
    """What a configured folder was configured with."""
    return "\n".join([*options, hashlib.sha256(project.encode()).hexdigest()])


def _harness_copy(folder: Path, harness: Path | None) -> Path | None:
    """Where the build compiles the harness from: a copy in its project folder, so that the
    binary is the same wherever the feature's templates are (the path is in its symbols)."""
    return None if harness is None else folder / "project" / harness.name


def configure(sources: Sources, folder: Path, harness: Path | None = None, *,
              tools: bool = False) -> bool:
    """Write portkit's CMake project for `sources` into `folder` and configure it (once per
    project text and set of options). Whether it configured anything."""
    check_buildable(sources)
    project = folder / "project"
    project.mkdir(parents=True, exist_ok=True)
    copy = _harness_copy(folder, harness)
    if harness is not None and copy is not None and (
            not copy.is_file() or copy.read_bytes() != harness.read_bytes()):
        shutil.copyfile(harness, copy)
    options = _options(tools)
    text = project_text(sources, copy)
    stamp = folder / "portkit-options"
    wanted = _stamp(options, text)
    if (folder / "build.ninja").is_file() and stamp.is_file() and stamp.read_text() == wanted:
        return False
    # a folder configured from another source folder (an older portkit configured the tree's
    # own project there) is refused by CMake: start it afresh
    (folder / "CMakeCache.txt").unlink(missing_ok=True)
    (project / "CMakeLists.txt").write_text(text)
    proc = run(["cmake", "-S", project, "-B", folder, "-G", "Ninja", *options],
               check=False, env=_ccache_env(sources))
    if proc.returncode != 0:
        log = folder / "configure.log"
        log.write_text(proc.stdout + proc.stderr)
        raise BuildError(f"cmake configure failed: {_first_error(proc.stderr)} (log: {log})")
    stamp.write_text(wanted)
    return True


class _Progress:
    """Build progress on stderr: a first line once ninja has work to do (none when the build
    is up to date), then a line every tenth of the way, not every compile."""

    def __init__(self, label: str, say: Callable[[str], None]) -> None:
        self.label = label
        self.say = say
        self.total = 0
        self.shown = -1

    def __call__(self, line: str) -> None:
        m = re.match(r"\[(\d+)/(\d+)\]", line)
        if m and int(m.group(1)) > 0:  # [0/n]: ninja re-runs CMake, then counts anew
            done, total = int(m.group(1)), int(m.group(2))
            step = done * 10 // total
            if total != self.total:
                self.total, self.shown = total, -1
                self.say(f"building {self.label} ({total} steps)")
            if step != self.shown:
                self.shown = step
                sys.stderr.write(f"  {self.label}: {done}/{total}\n")


def _stderr(message: str) -> None:
    sys.stderr.write(f"portkit: {message}\n")


def ninja(sources: Sources, folder: Path, targets: Sequence[str], label: str = "build",
          say: Callable[[str], None] = _stderr) -> None:
    log = folder / "portkit-build.log"
    code = stream(["ninja", "-C", folder, *targets], log, on_line=_Progress(label, say),
                  env=_ccache_env(sources))
    if code != 0:
        raise BuildError(f"build failed: {_first_error(log.read_text())} (log: {log})")


def pending_steps(sources: Sources, folder: Path, harness: Path, *,
                  tools: Sequence[str] = ()) -> int | None:
    """How many steps building the harness (and `tools`) in `folder` takes: 0 when it is up
    to date, None when the folder is not configured yet (a full build)."""
    stamp = folder / "portkit-options"
    copy = _harness_copy(folder, harness)
    wanted = _stamp(_options(bool(tools)), project_text(sources, copy))
    if not (folder / "build.ninja").is_file() or not stamp.is_file() \
            or stamp.read_text() != wanted or copy is None or not copy.is_file() \
            or copy.read_bytes() != harness.read_bytes():
        return None
    proc = run(["ninja", "-n", "-C", folder, harness_binary(harness), *tools], check=False,
               env=_ccache_env(sources))
    if proc.returncode != 0:
        return None
    totals = re.findall(r"^\[\d+/(\d+)\]", proc.stdout, re.M)
    return int(totals[-1]) if totals else 0


def harness_binary(source: Path) -> str:
    """The name a harness source builds to: rotation_checks.cpp -> portkit-rotation-checks."""
    return "portkit-" + source.stem.replace("_", "-")


def build_harness(sources: Sources, folder: Path, harness: Path, label: str, *,
                  tools: Sequence[str] = (), say: Callable[[str], None] = _stderr) -> Path:
    """Configure and build ggml, libllama and a feature's harness (a C++ program against
    the tree's llama.h) in `folder`, plus llama.cpp's `tools` when asked; the bin folder."""
    configure(sources, folder, harness, tools=bool(tools))
    ninja(sources, folder, [harness_binary(harness), *tools], label, say)
    return folder / "bin"


def compile_units(tree: Tree, files: list[str]) -> CompileResult:
    """Compile the translation units among `files` (paths relative to the llama.cpp root).

    With llama.cpp's CMake project at the llama.cpp root, the units' object files through
    it (the tree's include paths and flags). Without one (an ollama-style fork keeps ggml
    apart and builds from its own top-level project), portkit's project for the vendored
    subset compiles and links all of libllama and ggml, the touched units among them.
    """
    units = [f for f in files if f.endswith((".cpp", ".c", ".cc"))]
    if not units:
        return CompileResult([], "nothing to compile")
    sources = Sources.of(tree)
    folder = build_dir(tree)
    configure(sources, folder)
    commands = json.loads((folder / "compile_commands.json").read_text())
    by_file = {Path(c["file"]).resolve(): c for c in commands}
    targets = []
    for unit in units:
        entry = by_file.get((tree.llama_root / unit).resolve())
        if entry is None:
            raise BuildError(f"{unit} is not compiled by the tree's CMake project")
        targets.append(entry.get("output") or _output_of(entry["command"]))
    if sources.has_project:
        ninja(sources, folder, targets, "the touched units")
        return CompileResult(units, f"the tree's CMake project ({folder})")
    ninja(sources, folder, [*targets, LIBRARY], "libllama with the touched units")
    return CompileResult(units, f"portkit's CMake project for the vendored subset, libllama and "
                                f"ggml compiled and linked ({folder})")


def _output_of(command: str) -> str:
    parts = command.split()
    return parts[parts.index("-o") + 1]
