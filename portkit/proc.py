"""The one way portkit runs a subprocess."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from portkit.errors import PortkitError


def run(
    args: Sequence[str | Path],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    capture: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise a PortkitError naming it and its last output line."""
    argv = [str(a) for a in args]
    try:
        proc = subprocess.run(
            argv, cwd=cwd, env=env, text=True, capture_output=capture, check=False
        )
    except FileNotFoundError as exc:
        raise PortkitError(f"command not found: {argv[0]}") from exc
    if check and proc.returncode != 0:
        out = (proc.stderr or "") + (proc.stdout or "")
        last = next((ln for ln in reversed(out.strip().splitlines()) if ln.strip()), "")
        name = " ".join(a for a in argv[:4] if not a.startswith("--"))
        raise PortkitError(f"{name} failed (exit {proc.returncode}): {last}")
    return proc


def stream(
    args: Sequence[str | Path],
    log: Path,
    *,
    on_line: Callable[[str], None],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """Run a long command with its output going to `log`, calling `on_line` for each line
    (for a progress display); return its exit code."""
    argv = [str(a) for a in args]
    with log.open("w") as out, subprocess.Popen(
        argv, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            on_line(line.rstrip("\n"))
        return proc.wait()
