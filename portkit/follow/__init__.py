"""Follow a hunk from base to target: the one engine `drift` and `rebase` both consume.

Text first, structure only where text fails (mergiraf's order):

  text       the line merge: git merge-file, and the conflicts whose order the text gives
             (portkit.follow.text); GNU patch's placement of each hunk, in series order
             (sequence); the patch's lines in the columns upstream respaced the lines
             beside them into (columns);
  sides      the base and the target as the engine reads them (sides), their words
             (words), and where a file went by git's rename rule (renames);
  target     a hunk that text does not place, followed into the target: located, relocated
             in the target's names (relocate), written where upstream moved and renamed
             its code, in upstream's words (translate), found there already by one of the ordered
             presence rules (presence), or its nearest match (where its lines went: in its
             function, its file, the file its code or its file went to); semantic drift
             (target);
  session    the engine one patch at a time for rebase (session).
"""

from portkit.follow.sequence import FUZZ_LIMIT
from portkit.follow.session import Follow, follow
from portkit.follow.sides import DriftInput, Side, feature_of, reversed_base, tree_view
from portkit.follow.words import identifiers

__all__ = ["FUZZ_LIMIT", "DriftInput", "Follow", "Side", "feature_of", "follow", "identifiers",
           "reversed_base", "tree_view"]
