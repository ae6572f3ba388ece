"""A real three-node Apache Kafka cluster (KRaft; every node is a broker and a controller), on loopback.

For chaos with replication: topics with three replicas and ``min.insync.replicas`` 2 (the sink, the
ledger and the transaction state log), so a SIGKILLed partition leader or transaction coordinator fails
over to another node while commits are in flight. Same jars as the single broker (``kafka.ensure_libs``);
configuration, data, pids and the persisted ports live under ``<state>/kafka3/node-<n>``. Started on
demand by the tests that use it (``python -m eos_stack.kafka_cluster up|down|status`` by hand), not by
``eos_stack up``: three more JVMs are not free on two cores.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from . import kafka
from .common import Stack, StackError, free_port, log, port_open, run

NODES = (1, 2, 3)
HEAP = os.environ.get("EOS_KAFKA3_HEAP", "384m")


class KafkaCluster:
    def __init__(self, st: Stack | None = None):
        self.st = st or Stack()
        self.home = self.st.dir("kafka3")

    # -- layout ----------------------------------------------------------------
    def name(self, node: int) -> str:
        return f"kafka3-{node}"

    def node_dir(self, node: int) -> Path:
        p = self.home / f"node-{node}"
        p.mkdir(parents=True, exist_ok=True)
        return p

    def ports(self) -> dict[int, dict[str, int]]:
        """Client and controller port of every node: chosen once, then persisted (a restarted node comes
        back at the same address with the same data)."""
        pf = self.home / "ports.json"
        if pf.exists():
            return {int(n): v for n, v in json.loads(pf.read_text()).items()}
        taken: set[int] = set()
        chosen: dict[int, dict[str, int]] = {}
        for n in NODES:
            chosen[n] = {}
            for kind in ("client", "controller"):
                port = free_port()
                while port in taken:
                    port = free_port()
                taken.add(port)
                chosen[n][kind] = port
        pf.write_text(json.dumps(chosen))
        return chosen

    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p['client']}" for p in self.ports().values())

    def write_config(self, node: int) -> Path:
        ports = self.ports()
        p = ports[node]
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node),
            "controller.quorum.voters": ",".join(f"{n}@127.0.0.1:{ports[n]['controller']}" for n in NODES),
            "controller.listener.names": "CONTROLLER",
            "listeners": f"PLAINTEXT://127.0.0.1:{p['client']},CONTROLLER://127.0.0.1:{p['controller']}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{p['client']}",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.node_dir(node) / "data"),
            # Three replicas, two in sync for every write: a lost node loses nothing acknowledged.
            "default.replication.factor": "3",
            "min.insync.replicas": "2",
            "offsets.topic.replication.factor": "3",
            "transaction.state.log.replication.factor": "3",
            "transaction.state.log.min.isr": "2",
            "share.coordinator.state.topic.replication.factor": "3",
            "share.coordinator.state.topic.min.isr": "2",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.num.partitions": "4",
            "broker.session.timeout.ms": "6000",
            "broker.heartbeat.interval.ms": "1000",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "delete.topic.enable": "true",
            # A killed leader's partitions move to an in-sync follower; an out-of-sync one never leads.
            "unclean.leader.election.enable": "false",
        }
        cfg = self.node_dir(node) / "server.properties"
        cfg.write_text("# Written by eos_stack.kafka_cluster; edit the code, not this file.\n"
                       + "".join(f"{k}={v}\n" for k, v in props.items()))
        return cfg

    def formatted(self, node: int) -> bool:
        return (self.node_dir(node) / "data" / "meta.properties").exists()

    # -- lifecycle -------------------------------------------------------------
    def up(self) -> str:
        self.home.mkdir(parents=True, exist_ok=True)    # again after a purge
        kafka.ensure_libs(self.st)
        cluster_id = self._cluster_id()
        for n in NODES:
            cfg = self.write_config(n)
            if not self.formatted(n):
                run(kafka.java_argv(self.st, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(cfg),
                                    heap="256m"), what=f"formatting Kafka node {n}", timeout=300)
        for n in NODES:
            if self.st.running_pid(self.name(n)) is None:
                self.start(n, wait=False)
        self.wait_ready()
        return self.bootstrap()

    def _cluster_id(self) -> str:
        f = self.home / "cluster.id"
        if not f.exists():
            f.write_text(kafka.new_cluster_id())
        return f.read_text().strip()

    def start(self, node: int, *, wait: bool = True) -> int:
        for kind, port in self.ports()[node].items():
            deadline = time.monotonic() + 15
            while port_open(port) and time.monotonic() < deadline:   # a just-killed JVM may hold it a moment
                time.sleep(0.2)
            if port_open(port):
                raise StackError(f"node {node}'s {kind} port {port} is in use by another program; "
                                 f"`python -m eos_stack.kafka_cluster down --purge` chooses new ports")
        cfg = self.write_config(node)
        pid = self.st.start_daemon(self.name(node), kafka.java_argv(self.st, "kafka.Kafka", str(cfg), heap=HEAP),
                                   cwd=self.node_dir(node), marker=str(cfg))
        log(f"Kafka node {node} starting (pid {pid}) at 127.0.0.1:{self.ports()[node]['client']}")
        if wait:
            self.wait_ready()
        return pid

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Until every node is registered and every partition has a leader."""
        from confluent_kafka.admin import AdminClient
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for n in NODES:
                # Looked at twice: a JVM that has only just been started can, for a moment, not yet show the
                # command line that marks it as ours (seen once in a full run; the node was up).
                if self.st.running_pid(self.name(n)) is None and not self._shows_up(n):
                    raise StackError(f"Kafka node {n} exited during start-up; {self.st.state}/logs/"
                                     f"{self.name(n)}.log ends with:\n{self.st.log_tail(self.name(n), 30)}")
            try:
                with AdminClient({"bootstrap.servers": self.bootstrap(), "log_level": 0}) as admin:
                    md = admin.list_topics(timeout=3)
                if len(md.brokers) == len(NODES) and all(p.leader >= 0 for t in md.topics.values()
                                                         for p in t.partitions.values()):
                    return
                last = f"{len(md.brokers)} of {len(NODES)} brokers registered"
            except Exception as exc:  # noqa: BLE001 - reported on timeout
                last = str(exc)
            time.sleep(0.5)
        raise StackError(f"the three-node Kafka cluster was not ready in {timeout:.0f}s ({last})")

    def _shows_up(self, node: int, seconds: float = 3.0) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.25)
            if self.st.running_pid(self.name(node)) is not None:
                return True
        return False

    def hard_kill(self, node: int) -> None:
        """SIGKILL one node (no shutdown, no flush); start it again with :meth:`start`."""
        pid = self.st.running_pid(self.name(node))
        if pid is None:
            return
        log(f"killing Kafka node {node} (pid {pid}) with SIGKILL")
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.st.running_pid(self.name(node)) is not None:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.1)
        self.st.pidfile(self.name(node)).unlink(missing_ok=True)

    def down(self, purge: bool = False) -> None:
        """Stop every node (SIGKILL when purging: the data goes anyway, and the last node of a quorum
        waits long for the others in a controlled shutdown)."""
        for n in NODES:
            if purge:
                self.hard_kill(n)
            else:
                self.st.stop_daemon(self.name(n), grace=kafka.STOP_GRACE)
        if purge:
            shutil.rmtree(self.home, ignore_errors=True)

    def status(self) -> str:
        up = [n for n in NODES if self.st.running_pid(self.name(n)) is not None]
        return f"{len(up)} of {len(NODES)} nodes running at {self.bootstrap()}"

    # -- who leads what --------------------------------------------------------
    def leader(self, topic: str, partition: int) -> int:
        from confluent_kafka.admin import AdminClient
        with AdminClient({"bootstrap.servers": self.bootstrap(), "log_level": 0}) as admin:
            md = admin.list_topics(topic, timeout=10)
        return md.topics[topic].partitions[partition].leader

    def coordinator(self, transactional_id: str) -> int:
        """The node coordinating ``transactional_id``: the leader of its ``__transaction_state`` partition
        (Kafka takes the id's Java hashCode, made non-negative, modulo the partition count)."""
        return self.leader("__transaction_state", _java_hash(transactional_id) % 4)


def _java_hash(text: str) -> int:
    """``Utils.abs(String.hashCode())`` as Kafka computes it (abs of the signed 32-bit hash; MIN_VALUE -> 0)."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return 0 if signed == -(1 << 31) else abs(signed)


def main(argv: list[str]) -> int:
    c = KafkaCluster()
    cmd = argv[0] if argv else "status"
    if cmd == "up":
        print(c.up())
    elif cmd == "down":
        c.down(purge="--purge" in argv)
    else:
        print(c.status())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
