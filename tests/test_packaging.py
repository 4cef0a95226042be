"""A wheel built from the repository is a complete portkit: every module, the templates (with
the validation harness) and the data inside, and it runs from anywhere without the checkout."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stderr[-2000:]}"
    return proc


def _contents(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # From a clean copy of what the build reads: setuptools reuses a checkout's build/ folder,
    # whose leftovers could hide a missing file.
    source = out / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for name in ("portkit", "templates"):
        shutil.copytree(REPO / name, source / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    # Built the way pip and pipx build it: an isolated build of the project folder.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", out, source],
         cwd=out)
    (built,) = out.glob("portkit-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel; its dependencies come from this interpreter's
    site-packages (added after the venv's own, so portkit is the wheel's)."""
    root = tmp_path_factory.mktemp("venv") / "v"
    _run([sys.executable, "-m", "venv", "--without-pip", root], cwd=root.parent)
    python = root / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
          wheel], cwd=root.parent)
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                   cwd=root.parent).stdout.strip()
    outer = [*site.getsitepackages(), site.getusersitepackages()]
    Path(purelib, "outer-deps.pth").write_text("\n".join(outer) + "\n")
    return root


def test_wheel_holds_templates_data_and_harness(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in (REPO / "templates").rglob("*"):
        if path.is_file():
            assert f"portkit/templates/{path.relative_to(REPO / 'templates')}" in names
    for path in [*(REPO / "portkit" / "data").glob("*.toml"),
                 *(REPO / "portkit").rglob("*.py")]:
        assert f"{path.relative_to(REPO)}" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "portkit = portkit.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_installed_wheel_runs_without_the_checkout(venv: Path, registry_tree, tmp_path: Path
                                                   ) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PORTKIT_TEMPLATES", "PYTHONPATH")}
    located = _run([venv / "bin" / "python", "-c",
                    "import portkit, portkit.features as f; print(portkit.__file__); "
                    "print(f.templates_root())"], cwd=elsewhere, env=env).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in located)

    portkit = venv / "bin" / "portkit"
    assert "anchors" in _run([portkit, "--help"], cwd=elsewhere, env=env).stdout
    assert "--published" in _run([portkit, "validate", "--help"], cwd=elsewhere, env=env).stdout

    registry = registry_tree("0.3.17")
    anchors = _run([portkit, "anchors", "--tree", registry, "--format", "json"], cwd=elsewhere,
                   env=env).stdout
    assert "build_rope_shift" in anchors

    copy = tmp_path / "llama-0.3.17"  # the sdist layout: the pin is read from CHANGELOG.md
    copy.mkdir()
    shutil.copy2(registry / "CHANGELOG.md", copy / "CHANGELOG.md")
    for part in ("src", "include"):
        shutil.copytree(registry / "vendor" / "llama.cpp" / part,
                        copy / "vendor" / "llama.cpp" / part)
    before = _contents(copy)
    dry = _run([portkit, "apply", "--dry-run", "--pin", "49bfddec", "--tree", copy],
               cwd=elsewhere, env=env)
    committed = REPO / "patches" / "kv-rotation" / "49bfddeca18e62fa3d39114a23e9fcbdf8a22388"
    assert dry.stdout == "".join(p.read_text() for p in sorted(committed.glob("*.patch")))
    assert "nothing changed" in dry.stderr
    assert _contents(copy) == before
