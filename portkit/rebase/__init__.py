"""Rebase: carry a patch series onto a newer tree, patch by patch, and say what is left.

Each patch goes, in order, onto the target as the patches carried before it left it (a
working copy of the files they touch; the base gets the whole series the same way). Drift
(portkit.drift) says how each hunk fares there; the engine (portkit.hunks, GNU patch), git
apply and git's 3-way merge make the bytes, one hunk at a time. A patch is

  unchanged     every hunk applies as it is, at most some lines away, inside what its
                function became: the same change, its diff made again on the target;
  merged        `git merge-file` of the target's file, the base file as the earlier patches
                left it, and the same with the hunk, is clean: context that changed around
                it, or a hunk the target already has verbatim (carried without it);
  relocated     a hunk went where drift followed its code (renamed, moved, another file),
                re-expressed in the target's names;
  dropped       the target has the change already (drift's present-upstream or
                already-applied: where is said);
  needs-human   nothing safe: the patch is left out of the series, and the side file
                needs-human/<patch>.conflict holds both sides, the nearest match and why;
  needs-review  carried, but a reviewer must look: a symbol its added code uses changed
                (drift's semantic check), a hunk landed only by ignoring context (fuzz) or
                by a guess, a hunk was left out as upstream's in another form, it uses a name
                that a patch left out brings, or (--compile) it does not compile.

GNU patch's word is never taken alone: it misplaces hunks, with fuzz and without (the same
context twice). A hunk that needs fuzz is merged 3-way when the base file is known, else
carried for review; one whose context is found whole must land in what its function
became.

The carried series keeps every patch's mail (From, Date, Subject, body), file name and the
series' conventions (portkit.series); its diffs are git's (`git diff --no-index`, sealed from
the user's configuration), with `index` lines and function headings where the series has
them. Nothing is written until the whole series has been carried, and then all at once.

In an ollama-style fork, `plan_fork` and `move_fork` move the fork itself: its vendored
files refreshed from the target under its rsync rules, its pin, its series; one transaction.

The modules: report (statuses and the report), carry (one patch), run (the series),
move (the fork move), compile (--compile).
"""

from portkit.fork import FILTER, Rule, deleted, read_filter, sent
from portkit.rebase.compile import CompileError, compile_check, compile_errors
from portkit.rebase.move import ForkMove, fork_state, move_fork, plan_fork, refuse_self_target
from portkit.rebase.report import (
    ATTENTION,
    ATTENTION_EXIT,
    CONFLICTS,
    DROPPED,
    FORMATS,
    MERGED,
    NEEDS_HUMAN,
    NEEDS_REVIEW,
    RELOCATED,
    SCHEMA,
    STATUSES,
    UNCHANGED,
    Rebased,
    RebasedPatch,
    RebaseReport,
    render,
)
from portkit.rebase.run import base_spec, check_out, rebase, write_rebased

__all__ = ["ATTENTION", "ATTENTION_EXIT", "CONFLICTS", "DROPPED", "FILTER", "FORMATS", "MERGED",
           "NEEDS_HUMAN", "NEEDS_REVIEW", "RELOCATED", "SCHEMA", "STATUSES", "UNCHANGED",
           "CompileError", "ForkMove", "Rebased", "RebasedPatch", "RebaseReport", "Rule",
           "base_spec", "compile_check", "compile_errors", "deleted", "fork_state",
           "move_fork", "plan_fork", "read_filter", "rebase", "refuse_self_target", "render",
           "check_out", "sent", "write_rebased"]
