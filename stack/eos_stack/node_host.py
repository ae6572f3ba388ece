"""What the node part (:mod:`eos_stack.node`) changes on the host, and undoes: one bridge per node with its
gateway address, the nodes' cgroup folders, mounts left under a node's folder, and the iptables chains kubelets
make.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from .common import log, run
from .node_config import CGROUP_V1, NodeLayout


# -- host: bridge, cgroups, mounts ------------------------------------------------------------------------
def ensure_bridge(n: NodeLayout) -> None:
    if subprocess.run(["ip", "link", "show", n.bridge], capture_output=True).returncode != 0:
        run(["ip", "link", "add", "name", n.bridge, "type", "bridge"], what=f"create bridge {n.bridge}")
    addrs = run(["ip", "-o", "addr", "show", "dev", n.bridge], what="ip addr")
    if f" {n.node_ip}/" not in addrs:
        run(["ip", "addr", "add", f"{n.node_ip}/24", "dev", n.bridge], what=f"address {n.node_ip}")
    run(["ip", "link", "set", n.bridge, "up"], what=f"bridge {n.bridge} up")


def cgroup_dirs(n: NodeLayout) -> list[Path]:
    base = Path("/sys/fs/cgroup")
    return [base / c / n.cgroup_root.lstrip("/") for c in CGROUP_V1 if (base / c).is_dir()]


def ensure_cgroups(n: NodeLayout) -> None:
    for d in cgroup_dirs(n):
        d.mkdir(exist_ok=True)
        if d.parent.name == "cpuset":   # a new cpuset holds no CPUs until given its parent's
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not (d / f).read_text().strip():
                    (d / f).write_text((d.parent / f).read_text())


def remove_cgroups(n: NodeLayout) -> None:
    for d in cgroup_dirs(n):
        if d.is_dir():
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                _rmdir(sub)
            _rmdir(d)


def _rmdir(d: Path) -> None:
    try:
        d.rmdir()
    except OSError as exc:
        log(f"node: cannot remove cgroup {d}: {exc}")


def unmount_under(root: Path) -> int:
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    mine = sorted({m for m in mounts if m == str(root) or m.startswith(str(root) + "/")}, key=len, reverse=True)
    for m in mine:
        subprocess.run(["umount", "-l", m], capture_output=True)
    return len(mine)


def remove_kubelet_chains() -> None:
    """Remove the iptables chains kubelets make (KUBE-FIREWALL, which drops non-loopback packets to 127/8, the
    canaries and the hint), unless a kubelet of another stack on this machine still runs."""
    if subprocess.run(["pgrep", "-x", "kubelet"], capture_output=True).returncode == 0:
        return
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            rules = subprocess.run([tool, "-t", table, "-S"], capture_output=True, text=True).stdout.splitlines()
            chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
            for r in rules:
                words = r.split()
                if words[0] == "-A" and words[-2:-1] == ["-j"] and words[-1] in chains and words[1] not in chains:
                    subprocess.run([tool, "-t", table, "-D", *words[1:]], capture_output=True)
            for c in chains:
                subprocess.run([tool, "-t", table, "-F", c], capture_output=True)
            for c in chains:
                subprocess.run([tool, "-t", table, "-X", c], capture_output=True)
