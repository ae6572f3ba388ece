"""What the node part (:mod:`eos_stack.node`) writes: each node's layout and names, containerd's configuration,
the kubelet's configuration, the CNI network, and the pause image as an OCI archive. Pure functions of their
arguments (no daemons, no host changes): unit-tested in ``tests/operator/test_node_config.py``.

Names that the host sees (bridge interface, cgroup root) carry a short hash of the state folder, so two
worktrees' stacks on one machine do not share them; the Pod CIDR is derived from it too.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

NODES = (1, 2)
CLUSTER_DOMAIN = "cluster.local"
PAUSE_IMAGE = "localhost/eos-pause:1.0"
CNI_BIN_DIR = "/usr/lib/cni"        # Debian's containernetworking-plugins
RUNC = "/usr/sbin/runc"             # Debian's runc
# The kubelet's cgroup v1 controllers (cgroupfs driver): the cgroup root must exist in each mounted one.
CGROUP_V1 = ("cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer", "blkio", "hugetlb", "systemd")
# The real kube-scheduler has one profile, under a name of its own, and the real nodes carry a taint, so no Pod
# lands on them that does not ask for them (the stack's API server is shared by several tests and, once, by a
# test node that bound default-scheduler Pods: the process kubelet, since retired; KWOK's fake Nodes take their
# own Pods the same way, kwok.pod_template). A Pod for the real nodes gets both from ``placement()``.
SCHEDULER_NAME = "eos-real-nodes"
TAINT = {"key": "eos.local/real-node", "value": "true", "effect": "NoSchedule"}


def placement() -> dict:
    """The Pod spec fields that put a Pod on the real nodes: their scheduler and the toleration of their taint."""
    return {"schedulerName": SCHEDULER_NAME,
            "tolerations": [{"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"],
                             "effect": TAINT["effect"]}]}


def scheduler_config(kubeconfig: Path) -> dict:
    """KubeSchedulerConfiguration (v1): one profile, ``SCHEDULER_NAME``; no leader election (one scheduler)."""
    return {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": SCHEDULER_NAME}]}

PAUSE_C = r"""/* The Pod sandbox's process (eos_stack.node): holds the Pod's namespaces, reaps orphans, stops on a signal. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stop;
    sigaction(SIGINT, &sa, 0);
    sigaction(SIGTERM, &sa, 0);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, 0);
    for (;;) pause();
}
"""


@dataclass(frozen=True)
class NodeLayout:
    """One node: its name, folders, host-visible names and addresses."""
    index: int
    home: Path                 # <state>/node/n<index>
    tag: str                   # 4 hex digits of the state folder's hash

    @property
    def name(self) -> str:
        return f"eos-node-{self.index}"

    @property
    def subnet_octet(self) -> int:
        return (int(self.tag, 16) % 100) * 2 + self.index      # 1..200, this stack's nodes side by side

    @property
    def pod_cidr(self) -> str:
        return f"10.244.{self.subnet_octet}.0/24"

    @property
    def node_ip(self) -> str:
        """The bridge's own (gateway) address: private, on this machine only, reachable from the node's Pods."""
        return f"10.244.{self.subnet_octet}.1"

    @property
    def services_ip(self) -> str:
        """The stack's address for Pods (services_ip): the same for every node of this stack."""
        return services_ip_of(self.tag)

    @property
    def bridge(self) -> str:
        return f"eos{self.tag}n{self.index}"                    # <= 15 characters (IFNAMSIZ)

    @property
    def cgroup_root(self) -> str:
        return f"/eos-{self.tag}-n{self.index}"

    @property
    def socket(self) -> Path:
        return self.home / "containerd.sock"

    @property
    def containerd_root(self) -> Path:
        return self.home / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.home / "containerd" / "state"

    @property
    def registry_hosts_dir(self) -> Path:
        """containerd's ``config_path``: one folder per registry host with its ``hosts.toml``."""
        return self.home / "certs.d"

    @property
    def kubelet_root(self) -> Path:
        return self.home / "kubelet"

    @property
    def cni_conf_dir(self) -> Path:
        return self.home / "cni" / "net.d"


def stack_tag(state: Path) -> str:
    return hashlib.sha256(str(Path(state).resolve()).encode()).hexdigest()[:4]


# -- the stack's services as Pods reach them ---------------------------------------------------------------
def services_ip_of(tag: str) -> str:
    """The address on this machine where Pods reach the stack's API server, Kafka and MinIO (which listen on
    127.0.0.1): ``10.243.<1..250>.1``, on an interface of its own (``services_iface``), a /32 that no route
    leads to from off the machine; each node's Pods get a route to it through their bridge's gateway."""
    return f"10.243.{int(tag, 16) % 250 + 1}.1"


def services_ip(state: Path) -> str:
    """The services address of the stack whose state folder is ``state``. A test's private server (its folder
    under ``<state>/private/``: tests/harness/private.py) belongs to that stack: a private broker advertises its
    listener for Pods there, and the test forwards that port to it (``tests.harness.private.Forwarder``)."""
    state = Path(state)
    if state.parent.name == "private":
        state = state.parent.parent
    return services_ip_of(stack_tag(state))


def services_iface(state: Path) -> str:
    return f"eos{stack_tag(state)}s"                             # <= 15 characters (IFNAMSIZ)


API_HOSTNAME = "kubernetes.default.svc"     # a name in the API server's certificate (kube.ensure_pki)


def host_aliases(state: Path) -> list[dict]:
    """A Pod's ``hostAliases`` so that ``https://kubernetes.default.svc:<port>`` reaches the API server at the
    services address and its certificate matches (it names no such address)."""
    return [{"ip": services_ip(state), "hostnames": [API_HOSTNAME]}]


def layouts(state: Path, count: int = len(NODES)) -> list[NodeLayout]:
    tag = stack_tag(state)
    return [NodeLayout(i, Path(state) / "node" / f"n{i}", tag) for i in NODES[:count]]


# -- containerd -------------------------------------------------------------------------------------------
def containerd_toml(n: NodeLayout) -> str:
    """containerd 1.6 (config version 2): its own root, state and sockets; the CRI plugin with runc (cgroupfs),
    the local pause image, no negative OOM score adjustments (runc cannot set them without CAP_SYS_RESOURCE
    here: "can't get final child's PID from pipe: EOF"), a streaming server on a free loopback port."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    q = json.dumps
    return f"""# Written by eos_stack.node for {n.name}.
version = 2
root = {q(str(n.containerd_root))}
state = {q(str(n.containerd_state))}
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = {q(str(n.socket))}

[ttrpc]
  address = {q(str(n.socket) + ".ttrpc")}

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {q(str(n.home / "containerd" / "opt"))}

[{cri}]
  sandbox_image = {q(PAUSE_IMAGE)}
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true

  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [{cri}.containerd.runtimes.runc.options]
        BinaryName = {q(RUNC)}
        SystemdCgroup = false

  [{cri}.cni]
    bin_dir = {q(CNI_BIN_DIR)}
    conf_dir = {q(str(n.cni_conf_dir))}
    max_conf_num = 1

  [{cri}.registry]
    config_path = {q(str(n.registry_hosts_dir))}
"""


def registry_hosts_toml(address: str) -> str:
    """containerd's ``hosts.toml`` for the stack's registry (``<registry_hosts_dir>/<address>/hosts.toml``): plain
    HTTP on loopback. containerd runs on this machine's network, so 127.0.0.1 is the registry, not a Pod's."""
    return f"""# Written by eos_stack.node: the stack's local registry (eos_stack.registry), plain HTTP.
server = "http://{address}"

[host."http://{address}"]
  capabilities = ["pull", "resolve"]
"""


# -- CNI ----------------------------------------------------------------------------------------------------
def cni_conflist(n: NodeLayout) -> dict:
    """A bridge with host-local addresses from the node's Pod CIDR. No masquerade and no default route: a Pod
    reaches its node (the gateway), the Pods on its bridge and, by a /32 route through the gateway, the stack's
    services address (services_ip_of), nothing off the machine."""
    return {
        "cniVersion": "0.4.0",
        "name": f"eos-{n.name}",
        "plugins": [{
            "type": "bridge",
            "bridge": n.bridge,
            "isGateway": True,
            "ipMasq": False,
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": n.pod_cidr, "gateway": n.node_ip}]],
                "routes": [{"dst": f"{n.services_ip}/32", "gw": n.node_ip}],
                "dataDir": str(n.home / "cni" / "ipam"),
            },
        }],
    }


# -- kubelet ------------------------------------------------------------------------------------------------
def kubelet_config(n: NodeLayout, *, ca: Path, serving_crt: Path, serving_key: Path, port: int,
                   healthz_port: int, resolv_conf: Path) -> dict:
    """KubeletConfiguration (v1beta1) for this machine kind: cgroups v1 (``failCgroupV1: false``) with the
    cgroupfs driver under the node's own cgroup root; client certificates of the stack CA and webhook
    authorization (the API server's ``kubectl logs``/``exec``); a serving certificate for the node IP."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": n.cgroup_root,
        "cgroupsPerQOS": True,
        "containerRuntimeEndpoint": f"unix://{n.socket}",
        "address": n.node_ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(serving_crt),
        "tlsPrivateKeyFile": str(serving_key),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [n.services_ip],          # CoreDNS (node_dns.py) listens there
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(resolv_conf),
        "podCIDR": n.pod_cidr,
        "podLogsDir": str(n.home / "pod-logs"),
        "volumePluginDir": str(n.home / "volume-plugins"),
        "maxPods": 40,
        "failSwapOn": False,
        "serializeImagePulls": False,
        "registerNode": True,
        "registerWithTaints": [TAINT],
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        # The nodes' "disk" is this machine's, shared with builds, caches and other stacks: how full it is says
        # nothing about the node. The kubelet counts usage as 1 - available/capacity of the whole disk, and CI's
        # machine runs near 95 % of it: with a percentage threshold the kubelet deleted the project's image from
        # a node between the stack's pull and the test's check, and tainted a node with DiskPressure under a
        # test (CI of 2026-11-29). So disk eviction only when the disk is really out of room, and no image GC
        # (the stack pulls what the Pods use, ``imagePullPolicy: Never`` needs it kept). Memory eviction stays
        # real (tests/e2e/test_real_node_oom.py).
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "512Mi", "imagefs.available": "512Mi",
                         "nodefs.inodesFree": "2%"},
        "imageGCHighThresholdPercent": 100,     # 100 turns image garbage collection off
        "imageGCLowThresholdPercent": 99,
    }


def kubelet_argv(binary: Path, n: NodeLayout, config: Path, kubeconfig: Path) -> list[str]:
    return [str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}", f"--root-dir={n.kubelet_root}",
            f"--cert-dir={n.home / 'kubelet-pki'}", f"--hostname-override={n.name}", f"--node-ip={n.node_ip}",
            f"--node-labels=eos.local/node={n.index}", "--v=1"]


def resolv_conf() -> str:
    """The Pods' upstream resolver (``dnsPolicy: Default``): none reachable from a Pod network that leaves no
    packet off the machine; ClusterFirst Pods (the default) get ``clusterDNS``, the stack's CoreDNS, instead."""
    return "# Written by eos_stack.node: no resolver is reachable from the Pod network.\nnameserver 127.0.0.1\n"


# -- the pause image as an OCI archive ---------------------------------------------------------------------
def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def pause_oci_archive(pause_binary: bytes, name: str = PAUSE_IMAGE) -> bytes:
    """An OCI image layout (as a tar) of one layer holding ``/pause``; ``io.containerd.image.name`` names it for
    ``ctr images import``. Runs as 65535, as Kubernetes' own pause image does. Reproducible: fixed mtimes."""
    layer_tar = io.BytesIO()
    with tarfile.open(fileobj=layer_tar, mode="w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo("pause")
        info.size, info.mode, info.mtime = len(pause_binary), 0o755, 0
        t.addfile(info, io.BytesIO(pause_binary))
    diff_id, layer_raw = _blob(layer_tar.getvalue())
    layer_digest, layer = _blob(gzip.compress(layer_raw, mtime=0))
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }, sort_keys=True).encode()
    config_digest, config = _blob(config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_digest,
                    "size": len(layer)}],
    }, sort_keys=True).encode()
    manifest_digest, manifest = _blob(manifest)
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
                       "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"},
                       "annotations": {"io.containerd.image.name": name,
                                       "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}],
    }, sort_keys=True).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
        files = [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)]
        files += [(f"blobs/sha256/{d.split(':')[1]}", b) for d, b in
                  ((layer_digest, layer), (config_digest, config), (manifest_digest, manifest))]
        for path, data in files:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()
