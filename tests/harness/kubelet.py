"""A "process kubelet" for tests: runs Pods of the local API server as local processes.

The local stack has an API server but no nodes. This harness plays the kubelet
(and the scheduler) for the Pods it is given, so an operator that creates Pods
sees them run, finish, fail and disappear exactly as through the Pod API of a
real cluster; it cannot tell the difference through the API.

What it does, per Pod in its scope (a namespace and/or a label selector; Spark's
executor Pods, created by a driver Pod in the namespace, are in the scope of a
kubelet of that namespace like any other Pod):

* **Claiming.** A Pod whose ``spec.nodeName`` is empty and whose
  ``spec.schedulerName`` is the default one is bound to this kubelet's node
  name through the ``pods/binding`` subresource, as kube-scheduler would do
  (the binding is atomic, so two harnesses never run the same Pod). A Pod that
  already names this node is run too (unless its container ran before: see
  restarts); Pods for other nodes or schedulers are left alone. There is no Node
  object; nothing needs one.
* **Scheduling** (``tests/harness/scheduling.py``). The node's labels are a
  kubelet's (``kubernetes.io/hostname`` = the node name, ``kubernetes.io/os`` =
  ``linux``, ``kubernetes.io/arch``) plus ``node_labels``; it has no taints, so
  tolerations never matter. A Pod whose ``nodeSelector`` (or required node
  affinity) does not select the node is not bound: as kube-scheduler it gets
  phase ``Pending`` and ``PodScheduled`` False, reason ``Unschedulable``, message
  ``0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.
  preemption: ...``. So does a Pod whose ``persistentVolumeClaim`` does not exist
  (``persistentvolumeclaim "NAME" not found``) or is not bound (``pod has unbound
  immediate PersistentVolumeClaims``), or whose claim's PersistentVolume does not
  select the node; such Pods are checked again every second, so one schedules
  once its claim binds. A Pod created with this node's name that does not fit is
  rejected as a kubelet's admission does: ``Failed``, reason ``NodeAffinity``.
* **Running.** The first container runs as a local process in its own process
  group: its ``command`` + ``args`` (with Kubernetes ``$(VAR)`` expansion; a
  command of ``python``/``python3``/``python3.X`` becomes ``sys.executable`` so the
  test venv is used), or, without a ``command``, the image's entrypoint
  (``docker/entrypoint.sh``: ``executor`` starts Spark's executor backend with
  java, ``driver`` spark-submit, anything else is exec'd) with its ``args`` and
  the image's ``ENV`` as this machine has it (``SPARK_HOME`` = PySpark's folder,
  ``PYSPARK_PYTHON`` = this interpreter, ``JAVA_HOME`` if set here, the stack's
  ``SPARK_JARS``/``SPARK_S3_JARS``/``EOS_SPARK_CDS_ARCHIVE``, the venv first on
  ``PATH``) as defaults under the Pod's own env. Images are otherwise ignored and
  so are the other containers (init containers are not run). The environment is
  this process's environment *without* ``KUBECONFIG``/``KUBECTL``/``KUBE_APISERVER``
  (a Pod has no credentials but its ServiceAccount's), plus ``HOSTNAME`` (the pod
  name), ``KUBERNETES_SERVICE_HOST``/``_PORT``/``_PORT_HTTPS`` (the API server of
  the kubeconfig, as an in-cluster client finds it), the container's ``env``
  (literal values, ``secretKeyRef``, ``configMapKeyRef``, ``fieldRef``:
  ``metadata.name``/``namespace``/``uid``/labels/annotations, ``spec.nodeName``,
  ``spec.serviceAccountName``, ``status.podIP`` = the Pod's own 127.x.y.z address, ``hostIP`` = 127.0.0.1) and
  ``envFrom``, and ``EOS_TERMINATION_MESSAGE_PATH``. The working directory is
  ``workingDir`` if set, else the repository root. stdout and stderr go to a
  per-pod log file (``log_path(namespace, name)``).
* **Volumes**, in a mount namespace of the Pod's own (``unshare --mount``, which
  like the ``sh`` that makes the bind mounts execs in place: the Pod's process
  keeps the PID the kubelet signals), each at its ``mountPath``: ``emptyDir`` a
  fresh folder of the Pod, ``configMap``/``secret`` a folder of the Pod with their
  keys as files (``items`` honoured; read-only), ``hostPath`` the host's folder.
  A volume's ConfigMap/Secret that does not exist yet is waited for, the Pod
  ``Pending`` and ``ContainerCreating`` meanwhile (Spark creates its executor
  ConfigMap after its first executor Pods); preparing and starting happen on a
  thread of the Pod, not the watch. A ``persistentVolumeClaim`` is mounted from
  its Bound PersistentVolume's ``hostPath`` or ``local.path`` (the PV controller of
  the stack's controller-manager binds claims; one not bound yet is waited for,
  as a kubelet's volume manager does); PersistentVolumes of other kinds, other
  volume kinds and ``subPath`` fail the Pod. A Pod with nothing to mount runs
  without a namespace. Mount points missing on this machine are made
  and removed again when no Pod uses them; the Pod's folders (under
  ``.stack/kubelet/<node>/pods/<uid>``) go when its process ended.
* **ServiceAccount token**, as a kubelet projects it: unless
  ``automountServiceAccountToken`` is false (Pod, else ServiceAccount), a
  TokenRequest for the Pod's ServiceAccount bound to the Pod (a Pod naming none
  gets ``default``'s, unbound: the API server binds only to the ServiceAccount a
  Pod names) with the API server's default audience, mounted read-only at
  ``/var/run/secrets/kubernetes.io/serviceaccount`` as ``token``, ``ca.crt`` (the
  kubeconfig's CA) and ``namespace``. So Spark's Kubernetes client in a driver Pod
  authenticates as the Pod's ServiceAccount, under RBAC. A ServiceAccount that
  does not exist (the local controller-manager makes no ``default`` ones) mounts
  nothing; a line at the top of the Pod's log says so.
* **Containers that cannot start**, as on a node: the Pod stays ``Pending`` with
  the container ``waiting``, and the kubelet keeps trying. Volumes come first
  (``ContainerCreating``, above), then the image: an image ``pullable`` refuses
  (default: every image pulls) shows ``ErrImagePull`` (``failed to pull and
  unpack image "IMG"...``) at the first try, ``ImagePullBackOff`` (``Back-off
  pulling image "IMG"``) at later ones, every 2s (``pullable`` is asked again
  each time). Then the container's env: a ``secretKeyRef``/``configMapKeyRef``/
  ``envFrom`` naming a Secret/ConfigMap or key that does not exist (not
  ``optional``) shows ``CreateContainerConfigError`` with a kubelet's message
  (``secret "NAME" not found``, ``couldn't find key KEY in Secret NS/NAME``),
  tried again every second: the container starts once it appears. The waiting
  state is written once per distinct reason and message; each distinct wait
  also gets a line in the Pod's log.
* **Status.** Written through the ``pods/status`` subresource: ``Pending`` when
  claimed, ``Running`` (container running, ``startedAt``, ``podIP`` its own 127.x.y.z address)
  once the process started, then ``Succeeded`` or ``Failed`` with the exit code
  (128+N for a process killed by signal N), reason ``Completed``/``Error`` and
  the termination message. ``/dev/termination-log`` is not writable per pod here,
  so ``terminationMessagePath`` is rewritten to a per-pod file whose path the
  process gets in ``EOS_TERMINATION_MESSAGE_PATH``; with
  ``terminationMessagePolicy: FallbackToLogsOnError`` a failed process with an
  empty message gets its log tail instead. A Pod deleted before its process
  started ends ``Failed`` with ``ContainerStatusUnknown`` (137), as on a node.
* **restartPolicy is treated as Never** whatever the Pod says: a finished
  process is never restarted (the operator under test manages restarts by
  creating new Pods).
* **Deletion.** When a Pod gets a ``deletionTimestamp`` its process group gets
  SIGTERM to the main process (as a kubelet signals PID 1), then SIGKILL of the
  whole process group after the deletion grace period
  (``terminationGracePeriodSeconds``, default 30); the final status is written
  and the Pod is deleted with grace period 0, as a kubelet confirms a deletion,
  so the object disappears (unless finalizers hold it). A Pod that vanishes
  outright (force deletion) gets the same signals, without a status.
* **Chaos.** ``kill9(namespace, name)`` SIGKILLs the process group; the Pod then
  ends ``Failed`` with exit code 137.
* **Driver stand-ins** (``standin_image``, a glob): a Pod whose container image matches runs
  ``tests/harness/standin.py`` with its command as arguments, set up as above: a driver's command is stood
  in (Kafka and the operator see a driver; no Spark), any other is exec'd. Without volumes it is forked from
  one process that imported the stand-in once (``tests/harness/zygote.py``), so hundreds share its memory.
* **Containers** (``containers``, a ``tests/harness/containers.py`` runtime): a Pod runs as ``podman run`` of
  its image from the project's container storage (the image ``make image`` built) instead of a local process,
  with the same volumes, token, env sources, status and signals; an image not in the storage waits in
  ``ErrImagePull``/``ImagePullBackOff``. That module says how a Pod maps onto ``podman run``.
* **Restarts of the harness.** A Pod bound to this node whose container ran
  (state ``running``) but has no process here (the harness was restarted) is
  marked Failed with reason ``ProcessLost`` and exit code 137: its process
  cannot be re-attached. One whose container never started is started.
  ``stop()`` terminates the processes it runs (SIGTERM, then SIGKILL) and
  records their final status.

Use it in-process as a context manager (``with ProcessKubelet(kubeconfig) as k:``)
or as a program: ``python -m tests.harness.kubelet --kubeconfig .stack/kube/admin.kubeconfig``
(``--node-label KEY=VALUE`` and ``--unpullable GLOB`` repeatable, ``--standin-image GLOB``).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from eos_job.process_tree import descendants, kill_tree

from . import scheduling
from .zygote import Zygote
from .containers import Containers
from .pod_setup import MOUNT_POINTS, PYTHON_NAMES, ApiServer, ImagePullError, NotYet, PodSetup, container_of, \
    host_mount_points, namespaced_argv, pod_ip, remove_pod_dir

REPO = Path(__file__).resolve().parents[2]
DEFAULT_NODE = "eos-process-kubelet"
DEFAULT_SCHEDULER = "default-scheduler"
MERGE_PATCH = "application/merge-patch+json"
MAX_MESSAGE = 4096
CLAIM_RETRY = 1.0   # seconds between checks of the unbound Pods that have claims
STANDIN = "tests.harness.standin"   # the driver stand-in's module (standin_image)

log = logging.getLogger("eos.kubelet")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PodRun:
    namespace: str
    name: str
    uid: str
    pod: dict
    log_path: Path
    pod_dir: Path
    proc: subprocess.Popen | None = None
    mount_points: list[str] = field(default_factory=list)   # made for this Pod on this machine's tree
    started_at: str = ""
    deleting: bool = False
    gone: bool = False
    kill_timer: threading.Timer | None = None
    waiter: threading.Thread | None = None
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)   # deleting/gone vs. starting the process

    @property
    def message_path(self) -> Path:
        return self.pod_dir / "termination-log"


class ProcessKubelet:
    """Run the Pods of one namespace (or all, or a label selector) as local processes."""

    def __init__(self, kubeconfig: str | os.PathLike | None = None, *, namespace: str | None = None,
                 label_selector: str | None = None, node_name: str = DEFAULT_NODE,
                 log_dir: str | os.PathLike | None = None, workdir: str | os.PathLike | None = None,
                 inherit_env: bool = True, extra_env: dict[str, str] | None = None,
                 env_for: "Callable[[str], dict[str, str]] | None" = None,
                 pullable: "Callable[[str], bool] | None" = None, node_labels: dict[str, str] | None = None,
                 standin_image: str | None = None, containers: "Containers | None" = None):
        self.kubeconfig = str(kubeconfig or os.environ.get("KUBECONFIG") or "")
        if not self.kubeconfig:
            raise ValueError("no kubeconfig given and KUBECONFIG is not set")
        self.namespace = namespace
        self.label_selector = label_selector
        self.node_name = node_name
        state = self.state_dir = Path(os.environ.get("EOS_STATE", REPO / ".stack")).resolve()
        self.log_dir = Path(log_dir) if log_dir else state / "kubelet" / node_name
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Per-Pod folders (volumes, token, termination message), removed when the Pod's process ended. Not
        # under /tmp: a Pod may mount an emptyDir there.
        self.pods_dir = state / "kubelet" / node_name / "pods"
        self.workdir = Path(workdir) if workdir else REPO
        self.inherit_env = inherit_env
        self.extra_env = dict(extra_env or {})
        self.env_for = env_for   # per-Pod extra environment by Pod name (fault injection into one Pod)
        self.pullable = pullable   # which images "pull" (None: all); the others wait in ImagePullBackOff
        self.node_labels = scheduling.node_labels(node_name, node_labels)
        self.standin_image = standin_image   # a glob: such Pods run the driver stand-in
        self.containers = containers   # Pods run as containers of the image (tests/harness/containers.py)
        self._zygote: Zygote | None = None
        self._api_client = None
        self.v1: client.CoreV1Api | None = None
        self._setup: PodSetup | None = None
        self._runs: dict[str, PodRun] = {}   # by pod uid
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp = None
        self._synced = threading.Event()
        # Unbound Pods with claims, by uid (the newest copy): checked again, as kube-scheduler retries them.
        self._claim_waiters: dict[str, dict] = {}
        self._handling = threading.Lock()   # the watch's events vs. those retries
        self._retrier: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> "ProcessKubelet":
        self._api_client = config.new_client_from_config(config_file=self.kubeconfig)
        self.v1 = client.CoreV1Api(self._api_client)
        self._setup = PodSetup(self.v1, ApiServer.of(self._api_client.configuration), node_name=self.node_name,
                               workdir=self.workdir, inherit_env=self.inherit_env, extra_env=self.extra_env,
                               env_for=self.env_for, pullable=self._pullable(), container=self.containers is not None)
        if self.standin_image and self._zygote is None:
            self._zygote = Zygote(STANDIN, {**os.environ, **self.extra_env})
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch_loop, name=f"kubelet-{self.node_name}", daemon=True)
        self._thread.start()
        self._retrier = threading.Thread(target=self._retry_claims, name=f"kubelet-{self.node_name}-claims",
                                         daemon=True)
        self._retrier.start()
        if not self._synced.wait(30):
            log.warning("kubelet: the first pod list did not finish within 30s")
        return self

    def _pullable(self) -> "Callable[[str], bool] | None":
        if self.containers is None:
            return self.pullable
        # No registry: an image "pulls" when it is in the container storage (and the test's rule allows it).
        return lambda image: (self.pullable is None or self.pullable(image)) and self.containers.has(image)

    def stop(self, grace: float = 10.0) -> None:
        """Stop watching, terminate the processes still running, record their status."""
        self._stop.set()
        resp = self._resp
        if resp is not None:
            # Wake the watch thread: shutting the socket down ends its blocked read.
            sock = getattr(getattr(resp, "connection", None), "sock", None)
            try:
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread:
            self._thread.join(timeout=10)
        if self._retrier:
            self._retrier.join(timeout=10)
        with self._lock:
            runs = [r for r in self._runs.values() if not r.done.is_set()]
        for r in runs:   # those still starting see the stop and end without a process
            self._signal(r, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for r in runs:
            r.done.wait(max(0.0, deadline - time.monotonic()))
            if not r.done.is_set():
                self._signal(r, signal.SIGKILL)
        for r in runs:
            r.done.wait(10)
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None
        if self._api_client is not None:
            try:
                self._api_client.close()
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self) -> "ProcessKubelet":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- public helpers -----------------------------------------------------
    def log_path(self, namespace: str, name: str) -> Path:
        return self.log_dir / f"{namespace}_{name}.log"

    def pid(self, namespace: str, name: str) -> int | None:
        r = self._find(namespace, name)
        return r.proc.pid if r and r.proc and r.proc.poll() is None else None

    def kill9(self, namespace: str, name: str) -> bool:
        """SIGKILL the pod's process group (chaos); the Pod then ends Failed with exit code 137."""
        r = self._find(namespace, name)
        if r is None or r.proc is None or r.proc.poll() is not None:
            return False
        self._signal(r, signal.SIGKILL)
        return True

    def _find(self, namespace: str, name: str) -> PodRun | None:
        with self._lock:
            found = [r for r in self._runs.values() if r.namespace == namespace and r.name == name]
        # The newest incarnation of that name.
        return found[-1] if found else None

    # -- watching -----------------------------------------------------------
    def _list_kwargs(self) -> dict:
        kw = {}
        if self.label_selector:
            kw["label_selector"] = self.label_selector
        return kw

    def _list_call(self, **kw):
        if self.namespace:
            return self.v1.list_namespaced_pod(self.namespace, _preload_content=False, **kw)
        return self.v1.list_pod_for_all_namespaces(_preload_content=False, **kw)

    def _watch_loop(self) -> None:
        rv = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    resp = self._list_call(**self._list_kwargs())
                    data = json.loads(resp.data)
                    rv = data["metadata"]["resourceVersion"]
                    seen = set()
                    for pod in data.get("items", []):
                        seen.add(pod["metadata"]["uid"])
                        self._handle("ADDED", pod)
                    with self._lock:
                        lost = [r for uid, r in self._runs.items() if uid not in seen and not r.gone]
                    for r in lost:
                        self._on_gone(r)
                    with self._handling:
                        for uid in set(self._claim_waiters) - seen:
                            del self._claim_waiters[uid]
                    self._synced.set()
                resp = self._list_call(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                                       timeout_seconds=30, _request_timeout=(10, 60), **self._list_kwargs())
                self._resp = resp
                try:
                    for line in iter_resp_lines(resp):
                        if self._stop.is_set():
                            break
                        if not line or not line.strip():
                            continue
                        ev = json.loads(line)
                        obj = ev.get("object") or {}
                        if ev["type"] == "ERROR":
                            if obj.get("code") == 410:
                                rv = None  # expired: list again
                                break
                            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if ev["type"] != "BOOKMARK":
                            self._handle(ev["type"], obj)
                finally:
                    self._resp = None
                    resp.close()
                    resp.release_conn()
            except Exception as exc:  # noqa: BLE001 - keep the kubelet alive
                if self._stop.is_set():
                    break
                if isinstance(exc, ApiException) and exc.status == 410:
                    rv = None
                log.warning("kubelet: watch failed (%s); retrying", exc)
                self._stop.wait(1.0)

    # -- event handling -----------------------------------------------------
    def _mine(self, pod: dict) -> bool:
        spec = pod.get("spec", {})
        node = spec.get("nodeName")
        if node:
            return node == self.node_name
        return spec.get("schedulerName", DEFAULT_SCHEDULER) == DEFAULT_SCHEDULER

    def _retry_claims(self) -> None:
        """Every second, the unbound Pods that have claims again: a claim may exist or bind by now."""
        while not self._stop.wait(CLAIM_RETRY):
            with self._handling:
                waiting = list(self._claim_waiters.items())
            for uid, pod in waiting:
                with self._handling:
                    if self._claim_waiters.get(uid) is pod and not self._stop.is_set():
                        self._handle_event("MODIFIED", pod)

    def _handle(self, kind: str, pod: dict) -> None:
        with self._handling:
            self._handle_event(kind, pod)

    def _handle_event(self, kind: str, pod: dict) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        self._claim_waiters.pop(uid, None)
        with self._lock:
            run = self._runs.get(uid)
        try:
            if kind == "DELETED":
                if run is not None:
                    self._on_gone(run)
                return
            if run is not None:
                run.pod = pod
                if meta.get("deletionTimestamp") and not run.deleting:
                    self._on_delete(run)
                return
            if not self._mine(pod):
                return
            phase = pod.get("status", {}).get("phase")
            bound_here = pod["spec"].get("nodeName") == self.node_name
            if meta.get("deletionTimestamp"):
                if bound_here:
                    self._confirm_deletion(meta["namespace"], meta["name"], uid)
                return
            if phase in ("Succeeded", "Failed"):
                return
            fits = scheduling.fits(pod, self.node_labels, self.node_name)
            if bound_here:
                statuses = pod.get("status", {}).get("containerStatuses") or [{}]
                if "running" in (statuses[0].get("state") or {}):
                    # Its container ran here, but we hold no process: the harness was restarted.
                    self._mark_lost(pod)
                elif not fits:
                    self._reject(pod)
                else:
                    self._start_pod(pod, bind=False)   # created for this node, or never started
                return
            if scheduling.claim_names(pod):
                self._claim_waiters[uid] = pod   # checked again until bound (also after a failed API call)
            blocker = scheduling.unschedulable(pod, self.node_labels, self.node_name, self._setup.claim,
                                               self._setup.persistent_volume)
            if blocker is not None:
                if not scheduling.marked_unschedulable(pod, blocker):
                    self._unschedulable(pod, blocker)
                return
            self._start_pod(pod)
            self._claim_waiters.pop(uid, None)
        except Exception:  # noqa: BLE001
            log.exception("kubelet: handling pod %s/%s failed", meta.get("namespace"), meta.get("name"))

    def _unschedulable(self, pod: dict, message: str) -> None:
        """What kube-scheduler writes for a Pod no node fits: it is not bound."""
        meta = pod["metadata"]
        log.info("kubelet: pod %s/%s does not fit node %s: Unschedulable: %s", meta["namespace"], meta["name"],
                 self.node_name, message)
        self._patch_pod_status(meta["namespace"], meta["name"], meta["uid"], {
            "phase": "Pending", "conditions": [scheduling.unschedulable_condition(_now(), message)]})

    def _reject(self, pod: dict) -> None:
        """A kubelet's admission of a Pod that names this node but does not fit it: Failed, never run."""
        meta = pod["metadata"]
        log.info("kubelet: pod %s/%s rejected: %s", meta["namespace"], meta["name"], scheduling.REJECTED_MESSAGE)
        self._patch_pod_status(meta["namespace"], meta["name"], meta["uid"], {
            "phase": "Failed", "reason": scheduling.REJECTED_REASON, "message": scheduling.REJECTED_MESSAGE})

    def _start_pod(self, pod: dict, *, bind: bool = True) -> None:
        meta = pod["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        if bind:
            try:
                self.v1.create_namespaced_pod_binding(
                    name, ns, client.V1Binding(metadata=client.V1ObjectMeta(name=name, uid=uid),
                                               target=client.V1ObjectReference(kind="Node", name=self.node_name,
                                                                               api_version="v1")),
                    _preload_content=False)
            except ApiException as exc:
                if exc.status in (404, 409):
                    return  # gone, or another kubelet claimed it
                raise
        pod["spec"]["nodeName"] = self.node_name
        run = PodRun(ns, name, uid, pod, self.log_path(ns, name), self.pods_dir / uid)
        with self._lock:
            self._runs[uid] = run
        self._patch_status(run, {
            "phase": "Pending",
            "hostIP": "127.0.0.1",
            "conditions": self._conditions(ready=False, initialized=False),
            "containerStatuses": [self._container_status(run, {"waiting": {"reason": "ContainerCreating"}},
                                                         ready=False)],
        })
        # Preparing may wait (a volume's ConfigMap that does not exist yet): not on the watch thread.
        threading.Thread(target=self._launch, args=(run,), name=f"start-{ns}-{name}", daemon=True).start()

    def _launch(self, run: PodRun) -> None:
        try:
            self._launch_process(run)
        except Exception as exc:  # noqa: BLE001 - keep the kubelet alive; the pod fails
            log.exception("kubelet: starting pod %s/%s failed", run.namespace, run.name)
            if not run.done.is_set() and run.proc is None:
                self._finish(run, exit_code=128, reason="StartError", message=str(exc)[:MAX_MESSAGE])

    def _launch_process(self, run: PodRun) -> None:
        ns, name, uid, pod = run.namespace, run.name, run.uid, run.pod
        waiting_for = None
        shown = ("ContainerCreating", None)   # the container's waiting reason and message, as last written
        while True:
            if run.deleting or run.gone or self._stop.is_set():
                self._never_started(run)
                return
            try:
                run.pod_dir.mkdir(parents=True, exist_ok=True)
                spec = self._setup.prepare(pod, run.pod_dir, run.message_path)
                break
            except NotYet as exc:
                # As a kubelet retries: a volume whose ConfigMap/Secret does not exist yet (Spark creates its
                # executor ConfigMap after the first executor Pods), an image that does not pull, an env
                # Secret/ConfigMap or key that does not exist. The Pod stays Pending, its container waiting.
                if str(exc) != waiting_for:
                    waiting_for = str(exc)
                    log.info("kubelet: pod %s/%s waits: %s", ns, name, exc)
                    with open(run.log_path, "ab") as out:
                        out.write(f"--- {_now()} process kubelet: waiting: {exc}\n".encode())
                state = (exc.reason, exc.message)
                if isinstance(exc, ImagePullError) and shown[0] in ("ErrImagePull", "ImagePullBackOff"):
                    state = ("ImagePullBackOff", f'Back-off pulling image "{exc.image}"')
                if state != shown:
                    shown = state
                    waiting = {"reason": state[0], **({"message": state[1]} if state[1] else {})}
                    self._patch_status(run, {"phase": "Pending", "conditions": self._conditions(ready=False),
                                             "containerStatuses": [self._container_status(
                                                 run, {"waiting": waiting}, ready=False)]})
                self._stop.wait(exc.retry)
            except Exception as exc:  # noqa: BLE001 - a bad spec fails the pod, like a kubelet would
                log.warning("kubelet: pod %s/%s cannot start: %s", ns, name, exc)
                self._finish(run, exit_code=128, reason="CreateContainerError", message=str(exc)[:MAX_MESSAGE])
                return
        if self.containers is not None:
            self._launch_container(run, spec)
            return
        argv, env, cwd = spec.argv, spec.env, spec.cwd
        standin = self.standin_image and fnmatch.fnmatchcase(self._container(pod).get("image", ""), self.standin_image)
        stood_in: list[str] = []
        if standin:
            # The Pod's own command line (its ``command`` and ``args``), not the image's entrypoint before them.
            c = self._container(pod)
            stood_in = [*(c.get("command") or []), *(c.get("args") or [])]
            if stood_in and PYTHON_NAMES.match(stood_in[0]):
                stood_in[0] = sys.executable
            argv = [sys.executable, "-m", STANDIN, *stood_in]
        run.message_path.write_text("")
        with open(run.log_path, "ab") as out:
            for note in spec.notes:
                out.write(f"--- {note}\n".encode())
            mounts = "".join(f"; {m.target} ({m.source}{', ro' if m.read_only else ''})" for m in spec.mounts)
            root = "; root filesystem read-only" if spec.read_only_root else ""
            out.write(f"--- {_now()} starting {argv!r} in {cwd}{mounts}{root}\n".encode())
            out.flush()
            with run.lock:
                if run.deleting or run.gone or self._stop.is_set():
                    started = False
                else:
                    started = True
                    try:
                        mounts = None   # the shell steps that make the Pod's mounts, for a forked stand-in
                        if spec.in_namespace():
                            run.mount_points = host_mount_points(spec.mounts)
                            MOUNT_POINTS.acquire(run.mount_points, uid)
                            mounts = namespaced_argv(["true"], spec.mounts, read_only_root=spec.read_only_root,
                                                     writable=(str(self.state_dir),))
                            mounts = mounts[mounts.index("-c") - 1:]
                            argv = namespaced_argv(argv, spec.mounts, cwd=cwd, read_only_root=spec.read_only_root,
                                                   writable=(str(self.state_dir),))
                        if standin and (mounts is None or os.geteuid() == 0):
                            run.proc = self._zygote.spawn(stood_in, env, cwd, run.log_path, mounts=mounts)
                        else:
                            cwd = str(run.pod_dir) if mounts else cwd   # the namespace's shell enters the Pod's cwd
                            run.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                        stdin=subprocess.DEVNULL, start_new_session=True)
                    except OSError as exc:
                        error = exc
                        started = None
        if started is False:
            self._never_started(run)
            return
        if started is None:
            self._finish(run, exit_code=128, reason="StartError", message=str(error)[:MAX_MESSAGE])
            return
        self._running(run)

    def _launch_container(self, run: PodRun, spec) -> None:
        """The Pod's container with podman (tests/harness/containers.py); the `podman run` client is the process
        the kubelet waits for and signals."""
        argv = self.containers.run_argv(run.pod, spec, run.message_path)
        with open(run.log_path, "ab") as out:
            for note in spec.notes:
                out.write(f"--- {note}\n".encode())
            # The env's values stay out of the log (Secrets reach containers that way).
            shown = [a.split("=", 1)[0] + "=..." if prev == "--env" else a for prev, a in zip(["", *argv], argv)]
            out.write(f"--- {_now()} starting container: {' '.join(shown)}\n".encode())
            out.flush()
            with run.lock:
                if run.deleting or run.gone or self._stop.is_set():
                    run_it = False
                else:
                    run_it = True
                    run.proc = subprocess.Popen(argv, cwd=run.pod_dir, env=self.containers.env, stdout=out,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True)
        if not run_it:
            self._never_started(run)
            return
        self._running(run)

    def _running(self, run: PodRun) -> None:
        ns, name = run.namespace, run.name
        run.started_at = _now()
        log.info("kubelet: started pod %s/%s as pid %s", ns, name, run.proc.pid)
        self._patch_status(run, {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": pod_ip(run.pod),
            "podIPs": [{"ip": pod_ip(run.pod)}],
            "startTime": run.started_at,
            "conditions": self._conditions(ready=True),
            "containerStatuses": [self._container_status(
                run, {"running": {"startedAt": run.started_at}}, ready=True)],
        })
        run.waiter = threading.Thread(target=self._wait, args=(run,), name=f"pod-{ns}-{name}", daemon=True)
        run.waiter.start()
        # Deleted while we were starting it (the watch thread may not have handled that event yet)?
        if run.pod["metadata"].get("deletionTimestamp") and not run.deleting:
            self._on_delete(run)

    def _never_started(self, run: PodRun) -> None:
        """Deleted, gone or stopped before its process started: what a kubelet reports for such a container."""
        self._finish(run, exit_code=137, reason="ContainerStatusUnknown",
                     message="The container could not be located when the pod was terminated")

    def _wait(self, run: PodRun) -> None:
        rc = run.proc.wait()
        if self.containers is not None:
            self.containers.remove(run.pod)   # if the podman client died before its container (--rm otherwise)
        # The container is gone with its main process: like a container runtime, end what it left behind.
        try:
            os.killpg(run.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if run.kill_timer:
            run.kill_timer.cancel()
        exit_code = rc if rc >= 0 else 128 - rc
        reason = "Completed" if rc == 0 else "Error"
        message = ""
        try:
            message = run.message_path.read_text(errors="replace")[:MAX_MESSAGE]
        except OSError:
            pass
        policy = self._container(run.pod).get("terminationMessagePolicy", "File")
        if not message.strip() and rc != 0 and policy == "FallbackToLogsOnError":
            try:
                lines = run.log_path.read_text(errors="replace").splitlines()[-80:]
                message = "\n".join(lines)[-2048:]
            except OSError:
                pass
        log.info("kubelet: pod %s/%s exited with %s", run.namespace, run.name, exit_code)
        self._finish(run, exit_code=exit_code, reason=reason, message=message,
                     signal_no=-rc if rc < 0 else None)

    def _finish(self, run: PodRun, *, exit_code: int, reason: str, message: str = "",
                signal_no: int | None = None) -> None:
        try:
            if not run.gone:
                term = {"exitCode": exit_code, "reason": reason, "startedAt": run.started_at or _now(),
                        "finishedAt": _now()}
                if message:
                    term["message"] = message
                if signal_no:
                    term["signal"] = signal_no
                self._patch_status(run, {
                    "phase": "Succeeded" if exit_code == 0 else "Failed",
                    "conditions": self._conditions(ready=False),
                    "containerStatuses": [self._container_status(
                        run, {"running": None, "waiting": None, "terminated": term}, ready=False)],
                })
                if run.deleting:
                    self._confirm_deletion(run.namespace, run.name, run.uid)
        finally:
            run.done.set()
            if run.mount_points:
                try:
                    MOUNT_POINTS.release(run.uid)
                except OSError as exc:
                    log.warning("kubelet: releasing the mount points of %s/%s failed: %s", run.namespace,
                                run.name, exc)
            remove_pod_dir(run.pod_dir)

    def _on_delete(self, run: PodRun) -> None:
        with run.lock:
            run.deleting = True
        if run.proc is None:
            if run.done.is_set():
                self._confirm_deletion(run.namespace, run.name, run.uid)
            return   # still starting: the launcher sees `deleting` and ends the Pod without a process
        if run.proc.poll() is not None and run.done.is_set():
            self._confirm_deletion(run.namespace, run.name, run.uid)
            return
        meta, spec = run.pod["metadata"], run.pod["spec"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        log.info("kubelet: pod %s/%s deleted: SIGTERM, SIGKILL in %ss", run.namespace, run.name, grace)
        self._signal(run, signal.SIGTERM)
        run.kill_timer = threading.Timer(max(float(grace), 0.0), self._signal, args=(run, signal.SIGKILL))
        run.kill_timer.daemon = True
        run.kill_timer.start()

    def _on_gone(self, run: PodRun) -> None:
        with run.lock:
            run.gone = True
        if run.proc is not None and run.proc.poll() is None and not run.deleting:
            run.deleting = True
            grace = run.pod["spec"].get("terminationGracePeriodSeconds", 30)
            self._signal(run, signal.SIGTERM)
            run.kill_timer = threading.Timer(max(float(grace), 0.0), self._signal, args=(run, signal.SIGKILL))
            run.kill_timer.daemon = True
            run.kill_timer.start()
        with self._lock:
            if run.done.is_set():
                self._runs.pop(run.uid, None)
        # Otherwise it is dropped from _runs once it ended, by the next list.

    def _signal(self, run: PodRun, sig: int) -> None:
        """SIGTERM goes to the main process only (PID 1 of a container); SIGKILL takes the whole group."""
        if run.proc is None or run.proc.poll() is not None:
            return
        try:
            if sig == signal.SIGKILL and self.containers is not None:
                self.containers.kill(run.pod)   # the container's processes are not the client's children
            if sig == signal.SIGKILL:
                # Every process of the Pod, as a container runtime kills a container: PySpark's daemon and
                # workers live in a process group of their own, which a group kill would miss.
                kill_tree(descendants(run.proc.pid), {run.proc.pid})
            else:
                os.kill(run.proc.pid, sig)
        except ProcessLookupError:
            pass

    def _confirm_deletion(self, ns: str, name: str, uid: str) -> None:
        try:
            self.v1.delete_namespaced_pod(
                name, ns, body=client.V1DeleteOptions(grace_period_seconds=0,
                                                      preconditions=client.V1Preconditions(uid=uid)),
                _preload_content=False)
        except ApiException as exc:
            if exc.status not in (404, 409):
                log.warning("kubelet: confirming deletion of %s/%s failed: %s", ns, name, exc)

    def _mark_lost(self, pod: dict) -> None:
        meta = pod["metadata"]
        run = PodRun(meta["namespace"], meta["name"], meta["uid"], pod, self.log_path(meta["namespace"], meta["name"]),
                     self.pods_dir / meta["uid"])
        statuses = pod.get("status", {}).get("containerStatuses") or [{}]
        run.started_at = ((statuses[0].get("state") or {}).get("running") or {}).get("startedAt", "")
        self._finish(run, exit_code=137, reason="ProcessLost",
                     message=f"the process kubelet {self.node_name} restarted and lost this pod's process")

    @staticmethod
    def _container(pod: dict) -> dict:
        return container_of(pod)

    # -- status -------------------------------------------------------------
    def _container_status(self, run: PodRun, state: dict, *, ready: bool) -> dict:
        c = self._container(run.pod)
        status = {"name": c.get("name", "main"), "image": c.get("image", ""), "imageID": "",
                  "ready": ready, "restartCount": 0, "started": "running" in state and bool(state["running"]),
                  "state": state}
        if run.proc is not None:
            status["containerID"] = (f"podman://{self.containers.name_of(run.pod)}" if self.containers is not None
                                     else f"process://{run.proc.pid}")
        return status

    @staticmethod
    def _conditions(*, ready: bool, initialized: bool = True) -> list[dict]:
        now = _now()
        def cond(t: str, ok: bool) -> dict:
            return {"type": t, "status": "True" if ok else "False", "lastTransitionTime": now}
        return [cond("PodScheduled", True), cond("Initialized", initialized), cond("ContainersReady", ready),
                cond("Ready", ready)]

    def _patch_status(self, run: PodRun, status: dict) -> None:
        self._patch_pod_status(run.namespace, run.name, run.uid, status)

    def _patch_pod_status(self, ns: str, name: str, uid: str, status: dict) -> None:
        body = {"metadata": {"uid": uid}, "status": status}
        try:
            self.v1.patch_namespaced_pod_status(name, ns, body, _content_type=MERGE_PATCH, _preload_content=False)
        except ApiException as exc:
            if exc.status in (404, 409):
                return  # the pod is gone (or replaced by a new one of the same name)
            log.warning("kubelet: status update of %s/%s failed: %s", ns, name, exc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.harness.kubelet", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    ap.add_argument("--namespace", "-n", help="only pods of this namespace (default: all)")
    ap.add_argument("--selector", "-l", help="only pods matching this label selector")
    ap.add_argument("--node-name", default=DEFAULT_NODE)
    ap.add_argument("--log-dir", help="per-pod log files (default .stack/kubelet/<node-name>)")
    ap.add_argument("--node-label", action="append", default=[], metavar="KEY=VALUE",
                    help="a label of the node, for nodeSelectors (repeatable)")
    ap.add_argument("--unpullable", action="append", default=[], metavar="GLOB",
                    help="images matching this pattern fail to pull: ImagePullBackOff (repeatable)")
    ap.add_argument("--standin-image", metavar="GLOB",
                    help="Pods of images matching this pattern run the driver stand-in (tests/harness/standin.py)")
    args = ap.parse_args(argv)
    bad = [x for x in args.node_label if "=" not in x]
    if bad:
        ap.error(f"--node-label takes KEY=VALUE, not {bad[0]!r}")
    labels = dict(x.split("=", 1) for x in args.node_label)
    refused = list(args.unpullable)
    pullable = (lambda image: not any(fnmatch.fnmatchcase(image, g) for g in refused)) if refused else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    kubelet = ProcessKubelet(args.kubeconfig, namespace=args.namespace, label_selector=args.selector,
                             node_name=args.node_name, log_dir=args.log_dir, pullable=pullable,
                             node_labels=labels, standin_image=args.standin_image)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    kubelet.start()
    log.info("process kubelet %s watching pods (namespace=%s, selector=%s); logs in %s",
             args.node_name, args.namespace or "*", args.selector or "-", kubelet.log_dir)
    stopping.wait()
    kubelet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
