"""The Kubernetes API part: etcd, kube-apiserver and a minimal kube-controller-manager.

This is the envtest approach, made a little more real: the three control-plane
binaries (and kubectl) are built from the Go module proxy by the wrapper module
in ``stack/kube-build`` and cached by version under ``<cache>/bin/k8s-<ver>/``.
There is no kubelet and no scheduler; the controller-manager runs only the
``garbagecollector`` and ``namespace`` controllers, so owner references and
namespace deletion behave as in a cluster, and the PersistentVolume ones
(``persistentvolume-binder``, ``pvc-protection``, ``pv-protection``), so claims bind
to PersistentVolumes and are deleted as in a cluster, and the ``deployment`` and
``replicaset`` ones, so the chart's operator Deployment gets its Pod, the ``endpointslice`` one, so a
Service gets its EndpointSlices (what the real nodes' cluster DNS answers a headless Service's names from), and
the ``disruption`` one, so a PodDisruptionBudget's status (the disruptions it allows) is computed and the Eviction
API honours it. Pods are run by the real nodes (``node.py``, ``up node``); the tests' process kubelet, a
stand-in node that ran Pods as local processes, is retired.

Certificates (a CA, the apiserver's serving cert, the service-account key pair
and an admin client cert in ``system:masters``) are made with the ``openssl``
CLI under ``<state>/kube/pki`` and reused while they exist. The ports are
chosen once and kept in ``<state>/kube/ports.json``.
"""
from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
import urllib.request
from pathlib import Path

from .common import REPO, Stack, StackError, free_port, log, port_open, require_tool, run, wait_for
from .go_build import build_once, go_env, require_go, run_logged_build

K8S_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.5"  # pinned in stack/kube-build/go.mod
BUILD_DIR = REPO / "stack" / "kube-build"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
BUILD_PACKAGES = [
    "k8s.io/kubernetes/cmd/kube-apiserver",
    "k8s.io/kubernetes/cmd/kube-controller-manager",
    "k8s.io/kubernetes/cmd/kubectl",
    "go.etcd.io/etcd/server/v3",  # its binary comes out named "server"
]
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"
ENV_KEYS = ["KUBECONFIG", "KUBECTL", "KUBE_APISERVER"]
DAEMONS = ("kube-etcd", "kube-apiserver", "kube-controller-manager")


# -- paths ------------------------------------------------------------------
def bin_dir(st: Stack) -> Path:
    return st.cache / "bin" / f"k8s-{K8S_VERSION}"


def binary(st: Stack, name: str) -> Path:
    return bin_dir(st) / name


def kube_dir(st: Stack) -> Path:
    return st.dir("kube")


def pki_dir(st: Stack) -> Path:
    return st.dir("kube", "pki")


def admin_kubeconfig(st: Stack) -> Path:
    return kube_dir(st) / "admin.kubeconfig"


def version_ldflags() -> str:
    """Stamp the version into the binaries, as Kubernetes' own build does (hack/lib/version.sh).

    Without it they report ``v0.0.0-master+$Format:%H$``, which ``kubectl version``,
    helm's kubeVersion checks and other clients cannot parse.
    """
    major, minor = K8S_VERSION.lstrip("v").split(".")[:2]
    values = {"gitVersion": K8S_VERSION, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean",
              "buildDate": "1970-01-01T00:00:00Z"}  # fixed, so a rebuild is a cache hit
    return " ".join(f"-X {pkg}.{k}={v}" for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
                    for k, v in values.items())


def build_stamp() -> str:
    return json.dumps({"kubernetes": K8S_VERSION, "etcd": ETCD_VERSION, "ldflags": version_ldflags()},
                      sort_keys=True)


def stamp_file(st: Stack) -> Path:
    return bin_dir(st) / "BUILD"


def binaries_present(st: Stack) -> bool:
    try:
        stamped = stamp_file(st).read_text() == build_stamp()
    except OSError:
        stamped = False
    return stamped and all(os.access(binary(st, b), os.X_OK) for b in BINARIES)


def ensure_binaries(st: Stack) -> None:
    if binaries_present(st):
        return
    go = require_go()
    build_once(bin_dir(st), "kube: another `up` is building the binaries; waiting for it",
               lambda: binaries_present(st), lambda: _build(st, go, bin_dir(st)))


def _build(st: Stack, go: str, out: Path) -> None:
    log(f"kube: building kube-apiserver, kube-controller-manager, kubectl {K8S_VERSION} and etcd "
        f"{ETCD_VERSION} from source into {out}; this takes 15-40 minutes on a cold cache "
        f"(2 cores), a few minutes to relink with a warm Go cache")
    logfile = st.dir("logs") / "kube-build.log"
    # Build next to the final folder, then rename into place: renaming over a binary
    # that is running works, writing into it does not ("text file busy").
    staging = out.with_name(out.name + f".build-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        run_logged_build([go, "build", "-trimpath", "-ldflags", version_ldflags(), "-o", str(staging) + "/",
                          *BUILD_PACKAGES], what="kube: go build", cwd=BUILD_DIR, env=go_env(st), logfile=logfile)
        (staging / "server").replace(staging / "etcd")
        missing = [b for b in BINARIES if not os.access(staging / b, os.X_OK)]
        if missing:
            raise StackError(f"the kube build finished but {missing} are missing; see {logfile}")
        for b in BINARIES:
            (staging / b).replace(out / b)
        (out / "server").unlink(missing_ok=True)
        stamp_file(st).write_text(build_stamp())
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _binary_replaced(pid: int | None) -> bool:
    """True when the daemon runs a binary that a rebuild has since replaced on disk."""
    if pid is None:
        return False
    try:
        return os.readlink(f"/proc/{pid}/exe").endswith(" (deleted)")
    except OSError:
        return False


# -- certificates -----------------------------------------------------------
def _openssl() -> str:
    if shutil.which("openssl") is None and shutil.which("apt-get") and os.geteuid() == 0:
        log("kube: openssl not found, installing it with apt-get")
        subprocess.run(["apt-get", "install", "-y", "-q", "openssl"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return require_tool("openssl", "install the openssl command line tool (e.g. apt-get install openssl)")


def _subject(cn: str, orgs: list[str] | tuple[str, ...] = ()) -> str:
    def esc(s: str) -> str:
        return re.sub(r"([/+=,\\])", r"\\\1", s)
    return "/" + "/".join([*(f"O={esc(o)}" for o in orgs), f"CN={esc(cn)}"])


def _write_ext(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _issue_cert(st: Stack, name: str, cn: str, orgs: list[str] | tuple[str, ...], ext: list[str],
                out_dir: Path | None = None) -> tuple[Path, Path]:
    """An EC P-256 key and a certificate for it signed by the stack CA."""
    ossl = _openssl()
    pki = pki_dir(st)
    out_dir = out_dir or pki
    key, crt, csr = out_dir / f"{name}.key", out_dir / f"{name}.crt", out_dir / f"{name}.csr"
    extfile = _write_ext(out_dir / f"{name}.ext", ext)
    run([ossl, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(csr), "-subj", _subject(cn, orgs)], what=f"openssl key for {name}")
    run([ossl, "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
         "-set_serial", "0x" + secrets.token_hex(16), "-days", "3650", "-sha256",
         "-extfile", str(extfile), "-out", str(crt)], what=f"openssl certificate for {name}")
    csr.unlink(missing_ok=True)
    extfile.unlink(missing_ok=True)
    key.chmod(0o600)
    return crt, key


def ensure_pki(st: Stack) -> None:
    """Make the CA, serving cert, SA key pair and client certs once; reuse them afterwards."""
    pki = pki_dir(st)
    ossl = None
    if not ((pki / "ca.crt").exists() and (pki / "ca.key").exists()):
        ossl = _openssl()
        log("kube: creating a CA")
        run([ossl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"), "-days", "3650", "-sha256",
             "-subj", "/CN=eos-local-kubernetes-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"], what="openssl CA")
        (pki / "ca.key").chmod(0o600)
        # Everything signed by an older CA is now worthless.
        for stale in ("apiserver", "admin", "controller-manager", "apiserver-kubelet-client"):
            (pki / f"{stale}.crt").unlink(missing_ok=True)
    if not (pki / "apiserver.crt").exists():
        sans = ["IP:127.0.0.1", f"IP:{SERVICE_IP}", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local"]
        _issue_cert(st, "apiserver", "kube-apiserver", [], [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            "extendedKeyUsage=serverAuth",
            "subjectAltName=" + ",".join(sans),
        ])
    if not (pki / "admin.crt").exists():
        _issue_cert(st, "admin", "eos-admin", ["system:masters"], _client_ext())
    if not (pki / "controller-manager.crt").exists():
        # The GC and namespace controllers act on every resource type; with
        # --use-service-account-credentials=false they need a superuser identity.
        _issue_cert(st, "controller-manager", "system:kube-controller-manager", ["system:masters"],
                    _client_ext())
    if not (pki / "apiserver-kubelet-client.crt").exists():
        # The API server's identity towards kubelets (logs, exec, port-forward) when real nodes run (node.py).
        _issue_cert(st, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ["system:masters"],
                    _client_ext())
    if not ((pki / "sa.key").exists() and (pki / "sa.pub").exists()):
        ossl = ossl or _openssl()
        run([ossl, "genrsa", "-out", str(pki / "sa.key"), "2048"], what="openssl service-account key")
        run([ossl, "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")],
            what="openssl service-account public key")
        (pki / "sa.key").chmod(0o600)


def _client_ext() -> list[str]:
    return ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
            "extendedKeyUsage=clientAuth"]


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(st: Stack, path: Path, user: str, crt: Path, key: Path) -> Path:
    """A self-contained kubeconfig (certs embedded) for ``user`` against our apiserver."""
    server = apiserver_url(st)
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "eos-local", "cluster": {
            "server": server, "certificate-authority-data": _b64(pki_dir(st) / "ca.crt")}}],
        "users": [{"name": user, "user": {
            "client-certificate-data": _b64(crt), "client-key-data": _b64(key)}}],
        "contexts": [{"name": "eos-local", "context": {"cluster": "eos-local", "user": user}}],
        "current-context": "eos-local",
        "preferences": {},
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(cfg, indent=2) + "\n")  # JSON is YAML: every client reads it
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


def make_client_kubeconfig(st: Stack, user: str, groups: list[str] | tuple[str, ...] = (),
                           path: Path | str | None = None) -> Path:
    """Issue a client cert for ``user`` in ``groups`` signed by the stack CA and write a kubeconfig.

    Use it to run a component under a limited RBAC identity (bind roles to the
    user or one of its groups). The stack must have been brought up once (the CA
    and the ports exist). Returns the kubeconfig path (default
    ``<state>/kube/clients/<user>.kubeconfig``).
    """
    pki = pki_dir(st)
    if not (pki / "ca.key").exists() or not ports_file(st).exists():
        raise StackError("the kube part has not been set up yet: run `python -m eos_stack up kube` first")
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", user) + ("-" + "-".join(
        re.sub(r"[^A-Za-z0-9_.-]", "_", g) for g in groups) if groups else "")
    clients = st.dir("kube", "clients")
    crt, key = _issue_cert(st, safe, user, list(groups), _client_ext(), out_dir=clients)
    return write_kubeconfig(st, Path(path) if path else clients / f"{safe}.kubeconfig", user, crt, key)


# -- ports ------------------------------------------------------------------
PORT_NAMES = ("etcd_client", "etcd_peer", "apiserver", "controller_manager")


def ports_file(st: Stack) -> Path:
    return kube_dir(st) / "ports.json"


def load_ports(st: Stack) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in json.loads(ports_file(st).read_text()).items()}
    except (OSError, ValueError):
        return {}


def ensure_ports(st: Stack) -> dict[str, int]:
    """The ports chosen on the first ``up``; a port taken by a foreign program is replaced."""
    ports = load_ports(st)
    owner = {"etcd_client": "kube-etcd", "etcd_peer": "kube-etcd", "apiserver": "kube-apiserver",
             "controller_manager": "kube-controller-manager"}
    changed = False
    taken = set()
    for name in PORT_NAMES:
        port = ports.get(name)
        ours = st.running_pid(owner[name]) is not None
        if port is None or (not ours and port_open(port)) or port in taken:
            if port is not None:
                log(f"kube: port {port} ({name}) is used by another program; choosing a new one")
            port = free_port()
            while port in taken:
                port = free_port()
            ports[name] = port
            changed = True
        taken.add(port)
    if changed:
        ports_file(st).write_text(json.dumps(ports, indent=2) + "\n")
    return ports


def apiserver_url(st: Stack) -> str:
    port = load_ports(st).get("apiserver")
    if not port:
        raise StackError("the kube part has no apiserver port yet: run `python -m eos_stack up kube`")
    return f"https://127.0.0.1:{port}"


# -- health -----------------------------------------------------------------
def _ssl_ctx(st: Stack, client: bool = True) -> ssl.SSLContext:
    pki = pki_dir(st)
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if client:
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx


def apiserver_ready(st: Stack) -> bool:
    try:
        url = apiserver_url(st) + "/readyz"
        with urllib.request.urlopen(url, context=_ssl_ctx(st), timeout=3) as resp:
            return resp.status == 200 and resp.read().strip() == b"ok"
    except Exception:  # noqa: BLE001 - any failure means "not ready"
        return False


def etcd_healthy(st: Stack) -> bool:
    port = load_ports(st).get("etcd_client")
    if not port:
        return False
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3) as resp:
            return json.loads(resp.read()).get("health") == "true"
    except Exception:  # noqa: BLE001
        return False


def controller_manager_healthy(st: Stack) -> bool:
    port = load_ports(st).get("controller_manager")
    if not port:
        return False
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # its serving cert is self-signed, on loopback
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=3) as resp:
            return resp.status == 200
    except Exception:  # noqa: BLE001
        return False


def _fail_with_log(st: Stack, name: str):
    return lambda: f"--- last lines of {st.state / 'logs' / (name + '.log')} ---\n{st.log_tail(name)}"


def _wait_daemon(st: Stack, name: str, check, what: str, timeout: float) -> None:
    def probe():
        if st.running_pid(name) is None:
            raise StackError(f"{name} exited")
        return check()
    try:
        wait_for(probe, what, timeout, on_fail=_fail_with_log(st, name))
    except StackError:
        if st.running_pid(name) is None:
            raise StackError(f"{name} exited during start-up\n{_fail_with_log(st, name)()}") from None
        raise


# -- the part interface -----------------------------------------------------
def _reusable(st: Stack, name: str, healthy, argv: list[str] | None = None) -> bool:
    """A running, healthy daemon of ours that runs the current build (and, given ``argv``, these arguments)."""
    pid = st.running_pid(name)
    if pid is None:
        return False
    if _binary_replaced(pid):
        log(f"kube: {name} runs an older build of its binary; restarting it")
        return False
    if argv is not None and _argv(pid) not in (None, argv):
        log(f"kube: {name} runs with other arguments than this version starts it with; restarting it")
        return False
    return bool(healthy())


def _argv(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.decode(errors="replace").split("\0")[:-1] if raw else None


def up(st: Stack) -> dict[str, str]:
    ensure_binaries(st)
    ensure_pki(st)
    ports = ensure_ports(st)
    kd, pki = kube_dir(st), pki_dir(st)
    admin = write_kubeconfig(st, admin_kubeconfig(st), "eos-admin", pki / "admin.crt", pki / "admin.key")
    kcm_cfg = write_kubeconfig(st, kd / "controller-manager.kubeconfig", "system:kube-controller-manager",
                               pki / "controller-manager.crt", pki / "controller-manager.key")

    stale = [d for d in DAEMONS if _binary_replaced(st.running_pid(d))]
    if stale:
        # Stop all in order (an apiserver whose etcd is gone does not shut down cleanly).
        log(f"kube: {', '.join(stale)} run an older build of the binaries; restarting the control plane")
        down(st)

    # etcd
    etcd_data = st.dir("kube", "etcd")
    etcd_data.chmod(0o700)
    if _reusable(st, "kube-etcd", lambda: etcd_healthy(st)):
        log("kube: etcd already running")
    else:
        st.stop_daemon("kube-etcd")
        client = f"http://127.0.0.1:{ports['etcd_client']}"
        peer = f"http://127.0.0.1:{ports['etcd_peer']}"
        st.start_daemon("kube-etcd", [
            str(binary(st, "etcd")), "--name=eos", f"--data-dir={etcd_data}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=eos={peer}", "--initial-cluster-state=new",
            "--log-level=warn",
        ], marker=str(etcd_data))
        _wait_daemon(st, "kube-etcd", lambda: etcd_healthy(st), "etcd to be healthy", 60)

    # kube-apiserver
    url = apiserver_url(st)
    apiserver_argv = [
        str(binary(st, "kube-apiserver")),
        f"--etcd-servers=http://127.0.0.1:{ports['etcd_client']}",
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
        f"--secure-port={ports['apiserver']}",
        f"--cert-dir={st.dir('kube', 'apiserver-certs')}",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=RBAC",
        "--disable-admission-plugins=ServiceAccount",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        f"--service-account-issuer={url}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        # The endpoints of the "kubernetes" Service may not be loopback addresses:
        # without this the apiserver logs a failed reconcile every 10 seconds.
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        # Real nodes (node.py): reach a kubelet at its node IP, with a client certificate, checking its serving
        # certificate against the stack CA.
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        "--kubelet-preferred-address-types=InternalIP",
    ]
    if _reusable(st, "kube-apiserver", lambda: apiserver_ready(st), apiserver_argv):
        log("kube: kube-apiserver already running")
    else:
        st.stop_daemon("kube-apiserver")
        st.start_daemon("kube-apiserver", apiserver_argv, marker=str(pki / "apiserver.crt"))
        _wait_daemon(st, "kube-apiserver", lambda: apiserver_ready(st), "kube-apiserver /readyz", 180)

    # kube-controller-manager (owner-reference GC, namespace deletion, PersistentVolume binding and protection,
    # Deployments, EndpointSlices)
    kcm_argv = [
        str(binary(st, "kube-controller-manager")),
        f"--kubeconfig={kcm_cfg}",
        # deployment and replicaset: the chart's operator Deployment runs (tests/e2e: its Pod in a container).
        # endpointslice: a Service's EndpointSlices, where the real nodes' cluster DNS (node_dns.py) finds a
        # headless Service's Pods. disruption: PodDisruptionBudget status; without it the Eviction API refuses
        # every Pod a budget covers. nodelifecycle and taint-eviction-controller: a real node whose kubelet stops
        # posting its Lease is marked Unknown (NotReady) after the grace period below, its Pods not Ready, and the
        # Node tainted unreachable (NoSchedule: no new Pod lands there; NoExecute: the Pods' default 300 s
        # tolerations, then deleted), as on a cluster (docs/operations.md#node-loss).
        "--controllers=garbagecollector,namespace,persistentvolume-binder,pvc-protection,pv-protection,"
        "deployment,replicaset,endpointslice,disruption,nodelifecycle,taint-eviction-controller",
        # 20 s without a Lease renewal (the kubelets renew every 10 s) instead of 50 s, checked every 2 s: the
        # node-loss test waits less; the controller only reads the two Nodes' Leases.
        "--node-monitor-grace-period=20s", "--node-monitor-period=2s",
        "--use-service-account-credentials=false",
        "--leader-elect=false",
        "--bind-address=127.0.0.1", f"--secure-port={ports['controller_manager']}",
        f"--cert-dir={st.dir('kube', 'controller-manager-certs')}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--profiling=false",
    ]
    if _reusable(st, "kube-controller-manager", lambda: controller_manager_healthy(st), kcm_argv):
        log("kube: kube-controller-manager already running")
    else:
        st.stop_daemon("kube-controller-manager")
        st.start_daemon("kube-controller-manager", kcm_argv, marker=str(kcm_cfg))
        _wait_daemon(st, "kube-controller-manager", lambda: controller_manager_healthy(st),
                     "kube-controller-manager /healthz", 90)

    return {"KUBECONFIG": str(admin), "KUBECTL": str(binary(st, "kubectl")), "KUBE_APISERVER": url}


def down(st: Stack, purge: bool = False) -> None:
    for name in reversed(DAEMONS):
        st.stop_daemon(name, grace=30.0)
    if purge:
        path = st.state / "kube"
        if path.exists():
            log(f"kube: deleting {path}")
            shutil.rmtree(path)
        st.drop_env(ENV_KEYS)


def status(st: Stack) -> tuple[str, str]:
    if not binaries_present(st):
        return "missing", f"binaries not built yet in {bin_dir(st)} (`up kube` builds them)"
    pids = {name: st.running_pid(name) for name in DAEMONS}
    if not any(pids.values()):
        return "stopped", "not running"
    down_ = [n for n, p in pids.items() if p is None]
    if down_:
        return "stopped", f"not running: {', '.join(down_)}"
    if not apiserver_ready(st):
        return "stopped", f"kube-apiserver at {apiserver_url(st)} is not ready"
    return "running", f"{apiserver_url(st)} KUBECONFIG={admin_kubeconfig(st)}"
