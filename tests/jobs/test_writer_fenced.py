"""The driver's partition-0 writer fenced: the reason it stops with names a newer epoch only when one was taken
(a driver on a lost node is fenced by the replacement's resolution before the new driver takes its epoch)."""
from __future__ import annotations

import pytest

from eos_job import epoch
from eos_job.contract import DriverSuperseded
from eos_job.writer import BatchWriter

pytestmark = pytest.mark.unit


def fenced_writer(monkeypatch, newest: int) -> BatchWriter:
    w = BatchWriter.__new__(BatchWriter)      # no spec or broker: only what _write_ledger reads
    w._watch, w._producer, w.sec = None, object(), {}
    w.base = dict(bootstrap="b:9092", ledger_topic="ledger", stream_uid="uid", epoch=3)

    def fenced(*_a, **_kw):
        raise DriverSuperseded("this driver's ledger writer was fenced (_FENCED)")
    monkeypatch.setattr(epoch, "write_driver_record", fenced)
    monkeypatch.setattr(epoch, "newest_epoch", lambda *_a: newest)
    return w


@pytest.mark.parametrize("newest, says", [
    (4, "a newer driver (epoch 4) runs this stream; this one (epoch 3) stops"),
    (3, "a newer driver of this stream is starting (its resolution fenced this driver's writer; no epoch above "
        "this one's, 3, yet)"),
])
def test_the_reason_names_a_newer_epoch_only_when_one_was_taken(monkeypatch, newest, says):
    with pytest.raises(DriverSuperseded) as seen:
        fenced_writer(monkeypatch, newest)._write_ledger("k", b"v")
    assert says in str(seen.value) and "ledger writer was fenced" in str(seen.value)
