"""Regenerate tests/conformance/vectors.json from the Python reference writer (``python -m
tests.conformance.make_vectors``): the golden vectors both slot writers are checked against, the Python one by
tests/jobs/test_conformance_vectors.py, the JVM one by jvm/slot-writer's VectorsTest (run by its Maven build).

What they pin: transactional ids, ledger keys and partitions, the audit headers, the slot ledger record's JSON
bytes (and its decoding), the digest of given record hashes, ``decide_slot``'s table and poison records' dead
letters (``poison.too_large`` and ``poison.dead_letter``: headers, the value cut to the dead-letter topic's
limit, the reason cut to 4000 characters)."""
from __future__ import annotations

import itertools
import json
import sys
from dataclasses import asdict
from pathlib import Path

from types import SimpleNamespace

import numpy as np

from eos_job import audit, poison, protocol

PATH = Path(__file__).with_name("vectors.json")


def _record(r: protocol.SlotLedgerRecord | None) -> dict | None:
    return None if r is None else {**asdict(r), "digest": f"{r.digest:016x}"}


def vectors() -> dict:
    ids = [{"prefix": p, "generation": g, "slot": s, "transactional_id": protocol.transactional_id(p, g, s)}
           for p, g, s in [("eos-default-colors", 0, 0), ("eos-ns-a.b_c", 3, 17), ("x", 12, 255)]]
    keys = [{"stream_uid": u, "checkpoint_id": c, "generation": g, "slot": s,
             "slot_key": protocol.slot_key(u, c, g, s), "ledger_partition": protocol.ledger_partition(s),
             "epoch_key": protocol.epoch_key(u),
             "audit_headers": [[k, v.decode()] for k, v in audit.audit_headers(c, g, s, 41)]}
            for u, c, g, s in [("0b5e-uid", "4f1c2d3e-aaaa-bbbb", 0, 0), ("u", "short", 2, 9)]]
    records = []
    for r in [protocol.SlotLedgerRecord(0, 0, 0),
              protocol.SlotLedgerRecord(7, 200, 0xFFFF_FFFF_FFFF_FFFF, 3, "spec", "0123abcd0123abcd", "o1", 4),
              protocol.SlotLedgerRecord(2**40, 5, 0x00c8, 0, 'q"uote\\ü\n\x01', "", "", 0)]:
        records.append({"record": _record(r), "encoded": r.encode().decode()})
    digests = []
    for hashes in [[], [1, 2, 3], [-1, 1], [2**63 - 1, 2**63 - 1, -(2**63)], [-7046029254386353131, 42]]:
        digests.append({"hashes": hashes,
                        "digest": f"{protocol.digest_of_hashes(np.array(hashes, dtype=np.int64)):016x}"})
    decisions = []
    # Recorded: none, or batch 4/5/6 (before, the same, after), with or without input and output hash, of an older
    # or a newer epoch; asked: the same or another input or output, with or without epochs, a newer stream epoch.
    recorded = [None] + [protocol.SlotLedgerRecord(b, 10, 1, 0, "s", i, o, e)
                         for b, (i, o), e in itertools.product([4, 5, 6], [("in-a", "out-a"), ("", "")], [0, 3])]
    for rec, (inp, out), (ep, sep), slots in itertools.product(
            recorded, [("in-a", "out-a"), ("in-b", "out-a"), ("in-a", "out-b"), ("", "")],
            [(0, 0), (2, 0), (2, 3)], [False, True]):
        d = protocol.decide_slot(5, rec, input=inp, output_hash=out, epoch=ep, stream_epoch=sep, input_slots=slots)
        decisions.append({"batch": 5, "recorded": _record(rec), "input": inp, "output_hash": out, "epoch": ep,
                          "stream_epoch": sep, "input_slots": slots, "action": d.action.value})
    return {"transactional_ids": ids, "keys": keys, "records": records, "digests": digests,
            "decisions": decisions, "dead_letters": dead_letters()}


def dead_letters() -> list[dict]:
    """Poison records: the transformation's error (``why`` given), or over a topic's max.message.bytes by itself
    (``why`` null: ``poison.too_large`` says), and the dead letter each becomes."""
    cases = []
    value = bytes(range(256)) * 12   # 3072 bytes
    for topic, key, val, why, limits, slot in [
            ("out", b"k1", b"v" * 10, "bad color: 'orange'", {}, 3),
            ("routed", None, None, "", {}, 0),
            ("out", b"key", value, "x\u00fc" * 2500, {}, 1),                   # the reason cut to 4000 characters
            ("out", b"key", value, "cut", {"dlq": 2000}, 1),                    # the value cut to fit the topic
            ("out", b"key", value, None, {"out": 3000, "dlq": 1_000_000}, 2),   # over its topic's limit
            ("out", b"key", value, None, {"out": 4000}, 2)]:                    # fits: no dead letter
        cfg = SimpleNamespace(dead_letter_topic="dlq", checkpoint_id="4f1c2d3e-aaaa-bbbb", generation=2, batch=41,
                              topic_limits=limits, producer_config={})
        reason = why if why is not None else poison.too_large(topic, key, val, limits)
        case = {"topic": topic, "key": key.hex() if key is not None else None,
                "value": val.hex() if val is not None else None, "error": why, "topic_limits": limits, "slot": slot,
                "dead_letter_topic": cfg.dead_letter_topic, "checkpoint_id": cfg.checkpoint_id,
                "generation": cfg.generation, "batch": cfg.batch, "poison": reason, "dead_letter": None}
        if reason is not None:
            t, v, k, headers = poison.dead_letter(cfg, topic, key, val, reason, slot)
            case["dead_letter"] = {"topic": t, "key": k.hex() if k is not None else None,
                                   "value": v.hex() if v is not None else None,
                                   "headers": [[hk, hv.hex()] for hk, hv in headers]}
        cases.append(case)
    return cases


def render() -> str:
    """Indented, but one case of the decision table a line."""
    doc = vectors()
    cases = doc.pop("decisions")
    head = json.dumps(doc, indent=1, sort_keys=True)
    rows = ",\n".join("  " + json.dumps(c, sort_keys=True) for c in cases)
    return head[:-2] + ',\n "decisions": [\n' + rows + "\n ]\n}\n"


if __name__ == "__main__":
    PATH.write_text(render())
    print(f"wrote {PATH}", file=sys.stderr)
