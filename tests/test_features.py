"""A feature is an object: its manifest, anchors, fragments and how it is validated."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from portkit.errors import PortkitError
from portkit.features import Feature, templates_root


def test_shipped_feature_names_its_own_validation():
    feature = Feature.load("kv-rotation")
    validation = feature.validation
    assert validation.checks == "kv_rotation"
    harness = feature.harness()
    assert harness is not None and harness.is_file() and harness.parent.parent == feature.folder
    assert validation.reference == "pypi:llama-cpp-python==0.3.20"
    assert feature.published()["smollm2"]["q4_0/q4_0"]["on"]["kld"] > 0
    assert all((feature.folder / "fragments" / f).is_file() for f in validation.broken_blank)


def test_broken_copy_blanks_only_the_named_fragments(tmp_path: Path):
    feature = Feature.load("kv-rotation")
    broken = feature.broken(tmp_path)
    assert broken.folder == tmp_path / "kv-rotation"
    for fragment in (feature.folder / "fragments").iterdir():
        copied = (broken.folder / "fragments" / fragment.name).read_text()
        if fragment.name in feature.validation.broken_blank:
            assert copied == ""
        else:
            assert copied == fragment.read_text()


def _feature_copy(tmp_path: Path) -> Path:
    shutil.copytree(templates_root() / "kv-rotation", tmp_path / "kv-rotation")
    return tmp_path / "kv-rotation" / "manifest.toml"


@pytest.mark.parametrize("drop,add,message", [
    ("checks", None, "needs `checks`"),
    ("harness", 'harness = "harness/none.cpp"', "names harness/none.cpp, which is not in"),
    ("broken_blank", 'broken_blank = ["nope.j2"]', "broken_blank names no fragment nope.j2"),
    (None, 'colour = "blue"', "takes only"),
])
def test_a_bad_validation_table_is_a_one_line_error(tmp_path: Path, drop: str | None,
                                                    add: str | None, message: str):
    manifest = _feature_copy(tmp_path)
    lines = [ln for ln in manifest.read_text().splitlines()
             if drop is None or not ln.startswith(f"{drop} = ")]
    manifest.write_text("\n".join(lines + ([add] if add else [])) + "\n")
    with pytest.raises(PortkitError, match=message) as caught:
        Feature.load("kv-rotation", tmp_path)
    assert "\n" not in str(caught.value)


def test_a_feature_without_validation_says_so(tmp_path: Path):
    manifest = _feature_copy(tmp_path)
    text = manifest.read_text()
    manifest.write_text(text[: text.index("[validation]")])
    feature = Feature.load("kv-rotation", tmp_path)
    with pytest.raises(PortkitError, match="says nothing about how to validate it"):
        _ = feature.validation
