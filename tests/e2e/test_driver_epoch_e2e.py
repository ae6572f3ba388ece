"""Two drivers on one checkpoint lineage at once: the older one stops, the output stays exact.

Driver A runs the unique-id stream while events trickle in. Driver B starts from a live snapshot of A's
checkpoint (same stream, same checkpoint identity), as a driver on an unreachable node and its replacement
would, or a second driver started by hand. B takes the next epoch and stamps it on every slot; A's next slot
task reads the stamp after its own fence and stops for good (reason Superseded) instead of fencing B again.
B re-runs what A committed after the snapshot with A's input, and the unique-id audit finds every id once."""
from __future__ import annotations

import json
import re
import threading

import pytest
import yaml

from eos_stack.cluster import wait_until
from examples.colors.generator import expected_ids, produce
from tests.e2e.streams import assert_ids_exact, run_config, run_job, wait_consumed

pytestmark = pytest.mark.stack


def _trickle(run, stop: threading.Event, sent: list[tuple[int, int, int]]) -> None:
    next_id, seed = 10_000, 300
    while not stop.is_set():
        seed += 1
        produce(run.bootstrap, run.events, 30, seed=seed, start_id=next_id)
        sent.append((30, seed, next_id))
        next_id += 30
        stop.wait(0.3)


def test_a_second_driver_supersedes_the_first_which_stops_without_fencing_back(colors_run, tmp_path):
    a = colors_run(module="examples.colors.ids", max_offsets_per_trigger=None, work_dir=tmp_path / "a")
    a.setup()
    produce(a.bootstrap, a.events, 200, seed=3)
    sent = [(200, 3, 0)]
    cfg = run_config(a)
    a.start()
    stop = threading.Event()
    feeder = threading.Thread(target=_trickle, args=(a, stop, sent), daemon=True)
    feeder.start()
    try:
        a.wait_for_batches(2)
        snap = tmp_path / "snapshot"
        r = run_job(["snapshot", "take", "--checkpoint", str(a.live_checkpoint), "--dest", str(snap),
                     "--stream-json", json.dumps(cfg.stream.wire()), "--spec-hash", cfg.spec.spec_hash()])
        assert r.returncode == 0, r.stderr[-3000:]
        a.wait_for_batches(2)

        b = colors_run(module="examples.colors.ids", max_offsets_per_trigger=None, run_id=a.run_id,
                       work_dir=tmp_path / "b")
        restored = tmp_path / "b" / "restored"
        doc = cfg.model_copy(update={"checkpoint_dir": str(restored), "restore_from": str(snap)})
        b.config_path.write_text(yaml.safe_dump(doc.model_dump(by_alias=True, mode="json")))
        b.start()
        # A keeps getting input, so it keeps trying to write: it must stop by itself, superseded.
        wait_until(lambda: a.proc.poll() is not None, "driver A to stop once driver B started", 240, a.log_tail)
        summary = json.loads((a.workdir / "termination.json").read_text())
        assert summary["reason"] == "Superseded", summary
        assert "newer driver (epoch" in summary["error"], summary
        assert b.proc.poll() is None, b.log_tail(60)
        wait_until(lambda: "batch" in b.log_path.read_text() and "committed:" in b.log_path.read_text(),
                   "driver B to commit batches", 120, b.log_tail)
    finally:
        stop.set()
        feeder.join(30)
    wait_consumed(b, restored)
    assert b.stop() == 0, b.log_tail()
    epoch_a, epoch_b = (int(re.findall(r"driver epoch (\d+)\b", r.log_path.read_text())[0]) for r in (a, b))
    assert epoch_b > epoch_a, (epoch_a, epoch_b)
    expected = set().union(*(expected_ids(n, seed, start) for n, seed, start in sent))
    assert_ids_exact(b, expected)
