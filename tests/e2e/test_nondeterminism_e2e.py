"""A non-deterministic job on the real stack: the driver dies after a batch reached the sink, the
restart replays it, every slot is skipped (nothing twice) and the differing output is detected,
carried in the ledger and reported by the operator (event, status, metric). The drivers run on the real nodes
(tests/e2e/on_nodes.py); the first one's fault is its own variable, added by the operator under test
(``driver_env``: a real kubelet gives a Pod only what its spec says)."""
from __future__ import annotations

import pytest

from eos_stack.common import free_port
from tests.e2e.streams import NAME, finish_exact, rig, scrape


@pytest.mark.real_nodes
def test_a_replay_that_differs_from_the_sink_is_reported_and_nothing_is_written_twice(
        stack_env, nodes, kubectl, namespace, on_nodes, tmp_path, report_result):
    # The first driver (attempt 0) dies after batch 0 is wholly in the sink, before Spark's commits/0.
    driver_env = [[0, "EOS_FAULT_KILL_BEFORE_COMMIT_LOG", "1"]]
    with rig(stack_env, kubectl, namespace, tmp_path, on_nodes=on_nodes, driver_env=driver_env) as r:
        port = free_port()
        doc = r.stream()
        doc["spec"]["job"]["module"] = "tests.e2e.jobs.colors_nondeterministic"
        trickle = r.run_stream(doc, seed=11, metrics_port=port)
        st = r.wait_status(lambda s: (s.get("nondeterministicSlots") or 0) > 0
                           and s.get("driverPod") == f"{NAME}-driver-1", "the replayed difference to be reported",
                           240)
        slots = st["nondeterministicSlots"]
        assert 1 <= slots <= 2, st
        events = [(e["type"], e["reason"], e["message"]) for e in kubectl.event_objects(namespace, NAME)]
        warned = [m for t, reason, m in events if (t, reason) == ("Warning", "NondeterministicOutput")]
        assert len(warned) == 1 and warned[0].startswith(f"{slots} replayed output slot(s)"), events
        assert scrape(port)[("eos_stream_nondeterministic_slots", namespace)] == slots
        expected = finish_exact(r, trickle)      # the counts are exact: the replay wrote nothing
        report_result(f"non-determinism: batch 0 replayed after a kill, {slots} of 2 slots differed from the sink "
                      f"and were skipped; reported once (event, status, metric); counts exact {expected}")
