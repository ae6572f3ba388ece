"""Unit tests of the sink audit's pure pieces (eos_job.audit): headers, Spark's record hash, the comparison."""
import pytest

from eos_job import audit, protocol
from eos_job.protocol import SlotLedgerRecord

CKPT = "31f1441a-bdbe-4aee-bd90-3749c06add94"


def test_record_hash_is_sparks_xxhash64():
    # Values printed by Spark 4.2: SELECT xxhash64(cast('k1' as binary), cast('v1' as binary)), the same with a null
    # key, and with a topic and an array of (key, value) header structs (the runtime's HASH_COL, eos_job.contract).
    assert audit.record_hash(b"k1", b"v1") == -3489271716380212840
    assert audit.record_hash(None, b"v1") == -7208182780577998065
    assert audit.record_hash(b"k1", b"v1", "out", [("h", b"x")]) == -6833372296071893246


def test_headers_name_the_slot_run_and_batch_and_round_trip():
    hdrs = audit.audit_headers(CKPT, 2, 3, 17)
    assert hdrs == [("eos.batch", b"17"), ("eos.slot", b"31f1441a/2/3")]
    assert audit.group_of([("user", b"x"), *hdrs]) == ("31f1441a/2", 3, 17)
    assert audit.group_of([("user", b"x")]) is None and audit.group_of(None) is None
    assert audit.group_of([("eos.batch", b"x"), ("eos.slot", b"a/0/1")]) is None
    # The user's headers are hashed, ours are not: they were added after Spark computed the hash.
    assert audit.user_headers([("user", b"x"), *hdrs]) == [("user", b"x")]


def test_ledger_keys_map_to_groups_and_other_records_do_not():
    r = SlotLedgerRecord(batch=4, count=2, digest=1)
    assert audit.ledger_group(f"ns/name/{CKPT}/1/0", r) == ("31f1441a/1", 0, 4)
    assert audit.ledger_group(f"ns/name/{CKPT}/batch", r) is None
    assert audit.ledger_group(f"ns/name/{CKPT}/input/4", r) is None


def _seen(*records, topic="out"):
    s = audit.Seen()
    for i, (k, v) in enumerate(records):
        s.add(topic, 0, i, k, v, None)
    return s


def _ledger(records, batch=0, **kw):
    digest = protocol.combine_digests(*[audit.record_hash(k, v) for k, v in records])
    return SlotLedgerRecord(batch=batch, count=len(records), digest=digest, **kw)


RECS = [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
G = ("31f1441a/0", 1, 0)


def test_the_sink_holding_each_committed_slot_once_is_exact():
    result = audit.compare({G: _seen(*RECS)}, {G: _ledger(RECS)})
    assert result.exact and (result.slots_checked, result.digests_checked, result.records) == (1, 1, 3)
    assert result.summary().startswith("exactly once: 1 slot batch(es)")


def test_a_topic_column_naming_the_record_s_topic_matches_too():
    digest = protocol.combine_digests(*[audit.record_hash(k, v, "out") for k, v in RECS])
    rec = SlotLedgerRecord(batch=0, count=3, digest=digest)
    assert audit.compare({G: _seen(*RECS)}, {G: rec}).exact


@pytest.mark.parametrize("held,kind", [
    (RECS[:2], "missing"),                    # a lost record
    (RECS + RECS, "extra"),                   # the slot written twice
    ([RECS[0], RECS[1], RECS[1]], "digest"),  # one lost, one doubled: the count hides it, the digest does not
    ([], "missing"),                          # the whole slot lost
])
def test_loss_and_duplicates_are_named_with_batch_slot_and_offsets(held, kind):
    seen = {G: _seen(*held)} if held else {}
    result = audit.compare(seen, {G: _ledger(RECS)})
    assert [f.kind for f in result.findings] == [kind]
    f = result.findings[0]
    assert (f.batch, f.slot, f.committed, f.found) == (0, 1, 3, len(held))
    text = f.describe()
    assert "batch 0 slot 1" in text and (not held or f"out[0] offsets 0..{len(held) - 1}" in text)
    if kind == "extra":
        assert "doubled" in text


def test_dead_letters_count_but_leave_the_digest_unchecked():
    seen = {G: _seen(*RECS[:2])}
    seen[G].dead_letters = 1
    result = audit.compare(seen, {G: _ledger(RECS, dead_letters=1)})
    assert result.exact and result.digests_checked == 0 and result.slots_checked == 1


def test_from_batch_and_records_whose_ledger_record_is_gone():
    old = ("31f1441a/0", 1, 0)
    new = ("31f1441a/0", 1, 5)
    result = audit.compare({old: _seen(*RECS), new: _seen(*RECS)}, {new: _ledger(RECS, batch=5)}, unlabelled=2)
    assert result.exact and result.slots_checked == 1 and result.unrecorded == 3 and result.unlabelled == 2
    assert "3 record(s) whose ledger record is compacted away not checked" in result.summary()
    assert audit.compare({}, {old: _ledger(RECS)}, from_batch=1).slots_checked == 0
