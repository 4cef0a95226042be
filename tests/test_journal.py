"""The transaction journal as input (portkit/transaction.py): what a transaction wrote reads
back, whatever ids the files it saved have; what no system has is a bad journal."""

from __future__ import annotations

from pathlib import Path

import pytest

from portkit.errors import RecordError
from portkit.transaction import Journal, _Original


def _journal(owner: tuple[int, int], pid: int = 4242) -> Journal:
    return Journal("apply of x", pid, [_Original("src/a.cpp", b"int a;\n", 0o644, owner,
                                                 None)], [], [])


@pytest.mark.parametrize("owner", [(0, 0), (65534, 65534), (3000000000, 3000000000),
                                   (4294967294, 4294967294)])
def test_a_journal_of_any_real_owner_reads_back(owner):
    """uids and gids are unsigned 32-bit (nfsnobody 4294967294, directory services' large
    ids): the journal of a file they own must be read, or the tree could not be recovered."""
    back = Journal.parse(_journal(owner).to_json(), Path(".journal"))
    assert back.files[0].owner == owner and back.pid == 4242


@pytest.mark.parametrize("owner, pid", [((2 ** 32, 0), 1), ((-1, 0), 1), ((0, 0), 2 ** 31)])
def test_ids_no_system_has_are_a_bad_journal(owner, pid):
    with pytest.raises(RecordError, match="bad journal .*not an id"):
        Journal.parse(_journal(owner, pid).to_json(), Path(".journal"))
