"""`make demo`: the colors stream run by the operator on the local stack, its driver killed once.

1. reads ``.stack/env`` (``make stack-up``), creates a namespace ``eos-demo-<id>`` and
   applies the CRD;
2. starts the operator (``python -m eos_operator run --namespace NS``) and a process
   kubelet: the stack has a kube-apiserver but no node, so ``tests/harness/kubelet.py``
   plays the node and runs the driver Pod's container command as a local process;
3. creates unique topics, writes N color events with a known distribution and applies
   ``examples/colors.yaml`` (bootstrap, topics and checkpoint rewritten for this run);
4. once the stream runs and has committed a few batches, SIGKILLs the driver and
   shows the operator's reaction: DriverFailed, Restarting, Resolved (resolution
   fences every slot before the new driver starts), Submitted, Running;
5. waits until the output has caught up, suspends the stream (the driver stops at a
   clean batch boundary) and prints the counts next to the expected ones, with a
   verdict from an independent read_committed audit of the output and the ledger;
6. cleans up (stream, operator, kubelet, namespace); exits 0 only when exactly once.

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
from eos_stack.cluster import PYTHONPATH, Kubectl, OperatorProcess, condition
from eos_stack.common import Stack, poll, timed_out

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
        self.checkpoint = work / "checkpoint"
        self.name = "colors"
        self.manifest: dict[str, Any] = {}
        self.operator: OperatorProcess | None = None
        self.kubelet = None
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

    def driver_log(self, pod: str) -> str:
        path = self.kubelet.log_path(self.namespace, pod)
        return path.read_text(errors="replace") if path.exists() else ""

    # ------------------------------------------------------------- the demo
    def setup(self) -> None:
        from tests.harness.kubelet import ProcessKubelet

        say(f"local stack: Kafka {self.bootstrap}, kube-apiserver {self.env.get('KUBE_APISERVER', '?')}; "
            f"work dir {self.work}")
        self.kubectl.run("create", "namespace", self.namespace)
        self.namespace_created = True
        say(f"namespace {self.namespace} created")
        crds = self.kubectl.apply_crds()
        say(f"CRD applied and established: {', '.join(crds)}")
        self.operator = OperatorProcess(self.env["KUBECONFIG"], self.namespace, self.work / "operator.log",
                                        interval=2, resolution_timeout=60, progress_interval=2).start()
        say(f"operator started: python -m eos_operator run --namespace {self.namespace} "
            f"(pid {self.operator.proc.pid}, log {self.operator.log_path})")
        say("there is no kubelet on this machine (the stack has an API server, no nodes): a process kubelet "
            "(tests/harness/kubelet.py) plays the node and runs the driver Pod's command as a local process")
        self.kubelet = ProcessKubelet(self.env["KUBECONFIG"], namespace=self.namespace, log_dir=self.work / "kubelet",
                                      extra_env={"PYTHONPATH": PYTHONPATH,
                                                 "SPARK_JARS": self.env.get("SPARK_JARS", "")}).start()
        say(f"process kubelet watching {self.namespace} (driver logs in {self.kubelet.log_dir})")

    def apply_stream(self) -> dict[str, int]:
        create_topics(self.bootstrap, {self.events_topic: 3, self.counts_topic: 3, self.dlq_topic: 1})
        say(f"topics {self.events_topic} -> {self.counts_topic} (dead letters: {self.dlq_topic})")
        expected = produce(self.bootstrap, self.events_topic, self.n)
        say(f"produced {self.n} color events; expected counts (orange is dropped): {expected}")

        doc = copy.deepcopy(yaml.safe_load(MANIFEST.read_text()))
        spec = doc["spec"]
        spec["source"].update(bootstrapServers=self.bootstrap, topics=[self.events_topic],
                              maxOffsetsPerTrigger=self.max_offsets)
        spec["sink"].update(bootstrapServers=self.bootstrap, topic=self.counts_topic,
                            deadLetterTopic=self.dlq_topic)
        spec["checkpoint"] = {"store": "local", "path": str(self.checkpoint)}
        self.name = doc["metadata"]["name"]
        self.manifest = doc
        self.kubectl.apply(doc, self.namespace)
        say(f"kubectl apply -f examples/colors.yaml (bootstrap, topics and checkpoint {self.checkpoint} rewritten; "
            f"maxOffsetsPerTrigger {self.max_offsets}, so the backlog takes ~{-(-self.n // self.max_offsets)} batches)")
        return expected

    def run_until_kill(self) -> str:
        self.wait(lambda: self.status().get("lifecycleState"), "the operator to pick the stream up", 120)
        say("waiting for the operator to resolve, submit the driver Pod and report Running ...")
        status = self.wait(lambda: (lambda s: s if s.get("lifecycleState") == "Running" else None)(self.status()),
                           "the stream to run", 300)
        pod = status["driverPod"]
        self.get_eos()
        say(f"driver Pod {pod} is running; waiting for {self.kill_after} committed batches "
            f"(status.lastCommittedBatch, read by the operator from the stream's ledger) ...")
        status = self.wait(lambda: (lambda s: s if (s.get("lastCommittedBatch") or -1) >= self.kill_after - 1
                                    else None)(self.status()), f"{self.kill_after} committed batches", 600)
        self.get_eos()
        return status["driverPod"]

    def kill_and_recover(self, pod: str) -> None:
        say(f"kill -9 of the driver process of {pod} (process group {self.kubelet.pid(self.namespace, pod)}) "
            f"mid-stream, at batch {self.status().get('lastCommittedBatch')}")
        if not self.kubelet.kill9(self.namespace, pod):
            raise DemoError(f"no running process for {pod}")
        say("the operator reacts: DriverFailed -> Restarting -> Resolved -> Submitted -> Running")
        status = self.wait(lambda: (lambda s: s if s.get("driverPod") not in (None, pod)
                                    and s.get("lifecycleState") == "Running" else None)(self.status()),
                           "the restart after kill -9", 300)
        self.print_new_events()
        say(f"restarted as {status['driverPod']}; restartCount {status.get('restartCount')}; "
            f"lastError: {first_line(status.get('lastError'))}")
        resolution = status.get("resolution") or {}
        say(f"resolution before the restart (status.resolution.summary): {resolution.get('summary') or resolution}")
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
        if self.kubelet is not None:
            for log in sorted(self.kubelet.log_dir.glob(f"{self.namespace}_*.log"))[-2:]:
                lines = log.read_text(errors="replace").splitlines()[-25:]
                say(f"{log.name} (tail):\n" + indent("\n".join(lines)))

    def cleanup(self) -> None:
        if self.namespace_created and self.operator is not None and self.operator.alive():
            # Deleting the stream while the operator runs lets it release its finalizer.
            r = self.kubectl.run("delete", "exactlyoncestream", "--all", "-n", self.namespace, "--timeout=120s",
                                 check=False)
            if r.returncode == 0:
                say("stream deleted (its checkpoint stays in the work dir)")
        if self.operator is not None:
            self.operator.stop()
            say("operator stopped")
        if self.kubelet is not None:
            self.kubelet.stop()
            say("process kubelet stopped")
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
    missing = [k for k in ("KAFKA_BOOTSTRAP", "KUBECONFIG", "KUBECTL", "SPARK_JARS") if not env.get(k)]
    if missing:
        print(f"{stack.env_file} has no {', '.join(missing)}: run `make stack-up` first", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    # Under the stack's state folder, the node's disk: the driver Pod's root filesystem is read-only (the
    # process kubelet leaves only its volumes and that folder writable), and its local checkpoint is here.
    work = Path(tempfile.mkdtemp(prefix="eos-demo-", dir=stack.dir("demo")))
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
    say(f"{'exactly once' if ok else 'FAILED'} in {time.monotonic() - t0:.0f}s; logs and checkpoint in {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
