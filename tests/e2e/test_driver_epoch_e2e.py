"""Two drivers on one checkpoint lineage at once: the older one stops, the output stays exact; and the
fence's negative control.

Driver A runs the unique-id stream while events trickle in, and holds the transactions of a batch open (a
driver on an unreachable node, stalled mid-commit). Driver B starts from a live snapshot of A's checkpoint
(same stream, same checkpoint identity), as A's replacement would, or a second driver started by hand. B
takes the next epoch and stamps it on every slot (fence, read, write): the fence aborts A's open
transactions. B re-runs the batch A was writing with A's input and commits it; then A's held transactions
try to commit. With the fence they fail, A fences again, reads B's stamp and stops for good (reason
Superseded) instead of fencing B back; every id is in the output once. Without the fence
(``EOS_UNSAFE_DISABLE=fence``: every producer its own transactional id) A's stale transactions commit on top
of B's, and the unique-id verifier reports the duplicates."""
from __future__ import annotations

import json
import re
import threading

import pytest
import yaml

from eos_job.verify import audit_ids
from eos_stack.cluster import wait_until
from examples.colors.generator import expected_ids, produce
from tests.e2e.job_runs import assert_ids_exact, run_config, run_job, wait_consumed

pytestmark = pytest.mark.stack


def _trickle(run, stop: threading.Event, sent: list[tuple[int, int, int]]) -> None:
    next_id, seed = 10_000, 300
    while not stop.is_set():
        seed += 1
        produce(run.bootstrap, run.events, 30, seed=seed, start_id=next_id)
        sent.append((30, seed, next_id))
        next_id += 30
        stop.wait(0.3)


@pytest.mark.parametrize("fence", ["on", "off"])
def test_a_second_driver_supersedes_the_first_which_stops_without_fencing_back(colors_run, tmp_path, fence):
    unsafe = {"EOS_UNSAFE_DISABLE": "fence"} if fence == "off" else {}
    journal, release = tmp_path / "faults.journal", tmp_path / "release"
    a = colors_run(module="examples.colors.ids", max_offsets_per_trigger=None, work_dir=tmp_path / "a",
                   transaction_timeout_ms=300_000,
                   extra_env={"EOS_FAULT_HOLD_OPEN": "240", "EOS_FAULT_HOLD_RELEASE": str(release),
                              "EOS_FAULT_FROM_BATCH": "2", "EOS_FAULT_JOURNAL": str(journal), **unsafe})
    a.setup()
    produce(a.bootstrap, a.events, 200, seed=3)
    sent = [(200, 3, 0)]
    cfg = run_config(a)
    a.start()
    stop = threading.Event()
    feeder = threading.Thread(target=_trickle, args=(a, stop, sent), daemon=True)
    feeder.start()
    try:
        # A committed batches 0 and 1 and holds batch 2's slot transactions open.
        wait_until(lambda: journal.exists() and "holding the transaction" in journal.read_text(),
                   "driver A to hold batch 2 open", 240, a.log_tail)
        held = sorted(set(re.findall(r"holding the transaction of slot \d+ batch (\d+)", journal.read_text())))
        assert held == ["2"], held
        snap = tmp_path / "snapshot"
        r = run_job(["snapshot", "take", "--checkpoint", str(a.live_checkpoint), "--dest", str(snap),
                     "--stream-json", json.dumps(cfg.stream.wire()), "--spec-hash", cfg.spec.spec_hash()])
        assert r.returncode == 0, r.stderr[-3000:]

        b = colors_run(module="examples.colors.ids", max_offsets_per_trigger=None, run_id=a.run_id,
                       work_dir=tmp_path / "b", extra_env=unsafe)
        restored = tmp_path / "b" / "restored"
        doc = cfg.model_copy(update={"checkpoint_dir": str(restored), "restore_from": str(snap)})
        b.config_path.write_text(yaml.safe_dump(doc.model_dump(by_alias=True, mode="json")))
        b.start()
        # B re-runs batch 2 with A's input (the ledger recorded it before A's slots began) and commits it.
        wait_until(lambda: max(map(int, re.findall(r"batch (\d+) committed:", b.log_path.read_text())),
                               default=-1) >= 2, "driver B to commit batch 2", 240, b.log_tail)
        release.touch()                   # A's held transactions now try to commit
        wait_until(lambda: a.proc.poll() is not None, "driver A to stop once driver B started", 240, a.log_tail)
        summary = json.loads((a.workdir / "termination.json").read_text())
        assert summary["reason"] == "Superseded", summary
        assert "newer driver (epoch" in summary["error"], summary
        assert b.proc.poll() is None, b.log_tail(60)
    finally:
        stop.set()
        feeder.join(30)
    wait_consumed(b, restored)
    assert b.stop() == 0, b.log_tail()
    epoch_a, epoch_b = (int(re.findall(r"driver epoch (\d+)\b", r.log_path.read_text())[0]) for r in (a, b))
    assert epoch_b > epoch_a, (epoch_a, epoch_b)
    expected = set().union(*(expected_ids(n, seed, start) for n, seed, start in sent))
    if fence == "on":
        assert "committing the held transaction" in journal.read_text()
        assert "fencing again" in a.log_path.read_text(), a.log_tail(80)   # the held commit failed
        assert_ids_exact(b, expected)
    else:
        audit = audit_ids(b.bootstrap, b.counts, expected)
        assert audit.duplicates, f"the verifier saw no violation without the fence: {audit.violations()}"
        print(f"negative control (fence off): {len(audit.duplicates)} ids written twice by the stale driver")
