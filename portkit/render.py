"""Stage 4, render: a feature's fragments at the tree's resolved anchors -> a git-am series.

Every edit is placed at an offset of the *original* file (where its anchor resolved); the
patches are the differences between successive states (original + edits of patches 1..k),
so each applies on top of the previous one, in order.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from portkit.anchors import Resolution
from portkit.errors import AnchorError, SpecError
from portkit.features import Feature, Resolved, feature_dir, resolve_feature
from portkit.index import Index, flat
from portkit.manifest import Condition, EditSpec, Manifest, PatchSpec, load_manifest
from portkit.series import (
    PORTKIT,
    Conventions,
    MailPatch,
    Series,
    git_diff,
    new_patch,
    unified_diff,
)
from portkit.tree import Tree

PRESENT, NOT_APPLICABLE, RENDERED = "present upstream", "not applicable", "rendered"


@dataclass(frozen=True)
class Splice:
    """Replace bytes start..end of the original file by text (end -1: insert at start)."""

    file: str
    start: int
    end: int
    text: str
    order: tuple[int, int]


_BLANK_EDGES = re.compile(r"\A(?:[ \t]*\n)+|(?:\n[ \t]*)+\Z")


def _above_comments(src: bytes, start: int) -> int:
    """Start of the line of `start`, moved up over the comment block (and the blank lines
    between) that introduces it, so that a section header stays with what it heads."""
    lines = src[: src.rfind(b"\n", 0, start) + 1].splitlines(keepends=True)
    offset = sum(len(ln) for ln in lines)
    best = offset
    for line in reversed(lines):
        stripped = line.strip()
        if stripped and not stripped.startswith(b"//"):
            break
        offset -= len(line)
        if stripped:
            best = offset
    return best


@dataclass
class PatchOutcome:
    number: int  # position in the manifest
    spec: PatchSpec
    status: str
    reason: str = ""
    mail: MailPatch | None = None
    skipped_edits: list[str] = field(default_factory=list)
    changes: list[tuple[str, bytes, bytes]] = field(default_factory=list)  # (file, before, after)


@dataclass
class Rendered:
    tree: Tree
    manifest: Manifest
    outcomes: list[PatchOutcome]
    variables: dict[str, str]
    resolutions: dict[str, Resolution]

    @property
    def patches(self) -> list[PatchOutcome]:
        return [o for o in self.outcomes if o.mail is not None]

    @property
    def present_upstream(self) -> bool:
        return not self.patches and any(o.status == PRESENT for o in self.outcomes)

    def series(self, conventions: Conventions = PORTKIT, first_number: int | None = None
               ) -> Series:
        """The rendered patches as a series written the way `conventions` say (portkit's own
        by default; a fork's, to add them to its series), numbered from `first_number` (the
        conventions' next number by default)."""
        first = conventions.next_number if first_number is None else first_number
        total = len(self.patches)
        patches = []
        for i, o in enumerate(self.patches):
            assert o.mail is not None
            diff = o.mail.diff if conventions.style == "portkit" else git_diff(
                {rel: before for rel, before, _ in o.changes},
                {rel: after for rel, _, after in o.changes}, abbrev=conventions.abbrev)
            patches.append(new_patch(conventions, subject=o.spec.subject, body=o.mail.body,
                                     author=o.mail.author, date=o.mail.date, diff=diff,
                                     number=first + i, total=total))
        return Series(Path(), "format-patch", tuple(patches), conventions)

    def mails(self, first_number: int = 1) -> list[tuple[str, str]]:
        """(file name, text) of each rendered patch in portkit's own conventions."""
        return [(p.name, p.text) for p in self.series(PORTKIT, first_number).patches]

    def files(self) -> list[str]:
        return sorted({f for o in self.patches if o.mail for f in o.mail.files()})


class _Renderer:
    def __init__(self, tree: Tree, manifest: Manifest, index: Index,
                 resolutions: dict[str, Resolution]) -> None:
        self.tree = tree
        self.manifest = manifest
        self.index = index
        self.res = resolutions
        import jinja2  # only where a feature is rendered (drift and rebase never do)

        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(manifest.folder / "fragments"),
            undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)

    def resolution(self, anchor_id: str) -> Resolution:
        if anchor_id not in self.res:
            raise SpecError(f"{self.manifest.feature}: the manifest names an unknown anchor "
                               f"{anchor_id}")
        res = self.res[anchor_id]
        if res.status == "error":
            raise AnchorError(res.note)
        return res

    def variables(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, choices in self.manifest.variables.items():
            for choice in choices:
                if choice.anchor is None:
                    out[name] = choice.value
                    break
                res = self.resolution(choice.anchor)
                if res.found and res.symbol and (choice.kind in (None, res.symbol.kind)):
                    out[name] = choice.value.replace("{name}", res.symbol.name)
                    break
            else:
                raise AnchorError(f"{self.manifest.feature}: no value of {name} fits this tree")
        return out

    def holds(self, cond: Condition) -> bool:
        res = self.res.get(cond.anchor)
        if res is None or not res.found or res.symbol is None:
            return False
        members = {m.name for m in self.index.members(res.symbol)}
        if cond.has is not None and cond.has not in members:
            return False
        return cond.contains is None or flat(cond.contains) in flat(self.index.text(res.symbol))

    def splice(self, edit: EditSpec, order: tuple[int, int], variables: dict[str, str]) -> Splice:
        res = self.resolution(edit.anchor)
        sym = res.symbol
        assert sym is not None
        src = self.index.source(sym.file)
        context = {**variables, **edit.vars}
        if edit.replace is not None:
            point = res.point(edit.where)
            statement = src[point.start : point.end].decode("utf-8")
            old = self.env.from_string(edit.replace["old"]).render(context)
            new = self.env.from_string(edit.replace["new"]).render(context)
            if statement.count(old) != 1:
                first = statement.splitlines()[0].strip()
                raise AnchorError(f"anchor {edit.anchor}.{edit.where}: expected {old!r} once in "
                                  f"{first!r} ({sym.file}:{point.line})")
            at = point.start + len(statement[: statement.index(old)].encode())
            return Splice(sym.file, at, at + len(old.encode()), new, order)
        text = (self.env.get_template(edit.fragment).render(context) if edit.fragment
                else self.env.from_string(edit.text or "").render(context))
        # One blank line separates an inserted block from the code it goes before or after,
        # whatever blank lines the fragment itself starts or ends with.
        block = _BLANK_EDGES.sub("", text)
        if edit.where == "before-symbol":
            return Splice(sym.file, _above_comments(src, sym.start_byte), -1, block + "\n\n",
                          order)
        if edit.where == "after-symbol":
            end = src.find(b"\n", sym.end_byte)
            offset = len(src) if end < 0 else end + 1
            return Splice(sym.file, offset, -1, "\n" + block + "\n", order)
        point = res.point(edit.where)
        spec = next(p for p in res.spec.points if p.name == edit.where)
        if spec.after_param is not None:  # a parameter line: take the indentation of its line
            line_start = src.rindex(b"\n", 0, point.start) + 1
            text = src[line_start : point.start].decode() + text.strip() + "\n"
        elif spec.before is not None:
            text = block + "\n\n"
        else:
            text = "\n" + block + "\n"
        return Splice(sym.file, point.offset, -1, text, order)

    def render(self) -> Rendered:
        variables: dict[str, str] = {}
        outcomes: list[PatchOutcome] = []
        splices: dict[int, list[Splice]] = {}
        for number, spec in enumerate(self.manifest.patches):
            if spec.present_when and all(self.holds(c) for c in spec.present_when):
                outcomes.append(PatchOutcome(number, spec, PRESENT, "already in this tree"))
                continue
            if spec.requires and not self.resolution(spec.requires).found:
                outcomes.append(PatchOutcome(number, spec, NOT_APPLICABLE,
                                             self.resolution(spec.requires).note))
                continue
            if not variables:
                variables = self.variables()
            outcome = PatchOutcome(number, spec, RENDERED)
            splices[number] = []
            for i, edit in enumerate(spec.edits):
                res = self.resolution(edit.anchor)
                if not res.found:
                    outcome.skipped_edits.append(f"{edit.anchor}: {res.note}")
                    continue
                splices[number].append(self.splice(edit, (number, i), variables))
            outcomes.append(outcome)
        self._diffs(outcomes, splices)
        return Rendered(self.tree, self.manifest, outcomes, variables, self.res)

    def _diffs(self, outcomes: list[PatchOutcome], splices: dict[int, list[Splice]]) -> None:
        applied: dict[str, list[Splice]] = defaultdict(list)
        for outcome in outcomes:
            number = outcome.number
            if not splices.get(number):
                continue
            diff = []
            touched = sorted({s.file for s in splices[number]})
            for rel in touched:
                before = self._state(rel, applied[rel])
                applied[rel] += [s for s in splices[number] if s.file == rel]
                after = self._state(rel, applied[rel])
                diff.append(unified_diff(rel, before, after))
                outcome.changes.append((rel, before, after))
            outcome.mail = MailPatch(outcome.spec.subject, self._body(outcome.spec), "".join(diff),
                                     self.manifest.author, self.manifest.date)

    def _state(self, rel: str, splices: list[Splice]) -> bytes:
        src = self.index.source(rel)
        out, cursor = [], 0
        for s in sorted(splices, key=lambda s: (s.start, s.order)):
            if s.start < cursor:
                raise SpecError(f"{rel}: two edits overlap at byte {s.start}")
            out += [src[cursor : s.start], s.text.encode()]
            cursor = s.start if s.end < 0 else s.end
        out.append(src[cursor:])
        return b"".join(out)

    def _body(self, spec: PatchSpec) -> str:
        pin = self.tree.pin[:12] if self.tree.pin else "an unknown commit"
        return (f"{spec.body}\n\n"
                f"Part of the port of {self.manifest.upstream}.\n"
                f"Rendered by portkit from templates/{self.manifest.feature} for llama.cpp {pin} "
                f"({self.tree.layout} tree).")


def render(tree: Tree, feature: str, templates: Path | None = None) -> Rendered:
    """Resolve the feature's anchors in `tree` and render its patch series."""
    manifest = load_manifest(feature_dir(feature, templates))
    index, resolutions = resolve_feature(tree, feature, templates)
    return _Renderer(tree, manifest, index, resolutions).render()


def upstream_patches(feature: Feature, resolved: Resolved) -> dict[str, str]:
    """The feature's patches that the resolved tree has upstream already (by their
    manifest's `present_when`): subject -> what says so."""
    renderer = _Renderer(resolved.tree, feature.manifest, resolved.index, resolved.anchors)
    found = {}
    for spec in feature.manifest.patches:
        if spec.present_when and all(renderer.holds(c) for c in spec.present_when):
            found[spec.subject] = "; ".join(
                f"{c.anchor} " + (f"has {c.has}" if c.has else f"contains {c.contains!r}")
                for c in spec.present_when)
    return found


def write_series(rendered: Rendered, out: Path, first_number: int = 1) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return rendered.series(PORTKIT, first_number).write(out)
