"""The operator-level building blocks of the end-to-end tests (fixtures are in conftest.py).

The operator process with its test-only switches, a stream's topics and manifest, diagnostics for a
timed-out wait (the followed Pod logs among them), a steady event trickle with its expected counts, a rig of
topics, the real nodes' Pods and a (restartable) operator, a hostPath volume for a claim, the unique-id verifiers,
and the operator's /metrics, scraped. Job level (no Kubernetes) is ``tests.e2e.job_runs``; the secured listener
``tests.e2e.secured``."""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from eos_job.verify import audit_counts, audit_ids, ledger_monotone, open_transactions, read_committed
from eos_stack import cluster
from eos_stack.cluster import Kubectl, wait_until
from examples.colors.generator import counted, event_value, events, expected_ids, produce
from examples.colors.local_run import REPO, create_topics
from examples.colors.manifest import colors_manifest
from tests.e2e.exactness import assert_exactly_once, assert_slots_exact
from tests.e2e.on_nodes import NodeStreams
from tests.harness.node_pods import NodePods

NAME = "colors"
IDS = "examples.colors.ids"   # the unique-id stream's job: every kept event passed through, keyed by its id

# The operator as a program, with test-only switches applied from outside its code: slow resolution,
# die right after a Pod create, die right after a status write containing a marker, forget that a stream's
# running driver runs its current spec (restart it instead of adopting it).
OPERATOR_WRAPPER = r'''
import asyncio, os, sys
from eos_operator import adapters, cli
delay = float(os.environ.get("EOS_TEST_RESOLVE_DELAY", "0") or 0)
if delay:
    _resolve = adapters.JobResolver.resolve
    async def slow_resolve(self, config, *args, **kwargs):
        await asyncio.sleep(delay)
        return await _resolve(self, config, *args, **kwargs)
    adapters.JobResolver.resolve = slow_resolve
if os.environ.get("EOS_TEST_CRASH_AFTER_CREATE"):
    _create = adapters.KubernetesApi.create_pod
    async def create_then_die(self, namespace, body):
        await _create(self, namespace, body)
        os._exit(137)
    adapters.KubernetesApi.create_pod = create_then_die
marker = os.environ.get("EOS_TEST_CRASH_AFTER_STATUS")
if marker:
    import json
    _patch = adapters.KubernetesApi.patch_stream_status
    async def patch_then_die(self, namespace, name, status, resource_version):
        result = await _patch(self, namespace, name, status, resource_version)
        if marker in json.dumps(status, separators=(",", ":")):
            os._exit(137)
        return result
    adapters.KubernetesApi.patch_stream_status = patch_then_die
forget = os.environ.get("EOS_TEST_FORGET_ADOPTION")
if forget:
    # The operator-upgrade e2e's negative control: for stream <forget>, the spec its running driver was launched
    # with reads as another trigger interval (as an operator that misreads an older spec would), so the operator
    # restarts the driver it should adopt. Only while the first driver it sees is the stream's: the restart's new
    # driver is recorded with the real spec, and is left alone.
    import json
    from eos_operator import reconciler
    _parse = reconciler.parse_status
    adopted = {}
    def parse_forgetting(raw):
        status = _parse(raw)
        pod = status.driver_pod or ""
        if (pod.startswith(f"{forget}-driver-") and status.last_reconciled_spec
                and adopted.setdefault(forget, pod) == pod):
            spec = json.loads(status.last_reconciled_spec)
            spec["triggerIntervalMs"] = 4321
            status.last_reconciled_spec = json.dumps(spec, sort_keys=True, separators=(",", ":"))
        return status
    reconciler.parse_status = parse_forgetting
driver_env = os.environ.get("EOS_TEST_DRIVER_ENV")
if driver_env:
    # The real nodes' negative controls and faults: a stream cannot set the runtime's EOS_* variables
    # (job.podTemplate refuses them), so the operator under test adds them to the driver Pods it creates. JSON
    # [[attempt or null for every attempt, name, value], ...].
    import json
    from eos_operator import children
    _driver_pod = children.driver_pod
    extra = json.loads(driver_env)
    def driver_pod_with_env(ref, spec, *, attempt, **kw):
        pod = _driver_pod(ref, spec, attempt=attempt, **kw)
        pod["spec"]["containers"][0]["env"] += [{"name": n, "value": v} for a, n, v in extra if a in (None, attempt)]
        return pod
    children.driver_pod = driver_pod_with_env
pod_env = os.environ.get("EOS_TEST_POD_ENV")
if pod_env:
    # The operator-upgrade e2e on the real nodes: which runtime each Pod the operator creates runs (a PYTHONPATH
    # onto a ConfigMap of another build's eos_job). JSON {Pod name prefix: {name: value}}; "" matches every Pod.
    import json
    by_prefix = json.loads(pod_env)
    _create_pod = adapters.KubernetesApi.create_pod
    async def create_pod_with_env(self, namespace, body):
        for prefix, env in by_prefix.items():
            if body["metadata"]["name"].startswith(prefix):
                for c in body["spec"]["containers"]:
                    c["env"] = [e for e in c.get("env") or [] if e["name"] not in env] + [
                        {"name": n, "value": v} for n, v in env.items()]
        return await _create_pod(self, namespace, body)
    adapters.KubernetesApi.create_pod = create_pod_with_env
sys.exit(cli.main(sys.argv[1:]))
'''


class OperatorProcess(cluster.OperatorProcess):
    """The operator through OPERATOR_WRAPPER, so the test-only switches apply."""
    wrapper = OPERATOR_WRAPPER


class Diagnostics:
    """What to print when a wait times out."""

    def __init__(self, kubectl: Kubectl, namespace: str, operator: OperatorProcess | None = None,
                 kubelet: NodePods | None = None):
        self.kubectl, self.namespace, self.operator, self.kubelet = kubectl, namespace, operator, kubelet

    def __call__(self) -> str:
        parts = []
        try:
            for s in self.kubectl.json("get", "exactlyoncestreams", "-n", self.namespace)["items"]:
                parts.append(f"stream {s['metadata']['name']} status: {json.dumps(s.get('status'), indent=1)}")
            parts.append("pods: " + ", ".join(_pod_line(p) for p in self.kubectl.pods(self.namespace)))
            if os.environ.get("EOS_NODES"):
                parts.append("nodes: " + "; ".join(_node_line(n) for n in self.kubectl.json("get", "nodes")["items"]
                                                   if n["metadata"]["name"] in os.environ["EOS_NODES"].split(",")))
            parts.append(self.kubectl.run("get", "events", "-n", self.namespace, check=False).stdout)
        except Exception as exc:  # noqa: BLE001 - diagnostics must not hide the failure
            parts.append(f"(could not read state: {exc})")
        if self.operator is not None:
            parts.append("operator log:\n" + self.operator.tail())
        if self.kubelet is not None:
            # The two Pod logs written last (followed from the real nodes).
            for log in sorted(self.kubelet.log_dir.glob(f"{self.namespace}_*.log"), key=lambda f: f.stat().st_mtime)[-2:]:
                lines = log.read_text(errors="replace").splitlines()[-25:]
                parts.append(f"{log.name}:\n" + "\n".join(lines))
        return "\n".join(parts)




def _pod_line(pod: dict) -> str:
    """``name=phase`` with why a Pod is not running: Evicted, unschedulable (taints, resources), waiting reason."""
    st = pod.get("status", {})
    why = [st.get("reason")] + [f"{c['type']}: {c.get('message')}" for c in st.get("conditions", [])
                                if c.get("status") == "False" and c.get("message")]
    why += [cs["state"]["waiting"].get("reason") for cs in st.get("containerStatuses", [])
            if "waiting" in cs.get("state", {})]
    why = [w for w in why if w]
    return f"{pod['metadata']['name']}={st.get('phase')}" + (f" ({'; '.join(why)[:300]})" if why else "")


def _node_line(node: dict) -> str:
    """A real node's conditions that are not as they should be (Ready not True, a pressure True) and its taints."""
    bad = [f"{c['type']}={c['status']}" for c in node.get("status", {}).get("conditions", [])
           if (c["type"] == "Ready") != (c["status"] == "True")]
    taints = [f"{t['key']}:{t['effect']}" for t in node.get("spec", {}).get("taints", [])]
    return f"{node['metadata']['name']} {' '.join(bad) or 'Ready'} taints=[{', '.join(taints)}]"


class ColorsTopics:
    def __init__(self, bootstrap: str, *, create_sink: bool = True):
        self.bootstrap = bootstrap
        run_id = uuid.uuid4().hex[:8]
        self.events, self.counts, self.dlq = (f"op-colors-events-{run_id}", f"op-colors-counts-{run_id}",
                                              f"op-colors-dlq-{run_id}")
        topics = {self.events: 3, self.dlq: 1}
        if create_sink:
            topics[self.counts] = 3
        create_topics(bootstrap, topics)

    def create_sink(self) -> None:
        create_topics(self.bootstrap, {self.counts: 3})

    def ledger(self, namespace: str, name: str) -> str:
        return f"{self.counts}.eos-ledger.{namespace}.{name}"


def colors_stream(name: str, topics: ColorsTopics, checkpoint: Path, *, attempts: int = 3,
                  delay: float = 1.0, module: str | None = None) -> dict[str, Any]:
    """The colors stream under the operator; ``module="examples.colors.ids"``: the unique-id stream."""
    return colors_manifest(name, topics.bootstrap, topics.events, topics.counts, checkpoint, dlq=topics.dlq,
                           max_offsets_per_trigger=2000, trigger_interval_ms=500,
                           job={"module": module} if module else None,
                           restartStrategy={"type": "fixed-delay",
                                            "fixedDelay": {"attempts": attempts, "delaySeconds": delay}},
                           upgradeMode="last-state")


class Trickle(threading.Thread):
    """Events keep arriving: a small chunk every ``period`` seconds; the expected counts follow."""

    def __init__(self, bootstrap: str, topic: str, chunk: int = 10, period: float = 0.25, start_id: int = 0):
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 5})
        self.topic, self.chunk, self.period, self.next_id = topic, chunk, period, start_id
        self.expected: Counter = Counter()
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def send(self, n: int, seed: int) -> None:
        for i, color in events(n, seed=seed, start_id=self.next_id):
            self.producer.produce(self.topic, key=str(i).encode(), value=event_value(i, color))
            if counted(color):
                self.expected[color] += 1
        self.next_id += n
        if self.producer.flush(30):
            raise RuntimeError("events not delivered")

    def run(self) -> None:
        seed = 1000
        try:
            while not self.halt.wait(self.period):
                seed += 1
                self.send(self.chunk, seed)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def stop(self) -> dict[str, int]:
        self.halt.set()
        self.join(30)
        assert self.error is None, self.error
        return dict(sorted(self.expected.items()))


class IdFeed(threading.Thread):
    """Produces events with unique ids in small chunks while the job is being killed; knows every id sent."""

    def __init__(self, bootstrap: str, topic: str, chunk: int = 100, pause: float = 2.0, first_id: int = 0):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.chunk, self.pause = bootstrap, topic, chunk, pause
        self.first_id = first_id   # the chunks' ids start here (another feed of the same topic: further on)
        self.chunks: list[tuple[int, int, int]] = []   # (n, seed, first id)
        self.sent = 0
        self.stop_flag = threading.Event()
        self.paused = threading.Event()
        self._producing = threading.Lock()
        self.error: Exception | None = None

    def send(self, n: int, seed: int, start_id: int) -> None:
        produce(self.bootstrap, self.topic, n, seed=seed, start_id=start_id)
        self.chunks.append((n, seed, start_id))

    def run(self):
        try:
            while not self.stop_flag.is_set():
                with self._producing:
                    if not self.paused.is_set():
                        self.send(self.chunk, self.sent, self.first_id + self.sent)
                        self.sent += self.chunk
                time.sleep(self.pause)
        except Exception as exc:  # noqa: BLE001 - surfaced by the test
            self.error = exc

    def hold(self) -> None:
        """Stop producing and wait for a chunk in flight to be delivered, so the broker can be taken down."""
        self.paused.set()
        with self._producing:
            pass
        if self.error:
            raise self.error

    def resume(self) -> None:
        self.paused.clear()

    def finish(self) -> set[int]:
        self.stop_flag.set()
        self.join(120)
        if self.error:
            raise self.error
        return set().union(*(expected_ids(n, seed, start) for n, seed, start in self.chunks))


class Rig:
    """Topics, the real nodes' Pods (``NodePods``) and a (restartable) operator for one namespace; the rig's
    streams are placed on the real nodes by ``on_nodes`` (``place``). Made by ``rig()``; a test that places its
    streams itself makes one without ``kubelet`` and ``on_nodes`` (test_start_failures_e2e.py)."""

    def __init__(self, stack_env: dict[str, str], kubectl: Kubectl, namespace: str, tmp_path: Path,
                 kubelet: NodePods | None, on_nodes: NodeStreams | None = None, driver_env: list | None = None):
        self.env, self.kubectl, self.ns, self.tmp = stack_env, kubectl, namespace, tmp_path
        self.on_nodes = on_nodes
        self.driver_env = driver_env
        self.bootstrap = stack_env["KAFKA_BOOTSTRAP"]
        self.topics = ColorsTopics(self.bootstrap)
        self.kubelet = kubelet
        self.operator: OperatorProcess | None = None
        self.diag = Diagnostics(kubectl, namespace, None, kubelet)
        self.feeds: list[IdFeed] = []    # stopped when the rig closes, also after a failure

    def start_operator(self, metrics_port: int | None = None, leader_election: bool = False,
                       log: str = "operator.log", **switches: str) -> OperatorProcess:
        if self.driver_env:
            switches.setdefault("EOS_TEST_DRIVER_ENV", json.dumps(self.driver_env))
        self.operator = OperatorProcess(self.env["KUBECONFIG"], self.ns, self.tmp / log, metrics_port=metrics_port,
                                        leader_election=leader_election, **switches).start()
        self.diag.operator = self.operator
        return self.operator

    def run_stream(self, doc: dict[str, Any], *, seed: int, first_output: bool = True,
                   metrics_port: int | None = None) -> Trickle:
        """Start the operator, a backlog of 1000 events, the stream; once it runs (and wrote its first
        output), a steady trickle of events. Returns the trickle (its ``stop()`` gives the expected counts)."""
        self.start_operator(metrics_port=metrics_port)
        trickle = Trickle(self.bootstrap, self.topics.events)
        trickle.send(1000, seed=seed)
        self.kubectl.apply(doc, self.ns)
        self.wait_status(lambda s: s.get("lifecycleState") == "Running", "the stream to run")
        if first_output:
            wait_until(lambda: self.counts_total() > 0, "first output", 240, self.diag, 2)
        trickle.start()
        return trickle

    def run_ids(self, doc: dict[str, Any], *, seed: int, first_output: bool = True) -> IdFeed:
        """``run_stream`` for the unique-id stream (``stream(module=IDS)``): a backlog of 1000 unique ids
        (from 1,000,000 on, apart from the feed's), the stream; once it runs (and wrote its first output),
        an id feed. Returns the feed (its ``finish()`` gives every kept id sent, the backlog's too)."""
        self.start_operator()
        feed = IdFeed(self.bootstrap, self.topics.events, chunk=50, pause=1.0)
        self.feeds.append(feed)
        feed.send(1000, seed, 1_000_000)
        self.kubectl.apply(doc, self.ns)
        self.wait_status(lambda s: s.get("lifecycleState") == "Running", "the stream to run")
        if first_output:
            wait_until(lambda: self.output_total() > 0, "first output", 240, self.diag, 2)
        feed.start()
        return feed

    def status(self, name: str = NAME) -> dict[str, Any]:
        return self.kubectl.status(self.ns, name)

    def wait_status(self, pred: Callable[[dict[str, Any]], bool], what: str, timeout: float = 240,
                    name: str = NAME) -> dict[str, Any]:
        return wait_until(lambda: (lambda s: s if pred(s) else None)(self.status(name)), what, timeout,
                          self.diag, 0.5)

    def pod_phase(self, pod: str) -> str | None:
        for p in self.kubectl.pods(self.ns):
            if p["metadata"]["name"] == pod:
                return (p.get("status") or {}).get("phase")
        return None

    def counts_total(self, topic: str | None = None) -> int:
        return sum(audit_counts(self.bootstrap, topic or self.topics.counts).final.values())

    def output_total(self, topic: str | None = None) -> int:
        """Records in the sink, read_committed (the unique-id stream's progress)."""
        return len(read_committed(self.bootstrap, topic or self.topics.counts))

    def stream(self, module: str | None = None, **spec_changes: Any) -> dict[str, Any]:
        """The colors stream of the rig (``module=IDS``: the unique-id stream), snapshot upgrades."""
        doc = colors_stream(NAME, self.topics, self.tmp / "checkpoint", attempts=10, delay=2, module=module)
        del doc["spec"]["upgradeMode"]          # snapshot, the default
        doc["spec"].update(spec_changes)
        return self.place(doc)

    def place(self, doc: dict[str, Any]) -> dict[str, Any]:
        """``doc`` as the rig runs it: on the real nodes (tests/e2e/on_nodes.py); as is without ``on_nodes`` (its
        test places it)."""
        return self.on_nodes.place(doc) if self.on_nodes else doc


@contextlib.contextmanager
def rig(stack_env, kubectl, namespace, tmp_path, *, on_nodes: NodeStreams,
        driver_env: list | None = None) -> Iterator[Rig]:
    """A ``Rig`` whose Pods run on the real nodes, placed by ``on_nodes`` (the ``on_nodes`` fixture). A real
    kubelet gives a Pod only what its spec says, so a driver's own variables (the ``EOS_FAULT_*`` of one attempt)
    are ``driver_env``, ``[[attempt or None, name, value], ...]``: the operator under test adds them to the
    driver Pods it creates (``EOS_TEST_DRIVER_ENV``)."""
    with on_nodes.pods(tmp_path / "kubelet") as kubelet:
        r = Rig(stack_env, kubectl, namespace, tmp_path, kubelet, on_nodes, driver_env)
        try:
            yield r
        finally:
            for feed in r.feeds:
                feed.stop_flag.set()
            kubectl.run("delete", "exactlyoncestream", "--all", "-n", namespace, "--timeout=120s", check=False)
            if r.operator is not None:
                r.operator.stop()


def finish_exact(r: Rig, trickle: Trickle, name: str = NAME, counts: str | None = None) -> dict[str, int]:
    expected = trickle.stop()
    counts = counts or r.topics.counts
    wait_until(lambda: audit_counts(r.bootstrap, counts).final == expected, "the output to catch up", 300,
               r.diag, 2)
    assert_exactly_once(r.bootstrap, counts, f"{counts}.eos-ledger.{r.ns}.{name}", expected, (r.topics.dlq,))
    return expected


def finish_ids(r: Rig, feed: IdFeed, name: str = NAME, topic: str | None = None,
               also: set[int] | frozenset[int] = frozenset()) -> set[int]:
    """Stop ``feed``; once every id it sent (and those of ``also``) is in the output: the unique-id audit
    (set equality, none twice, read_committed; the ledger; no open transaction; the sink audit)."""
    return settle_ids(r, feed.finish() | set(also), name, topic)


def settle_ids(r: Rig, expected: set[int], name: str = NAME, topic: str | None = None) -> set[int]:
    """Once every id of ``expected`` is in ``topic`` (the rig's sink by default), the unique-id audit of
    stream ``name`` writing it, with its own ledger."""
    topic = topic or r.topics.counts
    wait_ids(r.bootstrap, topic, expected, r.diag, timeout=300)
    assert_ids_exactly_once(r.bootstrap, topic, f"{topic}.eos-ledger.{r.ns}.{name}", expected, (r.topics.dlq,))
    return expected


def kept_ids_from(bootstrap: str, topic: str, offsets: dict[str, int]) -> set[int]:
    """The ids the unique-id stream keeps of ``topic``'s records at or after ``offsets`` (partition -> offset,
    as a checkpoint's offset log holds them): what a stream restored at those offsets must write."""
    ids = set()
    for m in read_committed(bootstrap, topic):
        if m.offset() >= offsets[str(m.partition())]:
            event = json.loads(m.value())
            if counted(event["color"]):
                ids.add(int(event["id"]))
    return ids


# ------------------------------------------------------------ volumes
def host_claim(kubectl: Kubectl, namespace: str, name: str, path: Path) -> str:
    """A claim ``name`` of ``namespace`` and a hostPath PersistentVolume at ``path`` reserved for it (no
    StorageClass): the stack's controller manager binds them, a real node's kubelet mounts the volume where a
    Pod asks. Returns the volume's name (cluster-scoped: delete it after the namespace's claim)."""
    pv = f"{namespace}-{name}"
    path.mkdir(parents=True, exist_ok=True)
    kubectl.apply({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
                   "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                            "persistentVolumeReclaimPolicy": "Retain",
                            "claimRef": {"namespace": namespace, "name": name},
                            "hostPath": {"path": str(path), "type": "Directory"}}}, namespace)
    # A claim the PV controller syncs before it has seen the volume waits for its next resync (15 s).
    wait_until(lambda: kubectl.json("get", "pv", pv).get("status", {}).get("phase") == "Available",
               f"{pv} Available", 30, interval=0.1)
    kubectl.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
                   "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                            "resources": {"requests": {"storage": "1Gi"}}}}, namespace)
    return pv


# ------------------------------------------------------------ verifiers
def assert_ids_exactly_once(bootstrap: str, topic: str, ledger: str, expected: set[int],
                            other_topics: tuple[str, ...] = ()) -> None:
    """The unique-id verifier: the output, read_committed, is the expected ids as a set, none twice; the
    ledger only grew per slot; no transaction is left open."""
    audit = audit_ids(bootstrap, topic, expected)
    assert audit.violations() == [], f"not exactly once: {audit.violations()}"
    assert ledger_monotone(bootstrap, ledger) == []
    assert open_transactions(bootstrap, [topic, ledger, *other_topics]) == set()
    assert_slots_exact(bootstrap, [topic], ledger, other_topics)


def wait_ids(bootstrap: str, topic: str, expected: set[int], diag: Callable[[], str], timeout: float = 420) -> None:
    """Until every expected id is in the output (read_committed)."""
    wait_until(lambda: not audit_ids(bootstrap, topic, expected).missing, "every id in the output", timeout,
               diag, 2)


# ------------------------------------------------------------ metrics
def scrape(port: int) -> dict[tuple[str, ...], float]:
    """The colors stream's samples of the operator's /metrics, keyed (name, namespace[, state | type, reason])."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("stream") != NAME:
                continue
            extra = tuple(s.labels[k] for k in ("state", "type", "reason") if k in s.labels)
            out[(s.name, s.labels["namespace"], *extra)] = s.value
    return out
