"""The three status vocabularies are types, not loose strings: what the patch engine says of
a hunk (hunks.Landed), how a hunk fares on a target (drift's Drift), and what became of a
patch in a rebase (rebase's Verdict). Each is written as its plain value (reports, JSON) and
read back as its type; an unknown value is an error that lists the choices."""

from __future__ import annotations

import json

import pytest

from portkit.drift import model as dm
from portkit.follow.text import Settled, merge
from portkit.hunks import Landed
from portkit.rebase import report as rr


@pytest.mark.parametrize("kind, values", [
    (Landed, ["clean", "offset", "fuzz", "already-applied", "failed"]),
    (dm.Drift, ["clean", "offset", "fuzz", "relocated", "conflict", "already-applied",
                "present-upstream"]),
    (rr.Verdict, ["unchanged", "merged", "relocated", "dropped", "needs-human",
                  "needs-review"]),
    (Settled, ["beside", "same-point", "already", "deleted", "edited", "apart", "words",
               "layout", "count"]),
])
def test_each_vocabulary_is_one_type_in_its_documented_order(kind, values):
    assert [member.value for member in kind] == values
    assert all(json.dumps(member) == json.dumps(member.value) for member in kind)


def test_a_hunk_read_from_json_has_its_status_as_a_type():
    hunk = dm.HunkDrift("src/a.cpp", 3, "conflict", "context changed", 7)  # as JSON gives it
    assert hunk.status is dm.Drift.CONFLICT
    with pytest.raises(ValueError, match="clean, offset, fuzz"):
        dm.HunkDrift("src/a.cpp", 3, "broken", "?", 7)


def test_a_rebased_patch_has_its_verdict_as_a_type():
    row = rr.RebasedPatch("0001-a.patch", "a", "needs-review", "why", "0001-a.patch")
    assert row.status is rr.Verdict.NEEDS_REVIEW
    with pytest.raises(ValueError, match="unchanged, merged"):
        rr.RebasedPatch("0001-a.patch", "a", "fine", "why", None)


def test_the_line_merge_says_how_it_settled_a_block_as_a_type():
    base = b"".join(b"line %d\n" % i for i in range(1, 9))
    ours = base.replace(b"line 4\n", b"line 4\nupstream\n")
    theirs = base.replace(b"line 4\n", b"line 4\npatch\n")
    assert merge(ours, base, theirs).settled == (Settled.SAME_POINT,)
