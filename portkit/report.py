"""One way to print a report in each format: a table for people, JSON for programs."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Sequence
from typing import Any

import click

PIPE_WIDTH = 120  # a table's width when stdout is not a terminal (a log, a pager, a file)
GAP = "  "
ELLIPSIS = "…"


_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """`text` as UTF-8 can hold it: a byte that was not UTF-8 (read with surrogateescape, as
    portkit reads patches) becomes U+FFFD, the same in every format."""
    return _SURROGATE.sub("\ufffd", text)


def valid_data(data: Any) -> Any:
    """`data` (JSON's kinds) with every string made valid_text: JSON a strict reader takes."""
    if isinstance(data, str):
        return valid_text(data)
    if isinstance(data, dict):
        return {valid_text(k): valid_data(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [valid_data(v) for v in data]
    return data


def md_code(text: str, *, cell: bool = True) -> str:
    """An inline Markdown code span, whatever the text holds: on one line, fenced by more
    backticks than it has; in a table cell (`cell`) its pipes escaped, as GFM wants there
    (outside a table the backslash would show)."""
    text = " ".join(text.split())
    text = text.replace("|", "\\|") if cell else text
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def table_width() -> int:
    """The terminal's width when stdout is one ($COLUMNS first), else PIPE_WIDTH."""
    if sys.stdout.isatty():
        return shutil.get_terminal_size((PIPE_WIDTH, 24)).columns
    return PIPE_WIDTH


def fit_widths(natural: Sequence[int], least: Sequence[int], width: int) -> list[int]:
    """Column widths that fit `width` with GAP between: the widest columns are cut first,
    down to one common cap, none below its `least`. Columns already narrow keep theirs."""
    room = width - len(GAP) * (len(natural) - 1)
    if sum(natural) <= room:
        return list(natural)
    low, high = 0, max(natural)  # the largest cap that fits
    while low < high:
        cap = (low + high + 1) // 2
        if sum(max(min(n, cap), m) for n, m in zip(natural, least, strict=True)) <= room:
            low = cap
        else:
            high = cap - 1
    return [max(min(n, low), m) for n, m in zip(natural, least, strict=True)]


def _cell(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + ELLIPSIS


def emit_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
               width: int | None = None) -> None:
    """Rows under headers, in columns that fit `width` (default: `table_width()`); cut
    cells end with an ellipsis. The full text is for `--format json`."""
    cells = [[str(c) for c in row] for row in [headers, *rows]]
    natural = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    least = [min(n, max(len(h), 4)) for n, h in zip(natural, headers, strict=True)]
    widths = fit_widths(natural, least, table_width() if width is None else width)

    def line(row: Sequence[str]) -> str:
        return GAP.join(_cell(c, w).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()

    click.echo(line(cells[0]))
    click.echo(GAP.join("-" * w for w in widths))
    for row in cells[1:]:
        click.echo(line(row))
