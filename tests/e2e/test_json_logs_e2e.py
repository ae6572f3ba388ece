"""JSON logs end to end: an operator started with ``EOS_LOG_FORMAT=json`` (as the chart's ``operator.logFormat``
sets its flag) runs the colors stream; every line it writes is one JSON object, its records about the stream
name it, and the driver it starts logs its own records as JSON too (the format passed on in the Pod's
environment), with the stream, namespace, attempt and the batch being written. The driver runs on the real
nodes; its log is the container's, as the nodes' kubelet keeps it, followed through the API (``NodePods``)."""
from __future__ import annotations

import json

import pytest

from eos_stack.cluster import wait_until
from tests.e2e.streams import Trickle, rig


def json_lines(text: str) -> tuple[list[dict], list[str]]:
    docs, other = [], []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            other.append(line)
            continue
        (docs if isinstance(doc, dict) else other).append(doc if isinstance(doc, dict) else line)
    return docs, other


@pytest.mark.real_nodes
def test_the_operator_and_its_driver_log_json(stack_env, nodes, kubectl, namespace, on_nodes, tmp_path):
    with rig(stack_env, kubectl, namespace, tmp_path, on_nodes=on_nodes) as r:
        op = r.start_operator(EOS_LOG_FORMAT="json")
        Trickle(r.bootstrap, r.topics.events).send(300, seed=30)
        doc = r.stream()
        kubectl.apply(doc, namespace)
        r.wait_status(lambda s: s.get("lifecycleState") == "Running", "the stream to run")
        wait_until(lambda: r.counts_total() > 0, "first output", 240, r.diag, 2)

        def driver_text() -> str:
            logs = sorted(r.kubelet.log_dir.glob(f"{namespace}_colors-driver-0*.log"))
            return "\n".join(p.read_text(errors="replace") for p in logs)
        # The batch's log record follows its commit (the output can be read before the line is written).
        wait_until(lambda: " committed: " in driver_text(), "the driver to log a committed batch", 120, r.diag, 1)
        driver_text = driver_text()
    op_text = op.log_path.read_text(errors="replace")

    # The operator: every line it wrote is a JSON record (the lines the test harness itself writes into
    # the file, "===== operator start ...", are not the operator's).
    lines = [line for line in op_text.splitlines() if line.strip() and not line.startswith("===== operator")]
    docs, other = json_lines("\n".join(lines))
    assert docs and not other, f"not JSON: {other[:5]}"
    assert all({"time", "level", "logger", "message"} <= set(d) for d in docs)
    about = [d for d in docs if d.get("stream") == "colors"]
    assert about and all(d["namespace"] == namespace for d in about), docs[-20:]
    # Resolution runs in a worker thread of the operator: its records name the stream too.
    resolved = [d for d in docs if d["logger"] == "eos_job.resolution"]
    assert resolved and all(d.get("stream") == "colors" for d in resolved), resolved

    # The driver: the runtime's records are JSON with its context (Spark's own JVM lines stay text).
    runtime = [d for d in json_lines(driver_text)[0] if d.get("logger", "").startswith("eos_job")]
    assert runtime, driver_text[-3000:]
    assert all((d.get("stream"), d.get("namespace"), d.get("attempt")) == ("colors", namespace, 0)
               for d in runtime), runtime[:5]
    committed = [d for d in runtime if " committed: " in d["message"]]
    assert committed, [d["message"] for d in runtime]
    assert all("batch" in d and d["message"].startswith(f"batch {d['batch']} committed") for d in committed), committed
