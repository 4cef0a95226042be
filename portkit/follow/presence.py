"""Present upstream: the rules, in one ordered table. Each reads a `Place` (the target's
file, where the failed hunk's change is looked for) and says why the change is there, or
"". Only for a hunk that does not apply as text: none overrules one that does.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import cached_property
from typing import TYPE_CHECKING

from portkit.follow.words import _IDENT, _defines, _meaningful, identifiers
from portkit.index import uncommented
from portkit.series import Hunk

if TYPE_CHECKING:
    from portkit.follow.target import _Target


@dataclass
class Place:
    """Where a failed hunk's change is looked for: the target's file `rel` as upstream has
    it, within `span` lines (its `lines`), and what each presence rule reads of the hunk."""

    target: _Target
    hunk: Hunk
    rel: str
    span: tuple[int, int] | None
    lines: list[str]

    @cached_property
    def flat_lines(self) -> list[str]:
        """`lines` flattened (read when a rule needs them: the target flattens a whole file
        once, and a rule that rules itself out on names never needs them)."""
        flats = self.target.target.flat_lines(self.rel)
        return flats[max(self.span[0] - 1, 0):self.span[1]] if self.span else flats

    @cached_property
    def here(self) -> set[str]:
        return set(self.flat_lines)

    @cached_property
    def base_flat_lines(self) -> list[str]:
        """What the place stands for in the base, flattened: the hunk's function there where
        the place is the function it went to, else the hunk's whole file."""
        flats = self.target.base.flat_lines(self.hunk.path)
        sym = self.target.base_symbol(self.hunk) if self.span is not None else None
        return flats[max(sym.start_line - 1, 0):sym.end_line] if sym is not None else flats

    @cached_property
    def added(self) -> list[str]:
        return _meaningful(self.hunk.added)

    @cached_property
    def context(self) -> list[str]:
        """The hunk's meaningful context lines (its old side without what it removes)."""
        removed = set(self.hunk.removed)
        return _meaningful(line for line in self.hunk.old_lines if line not in removed)

    @cached_property
    def removed(self) -> list[str]:
        return [r for r in _meaningful(self.hunk.removed) if r not in set(self.added)]

    @cached_property
    def new_names(self) -> list[str]:
        """The names the hunk's added lines bring that its file in the base lacks."""
        base = self.target.base
        known = base.words.get(self.hunk.path, base.all_words)
        return [w for w in identifiers(self.hunk.added) if w not in known]


def added_lines_there(p: Place) -> str:
    """Every meaningful line the hunk adds is there, as many times more than the base had
    it as the hunk adds it more than it removes it (a `return 0;` the function had already
    is not the one the hunk adds; a line it moves into a new `if` is not one more), and the
    lines it removes are gone from around them (the same line may well stay elsewhere in
    the function)."""
    if not p.added or not all(a in p.here for a in p.added):
        return ""
    there, had = Counter(p.flat_lines), Counter(p.base_flat_lines)
    more = Counter(p.added)
    more.subtract(_meaningful(p.hunk.removed))  # a line it removes and adds again is no more
    if any(there[a] - had[a] < n for a, n in more.items() if n > 0):
        return ""
    wanted = set(p.added)
    at = [i for i, f in enumerate(p.flat_lines) if f in wanted]
    reach = len(p.hunk.old_lines) + 2
    near = set(p.flat_lines[max(min(at) - reach, 0):max(at) + reach + 1])
    return "" if any(r in near for r in p.removed) else f"all {len(p.added)} added lines are there"


def removed_lines_gone(p: Place) -> str:
    """A hunk that only removes lines: none of them is there any more, while the lines
    around them are (at least half of its meaningful context: where upstream rewrote the
    code around them too, their absence says nothing)."""
    if p.added or not p.removed or any(r in p.here for r in p.removed):
        return ""
    context = [c for c in p.context if c not in set(p.removed)]
    if context and 2 * sum(c in p.here for c in context) < len(context):
        return ""
    if any(_akin_count(r, p.flat_lines) > _akin_count(r, p.base_flat_lines, but=p.removed)
           for r in p.removed):
        return ""  # upstream changed the line (`trace(z)` is `trace(z, true)`): still there
    return f"the {len(p.removed)} lines it removes are gone"


def _akin_count(line: str, lines: list[str], but: Sequence[str] = ()) -> int:
    """How many of `lines` (other than `but`) are `line` changed a little: the same first
    word, and most of their text alike."""
    first = _IDENT.match(line)
    akin = 0
    for other in lines:
        if other == line or other in but or (first and not other.startswith(first.group())):
            continue
        if SequenceMatcher(None, line, other).ratio() >= _AKIN:
            akin += 1
    return akin


_AKIN = 0.8  # how alike a changed line is to what it was (`f(z);` and `f(z, true);` 0.85)


def new_names_there(p: Place) -> str:
    """Every name the hunk brings is there (used right there, in code, not in a comment; one
    it defines, defined anywhere in the target), and no line it removes is left."""
    if not p.new_names or any(r in p.here for r in p.removed):
        return ""
    code = uncommented("\n".join(p.lines))
    words = set(_IDENT.findall(code))
    defined = {w for w in p.new_names if _defines(w, p.hunk.added)}
    index = p.target.target.index
    if any(w not in words and not (w in defined and index.find(w)) for w in p.new_names):
        return ""
    values = set(_LITERAL.findall(code))
    if any(v not in values for v in _LITERAL.findall(uncommented("\n".join(p.hunk.added)))):
        return ""  # upstream has the names with values of its own (`return 5;`, not `7;`)
    return f"it has {', '.join(p.new_names[:4])}" + (" ..." if len(p.new_names) > 4 else "")


# a number or a string the added lines hold (a name upstream has may be set to another value)
_LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"|(?<![\w.])\d[\w.]*')


def there_under_upstreams_names(p: Place) -> str:
    """Every meaningful added line is there once the names the target lacks are read as
    the akin names upstream gained (`present_renamed`), and no line it removes is left."""
    if not p.new_names or any(r in p.here for r in p.removed):
        return ""
    return p.target.present_renamed(p.hunk, p.rel, p.span, p.removed)


@dataclass(frozen=True)
class PresenceRule:
    name: str
    holds: Callable[[Place], str]
    verbatim: bool  # reads the lines as they are (skipped where only names can tell)


# The one ordered table: the first rule that holds says why a failed hunk is upstream.
PRESENCE_RULES: tuple[PresenceRule, ...] = (
    PresenceRule("added lines there", added_lines_there, True),
    PresenceRule("removed lines gone", removed_lines_gone, True),
    PresenceRule("new names there", new_names_there, False),
    PresenceRule("there under upstream's names", there_under_upstreams_names, False),
)
