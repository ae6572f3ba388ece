"""What the scale benchmark observes: the streams and Pods of its namespace through watches, time-stamped as
they arrive (``Recorder``), the operator's Kafka connections and memory from /proc, Prometheus text."""
from __future__ import annotations

import re

import threading
import time
import urllib.request
from pathlib import Path

from kubernetes import client, watch
from prometheus_client.parser import text_string_to_metric_families

GROUP, VERSION, PLURAL = "streaming.eos.dev", "v1beta1", "exactlyoncestreams"
LABEL_STREAM = f"{GROUP}/stream"


class Recorder:
    """Watches the namespace's streams and Pods: each stream's latest status, and what changed when."""

    def __init__(self, api, namespace: str):
        self.ns, self.lock, self.halt = namespace, threading.Lock(), threading.Event()
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        self.status: dict[str, dict] = {}
        self.stream_events: dict[str, list[tuple[float, int | None]]] = {}   # (time, status.observedGeneration)
        self.pod_events: dict[str, list[tuple[float, str, str, bool]]] = {}  # (time, type, pod, deleting)
        self.versions: dict[str, str | None] = {}   # where each watch resumes
        for target in (self._streams, self._pods):
            threading.Thread(target=self._loop, args=(target,), daemon=True, name=target.__name__).start()

    def stop(self) -> None:
        self.halt.set()

    def stream(self, name: str) -> dict:
        with self.lock:
            return dict(self.status.get(name) or {})

    def first_action(self, name: str, old_pod: str | None, generation: int, since: float) -> tuple[float, str] | None:
        """The operator's first observable action on ``name`` after ``since``: a status write that observed
        ``generation``, or the deletion of its driver Pod ``old_pod``; None while there is none."""
        with self.lock:
            seen = [(t, "status") for t, g in self.stream_events.get(name, []) if t >= since and (g or 0) >= generation]
            seen += [(t, "pod deletion") for t, kind, pod, deleting in self.pod_events.get(name, [])
                     if t >= since and pod == old_pod and (deleting or kind == "DELETED")]
        return min(seen) if seen else None

    def pod_created_after(self, name: str, old_pod: str | None, since: float) -> float | None:
        with self.lock:
            return next((t for t, kind, pod, _ in self.pod_events.get(name, [])
                         if t >= since and kind == "ADDED" and pod != old_pod), None)

    # -------------------------------------------------------------- watching
    def _loop(self, target) -> None:
        while not self.halt.is_set():
            try:
                target()
            except Exception:  # noqa: BLE001 - an expired or broken watch: list and watch again
                self.halt.wait(0.5)

    def _streams(self) -> None:
        def listed() -> str:
            items = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL)
            for obj in items["items"]:
                self._stream("ADDED", obj)
            return items["metadata"]["resourceVersion"]
        self._watch("streams", listed, self.custom.list_namespaced_custom_object, (GROUP, VERSION, self.ns, PLURAL),
                    lambda kind, obj: self._stream(kind, obj))

    def _stream(self, kind: str, obj: dict) -> None:
        now, name, status = time.time(), obj["metadata"]["name"], obj.get("status") or {}
        with self.lock:
            self.status[name] = status
            events = self.stream_events.setdefault(name, [])
            if not events or events[-1][1] != status.get("observedGeneration"):
                events.append((now, status.get("observedGeneration")))

    def _pods(self) -> None:
        def listed() -> str:
            items = self.core.list_namespaced_pod(self.ns)
            for pod in items.items:   # after an expired watch: Pods it had not reported count as added now
                self._pod("ADDED", pod, only_new=True)
            return items.metadata.resource_version
        self._watch("pods", listed, self.core.list_namespaced_pod, (self.ns,), self._pod)

    def _pod(self, kind: str, pod, only_new: bool = False) -> None:
        stream = (pod.metadata.labels or {}).get(LABEL_STREAM)
        if not stream:
            return
        with self.lock:
            events = self.pod_events.setdefault(stream, [])
            if only_new and any(p == pod.metadata.name for _, _, p, _ in events):
                return
            events.append((time.time(), kind, pod.metadata.name, pod.metadata.deletion_timestamp is not None))

    def _watch(self, what: str, listed, func, args: tuple, handle) -> None:
        """Watch from where the last watch ended (a watch the server closes every 60 s must not lose what
        happened in between); list again only when that version expired (410)."""
        if self.versions.get(what) is None:
            self.versions[what] = listed()
        w = watch.Watch()
        try:
            for ev in w.stream(func, *args, resource_version=self.versions[what], timeout_seconds=60):
                obj = ev["object"]
                if ev["type"] == "ERROR":
                    self.versions[what] = None
                    return
                handle(ev["type"], obj)
                meta = obj["metadata"] if isinstance(obj, dict) else obj.metadata
                self.versions[what] = meta["resourceVersion"] if isinstance(meta, dict) else meta.resource_version
                if self.halt.is_set():
                    return
        except client.ApiException as exc:
            if exc.status == 410:
                self.versions[what] = None
            raise


def scrape(text: str, metric: str) -> list[tuple[dict, float]]:
    """The samples of ``metric`` (a counter's ``_total`` samples) in Prometheus text."""
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == metric:
                out.append((s.labels, s.value))
    return out


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def kafka_connections(pid: int, port: int) -> int:
    """ESTABLISHED TCP connections of process ``pid`` to ``port`` (the broker), from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    n = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "01" and int(f[2].rsplit(":", 1)[1], 16) == port and f[9] in inodes:
                n += 1
    return n


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_kb(pid: int) -> int:
    return _status_kb(pid, "VmRSS")


def private_kb(pid: int) -> int:
    """What the process holds alone (shares nothing of): private clean + dirty pages."""
    try:
        rows = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return 0
    return sum(int(r.split()[1]) for r in rows if r.startswith(("Private_Clean:", "Private_Dirty:")))


def collapsed_summary(text: str, seconds: float, top: int = 12) -> dict:
    """py-spy's collapsed stacks (``frame;frame;... count`` a line, outermost first) as the frames holding most
    samples: ``self`` (the innermost frame, where the CPU was) and ``inclusive`` (anywhere on the stack), each in
    % of all samples; a frame is ``function (file)``, its line numbers dropped."""
    leaf: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        total += count
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        leaf[frames[-1]] = leaf.get(frames[-1], 0) + count
        for f in set(frames):
            incl[f] = incl.get(f, 0) + count

    def ranked(d: dict[str, int]) -> list[list]:
        return [[f, round(100 * c / total, 1)] for f, c in sorted(d.items(), key=lambda x: -x[1])[:top]]
    return {"samples": total, "seconds": seconds, "self_pct": ranked(leaf) if total else [],
            "inclusive_pct": ranked(incl) if total else []}
