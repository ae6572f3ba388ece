"""The node part's configuration writers (stack/eos_stack/node_config.py): pure functions, no daemons."""
from __future__ import annotations

import io
import json
import tarfile
import tomllib
from pathlib import Path

from eos_stack import node_config as nc


def test_two_nodes_of_one_stack_share_nothing_the_host_sees():
    a, b = nc.layouts(Path("/tmp/stack-a"))
    assert (a.name, b.name) == ("eos-node-1", "eos-node-2")
    for attr in ("bridge", "cgroup_root", "pod_cidr", "node_ip", "socket", "kubelet_root", "home"):
        assert getattr(a, attr) != getattr(b, attr), attr
    assert all(len(n.bridge) <= 15 for n in (a, b))       # IFNAMSIZ
    assert a.node_ip.startswith(a.pod_cidr.rsplit(".", 1)[0] + ".") and a.node_ip.endswith(".1")
    other = nc.layouts(Path("/tmp/stack-b"))[0]           # another worktree's stack
    assert other.bridge != a.bridge and other.cgroup_root != a.cgroup_root


def test_containerd_config_is_private_to_the_node_and_restricts_oom_scores():
    n = nc.layouts(Path("/tmp/s"))[0]
    cfg = tomllib.loads(nc.containerd_toml(n))
    assert cfg["version"] == 2 and cfg["root"].startswith(str(n.home)) and cfg["state"].startswith(str(n.home))
    assert cfg["grpc"]["address"] == str(n.socket)
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True and cri["sandbox_image"] == nc.PAUSE_IMAGE
    assert cri["stream_server_port"] == "0"               # two containerds, no fixed port
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert cri["cni"]["conf_dir"] == str(n.cni_conf_dir)


def test_cni_bridge_stays_on_the_machine():
    n = nc.layouts(Path("/tmp/s"))[1]
    plugin = nc.cni_conflist(n)["plugins"][0]
    assert plugin["bridge"] == n.bridge and plugin["ipMasq"] is False
    # No default route: nothing leaves the machine; one /32 to the stack's services address via the gateway.
    assert plugin["ipam"]["routes"] == [{"dst": f"{n.services_ip}/32", "gw": n.node_ip}]
    assert n.services_ip == nc.services_ip(Path("/tmp/s")) and n.services_ip.startswith("10.243.")
    assert not n.services_ip.startswith(n.pod_cidr.rsplit(".", 1)[0])
    assert len(nc.services_iface(Path("/tmp/s"))) <= 15
    assert plugin["ipam"]["ranges"] == [[{"subnet": n.pod_cidr, "gateway": n.node_ip}]]


def test_kubelet_config_for_cgroups_v1_and_the_stack_ca():
    n = nc.layouts(Path("/tmp/s"))[0]
    cfg = nc.kubelet_config(n, ca=Path("/ca.crt"), serving_crt=Path("/s.crt"), serving_key=Path("/s.key"),
                            port=1234, healthz_port=1235, resolv_conf=Path("/r"))
    assert cfg["failCgroupV1"] is False and cfg["cgroupDriver"] == "cgroupfs" and cfg["cgroupRoot"] == n.cgroup_root
    assert cfg["clusterDNS"] == [n.services_ip] and cfg["address"] == n.node_ip and cfg["readOnlyPort"] == 0
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["authentication"]["x509"]["clientCAFile"] == "/ca.crt" and cfg["authorization"]["mode"] == "Webhook"
    argv = nc.kubelet_argv(Path("/kubelet"), n, Path("/c"), Path("/k"))
    assert f"--node-ip={n.node_ip}" in argv and f"--hostname-override={n.name}" in argv
    # The nodes share this machine's disk: no image GC, disk eviction only when it is really out of room (an
    # absolute amount, not a percentage of a disk that builds and caches keep near the kubelet's defaults).
    assert cfg["imageGCHighThresholdPercent"] == 100
    assert all(not cfg["evictionHard"][k].endswith("%") for k in ("nodefs.available", "imagefs.available"))


def test_a_private_servers_folder_has_its_stacks_services_address():
    """A test's private broker (tests/harness/private.py, under ``<state>/private/``) advertises its listener for
    Pods at the address of the stack it belongs to, where the test forwards it."""
    main = Path("/tmp/stack-a")
    assert nc.services_ip(main / "private" / "kafka-t-1a2b3c") == nc.services_ip(main)
    other = main / "elsewhere" / "kafka-t-1a2b3c"                # not a private folder: its own
    assert nc.services_ip(other) == nc.services_ip_of(nc.stack_tag(other))


def test_pause_archive_is_an_oci_layout_named_for_ctr_import():
    data = nc.pause_oci_archive(b"\x7fELF fake")
    assert data == nc.pause_oci_archive(b"\x7fELF fake")  # reproducible
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        files = {m.name: t.extractfile(m).read() for m in t.getmembers()}
    index = json.loads(files["index.json"])
    desc = index["manifests"][0]
    assert desc["annotations"]["io.containerd.image.name"] == nc.PAUSE_IMAGE
    manifest = json.loads(files["blobs/sha256/" + desc["digest"].split(":")[1]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["config"]["Entrypoint"] == ["/pause"] and config["config"]["User"] == "65535:65535"
    assert "blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1] in files


def test_real_scheduler_has_one_profile_of_its_own_and_real_pods_tolerate_the_nodes_taint():
    cfg = nc.scheduler_config(Path("/k"))
    assert cfg["kind"] == "KubeSchedulerConfiguration" and cfg["clientConnection"]["kubeconfig"] == "/k"
    assert [p["schedulerName"] for p in cfg["profiles"]] == [nc.SCHEDULER_NAME] != ["default-scheduler"]
    n = nc.layouts(Path("/tmp/s"))[0]
    kcfg = nc.kubelet_config(n, ca=Path("/ca.crt"), serving_crt=Path("/s.crt"), serving_key=Path("/s.key"),
                             port=1, healthz_port=2, resolv_conf=Path("/r"))
    assert kcfg["registerWithTaints"] == [nc.TAINT] and nc.TAINT["effect"] == "NoSchedule"
    spec = nc.placement()
    assert spec["schedulerName"] == nc.SCHEDULER_NAME
    assert [(t["key"], t["value"], t["effect"]) for t in spec["tolerations"]] == \
        [(nc.TAINT["key"], nc.TAINT["value"], nc.TAINT["effect"])]


def test_a_node_file_is_written_only_when_it_changes_and_never_half(tmp_path):
    # containerd reloads its CNI configuration on every write to the file; a reload that read it truncated left
    # the node without networks (a clean-clone run's containerd logged "unexpected end of JSON input").
    from eos_stack.common import write_if_changed
    f = tmp_path / "10-eos.conflist"
    assert write_if_changed(f, '{"a": 1}\n') and f.read_text() == '{"a": 1}\n'
    inode = f.stat().st_ino
    assert not write_if_changed(f, '{"a": 1}\n') and f.stat().st_ino == inode     # the same text: untouched
    assert write_if_changed(f, '{"a": 2}\n') and f.read_text() == '{"a": 2}\n'
    assert f.stat().st_ino != inode                       # renamed over it: never truncated in place
    assert [p.name for p in tmp_path.iterdir()] == ["10-eos.conflist"]
