"""The golden vectors (tests/conformance/vectors.json) are what the Python reference answers today: a change of
the protocol's encodings or decisions fails here until the file is regenerated (``python -m
tests.conformance.make_vectors``), and then the JVM writer's VectorsTest fails until it follows."""
from __future__ import annotations

import json

import pytest

from eos_job import protocol
from tests.conformance import make_vectors

pytestmark = pytest.mark.unit


def test_the_committed_vectors_are_the_python_references_answers():
    assert json.loads(make_vectors.PATH.read_text()) == make_vectors.vectors()
    assert make_vectors.PATH.read_text() == make_vectors.render()


def test_the_vectors_cover_every_slot_action_and_decode_back():
    doc = json.loads(make_vectors.PATH.read_text())
    assert {d["action"] for d in doc["decisions"]} == {a.value for a in protocol.SlotAction}
    for r in doc["records"]:
        rec = protocol.SlotLedgerRecord.decode(r["encoded"].encode())
        assert {**r["record"], "digest": int(r["record"]["digest"], 16)} == rec.__dict__


def test_a_drifted_record_encoding_is_caught(monkeypatch):
    """The check above can fail: the same comparison against a reference whose record JSON changed."""
    monkeypatch.setattr(protocol.SlotLedgerRecord, "encode",
                        lambda self: json.dumps({"batch": self.batch}).encode())
    assert json.loads(make_vectors.PATH.read_text()) != make_vectors.vectors()
