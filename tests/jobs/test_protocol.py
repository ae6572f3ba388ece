"""Unit tests of the protocol's pure pieces: ledger decisions, digests, slot mapping, records."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eos_job import protocol
from eos_job.protocol import SlotAction, SlotCommit, SlotLedgerRecord, decide_slot


def rec(batch, count=3, digest=99):
    return SlotLedgerRecord(batch=batch, count=count, digest=digest)


@pytest.mark.parametrize("recorded,batch,action", [
    (None, 0, SlotAction.WRITE),          # first batch ever
    (rec(4), 5, SlotAction.WRITE),        # normal progress
    (rec(5), 5, SlotAction.SKIP),         # replay of a committed batch
    (rec(9), 5, SlotAction.SKIP),         # restored from an older snapshot: later batch already out
    (rec(0), 1, SlotAction.WRITE),
])
def test_decide_slot(recorded, batch, action):
    d = decide_slot(batch, recorded)
    assert d.action is action
    assert d.recorded == recorded


def test_transactional_id_and_keys_are_stable_and_distinct():
    assert protocol.transactional_id("eos-ns-s-1234", 2, 7) == "eos-ns-s-1234-2-7"
    keys = {protocol.slot_key("u", "c", g, s) for g in range(3) for s in range(4)}
    assert len(keys) == 12
    # A fresh checkpoint identity must never share keys with the old one.
    assert protocol.slot_key("u", "c1", 0, 0) != protocol.slot_key("u", "c2", 0, 0)
    assert protocol.batch_key("u", "c", 0) not in keys


def test_ledger_partitions_reserve_zero_for_the_driver():
    assert protocol.BATCH_PARTITION == 0
    assert [protocol.ledger_partition(s) for s in range(3)] == [1, 2, 3]
    assert protocol.ledger_partitions_needed(3) == 4


@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=200), st.randoms())
def test_digest_ignores_row_order(values, rnd):
    arr = np.array(values, dtype=np.int64)
    shuffled = arr.copy()
    rnd.shuffle(shuffled)
    assert protocol.digest_of_hashes(arr) == protocol.digest_of_hashes(shuffled)
    assert 0 <= protocol.digest_of_hashes(arr) < 2**64


def test_digest_sees_a_missing_or_duplicated_row():
    arr = np.array([11, 22, 33], dtype=np.int64)
    assert protocol.digest_of_hashes(arr) != protocol.digest_of_hashes(arr[:2])
    assert protocol.digest_of_hashes(arr) != protocol.digest_of_hashes(np.append(arr, 33))


@given(st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 2**64 - 1), st.integers(0, 1000))
def test_ledger_record_round_trip(batch, count, digest, dead):
    r = SlotLedgerRecord(batch, count, digest, dead, "abc")
    assert SlotLedgerRecord.decode(r.encode()) == r


def test_slot_commit_round_trip():
    c = SlotCommit(1, 5, 10, 2**64 - 1, True, 2, False, 3)
    assert SlotCommit.from_row(c.to_row()) == c


def test_check_batch_commits_requires_one_commit_per_slot():
    ok = [SlotCommit(s, 4, 1, 1, False) for s in range(3)]
    protocol.check_batch_commits(4, [0, 1, 2], ok)
    with pytest.raises(RuntimeError, match="one commit per slot"):
        protocol.check_batch_commits(4, [0, 1, 2], ok[:2])
    with pytest.raises(RuntimeError, match="other batches"):
        protocol.check_batch_commits(4, [0, 1, 2], ok[:2] + [SlotCommit(2, 3, 1, 1, False)])
