"""Writers started at once on one tree: one works at a time, the others wait (or give up
naming the holder), and every exit status tells the truth about the tree they leave."""

from __future__ import annotations

import pytest

from .harness import APPLY, REVERSE, environ, race, reset


@pytest.mark.parametrize(("commands", "start", "trials"), [
    ([APPLY, APPLY], "before", 3),
    ([REVERSE, REVERSE], "after", 2),
    ([APPLY, REVERSE, APPLY, REVERSE], "before", 2),
    ([APPLY] * 4, "before", 1),
])
def test_racing_writers_tell_the_truth(trees, tree, commands, start, trials):
    for _ in range(trials):
        reset(tree, trees.before if start == "before" else trees.after)
        result = race(tree, commands, trees.states, start)
        assert result.truthful, result.why
        assert result.state in ("before", "after")


def test_writers_that_will_not_wait_give_up_naming_the_holder(trees, tree):
    reset(tree, trees.before)
    result = race(tree, [APPLY] * 4, trees.states, "before",
                  env=environ(PORTKIT_LOCK_WAIT="0"))
    assert result.truthful, result.why
    assert result.state == "after"
    codes = sorted(r.returncode for r in result.runs)
    assert codes[0] == 0 and set(codes) <= {0, 7}
