"""What the process kubelet prepares before a Pod's container starts: argv, environment, volumes, token.

``PodSetup.prepare`` turns a Pod into a ``Prepared`` process spec, as a kubelet and a container runtime
would before starting the container, in a kubelet's order: volumes, then the image, then the container's
configuration (environment, argv). What is not there yet raises a ``NotYet`` whose ``reason`` (and
``message``) the kubelet shows as the container's waiting state until a later try succeeds:

* a volume's ConfigMap/Secret that does not exist, or a claim that does not exist or is not Bound (or its
  PersistentVolume that does not exist): ``ContainerCreating`` (no message);
* an image the kubelet's ``pullable`` refuses: ``ImagePullError`` (``ErrImagePull``; the kubelet shows
  ``ImagePullBackOff`` on later tries);
* an ``env``/``envFrom`` Secret or ConfigMap that does not exist, or a key it lacks (not ``optional``):
  ``ConfigError``, ``CreateContainerConfigError`` with a kubelet's message (``secret "NAME" not found``,
  ``couldn't find key KEY in ConfigMap NS/NAME``).

Anything else that cannot work (an unsupported volume kind or ``fieldRef``, a missing ``workingDir``) raises
``ValueError``: the Pod fails. What it prepares:

* **argv.** The first container's ``command`` + ``args`` (``$(VAR)`` expanded). A container without a
  ``command`` runs the image's entrypoint, ``docker/entrypoint.sh`` of this repository, with its ``args``
  (without args, the Dockerfile's ``CMD``).
* **Environment**, in a kubelet's order (later wins): the kubelet's own environment without the test's
  Kubernetes credentials (``KUBECONFIG``, ``KUBECTL``, ``KUBE_APISERVER``: a Pod only has its
  ServiceAccount); for an entrypoint container the image's ``ENV`` as this machine has it (``SPARK_HOME``,
  ``PYSPARK_PYTHON``, ``JAVA_HOME``, the stack's jar lists, the venv first on ``PATH``); the kubelet's
  ``extra_env``; ``HOSTNAME`` and ``KUBERNETES_SERVICE_HOST``/``_PORT``/``_PORT_HTTPS`` (the API server
  of the kubelet's kubeconfig); then the container's ``envFrom`` and ``env`` (``fieldRef``,
  ``secretKeyRef``, ``configMapKeyRef``; a missing object or key raises ``ConfigError``).
* **Volumes** (``Mount`` list): ``emptyDir`` is a fresh directory of the Pod, ``configMap`` and
  ``secret`` a directory of the Pod holding their keys as files (``items`` honoured, read-only; one that
  does not exist yet raises ``NotYet``: the kubelet tries again, as a real one does), ``hostPath`` the
  host's path, ``persistentVolumeClaim`` the ``hostPath`` or ``local.path`` of the claim's Bound
  PersistentVolume (read-only if the volume or the mount says so). Other kinds, of volume or of
  PersistentVolume, fail the Pod.
* **ServiceAccount token**, as a kubelet projects it: unless ``automountServiceAccountToken`` is false
  (Pod, else ServiceAccount), a TokenRequest for the Pod's ServiceAccount bound to the Pod, written with
  the API server's CA and the namespace to the files ``token``, ``ca.crt`` and ``namespace`` mounted
  read-only at ``/var/run/secrets/kubernetes.io/serviceaccount``. A missing ServiceAccount mounts nothing
  (a note says so at the top of the Pod's log). A Pod naming no ServiceAccount (no admission plugin fills
  the field here) gets ``default``'s token unbound: the API server binds only to the one a Pod names.

``namespaced_argv`` wraps the argv so the process runs in its own mount namespace with the mounts at their
``mountPath``, in its ``workingDir`` (which may be a mount), with the root filesystem read-only when the
container's ``securityContext.readOnlyRootFilesystem`` says so (the stack's state folder, the node's disks,
stays writable) (``unshare --mount`` without ``--fork`` and ``sh -c '... exec "$@"'`` both exec in place: the
Pod's process keeps the PID the kubelet signals). ``MOUNT_POINTS`` creates missing mount points on this
machine and removes them when no Pod of any process kubelet on it uses them.
"""
from __future__ import annotations

import base64
import fcntl
import importlib.util
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
DOCKERFILE = REPO / "Dockerfile"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
NODE_IP = "127.0.0.1"


def pod_ip(pod: dict) -> str:
    """Each Pod its own address, as a Pod network gives: one of 127.0.0.0/8 (all loopback on Linux), derived
    from the Pod's uid. Spark tells executors on one host apart by address (two executors at 127.0.0.1 would
    read each other's shuffle files from a disk they do not share)."""
    import hashlib
    h = int.from_bytes(hashlib.sha256(pod["metadata"]["uid"].encode()).digest()[:3], "big")
    return f"127.{1 + h % 250}.{(h >> 8) % 256}.{1 + (h >> 16) % 254}"
# What a Pod never inherits from the process that runs the kubelet: the test's Kubernetes credentials.
DROPPED_ENV = ("KUBECONFIG", "KUBECTL", "KUBE_APISERVER")
# The image's ENV that names files of the stack on this machine (the image has them at fixed paths).
PASSED_THROUGH = ("SPARK_JARS", "SPARK_S3_JARS", "EOS_SPARK_CDS_ARCHIVE")
# What a kubelet asks for: the API server extends a Pod-bound token of exactly this lifetime (to a year by
# default), so no refresh is needed for a test's Pods.
TOKEN_SECONDS = 3607
# The fields of a PersistentVolume's spec that are not its volume source.
PV_FIELDS = {"accessModes", "capacity", "claimRef", "mountOptions", "nodeAffinity", "persistentVolumeReclaimPolicy",
             "storageClassName", "volumeAttributesClassName", "volumeMode"}
PYTHON_NAMES = re.compile(r"^python(3(\.\d+)?)?$")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined names are replaced, ``$$`` escapes a ``$``."""
    def repl(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", repl, value)


class NotYet(Exception):
    """The Pod cannot start yet (a kubelet keeps trying, every ``retry`` seconds here): a volume's ConfigMap or
    Secret does not exist. The container waits with ``reason`` (and ``message``, if any)."""
    reason = "ContainerCreating"
    retry = 0.5

    @property
    def message(self) -> str | None:
        return None   # a kubelet gives ContainerCreating no message


class ConfigError(NotYet):
    """The container's env names a Secret/ConfigMap or key that does not exist (and is not optional)."""
    reason = "CreateContainerConfigError"
    retry = 1.0

    @property
    def message(self) -> str | None:
        return str(self)


class ImagePullError(NotYet):
    """The kubelet's ``pullable`` refuses the container's image."""
    reason = "ErrImagePull"
    retry = 2.0

    def __init__(self, image: str):
        self.image = image
        super().__init__(f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
                         f'failed to resolve reference "{image}": {image}: not found')

    @property
    def message(self) -> str | None:
        return str(self)


@dataclass(frozen=True)
class ApiServer:
    """How a Pod reaches the API server: its host and port, and the CA that signed its serving certificate."""
    host: str
    port: int
    ca: bytes | None

    @classmethod
    def of(cls, configuration) -> "ApiServer":
        url = urlsplit(configuration.host)
        ca = Path(configuration.ssl_ca_cert).read_bytes() if configuration.ssl_ca_cert else None
        return cls(url.hostname or "127.0.0.1", url.port or 443, ca)


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str   # the mountPath, symlinks of existing folders resolved
    read_only: bool


@dataclass
class Prepared:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    mounts: list[Mount] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # lines for the top of the Pod's log
    read_only_root: bool = False   # securityContext.readOnlyRootFilesystem

    def in_namespace(self) -> bool:
        """Whether the process needs a mount namespace: mounts or a read-only root. Inside it the process enters
        ``cwd`` after the mounts, so a working directory may be a mount."""
        return bool(self.mounts) or self.read_only_root


def container_of(pod: dict) -> dict:
    return (pod.get("spec", {}).get("containers") or [{}])[0]


def image_cmd() -> list[str]:
    """The Dockerfile's ``CMD`` (exec form): what the image runs when a container names neither command nor args."""
    cmds = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("CMD [")]
    if not cmds:
        raise ValueError(f"{DOCKERFILE} has no CMD in exec form")
    return json.loads(cmds[-1][len("CMD "):])


def image_env() -> dict[str, str]:
    """The image's ENV, with this machine's paths: Spark is the installed PySpark, Python is this venv."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("PySpark is not installed: SPARK_HOME cannot be set for the image's entrypoint")
    env = {"SPARK_HOME": str(Path(list(spec.submodule_search_locations)[0])),
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])}
    for key in ("JAVA_HOME", *PASSED_THROUGH):
        if os.environ.get(key):
            env[key] = os.environ[key]
    return env


def field_ref(pod: dict, path: str, node_name: str) -> str:
    meta, spec = pod["metadata"], pod.get("spec", {})
    simple = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
              "spec.nodeName": node_name, "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
              "status.podIP": pod_ip(pod), "status.podIPs": pod_ip(pod), "status.hostIP": NODE_IP,
              "status.hostIPs": NODE_IP}
    if path in simple:
        return simple[path]
    m = re.match(r"metadata\.(labels|annotations)\['(.+)'\]$", path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    raise ValueError(f"fieldRef {path} is not supported by the process kubelet")


class PodSetup:
    """Reads what a Pod refers to (Secrets, ConfigMaps, its ServiceAccount) and prepares its process."""

    def __init__(self, v1, api_server: ApiServer, *, node_name: str, workdir: Path, inherit_env: bool = True,
                 extra_env: dict[str, str] | None = None,
                 env_for: "Callable[[str], dict[str, str]] | None" = None,
                 pullable: "Callable[[str], bool] | None" = None, container: bool = False):
        self.v1, self.api_server, self.node_name, self.workdir = v1, api_server, node_name, workdir
        self.inherit_env, self.extra_env, self.env_for = inherit_env, dict(extra_env or {}), env_for
        self.pullable = pullable
        # For a container runtime (tests/harness/containers.py): the image brings its own ENV, entrypoint,
        # working directory and paths; the Pod's env is only what Kubernetes gives a container.
        self.container = container

    def prepare(self, pod: dict, pod_dir: Path, message_path: Path) -> Prepared:
        c = container_of(pod)
        meta = pod["metadata"]
        # A kubelet's order: the volumes are mounted, then the image is pulled, then the container is configured.
        mounts = self.volumes(pod, pod_dir)
        image = c.get("image") or ""
        if self.pullable is not None and not self.pullable(image):
            raise ImagePullError(image)
        ns, name = meta["namespace"], meta["name"]
        command, args = list(c.get("command") or []), list(c.get("args") or [])
        if self.container:
            env = {}
        elif self.inherit_env:
            env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
        else:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if not command and not self.container:
            env.update(image_env())
        env.update(self.extra_env)
        if self.env_for is not None:
            env.update(self.env_for(name) or {})
        env["HOSTNAME"] = name
        host, port = self.api_server.host, str(self.api_server.port)
        env.update({"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port,
                    "KUBERNETES_SERVICE_PORT_HTTPS": port})
        if (Path.home() / ".kube" / "config").exists() and "HOME" not in self.extra_env and not self.container:
            # A Kubernetes client would find the test's credentials there: the Pod gets a home of its own.
            env["HOME"] = str(pod_dir / "home")
            (pod_dir / "home").mkdir(parents=True, exist_ok=True)
        for src in c.get("envFrom") or []:
            prefix = src.get("prefix", "")
            if "configMapRef" in src:
                ref = src["configMapRef"]
                data = self.config_map(ns, ref["name"], ref.get("optional", False)) or {}
            else:
                ref = src.get("secretRef", {})
                data = self.secret(ns, ref.get("name", ""), ref.get("optional", False)) or {}
            for k, v in data.items():
                env[prefix + k] = v
        container_env: dict[str, str] = {}
        for item in c.get("env") or []:
            if "valueFrom" in item:
                value = self.value_from(pod, item["valueFrom"])
                if value is None:
                    continue
            else:
                value = expand(item.get("value", ""), {**env, **container_env})
            container_env[item["name"]] = value
        env.update(container_env)
        if env.get("SPARK_LOCAL_IP") == "0.0.0.0":
            # "Every address of the Pod" (the operator's driver with job.metrics): in a real Pod its own network
            # namespace, loopback and the Pod's IP; Pods here share the host's, so the Pod's own 127.x.y.z.
            env["SPARK_LOCAL_IP"] = pod_ip(pod)
        # Cluster mode's driver Service name: no cluster DNS answers it here, so the runtime gives executors the
        # driver's Pod IP (EOS_POD_IP) instead, as it does for an operator that sets no name.
        env.pop("EOS_DRIVER_HOST", None)
        notes: list[str] = []
        token = self.service_account(pod, pod_dir, notes)
        if token is not None and not any(m.target == token.target for m in mounts):
            mounts.append(token)
        read_only_root = bool((c.get("securityContext") or {}).get("readOnlyRootFilesystem"))
        if self.container:
            # The runtime's argv is the Pod's; the image's entrypoint and CMD apply where it names none, its
            # WORKDIR where the Pod names none; the termination message file is mounted at its path.
            argv = [expand(a, env) for a in command + args]
            return Prepared(argv, env, c.get("workingDir") or "", mounts, notes, read_only_root)
        env["EOS_TERMINATION_MESSAGE_PATH"] = str(message_path)
        if command:
            argv = [expand(a, env) for a in command + args]
            if PYTHON_NAMES.match(argv[0]):
                argv[0] = sys.executable
        else:
            entry = [str(ENTRYPOINT)] if os.access(ENTRYPOINT, os.X_OK) else ["bash", str(ENTRYPOINT)]
            argv = entry + ([expand(a, env) for a in args] if args else image_cmd())
        cwd = c.get("workingDir")
        if not cwd and not command:
            # The image's WORKDIR: a directory of the Pod's own. Spark's executors copy the jars they fetch
            # into it; the repository is no place for them.
            (pod_dir / "work").mkdir(parents=True, exist_ok=True)
            cwd = str(pod_dir / "work")
        cwd = cwd or str(self.workdir)
        in_mount = any(os.path.realpath(cwd) == m.target or os.path.realpath(cwd).startswith(m.target + "/")
                       for m in mounts)
        if not in_mount and not Path(cwd).is_dir():
            raise ValueError(f"workingDir {cwd} does not exist on this machine")
        return Prepared(argv, env, cwd, mounts, notes, read_only_root)

    # -- env sources --------------------------------------------------------
    def value_from(self, pod: dict, vf: dict) -> str | None:
        ns = pod["metadata"]["namespace"]
        if "secretKeyRef" in vf:
            ref = vf["secretKeyRef"]
            return self._key(self.secret(ns, ref["name"], ref.get("optional", False)), ref, "Secret", ns)
        if "configMapKeyRef" in vf:
            ref = vf["configMapKeyRef"]
            return self._key(self.config_map(ns, ref["name"], ref.get("optional", False)), ref, "ConfigMap", ns)
        if "fieldRef" in vf:
            return field_ref(pod, vf["fieldRef"]["fieldPath"], self.node_name)
        raise ValueError(f"valueFrom {sorted(vf)} is not supported by the process kubelet")

    @staticmethod
    def _key(data: dict | None, ref: dict, kind: str, ns: str) -> str | None:
        if data is None:
            return None  # optional and missing
        if ref["key"] not in data:
            if ref.get("optional", False):
                return None
            raise ConfigError(f"couldn't find key {ref['key']} in {kind} {ns}/{ref['name']}")
        return data[ref["key"]]

    def _read(self, call, ns: str, name: str, optional: bool, kind: str) -> dict | None:
        try:
            return json.loads(call(name, ns, _preload_content=False).data)
        except ApiException as exc:
            if exc.status == 404:
                if optional:
                    return None
                raise ConfigError(f'{kind.lower()} "{name}" not found') from None   # a kubelet's words
            raise

    def _secret_bytes(self, ns: str, name: str, optional: bool) -> dict[str, bytes] | None:
        obj = self._read(self.v1.read_namespaced_secret, ns, name, optional, "Secret")
        if obj is None:
            return None
        out = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        out.update({k: v.encode() for k, v in (obj.get("stringData") or {}).items()})
        return out

    def secret(self, ns: str, name: str, optional: bool) -> dict[str, str] | None:
        data = self._secret_bytes(ns, name, optional)
        return None if data is None else {k: v.decode() for k, v in data.items()}

    def _config_map_bytes(self, ns: str, name: str, optional: bool) -> dict[str, bytes] | None:
        obj = self._read(self.v1.read_namespaced_config_map, ns, name, optional, "ConfigMap")
        if obj is None:
            return None
        out = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
        out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        return out

    def config_map(self, ns: str, name: str, optional: bool) -> dict[str, str] | None:
        obj = self._read(self.v1.read_namespaced_config_map, ns, name, optional, "ConfigMap")
        return None if obj is None else dict(obj.get("data") or {})

    # -- claims ---------------------------------------------------------------
    def claim(self, ns: str, name: str) -> dict | None:
        """The PersistentVolumeClaim, or None if it does not exist."""
        return self._object(lambda: self.v1.read_namespaced_persistent_volume_claim(name, ns, _preload_content=False))

    def persistent_volume(self, name: str) -> dict | None:
        """The PersistentVolume, or None if it does not exist."""
        return self._object(lambda: self.v1.read_persistent_volume(name, _preload_content=False))

    @staticmethod
    def _object(call) -> dict | None:
        try:
            return json.loads(call().data)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def claim_path(self, ns: str, name: str) -> Path:
        """The host folder of a Bound claim's PersistentVolume, checked as a kubelet's volume manager does (its
        words in the ``NotYet``: the Pod waits in ContainerCreating until the claim is bound)."""
        what = f"error processing PVC {ns}/{name}"
        pvc = self.claim(ns, name)
        if pvc is None:
            raise NotYet(f'{what}: failed to fetch PVC from API server: persistentvolumeclaims "{name}" not found')
        if pvc["metadata"].get("deletionTimestamp") and \
                "kubernetes.io/pvc-protection" not in (pvc["metadata"].get("finalizers") or []):
            raise NotYet(f"{what}: PVC is being deleted")
        if (pvc.get("status") or {}).get("phase") != "Bound":
            raise NotYet(f"{what}: PVC is not bound")
        pv_name = (pvc.get("spec") or {}).get("volumeName")
        if not pv_name:
            raise NotYet(f"{what}: PVC has empty pvc.Spec.VolumeName")
        pv = self.persistent_volume(pv_name)
        if pv is None:
            raise NotYet(f'{what}: failed to fetch PV {pv_name} from API server: persistentvolumes "{pv_name}" '
                          'not found')
        spec = pv.get("spec") or {}
        ref_uid = (spec.get("claimRef") or {}).get("uid")
        if ref_uid != pvc["metadata"]["uid"]:
            raise NotYet(f"{what}: found PV object {pv_name} but its pv.Spec.ClaimRef.UID {ref_uid} does not point "
                         f"to claim.UID {pvc['metadata']['uid']}")
        if "hostPath" in spec:
            return _host_path(spec["hostPath"])
        if "local" in spec:
            path = Path(spec["local"]["path"])
            if not path.is_dir():
                raise ValueError(f"PersistentVolume {pv_name}: local path {path} does not exist")
            return path
        kinds = sorted(k for k in spec if k not in PV_FIELDS)
        raise ValueError(f"PersistentVolume {pv_name} ({', '.join(kinds) or 'no source'}) of claim {ns}/{name} is "
                         "not supported by the process kubelet")

    # -- volumes ------------------------------------------------------------
    def volumes(self, pod: dict, pod_dir: Path) -> list[Mount]:
        ns = pod["metadata"]["namespace"]
        volumes = {v["name"]: v for v in pod.get("spec", {}).get("volumes") or []}
        mounts: list[Mount] = []
        for vm in container_of(pod).get("volumeMounts") or []:
            vol = volumes.get(vm["name"])
            if vol is None:
                raise ValueError(f"volumeMount {vm['name']} names no volume of the Pod")
            if vm.get("subPath") or vm.get("subPathExpr"):
                raise ValueError(f"volumeMount {vm['name']}: subPath is not supported by the process kubelet")
            source = pod_dir / "volumes" / vm["name"]
            read_only = bool(vm.get("readOnly"))
            if "emptyDir" in vol:
                source.mkdir(parents=True, exist_ok=True)
                source.chmod(0o777)   # as a kubelet makes it: any user of the Pod writes there
            elif "configMap" in vol or "secret" in vol:
                src = vol.get("configMap") or vol["secret"]
                ref_name = src.get("name") or src.get("secretName", "")
                kind = "ConfigMap" if "configMap" in vol else "Secret"
                read = self._config_map_bytes if "configMap" in vol else self._secret_bytes
                data = read(ns, ref_name, True)
                if data is None and not src.get("optional"):
                    raise NotYet(f"{kind} {ns}/{ref_name} of volume {vm['name']} does not exist")
                _write_keys(source, data or {}, src.get("items"), src.get("defaultMode", 0o644),
                            f"{kind} {ref_name}")
                read_only = True   # as a kubelet mounts API data
            elif "hostPath" in vol:
                source = _host_path(vol["hostPath"])
            elif "persistentVolumeClaim" in vol:
                claim = vol["persistentVolumeClaim"]
                source = self.claim_path(ns, claim.get("claimName", ""))
                read_only = read_only or bool(claim.get("readOnly"))
            else:
                kinds = sorted(k for k in vol if k != "name")
                raise ValueError(f"volume {vm['name']} ({', '.join(kinds)}) is not supported by the process kubelet")
            mounts.append(Mount(source, self._target(vm["mountPath"]), read_only))
        return mounts

    def service_account(self, pod: dict, pod_dir: Path, notes: list[str]) -> Mount | None:
        """The projected ServiceAccount token of a kubelet: token, ca.crt and namespace, bound to the Pod."""
        meta, spec = pod["metadata"], pod.get("spec", {})
        ns, sa_name = meta["namespace"], spec.get("serviceAccountName") or "default"
        if spec.get("automountServiceAccountToken") is False:
            return None
        try:
            sa = json.loads(self.v1.read_namespaced_service_account(sa_name, ns, _preload_content=False).data)
        except ApiException as exc:
            if exc.status != 404:
                raise
            notes.append(f"process kubelet: ServiceAccount {ns}/{sa_name} does not exist; no token mounted at "
                         f"{SA_DIR}")
            return None
        if spec.get("automountServiceAccountToken") is None and sa.get("automountServiceAccountToken") is False:
            return None
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": [], "expirationSeconds": TOKEN_SECONDS,
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                            "uid": meta["uid"]}}}
        if not spec.get("serviceAccountName"):
            # Without the ServiceAccount admission plugin (off in the local stack) the field stays empty, and
            # the API server binds a token to a Pod only for the ServiceAccount the Pod names.
            del body["spec"]["boundObjectRef"]
            notes.append(f"process kubelet: the Pod names no ServiceAccount; the token of {ns}/default is not "
                         "bound to the Pod")
        resp = self.v1.create_namespaced_service_account_token(sa_name, ns, body, _preload_content=False)
        token = json.loads(resp.data)["status"]["token"]
        files = {"token": token.encode(), "namespace": ns.encode()}
        if self.api_server.ca is not None:
            files["ca.crt"] = self.api_server.ca
        source = pod_dir / "serviceaccount"
        _write_keys(source, files, None, 0o644, "token")
        return Mount(source, self._target(SA_DIR), True)

    def _target(self, mount_path: str) -> str:
        """Where a mount goes: as given in a container (its image's own symlinks apply there), else with this
        machine's symlinks resolved (``/var/run`` is ``/run`` here)."""
        return mount_path if self.container else os.path.realpath(mount_path)


def _host_path(src: dict) -> Path:
    """A ``hostPath`` (of a volume or a PersistentVolume): the folder, made for ``DirectoryOrCreate`` (or no type)."""
    source = Path(src["path"])
    if not source.exists():
        if src.get("type") not in ("DirectoryOrCreate", None, ""):
            raise ValueError(f"hostPath {source} does not exist")
        source.mkdir(parents=True, exist_ok=True)
    return source


def _write_keys(folder: Path, data: dict[str, bytes], items: list[dict] | None, default_mode: int,
                what: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if items:
        chosen = []
        for item in items:
            if item["key"] not in data:
                raise ValueError(f"{what} has no key {item['key']}")
            chosen.append((item["path"], data[item["key"]], item.get("mode", default_mode)))
    else:
        chosen = [(k, v, default_mode) for k, v in data.items()]
    for rel, value, mode in chosen:
        path = folder / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise ValueError(f"{what}: item path {rel} leaves the volume")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value)
        path.chmod(mode)


# -- mount namespace ----------------------------------------------------------
def namespaced_argv(argv: list[str], mounts: list[Mount], *, cwd: str | None = None, read_only_root: bool = False,
                    writable: tuple[str, ...] = ()) -> list[str]:
    """``argv`` in a mount namespace of its own with ``mounts`` at their targets, exec'd in place in ``cwd``.

    Mounts are made shallowest first (a mount inside another volume gets its mount point there, made in the
    namespace), then the read-only ones are remounted read-only. With ``read_only_root`` the root filesystem
    is remounted read-only too, as a container's with ``readOnlyRootFilesystem``: only the Pod's volumes and
    ``writable`` (the node's own disks: the stack's state folder, where the tests' local checkpoint folders
    live) stay writable, so a write to ``/tmp``, HOME or the image's folders fails.
    Not root: a user namespace maps this user to root, so the bind mounts are allowed."""
    steps = []
    for m in sorted(mounts, key=lambda m: m.target.count("/")):
        steps.append(f"{_tool('mkdir')} -p {shlex.quote(m.target)} && {_tool('mount')} --bind "
                     f"{shlex.quote(str(m.source))} {shlex.quote(m.target)}")
    if read_only_root:
        for path in writable:
            steps.append(f"{_tool('mount')} --bind {shlex.quote(path)} {shlex.quote(path)}")
        steps.append(f"{_tool('mount')} -o remount,bind,ro /")
    for m in mounts:
        if m.read_only:
            steps.append(f"{_tool('mount')} -o remount,bind,ro {shlex.quote(m.target)}")
    if cwd:
        steps.append(f"cd {shlex.quote(cwd)}")
    script = " && ".join(steps + ['exec "$@"'])
    unshare = [_tool("unshare"), "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare[1:1] = ["--user", "--map-root-user"]
    return [*unshare, _tool("sh"), "-c", script, "sh", *argv]


def _tool(name: str) -> str:
    """Absolute: the Pod's own PATH must not decide which mount runs."""
    return shutil.which(name, path=os.defpath + ":/usr/sbin:/sbin:/usr/bin:/bin") or shutil.which(name) or name


def host_mount_points(mounts: list[Mount]) -> list[str]:
    """The targets that are mount points on this machine's tree (not inside another of the Pod's mounts)."""
    out: list[str] = []
    for m in sorted(mounts, key=lambda m: m.target.count("/")):
        if not any(m.target.startswith(p.rstrip("/") + "/") for p in out if p != m.target):
            out.append(m.target)
    return sorted(set(out))


class MountPoints:
    """Mount points made on this machine for Pods' mountPaths (``/opt/spark/conf``, Spark's
    ``/var/data/spark-<uuid>``...), removed once no Pod uses them. Shared by every process kubelet on the
    machine through a locked registry file: removing a folder that is a mount point in another Pod's
    namespace would detach that Pod's mount. Users are ``<pid>:<pod uid>``; those of dead kubelets are
    dropped, so a crashed kubelet leaves folders behind at worst, never takes them from a running Pod."""

    def __init__(self, registry: Path):
        self.registry = registry

    @contextmanager
    def _locked(self):
        with open(self.registry.with_suffix(".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                data = json.loads(self.registry.read_text()) if self.registry.exists() else {}
            except ValueError:
                data = {}
            data.setdefault("created", [])
            users = data.setdefault("users", {})
            for path in list(users):
                users[path] = [u for u in users[path] if _alive(int(u.split(":", 1)[0]))]
                if not users[path]:
                    del users[path]
            yield data
            tmp = self.registry.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(self.registry)

    def acquire(self, paths: list[str], owner: str) -> None:
        user = f"{os.getpid()}:{owner}"
        with self._locked() as data:
            for path in paths:
                missing = []
                p = Path(path)
                while not p.exists() and p != p.parent:
                    missing.append(str(p))
                    p = p.parent
                for folder in reversed(missing):
                    os.mkdir(folder)
                    data["created"].append(folder)
                data["users"].setdefault(path, []).append(user)

    def release(self, owner: str) -> None:
        user = f"{os.getpid()}:{owner}"
        with self._locked() as data:
            users = data["users"]
            for path in list(users):
                users[path] = [u for u in users[path] if u != user]
                if not users[path]:
                    del users[path]
            in_use = [p.rstrip("/") + "/" for p in users]
            kept = []
            for folder in sorted(set(data["created"]), key=lambda f: -f.count("/")):
                if any(u.startswith(folder.rstrip("/") + "/") for u in in_use):
                    kept.append(folder)
                    continue
                try:
                    os.rmdir(folder)
                except FileNotFoundError:
                    pass
                except OSError:
                    kept.append(folder)   # something else put files there: it stays, and is tried again later
            data["created"] = kept


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


MOUNT_POINTS = MountPoints(Path(tempfile.gettempdir()) / f"eos-process-kubelet-mount-points-{os.geteuid()}.json")


def remove_pod_dir(pod_dir: Path) -> None:
    shutil.rmtree(pod_dir, ignore_errors=True)
