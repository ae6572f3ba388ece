"""Pods in containers: the process kubelet's container runtime, ``podman run`` of the image ``make image`` built.

With a ``Containers`` runtime (``ProcessKubelet(containers=...)``) a Pod whose image is in the project's
container storage (``$EOS_CACHE/image``, :mod:`eos_stack.image`) runs as a container of that image, as a node's
container runtime would run it, so a test exercises what a cluster runs: the image's entrypoint (tini, then
``docker/entrypoint.sh``, whose ``executor`` branch starts Spark's executor backend), its ``ENV``, user, jars,
Python environment and ``WORKDIR``. A Pod whose image is not there waits in ``ErrImagePull`` /
``ImagePullBackOff``: there is no registry to pull from.

How a Pod maps onto ``podman run`` (runc, rootful, the project's storage and ``containers.conf``):

* **Network**: the host's (``--network host``), as every Pod here shares the loopback network; a Pod still gets
  its own 127.x.y.z address (``status.podIP``), which Spark binds to, and its hostname resolves to it in its
  ``/etc/hosts``, as a kubelet writes it (Spark's driver looks its own hostname up).
* **argv**: ``command`` replaces the image's ``ENTRYPOINT`` (``--entrypoint``, JSON) and ``args`` its ``CMD``, as
  Kubernetes does; without a ``command`` the image's entrypoint runs with the Pod's ``args`` (or its ``CMD``).
* **env**: only what Kubernetes gives a container (the Pod's ``env``/``envFrom``, ``HOSTNAME``,
  ``KUBERNETES_SERVICE_*``); the image's own ``ENV`` below it. Nothing of the test process's environment.
* **User**: ``securityContext.runAsUser``/``runAsGroup`` (container over Pod; else the image's ``USER``),
  ``fsGroup`` and ``supplementalGroups`` as extra groups; ``capabilities.drop: [ALL]`` and
  ``allowPrivilegeEscalation: false`` as ``--cap-drop`` and ``no-new-privileges``; ``readOnlyRootFilesystem``
  as ``--read-only`` without podman's extra tmpfs mounts (Kubernetes adds none: a Pod mounts its own).
* **Volumes** as the process kubelet prepares them (emptyDir, ConfigMap, Secret, hostPath, claims, the
  ServiceAccount token), bind-mounted at their ``mountPath``; the termination message file at
  ``terminationMessagePath`` (default ``/dev/termination-log``), read when the container ended.
* **Signals**: a Pod's deletion sends SIGTERM to ``podman run``, which passes it to the container's PID 1
  (``--sig-proxy``); SIGKILL (the grace period's end, ``kill9``) is ``podman kill --signal KILL``: a signal to
  the ``podman`` client alone would leave the container running under conmon. The container is removed when
  it ended (``--rm``, and ``podman rm --force`` if the client itself died).

Test tooling: it needs root and ``make image`` (the image, podman and runc); ``Containers.require()`` fails
naming what is missing.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

from eos_stack.common import Stack

from .pod_setup import Prepared, container_of, pod_ip

DEFAULT_MESSAGE_PATH = "/dev/termination-log"


class Containers:
    """``podman run`` of the project's container storage, for the process kubelet."""

    def __init__(self, st: Stack | None = None):
        from eos_stack import image
        self.st = st or Stack()
        self.env = image.engine_env(self.st)
        self._image = image
        self._present: dict[str, bool] = {}
        self._lock = threading.Lock()

    def require(self) -> str:
        """The image ``make image`` builds (the chart's and the CRD's default; ``EOS_TEST_IMAGE`` another build),
        or an error saying what to do."""
        missing = [t for t in ("podman", "runc") if not shutil.which(t)]
        if missing:
            raise RuntimeError(f"{', '.join(missing)} not installed: run `make image` as root (it installs them "
                               "and builds the image)")
        if os.geteuid() != 0:
            raise RuntimeError("Pods in containers need root (rootful podman, as `make image` builds)")
        name = self._image.image_under_test()
        if not self.has(name):
            raise RuntimeError(f"the image {name} is not in {self._image.home(self.st)}: run `make image`")
        return name

    def has(self, image: str) -> bool:
        """Whether ``image`` is in the storage (asked once per image: an absent one stays absent for a test)."""
        with self._lock:
            if image not in self._present:
                proc = subprocess.run(["podman", "image", "exists", image], env=self.env, capture_output=True,
                                      timeout=60)
                self._present[image] = proc.returncode == 0
            return self._present[image]

    @staticmethod
    def name_of(pod: dict) -> str:
        meta = pod["metadata"]
        return f"k8s_{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"[:120]

    def run_argv(self, pod: dict, spec: Prepared, message_file: Path) -> list[str]:
        c = container_of(pod)
        pod_sc = pod.get("spec", {}).get("securityContext") or {}
        sc = c.get("securityContext") or {}
        argv = [*self._image.run_argv(read_only=spec.read_only_root), "--name", self.name_of(pod),
                "--hostname", pod["metadata"]["name"], "--log-driver", "passthrough", "--sig-proxy=true",
                # A kubelet writes the Pod's /etc/hosts: its hostname resolves to its IP (Spark looks it up).
                "--add-host", f"{pod['metadata']['name']}:{pod_ip(pod)}"]
        user, group = sc.get("runAsUser", pod_sc.get("runAsUser")), sc.get("runAsGroup", pod_sc.get("runAsGroup"))
        if user is not None:
            argv += ["--user", f"{user}:{group}" if group is not None else str(user)]
        for gid in [pod_sc.get("fsGroup"), *(pod_sc.get("supplementalGroups") or [])]:
            if gid is not None:
                argv += ["--group-add", str(gid)]
        caps = sc.get("capabilities") or {}
        argv += [f"--cap-drop={cap}" for cap in caps.get("drop") or []]
        argv += [f"--cap-add={cap}" for cap in caps.get("add") or []]
        if sc.get("allowPrivilegeEscalation") is False:
            argv += ["--security-opt", "no-new-privileges"]
        for m in spec.mounts:
            argv += ["--volume", f"{m.source}:{m.target}:{'ro' if m.read_only else 'rw'}"]
        message_file.write_text("")
        message_file.chmod(0o666)   # the container's user writes its message there
        argv += ["--volume", f"{message_file}:{c.get('terminationMessagePath') or DEFAULT_MESSAGE_PATH}:rw"]
        for key, value in spec.env.items():
            argv += ["--env", f"{key}={value}"]
        if spec.cwd:
            argv += ["--workdir", spec.cwd]
        image, n = c.get("image") or "", len(c.get("command") or [])
        if n:   # `command` replaces the image's entrypoint; spec.argv is command + args
            return [*argv, "--entrypoint", json.dumps(spec.argv[:n]), image, *spec.argv[n:]]
        return [*argv, image, *spec.argv]

    def kill(self, pod: dict) -> None:
        """SIGKILL the container (its whole process tree: the container's PID namespace goes with PID 1)."""
        subprocess.run(["podman", "kill", "--signal", "KILL", self.name_of(pod)], env=self.env,
                       capture_output=True, timeout=60)

    def remove(self, pod: dict) -> None:
        subprocess.run(["podman", "rm", "--force", "--ignore", "--time", "0", self.name_of(pod)], env=self.env,
                       capture_output=True, timeout=120)
