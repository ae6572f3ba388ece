"""`make demo`: the colors stream run by the operator on the local stack's real nodes, its driver killed once.

1. reads ``.stack/env`` (``make demo`` made the stack, the image and the two real nodes: kubelet, containerd,
   CNI, eos_stack.node), creates a namespace ``eos-demo-<id>`` that enforces ``restricted`` Pod Security,
   applies the CRD and a Secret with the checkpoint bucket's keys;
2. starts the operator (``python -m eos_operator run --namespace NS``, a process on this machine);
3. creates unique topics, writes N color events with a known distribution and applies
   ``examples/colors.yaml`` (bootstrap, topics and checkpoint rewritten for this run: Kafka and the bucket
   through the stack's services address, which Pods and the operator both reach; the project's image from the
   stack's registry; the real nodes' scheduler and taint in ``job.podTemplate``);
4. once the stream runs and has committed a few batches, SIGKILLs every process of the driver's container (the
   JVM and PySpark's Python workers, found in the container's cgroup) and shows the operator's reaction:
   DriverFailed, Restarting, Resolved (resolution fences every slot before the new driver starts), Submitted,
   Running, and what the kill hit (resolution's report per slot);
5. waits until the output has caught up, suspends the stream (the driver stops at a
   clean batch boundary) and prints the counts next to the expected ones, with a
   verdict from an independent read_committed audit of the output and the ledger;
6. cleans up (stream, operator, namespace); exits 0 only when exactly once.

The job-level demo without Kubernetes is ``python -m examples.colors.demo_job``.
"""
from __future__ import annotations

import argparse
import copy
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import yaml

from eos_job.verify import audit_counts, ledger_monotone, open_transactions
from eos_stack import node_services
from eos_stack.cluster import RESTRICTED, Kubectl, OperatorProcess, condition
from eos_stack.common import Stack, poll, timed_out
from tests.harness.real_nodes import (LogFollower, keys_secret, kill9_container, node_image, stream_template,
                                      what_the_kill_hit)

from .generator import produce
from .local_run import create_topics

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "examples" / "colors.yaml"
GRACEFUL_DONE = "stopped at a clean boundary after batch"


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def indent(text: str, prefix: str = "       ") -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines())


def first_line(text: str | None) -> str:
    """A message without the driver's log tail that a failed driver's message carries."""
    text = (text or "").strip()
    failed = re.match(r"[^\n]*?\(exit code \d+[^)\n]*\)", text)
    head = failed.group(0) if failed else text.split("\n", 1)[0]
    if len(head) == len(text):
        return head
    return head + (" [+ the driver's log tail]" if failed else " [...]")


class DemoError(RuntimeError):
    pass


class Demo:
    def __init__(self, env: dict[str, str], events: int, max_offsets: int, kill_after: int, work: Path):
        self.env, self.n, self.max_offsets, self.kill_after, self.work = env, events, max_offsets, kill_after, work
        self.bootstrap = env["KAFKA_BOOTSTRAP"]
        self.kubectl = Kubectl(env)
        run_id = uuid.uuid4().hex[:6]
        self.namespace = f"eos-demo-{run_id}"
        self.events_topic, self.counts_topic, self.dlq_topic = (f"demo-colors-events-{run_id}",
                                                                f"demo-colors-counts-{run_id}",
                                                                f"demo-colors-dlq-{run_id}")
        self.name = "colors"
        self.manifest: dict[str, Any] = {}
        self.operator: OperatorProcess | None = None
        self.logs: dict[str, LogFollower] = {}     # driver Pod -> its log as written, kept after the Pod goes
        self.namespace_created = False
        self.seen_events: set[str] = set()

    # ------------------------------------------------------------- plumbing
    def status(self) -> dict[str, Any]:
        return self.kubectl.status(self.namespace, self.name)

    def print_new_events(self) -> list[dict[str, Any]]:
        """Print the stream's events not printed yet, oldest first; return them."""
        new = []
        for e in self.kubectl.event_objects(self.namespace, self.name):
            uid = e["metadata"]["uid"]
            if uid in self.seen_events:
                continue
            self.seen_events.add(uid)
            new.append(e)
            say(f"  event {e['type']:7} {e['reason']:12} {first_line(e.get('message'))}")
        return new

    def wait(self, check: Callable[[], Any], what: str, timeout: float, interval: float = 1.0) -> Any:
        """Poll ``check`` (printing the stream's new events meanwhile) until it returns something truthy."""
        def before() -> None:
            try:
                self.print_new_events()
            except Exception:  # noqa: BLE001 - the stream may not exist yet
                pass
            if self.operator is not None and not self.operator.alive():
                raise DemoError(f"the operator exited ({self.operator.proc.returncode}) while waiting for {what}")

        value, last_exc = poll(check, timeout, interval=interval, before=before)
        if value:
            return value
        raise DemoError(timed_out(what, timeout, last_exc))

    def get_eos(self) -> None:
        table = self.kubectl.run("get", "eos", "-n", self.namespace).stdout
        say(f"$ kubectl get eos -n {self.namespace}\n{indent(table)}")

    def ledger_topic(self) -> str:
        # The runtime's default (eos_job.spec: <sink topic>.eos-ledger.<namespace>.<name>).
        sink = self.manifest["spec"]["sink"]
        return sink.get("ledgerTopic") or f"{sink['topic']}.eos-ledger.{self.namespace}.{self.name}"

    def follow(self, pod: str) -> None:
        from kubernetes import client, config
        if pod not in self.logs:
            v1 = client.CoreV1Api(config.new_client_from_config(config_file=self.env["KUBECONFIG"]))
            self.logs[pod] = LogFollower(v1, self.namespace, pod)
            self.logs[pod].start()

    def driver_log(self, pod: str) -> str:
        return self.logs[pod].text if pod in self.logs else ""

    # ------------------------------------------------------------- the demo
    def setup(self) -> None:
        nodes = [n["metadata"]["name"] for n in self.kubectl.json("get", "nodes")["items"]]
        say(f"local stack: Kafka {self.bootstrap}, kube-apiserver {self.env.get('KUBE_APISERVER', '?')}, "
            f"nodes {', '.join(nodes) or '(none: run `make demo`)'}; work dir {self.work}")
        self.kubectl.run("create", "namespace", self.namespace)
        self.namespace_created = True
        self.kubectl.run("label", "namespace", self.namespace, *RESTRICTED)
        say(f"namespace {self.namespace} created (Pod Security: restricted, enforced)")
        crds = self.kubectl.apply_crds()
        say(f"CRD applied and established: {', '.join(crds)}")
        self.kubectl.apply(keys_secret(self.env, "checkpoint-keys"), self.namespace)
        say("Secret checkpoint-keys: the checkpoint bucket's keys (the stream names it; never in its spec)")
        self.operator = OperatorProcess(self.env["KUBECONFIG"], self.namespace, self.work / "operator.log",
                                        interval=2, resolution_timeout=60, progress_interval=2).start()
        say(f"operator started: python -m eos_operator run --namespace {self.namespace} "
            f"(pid {self.operator.proc.pid}, log {self.operator.log_path})")

    def apply_stream(self) -> dict[str, int]:
        create_topics(self.bootstrap, {self.events_topic: 3, self.counts_topic: 3, self.dlq_topic: 1})
        say(f"topics {self.events_topic} -> {self.counts_topic} (dead letters: {self.dlq_topic})")
        expected = produce(self.bootstrap, self.events_topic, self.n)
        say(f"produced {self.n} color events; expected counts (orange is dropped): {expected}")

        doc = copy.deepcopy(yaml.safe_load(MANIFEST.read_text()))
        spec = doc["spec"]
        pods = node_services.pod_env(Stack())    # Kafka and the bucket as Pods reach them (the operator too)
        spec["source"].update(bootstrapServers=pods["POD_KAFKA_BOOTSTRAP"], topics=[self.events_topic],
                              maxOffsetsPerTrigger=self.max_offsets)
        spec["sink"].update(bootstrapServers=pods["POD_KAFKA_BOOTSTRAP"], topic=self.counts_topic,
                            deadLetterTopic=self.dlq_topic)
        spec["checkpoint"]["path"] = f"/demo/{self.namespace}"
        spec["checkpoint"]["s3"].update(bucket=self.env["S3_BUCKET"], endpoint=pods["POD_S3_ENDPOINT"])
        spec["job"].update(image=node_image(), podTemplate=stream_template(), driver={"cpu": "1", "memory": "2Gi"})
        self.name = doc["metadata"]["name"]
        self.manifest = doc
        self.kubectl.apply(doc, self.namespace)
        say(f"kubectl apply -f examples/colors.yaml (rewritten for this run: Kafka {pods['POD_KAFKA_BOOTSTRAP']}, "
            f"topics, checkpoint s3://{self.env['S3_BUCKET']}/demo/{self.namespace} at {pods['POD_S3_ENDPOINT']}, "
            f"image {node_image()}, the real nodes' scheduler; maxOffsetsPerTrigger {self.max_offsets}, so the "
            f"backlog takes ~{-(-self.n // self.max_offsets)} batches)")
        return expected

    def run_until_kill(self) -> str:
        self.wait(lambda: self.status().get("lifecycleState"), "the operator to pick the stream up", 120)
        say("waiting for the operator to resolve, submit the driver Pod and report Running ...")
        status = self.wait(lambda: (lambda s: s if s.get("lifecycleState") == "Running" else None)(self.status()),
                           "the stream to run", 300)
        pod = status["driverPod"]
        self.follow(pod)
        self.get_eos()
        say(f"driver Pod {pod} is running on {self.pod(pod)['spec'].get('nodeName')}; waiting for {self.kill_after} committed batches "
            f"(status.lastCommittedBatch, read by the operator from the stream's ledger) ...")
        status = self.wait(lambda: (lambda s: s if (s.get("lastCommittedBatch") or -1) >= self.kill_after - 1
                                    else None)(self.status()), f"{self.kill_after} committed batches", 600)
        self.get_eos()
        return status["driverPod"]

    def pod(self, name: str) -> dict[str, Any]:
        return self.kubectl.json("get", "pod", name, "-n", self.namespace)

    def kill_and_recover(self, pod: str) -> None:
        (container,) = self.pod(pod)["status"]["containerStatuses"]
        batch = self.status().get('lastCommittedBatch')
        procs = kill9_container(container["containerID"])
        if not procs:
            raise DemoError(f"no running process in {pod}'s container")
        say(f"kill -9 of every process of {pod}'s container (the JVM and PySpark's workers: {len(procs)} processes "
            f"in {len(set(procs.values()))} process groups, from its cgroup) mid-stream, at batch {batch}")
        say("the operator reacts: DriverFailed -> Restarting -> Resolved -> Submitted -> Running")
        status = self.wait(lambda: (lambda s: s if s.get("driverPod") not in (None, pod)
                                    and s.get("lifecycleState") == "Running" else None)(self.status()),
                           "the restart after kill -9", 300)
        self.print_new_events()
        say(f"restarted as {status['driverPod']}; restartCount {status.get('restartCount')}; "
            f"lastError: {first_line(status.get('lastError'))}")
        self.follow(status["driverPod"])
        resolution = status.get("resolution") or {}
        say(f"resolution before the restart (status.resolution.summary): {resolution.get('summary') or resolution}")
        say(f"the kill hit {what_the_kill_hit(resolution)}")
        reasons = self.kubectl.events(self.namespace, self.name)
        after = reasons[reasons.index("DriverFailed"):] if "DriverFailed" in reasons else []
        want = ["DriverFailed", "Restarting", "Resolved", "Submitted", "Running"]
        it = iter(after)
        if not all(r in it for r in want):
            raise DemoError(f"events after the kill were {after}, expected the sequence {want}")
        self.get_eos()

    def catch_up(self, expected: dict[str, int]) -> None:
        total = sum(expected.values())
        t0 = time.monotonic()
        last: list[Any] = [0.0, None]   # when printed, what

        def caught_up() -> bool:
            final = audit_counts(self.bootstrap, self.counts_topic).final
            if final == expected:
                return True
            counted = sum(final.values())
            if time.monotonic() - last[0] > (10 if counted != last[1] else 30):
                last[:] = [time.monotonic(), counted]
                say(f"  committed output so far: {counted}/{total} counted "
                    f"(status.lastCommittedBatch {self.status().get('lastCommittedBatch')})")
            return False

        say("waiting until the committed output reaches the expected counts ...")
        self.wait(caught_up, "the output to catch up", 900, interval=3)
        say(f"caught up {time.monotonic() - t0:.0f}s after the restart")

    def suspend(self) -> None:
        pod = self.status().get("driverPod")
        say("suspending the stream (spec.job.state: suspended): the driver stops at a clean batch boundary")
        self.kubectl.patch_spec(self.namespace, self.name, {"job": {"state": "suspended"}})
        self.wait(lambda: self.status().get("lifecycleState") == "Suspended" and not self.kubectl.pods(self.namespace),
                  "the stream to suspend", 180)
        self.print_new_events()
        ready = condition(self.status(), "Ready")
        say(f"suspended (Ready={ready.get('status')}, reason {ready.get('reason')}); no driver Pod left")
        if pod in self.logs:
            self.logs[pod].join(30)
        stopped = [line for line in self.driver_log(pod).splitlines() if GRACEFUL_DONE in line] if pod else []
        say(f"driver log: {stopped[-1].strip() if stopped else '(no clean-stop line found)'}")
        self.get_eos()
        if not stopped:
            raise DemoError(f"{pod} did not report a clean stop")

    def verdict(self, expected: dict[str, int]) -> bool:
        audit = audit_counts(self.bootstrap, self.counts_topic)
        ledger_problems = ledger_monotone(self.bootstrap, self.ledger_topic())
        still_open = open_transactions(self.bootstrap, [self.counts_topic, self.dlq_topic, self.ledger_topic()])
        print()
        print(f"{'color':8} {'expected':>9} {'output':>9}")
        for color in sorted(set(expected) | set(audit.final)):
            mark = "" if expected.get(color, 0) == audit.final.get(color, 0) else "   <-- differs"
            print(f"{color:8} {expected.get(color, 0):>9} {audit.final.get(color, 0):>9}{mark}")
        ok = (audit.final == expected and not audit.duplicates and not audit.regressions and not ledger_problems
              and not still_open)
        print()
        print(f"read_committed audit of {self.counts_topic}: {audit.updates} count updates, "
              f"{len(audit.duplicates)} emitted twice, {len(audit.regressions)} going backwards; "
              f"ledger {self.ledger_topic()} monotone: {not ledger_problems}; open transactions: {len(still_open)}")
        for problem in ledger_problems[:5]:
            print(f"  ledger: {problem}")
        print("VERDICT: EXACTLY ONCE" if ok else "VERDICT: FAILED")
        print(flush=True)
        return ok

    def diagnostics(self) -> None:
        try:
            say(f"stream status: {yaml.safe_dump(self.status(), sort_keys=False)}")
            say("events:\n" + indent(self.kubectl.run("get", "events", "-n", self.namespace, check=False).stdout))
        except Exception as exc:  # noqa: BLE001 - diagnostics must not hide the failure
            say(f"(could not read the stream: {exc})")
        if self.operator is not None:
            say("operator log (tail):\n" + indent(self.operator.tail(40)))
        for pod in list(self.logs)[-2:]:
            say(f"driver Pod {pod}'s log (tail):\n" + indent("\n".join(self.driver_log(pod).splitlines()[-25:])))

    def cleanup(self) -> None:
        if self.namespace_created and self.operator is not None and self.operator.alive():
            # Deleting the stream while the operator runs lets it release its finalizer.
            r = self.kubectl.run("delete", "exactlyoncestream", "--all", "-n", self.namespace, "--timeout=120s",
                                 check=False)
            if r.returncode == 0:
                say("stream deleted (its checkpoint stays in the bucket)")
        if self.operator is not None:
            self.operator.stop()
            say("operator stopped")
        if self.namespace_created:
            for s in self.kubectl.json("get", "exactlyoncestreams", "-n", self.namespace)["items"]:
                self.kubectl.run("patch", "exactlyoncestream", s["metadata"]["name"], "-n", self.namespace,
                                 "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)
            r = self.kubectl.run("delete", "namespace", self.namespace, "--timeout=120s", check=False, timeout=150)
            say(f"namespace {self.namespace} deleted" if r.returncode == 0
                else f"namespace {self.namespace} not deleted: {r.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--events", type=int, default=20000, help="color events to write (default 20000)")
    ap.add_argument("--max-offsets-per-trigger", type=int, default=2000,
                    help="events per micro-batch (default 2000: the backlog takes ~10 batches)")
    ap.add_argument("--kill-after", type=int, default=3, help="committed batches before the kill (default 3)")
    a = ap.parse_args(argv)
    stack = Stack()
    env = stack.read_env()
    missing = [k for k in ("KAFKA_BOOTSTRAP", "KUBECONFIG", "KUBECTL", "S3_BUCKET") if not env.get(k)]
    if missing:
        print(f"{stack.env_file} has no {', '.join(missing)}: run `make demo` (the stack, the image, the nodes)",
              file=sys.stderr)
        return 2
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="eos-demo-", dir=stack.dir("demo")))    # the operator's log
    demo = Demo(env, a.events, a.max_offsets_per_trigger, a.kill_after, work)
    ok = False
    try:
        demo.setup()
        expected = demo.apply_stream()
        pod = demo.run_until_kill()
        demo.kill_and_recover(pod)
        demo.catch_up(expected)
        demo.suspend()
        ok = demo.verdict(expected)
    except Exception as exc:  # noqa: BLE001 - report, clean up, exit 1
        say(f"FAILED: {exc}")
        demo.diagnostics()
    except KeyboardInterrupt:
        say("interrupted")
    finally:
        try:
            demo.cleanup()
        except Exception as exc:  # noqa: BLE001
            say(f"cleanup incomplete: {exc}")
    say(f"{'exactly once' if ok else 'FAILED'} in {time.monotonic() - t0:.0f}s; the operator's log in {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
