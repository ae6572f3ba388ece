"""One process that plays every driver Pod of a KWOK node (the scale benchmark's drivers, ``eos_stack.kwok``).

KWOK makes a Pod ``Running`` through the real API server but runs nothing. This process watches the Pods of one
namespace on the fake Nodes of one run (``--run``, their ``eos.dev/kwok`` label) and, for each driver Pod that is
``Running``, plays its driver in a thread of its own (``driver_play``: the run config read from the Pod's
``EOS_RUN_CONFIG`` as ``eos_job.cli`` reads it, the pre-flight, the epoch claim, then a committed batch every
``--batch-seconds`` through the sink's write path). The operator so sees what it sees of a driver on a node: the
Pod Running, the stream's epoch stamped and its batches in the ledger.

* **Pod deleted** (deletionTimestamp set, KWOK's ``pod-delete`` stage then removes it) **or failed**
  (``fail_pod``: status ``Failed``, exit code 137, as a SIGKILL's): its driver stops after the running batch
  and writes nothing more; what it left open is for the operator's resolution, as after a real kill.
* **A driver that ends on its own** (superseded, refused, sink unusable): its Pod's status is written as the
  kubelet would, ``Failed`` (or ``Succeeded`` on exit 0) with the exit code and the summary as the termination
  message.
* **Other Pods** (pre-flight, drain, probe, snapshot): not played; such a Pod is failed with a message that
  says so (the benchmark makes none).

**Shards.** A process holds at most about 1,000 Kafka clients (each confluent-kafka client takes one of the
process's 1,024 thread-local storage keys; the next fails ``Failed to initialize thread local storage``) and a
driver holds three (its ledger-record producer, each slot's producer and ledger reader): ``--shard I/K`` plays
only the Pods whose name hashes to ``I`` of ``K`` (crc32), so K processes share the Pods, 250 streams each.

``--concurrency`` drivers at a time do their start or a batch (``driver_play``'s gate), so a few hundred
starting at once queue here rather than all at the broker at the same instant.
Run: ``python -m tests.harness.kwok_drivers --kubeconfig K --namespace NS --run RUN``.
"""
from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import logging
import signal
import sys
import threading
import time
import zlib

from kubernetes import client, config, watch

from eos_job import cli
from eos_operator.children import RUN_CONFIG_ENV

from .driver_play import is_driver, play, run_args

log = logging.getLogger("eos_job.kwok_drivers")

ENDED = ("Failed", "Succeeded")


def fail_pod(core: client.CoreV1Api, namespace: str, name: str, *, exit_code: int = 137, reason: str = "Error",
             message: str = "") -> None:
    """End a Pod as its node would report a container that exited ``exit_code`` (137: killed by SIGKILL)."""
    pod = core.read_namespaced_pod(name, namespace)
    now = dt.datetime.now(dt.timezone.utc).isoformat()
    phase = "Succeeded" if exit_code == 0 else "Failed"
    statuses = [{"name": c.name, "image": c.image, "imageID": "", "ready": False, "restartCount": 0,
                 "started": False, "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                                                             "message": message[:4000], "startedAt": now,
                                                             "finishedAt": now}}}
                for c in pod.spec.containers]
    core.patch_namespaced_pod_status(name, namespace, {"status": {
        "phase": phase, "containerStatuses": statuses,
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
                       {"type": "ContainersReady", "status": "False", "reason": "PodCompleted",
                        "lastTransitionTime": now}]}})


class ConfigError(Exception):
    """A Secret, ConfigMap or key that the container's env names does not exist (and is not optional): what a
    kubelet reports as ``CreateContainerConfigError``."""


def pod_env(core: client.CoreV1Api, pod: dict) -> dict[str, str]:
    """The container's environment as the kubelet gives it: literal values, and ``valueFrom`` read through the
    API (the driver's run config is a ConfigMap key: ``children.driver_pod``; Kafka credentials Secret keys)."""
    env = {}
    for e in pod["spec"]["containers"][0].get("env") or []:
        value = e.get("value") if "valueFrom" not in e else value_from(core, pod, e["valueFrom"])
        if value is not None:
            env[e["name"]] = value
    return env


def value_from(core: client.CoreV1Api, pod: dict, vf: dict) -> str | None:
    """One ``valueFrom``: a Secret's or ConfigMap's key (None when optional and missing) or a ``fieldRef``."""
    meta, ns = pod["metadata"], pod["metadata"]["namespace"]
    for kind, name, read in (("secretKeyRef", "Secret", core.read_namespaced_secret),
                             ("configMapKeyRef", "ConfigMap", core.read_namespaced_config_map)):
        if kind not in vf:
            continue
        ref = vf[kind]
        try:
            data = read(ref["name"], ns).data or {}
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            if ref.get("optional"):
                return None
            raise ConfigError(f'{name.lower()} "{ref["name"]}" not found') from None   # a kubelet's words
        if ref["key"] not in data:
            if ref.get("optional"):
                return None
            raise ConfigError(f"couldn't find key {ref['key']} in {name} {ns}/{ref['name']}")
        value = data[ref["key"]]
        return base64.b64decode(value).decode() if kind == "secretKeyRef" else value
    path = (vf.get("fieldRef") or {}).get("fieldPath")
    fields = {"metadata.name": meta["name"], "metadata.namespace": ns, "metadata.uid": meta.get("uid"),
              "spec.nodeName": pod["spec"].get("nodeName"),
              "spec.serviceAccountName": pod["spec"].get("serviceAccountName") or "default",
              "status.podIP": (pod.get("status") or {}).get("podIP"),
              "status.hostIP": (pod.get("status") or {}).get("hostIP")}
    if path not in fields:
        raise ValueError(f"valueFrom {vf} is not supported by the KWOK driver simulator")
    return fields[path]


class Drivers:
    """The watch and one thread per played driver, keyed by Pod uid."""

    def __init__(self, kubeconfig: str, namespace: str, run: str, *, batch_seconds: float, records: int,
                 concurrency: int, shard: tuple[int, int] = (0, 1)):
        self.core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        self.ns, self.run, self.shard = namespace, run, shard
        self.batch_seconds, self.records = batch_seconds, records
        self.gate = threading.BoundedSemaphore(concurrency)
        self.playing: dict[str, threading.Event] = {}
        self.threads: list[threading.Thread] = []
        self.stopped = threading.Event()
        self.nodes: set[str] = set()

    def on_kwok(self, pod) -> bool:
        name = pod.spec.node_name
        if name and name not in self.nodes:
            node = self.core.read_node(name)
            if (node.metadata.labels or {}).get("eos.dev/kwok") == self.run:
                self.nodes.add(name)
        return name in self.nodes

    def seen(self, pod, deleted: bool = False) -> None:
        if zlib.crc32(pod.metadata.name.encode()) % self.shard[1] != self.shard[0]:
            return   # another shard's
        uid, phase = pod.metadata.uid, pod.status.phase if pod.status else None
        if deleted or pod.metadata.deletion_timestamp or phase in ENDED:
            stop = self.playing.pop(uid, None)
            if stop is not None:
                stop.set()
            return
        if phase != "Running" or uid in self.playing or not self.on_kwok(pod):
            return
        command = list(pod.spec.containers[0].command or []) + list(pod.spec.containers[0].args or [])
        if not is_driver(command, {}):
            log.warning("%s: not a driver's Pod; the KWOK simulator plays drivers only", pod.metadata.name)
            fail_pod(self.core, self.ns, pod.metadata.name, exit_code=128, reason="StartError",
                     message="the KWOK driver simulator plays driver Pods only")
            return
        stop = self.playing[uid] = threading.Event()
        thread = threading.Thread(target=self.drive, args=(pod, command, stop), daemon=True, name=pod.metadata.name)
        self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        thread.start()

    def drive(self, pod, command: list[str], stop: threading.Event) -> None:
        name = pod.metadata.name
        try:
            raw = self.core.api_client.sanitize_for_serialization(pod)
            env = pod_env(self.core, raw)
            if not is_driver(command, env):   # a drain (its variable): not played
                raise ValueError("not a driver's Pod: the KWOK simulator plays driver Pods only")
            args = run_args(command, env)
            cfg = cli._load(args, json.loads(env[args.config_env or RUN_CONFIG_ENV]))
        except (ValueError, KeyError, ConfigError, client.ApiException) as exc:
            log.error("%s: %s: %s", name, type(exc).__name__, exc)
            return self.ended(name, stop, cli.EXIT_BAD_CONFIG, f"{type(exc).__name__}: {exc}")
        try:
            code, summary = play(cfg, stop, batch_seconds=self.batch_seconds, records=self.records,
                                 snapshot_dir=args.snapshot_on_stop, gate=lambda: self.gate)
        except Exception as exc:  # noqa: BLE001 - a driver that dies of anything else ends its Pod, as it would
            log.exception("%s: driver failed", name)
            return self.ended(name, stop, 1, f"{type(exc).__name__}: {exc}")
        self.ended(name, stop, code, summary.to_json())

    def ended(self, name: str, stop: threading.Event, code: int, message: str) -> None:
        """A driver that ended on its own ends its Pod; one stopped because its Pod went away writes nothing."""
        if stop.is_set():
            return
        log.info("%s: exit %d", name, code)
        try:
            fail_pod(self.core, self.ns, name, exit_code=code, reason="Completed" if code == 0 else "Error",
                     message=message)
        except client.ApiException as exc:
            log.warning("%s: its end not written: %s", name, exc.reason)

    def watch(self) -> None:
        version = None
        while not self.stopped.is_set():
            try:
                if version is None:
                    pods = self.core.list_namespaced_pod(self.ns)
                    for pod in pods.items:
                        self.seen(pod)
                    version = pods.metadata.resource_version
                for ev in watch.Watch().stream(self.core.list_namespaced_pod, self.ns, resource_version=version,
                                               timeout_seconds=60, allow_watch_bookmarks=True):
                    version = ev["raw_object"]["metadata"]["resourceVersion"]
                    if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self.seen(ev["object"], deleted=ev["type"] == "DELETED")
                    if self.stopped.is_set():
                        return
            except client.ApiException as exc:
                if exc.status == 410:   # too old: list again
                    version = None
                else:
                    log.warning("pod watch: %s", exc.reason)
                    time.sleep(1)

    def stop(self, grace: float = 30.0) -> None:
        """Every driver stops after its running batch (none is left inside a transaction), ``grace`` at most."""
        self.stopped.set()
        for stop in list(self.playing.values()):
            stop.set()
        deadline = time.monotonic() + grace
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--run", required=True, help="the fake Nodes' eos.dev/kwok label value")
    ap.add_argument("--batch-seconds", type=float, default=30.0, help="a driver's batch interval")
    ap.add_argument("--records", type=int, default=1, help="records per slot and batch")
    ap.add_argument("--concurrency", type=int, default=8, help="drivers starting or in a batch at once")
    ap.add_argument("--shard", default="0/1", help="I/K: play only the Pods whose name hashes to I of K")
    a = ap.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
                        stream=sys.stderr)
    drivers = Drivers(a.kubeconfig, a.namespace, a.run, batch_seconds=a.batch_seconds, records=a.records,
                      concurrency=a.concurrency, shard=tuple(int(x) for x in a.shard.split("/")))
    signal.signal(signal.SIGTERM, lambda *_: drivers.stopped.set())
    threading.Thread(target=drivers.watch, daemon=True, name="watch").start()
    while not drivers.stopped.wait(1):
        pass
    drivers.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
