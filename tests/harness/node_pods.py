"""The operator e2e tests' view of the Pods the real nodes (stack/eos_stack/node.py) run for one namespace (the
``kubelet`` fixture): the small interface the retired process kubelet gave them, kept so that the tests moved
to the real nodes changed little.

* ``kill9(namespace, pod)``: SIGKILL every process of the Pod's main container, found in its cgroup (the JVM and
  PySpark's Python workers, whatever their process groups; ``real_nodes.kill9_container``). The nodes' kubelet
  then sees the container exit 137 and the Pod ends ``Failed``, as a node's OOM kill or a crash leaves it.
* ``log_dir`` / ``log_path(namespace, pod)``: while the context is open, a watch of the namespace's Pods follows
  every Pod's log (``real_nodes.LogFollower``) into ``log_dir/{namespace}_{pod}.log`` from the moment its
  container started, so a driver's, drain's or snapshot Pod's log is still there after the Pod is gone.
  ``wait_log(namespace, pod)`` waits until a finished Pod's follower has the whole log.

Nothing here runs a Pod: the nodes' kubelet and containerd do, and a Pod is theirs only when it asks for their
scheduler (``real_nodes.stream_template``). A real kubelet gives a Pod only its spec's environment: see
``tests.e2e.on_nodes``.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from kubernetes import watch

from tests.harness.real_nodes import LogFollower, kill9_container


class NodePods:
    """Follows the logs of every Pod of ``namespace`` into ``log_dir``; kills a Pod's main container."""

    def __init__(self, v1, namespace: str, log_dir: Path):
        self.v1, self.namespace, self.log_dir = v1, namespace, Path(log_dir)
        self.followers: dict[str, LogFollower] = {}     # Pod name -> the follower of its latest Pod of that name
        self._followed: set[str] = set()                  # Pod uids
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._watch_loop, daemon=True, name=f"node-pods-{namespace}")

    def __enter__(self) -> "NodePods":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(10)
        for f in list(self.followers.values()):
            f.join(2)          # a follower of a Pod still running ends with the namespace

    def log_path(self, namespace: str, name: str) -> Path:
        return self.log_dir / f"{namespace}_{name}.log"

    def kill9(self, namespace: str, name: str) -> bool:
        """SIGKILL every process of the Pod's main container (the first; the operator's Pods have one); False
        when it runs none (not started, or ended already)."""
        from kubernetes.client.exceptions import ApiException
        try:
            pod = self.v1.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False     # gone already (the caller's diagnostics say why)
            raise
        main = pod.spec.containers[0].name
        cid = next((c.container_id for c in pod.status.container_statuses or []
                    if c.name == main and c.state.running and c.container_id), None)
        return bool(cid and kill9_container(cid))

    def wait_log(self, namespace: str, name: str, timeout: float = 30) -> str:
        """The Pod's whole log once its follower ended (its container finished), or what it has after
        ``timeout``."""
        deadline = time.monotonic() + timeout
        while name not in self.followers and time.monotonic() < deadline:
            time.sleep(0.2)
        f = self.followers.get(name)
        if f is not None:
            f.join(max(0.0, deadline - time.monotonic()))
        path = self.log_path(namespace, name)
        return path.read_text(errors="replace") if path.exists() else ""

    # ------------------------------------------------------------- the watch
    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            self._watch = watch.Watch()
            try:
                for event in self._watch.stream(self.v1.list_namespaced_pod, self.namespace, timeout_seconds=60):
                    self._seen(event["object"])
                    if self._stop.is_set():
                        break
            except Exception:  # noqa: BLE001 - a broken watch is restarted; the followers keep their logs
                time.sleep(1)

    def _seen(self, pod) -> None:
        name, uid = pod.metadata.name, pod.metadata.uid
        if uid in self._followed:
            return
        started = [c for c in pod.status.container_statuses or [] if c.state.running or c.state.terminated]
        if started:       # the log exists from here on (a follow before it is refused: ContainerCreating)
            self._followed.add(uid)
            f = LogFollower(self.v1, self.namespace, name, self.log_path(self.namespace, name))
            self.followers[name] = f
            f.start()
