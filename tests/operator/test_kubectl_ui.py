"""``kubectl eos ui`` without a cluster: which driver and port it forwards to, what it says when there is no UI,
and the ``kubectl port-forward`` it runs (a stand-in kubectl that records its arguments). Through a real kubelet's
port-forward to a real driver: tests/e2e/test_real_node_stream.py."""
from __future__ import annotations

import argparse
import os
import stat
import time

import pytest

from eos_job.driver_metrics import DriverMetrics
from eos_operator import kubectl_eos, spark_ui
from eos_operator.children import StreamRef
from eos_operator.kubectl_ui import NoUi, port_forward, ui, ui_service, ui_target


UID = "0f6c2a1e-1111-2222-3333-444455556666"


@pytest.fixture
def fake_kubectl(tmp_path, monkeypatch):
    """``fake_kubectl(script)``: a stand-in ``kubectl`` running the shell ``script``, first on PATH."""
    def install(script: str) -> None:
        fake = tmp_path / "kubectl"
        fake.write_text("#!/bin/sh\n" + script)
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return install


def stream(metrics: dict | None, state: str = "Running", pod: str | None = "colors-driver-3") -> dict:
    job = {"module": "m", **({"metrics": metrics} if metrics is not None else {})}
    return {"metadata": {"name": "colors", "namespace": "team-a", "uid": UID}, "spec": {"job": job},
            "status": {"lifecycleState": state, **({"driverPod": pod} if pod else {})}}


def test_the_running_driver_and_its_ui_port():
    assert ui_target(stream({"enabled": True})) == ("pod/colors-driver-3", 4040)
    assert ui_target(stream({"enabled": True, "port": 4321})) == ("pod/colors-driver-3", 4321)


def test_no_ui_says_which_field_turns_it_on():
    for metrics in (None, {"enabled": False, "port": 4321}):
        with pytest.raises(NoUi, match=r"team-a/colors: the driver's Spark UI is off\. It is on with "
                                       r"job\.metrics\.enabled: true"):
            ui_target(stream(metrics))
    with pytest.raises(NoUi, match="no driver is running \\(lifecycleState Suspended\\)"):
        ui_target(stream({"enabled": True}, state="Suspended"))
    with pytest.raises(NoUi, match="no driver is running"):
        ui_target(stream({"enabled": True}, pod=None))


def test_the_port_forward_it_runs(fake_kubectl, tmp_path):
    record = tmp_path / "argv"
    fake_kubectl(f"echo \"$@\" > {record}\necho 'Forwarding from 127.0.0.1:41234 -> 4321'\n"
                 "echo 'Forwarding from [::1]:41234 -> 4321'\nsleep 30\n")
    args = argparse.Namespace(port=0, kubeconfig="/k/config", context="prod")
    proc, url = port_forward(args, "team-a", "colors-driver-3", 4321)
    try:
        assert url == "http://127.0.0.1:41234"
        assert record.read_text().split() == ["port-forward", "-n", "team-a", "pod/colors-driver-3", ":4321",
                                              "--address", "127.0.0.1", "--kubeconfig", "/k/config",
                                              "--context", "prod"]
    finally:
        proc.kill()
        proc.wait()


def test_a_forward_with_many_errors_is_not_blocked_by_them(fake_kubectl, tmp_path, capfd):
    # kubectl writes an error line per failed connection; 200 KB of them would fill an undrained pipe (64 KB)
    # and block it in its write: the marker file after them is written only if they were read.
    done = tmp_path / "done"
    fake_kubectl("echo 'Forwarding from 127.0.0.1:41234 -> 4040'\n"
                 "i=0; while [ $i -lt 2000 ]; do echo \"E1128 error copying from local connection $i "
                 "to remote stream: an error line long enough to fill the pipe quickly....\" >&2; "
                 f"i=$((i+1)); done\ntouch {done}\nsleep 30\n")
    proc, _ = port_forward(argparse.Namespace(port=0), "team-a", "colors-driver-3", 4040)
    try:
        deadline = time.monotonic() + 30
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done.exists(), "kubectl port-forward blocked writing its errors"
    finally:
        proc.kill()
        proc.wait()
    assert "kubectl port-forward: E1128 error copying from local connection 1999" in capfd.readouterr().err


def test_a_forward_that_fails_says_why(fake_kubectl, tmp_path):
    fake_kubectl("echo 'error: unable to forward port because pod is not running' >&2\nexit 1\n")
    with pytest.raises(NoUi, match="ended \\(exit 1\\): error: unable to forward port"):
        port_forward(argparse.Namespace(port=8080), "team-a", "colors-driver-3", 4040)


def test_the_plugin_knows_the_command():
    args = kubectl_eos.parser().parse_args(["ui", "colors", "--port", "8080"])
    assert (args.command, args.name, args.port) == ("ui", "colors", 8080)


# ------------------------------------------------------------------ through the Spark UI Service
def the_service(owner_uid: str = UID, port: int = 4321) -> dict:
    body = spark_ui.service(StreamRef("colors", "team-a", owner_uid), DriverMetrics(enabled=True, port=port,
                                                                                    ui_service=True))
    return body


class Services:
    def __init__(self, *found: dict):
        self.found, self.asked = {s["metadata"]["name"]: s for s in found}, []

    def service(self, ns, name):
        self.asked.append((ns, name))
        return self.found.get(name)


def test_the_service_is_preferred_when_the_stream_owns_one():
    s = stream({"enabled": True, "port": 4321, "uiService": True})
    api = Services(the_service())
    svc = ui_service(api, "team-a", s)
    assert api.asked == [("team-a", "colors-ui")]
    assert ui_target(s, svc) == ("svc/colors-ui", 4321)
    # Negative control: a Service of that name someone else owns is not used; the Pod is.
    assert ui_service(Services(the_service(owner_uid="someone-else")), "team-a", s) is None
    assert ui_service(Services(), "team-a", s) is None
    assert ui_target(s, None) == ("pod/colors-driver-3", 4321)
    # No UI, no forward, Service or not.
    with pytest.raises(NoUi, match="the driver's Spark UI is off"):
        ui_target(stream({"enabled": False}), svc)


def test_through_the_service_a_forward_that_ends_is_made_again_on_the_same_local_port(fake_kubectl, tmp_path, capsys):
    # The stand-in kubectl: its first forward ends at once (the driver Pod went), the second records its
    # arguments and ends with 0, the third cannot forward (no driver runs): ui() gives up and returns.
    count, record = tmp_path / "count", tmp_path / "argv"
    fake_kubectl(f"""n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}
case $n in
  1) echo 'Forwarding from 127.0.0.1:41234 -> 4321'; exit 1 ;;
  2) echo "$@" > {record}; echo 'Forwarding from 127.0.0.1:41234 -> 4321'; exit 0 ;;
  *) echo 'error: timed out waiting for a running pod' >&2; exit 1 ;;
esac
""")
    args = argparse.Namespace(port=0, name="colors", kubeconfig=None, context=None)
    s = stream({"enabled": True, "port": 4321, "uiService": True})
    assert ui(args, "team-a", s, the_service(), again_for=0, sleep=lambda _s: None) == 0
    assert record.read_text().split() == ["port-forward", "-n", "team-a", "svc/colors-ui", "41234:4321",
                                          "--address", "127.0.0.1"]
    err = capsys.readouterr().err
    assert "forwarding svc/colors-ui again on http://127.0.0.1:41234" in err and "giving up" in err
    assert count.read_text().strip() == "3"


def test_to_a_pod_a_forward_that_ends_is_not_made_again(fake_kubectl, tmp_path):
    # Negative control of the one above: without the Service the forward is the Pod's, and ends with it.
    count = tmp_path / "count"
    fake_kubectl(f"n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}\n"
                 "echo 'Forwarding from 127.0.0.1:41234 -> 4321'; exit 1\n")
    args = argparse.Namespace(port=0, name="colors", kubeconfig=None, context=None)
    assert ui(args, "team-a", stream({"enabled": True, "port": 4321}), None, again_for=0,
              sleep=lambda _s: None) == 1
    assert count.read_text().strip() == "1"
