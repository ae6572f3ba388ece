"""A real single-node Apache Kafka broker (KRaft, broker and controller in one JVM).

The broker's jars are resolved once by Maven from ``stack/kafka/pom.xml`` into
``<cache>/kafka-<version>/libs``; its configuration, data and pid live under
``<state>/kafka``. The three loopback ports (the PLAINTEXT client listener, the
controller listener, and the SASL_SSL listener of :mod:`eos_stack.kafka_security`)
are chosen once and kept in ``<state>/kafka/ports.json``, so a restarted broker
comes back at the same address with the same data: tests and chaos helpers
(:func:`restart`, :func:`hard_kill`) rely on that.
"""
from __future__ import annotations

import base64
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

from . import kafka_security
from .kafka_ports import PORT_NAMES, bootstrap, home, ports  # noqa: F401 (kafka.home, kafka.ports, kafka.bootstrap)
from .common import REPO, Stack, StackError, log, port_open, require_tool, run
from .maven import JAVA_HINT, maven_copy_dependencies
from .node_config import services_ip

VERSION = os.environ.get("EOS_KAFKA_VERSION", "4.1.1")
NAME = "kafka"
POM = REPO / "stack" / "kafka" / "pom.xml"
HEAP = os.environ.get("EOS_KAFKA_HEAP", "512m")
START_TIMEOUT = 120.0  # two busy cores: a cold JVM start plus metadata log replay
STOP_GRACE = 30.0


# -- jars ----------------------------------------------------------------------
def libs_dir(st: Stack) -> Path:
    return st.cache / f"kafka-{VERSION}" / "libs"


def ensure_libs(st: Stack) -> Path:
    return maven_copy_dependencies(st, POM, {"kafka.version": VERSION}, libs_dir(st),
                                   what=f"Apache Kafka {VERSION}")


# -- configuration -------------------------------------------------------------
def data_dir(st: Stack) -> Path:
    return home(st) / "data"


def config_file(st: Stack) -> Path:
    return home(st) / "server.properties"


def heap_size(st: Stack) -> str:
    """The broker's heap: ``EOS_KAFKA_HEAP`` (512m), or what ``up(st, heap=...)`` kept in ``<state>/kafka/heap``
    (a test's private broker is smaller; its restarts after a kill keep the size)."""
    f = home(st) / "heap"
    return f.read_text().strip() if f.exists() else HEAP


PODS_LISTENER = "PODS"


def config_text(st: Stack) -> str:
    """The broker's ``server.properties``; a running broker started with other text is restarted by ``up``."""
    p = ports(st)
    sec, pods_sec = kafka_security.LISTENER, kafka_security.PODS_LISTENER
    props = {
        # KRaft, one process that is both the only controller and the only broker.
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{p['controller']}",
        "controller.listener.names": "CONTROLLER",
        # PLAINTEXT: unauthenticated (principal ANONYMOUS, a super user), what every test uses unless it
        # tests security; SASL_SSL: SCRAM users, TLS, ACLs (kafka_security). PODS: PLAINTEXT too, for Pods on
        # the real nodes (node_services.py): bound on loopback, advertised at the stack's services address,
        # where the node part forwards it (a Pod cannot reach 127.0.0.1; nothing off the machine reaches it).
        # PODS_SASL_SSL: the SASL_SSL listener again for Pods, the same way (its certificate names the services
        # address too: kafka_security.subject_alt_names).
        "listeners": f"PLAINTEXT://127.0.0.1:{p['client']},CONTROLLER://127.0.0.1:{p['controller']},"
                     f"{sec}://127.0.0.1:{p['sasl_ssl']},{PODS_LISTENER}://127.0.0.1:{p['pods']},"
                     f"{pods_sec}://127.0.0.1:{p['pods_sasl_ssl']}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{p['client']},{sec}://127.0.0.1:{p['sasl_ssl']},"
                                f"{PODS_LISTENER}://{services_ip(st.state)}:{p['pods']},"
                                f"{pods_sec}://{services_ip(st.state)}:{p['pods_sasl_ssl']}",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,{sec}:{sec},"
                                          f"{PODS_LISTENER}:PLAINTEXT,{pods_sec}:SASL_SSL",
        **kafka_security.broker_props(st),
        "log.dirs": str(data_dir(st)),
        # One node: the internal topics cannot have more than one replica.
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        # Fewer partitions for the internal topics (default 50 each): quicker first
        # transaction / first group and quicker log recovery after a hard kill. The
        # transaction and group protocols do not depend on the count.
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.num.partitions": "4",
        # After a hard kill the restarted node may only re-register once the old
        # incarnation's session has expired (default 9 s); 5 s shortens chaos-test
        # restarts while leaving room for a starved JVM on a busy 2-core machine.
        "broker.session.timeout.ms": "5000",
        "broker.heartbeat.interval.ms": "1000",
        # Consumer groups start at once instead of waiting 3 s for more members.
        "group.initial.rebalance.delay.ms": "0",
        # Deliberately false: tests and jobs must create their topics explicitly, so
        # a misspelt or missing topic is a clear error (UNKNOWN_TOPIC_OR_PART) instead
        # of a silently auto-created empty topic with default settings.
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "delete.topic.enable": "true",
    }
    text = "# Written by eos_stack.kafka on every `up`; edit the code, not this file.\n"
    return text + "".join(f"{k}={v}\n" for k, v in props.items())


def write_config(st: Stack) -> Path:
    kafka_security.ensure_tls(st)
    cfg = config_file(st)
    tmp = cfg.with_suffix(".tmp")  # holds the TLS key's password: owner-readable only
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(config_text(st))
    tmp.replace(cfg)
    return cfg


def config_current(st: Stack) -> bool:
    """Whether the running broker's configuration file says what this code would write now."""
    cfg = config_file(st)
    return cfg.exists() and cfg.read_text() == config_text(st)


LOG4J2 = """\
# Quiet log4j2 configuration for the test broker: warnings from everything,
# start/stop and state-change lines from the server itself. Goes to stdout,
# which eos_stack captures in <state>/logs/kafka.log.
status = warn
name = eos-kafka
# Kafka stops itself in its own JVM shutdown hook: log4j's hook must not stop
# logging first, or the shutdown lines (and any shutdown error) are lost.
shutdownHook = disable
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c{1})%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = INFO
logger.controller.name = kafka.server.ControllerServer
logger.controller.level = INFO
logger.kafka.name = kafka.Kafka
logger.kafka.level = INFO
"""


def write_log4j(st: Stack) -> Path:
    f = home(st) / "log4j2.properties"
    f.write_text(LOG4J2)
    return f


def java_argv(st: Stack, main: str, *args: str, heap: str = HEAP) -> list[str]:
    java = require_tool("java", JAVA_HINT)
    return [java, f"-Xmx{heap}", f"-Xms{min_heap(heap)}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={write_log4j(st)}",
            "-cp", f"{libs_dir(st)}/*", main, *args]


def min_heap(heap: str) -> str:
    return "128m" if heap.endswith("m") and int(heap[:-1]) > 128 else heap


def new_cluster_id() -> str:
    """Kafka's Uuid text form: 16 random bytes, URL-safe base64, no padding; never starting with "-" (as
    Kafka's own Uuid.randomUuid), which the storage tool would read as an option (one clean-clone run in 64
    failed so at `stack up`)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def formatted(st: Stack) -> bool:
    return (data_dir(st) / "meta.properties").exists()


def ensure_formatted(st: Stack, cfg: Path) -> None:
    if formatted(st):
        return
    log("formatting Kafka storage (first start)")
    out = run(java_argv(st, "kafka.tools.StorageTool", "format", "-t", new_cluster_id(), "-c", str(cfg),
                        heap="256m"),
              what="formatting Kafka storage (kafka.tools.StorageTool format)", timeout=300)
    if not formatted(st):
        raise StackError(f"Kafka storage format reported success but {data_dir(st)}/meta.properties is missing:\n{out}")


# -- readiness -----------------------------------------------------------------
def _admin_ready(bootstrap_servers: str) -> bool:
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:  # the stack can run without the client library; port check then
        return port_open(int(bootstrap_servers.rsplit(":", 1)[1]))
    # log_level 0: librdkafka would otherwise print every refused connection while
    # the broker is still starting.
    # Closed by the block, never left to the garbage collector (kafka_security._admin says why).
    with AdminClient({"bootstrap.servers": bootstrap_servers, "socket.timeout.ms": 3000, "log_level": 0}) as admin:
        return bool(admin.list_topics(timeout=3).brokers)


def _alive(pid: int) -> bool:
    # Not st.running_pid: right after Popen the child may not have exec'd java yet,
    # so its command line does not show the marker.
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, PermissionError, OSError):
        return False


def wait_ready(st: Stack, pid: int, timeout: float = START_TIMEOUT) -> None:
    """Wait until an admin client gets metadata with a broker in it; fail at once if
    the broker process dies (a bad config, a port taken meanwhile, a corrupt log)."""
    bs = bootstrap(st)
    deadline = time.monotonic() + timeout
    last: str | None = None
    while time.monotonic() < deadline:
        if not _alive(pid):
            _reap(pid)
            raise StackError(f"the Kafka broker exited during start-up; {st.state}/logs/{NAME}.log ends with:\n"
                             f"{st.log_tail(NAME, 40)}")
        try:
            if _admin_ready(bs) and port_open(ports(st)["sasl_ssl"]):
                return
        except Exception as exc:  # noqa: BLE001 - reported if it never succeeds
            last = repr(exc)   # not the exception: its traceback would keep every frame of the attempt alive
        time.sleep(0.5)
    raise StackError(f"timed out after {timeout:.0f}s waiting for Kafka at {bs}"
                     f"{f' (last error: {last})' if last else ''}\n{st.log_tail(NAME, 40)}")


# -- lifecycle -----------------------------------------------------------------
def _start(st: Stack) -> int:
    if st.running_pid(NAME) is None:
        for name, port in ports(st).items():
            # A just-killed JVM can hold its sockets a moment after it stops counting
            # as running (its main thread is a zombie before the others are gone).
            deadline = time.monotonic() + 15
            while port_open(port) and time.monotonic() < deadline:
                time.sleep(0.2)
            if port_open(port):
                raise StackError(f"Kafka's {name} port {port} (kept in {home(st)}/ports.json) is in use by "
                                 "another program; stop it, or `python -m eos_stack down kafka --purge` to choose new ports")
    cfg = write_config(st)
    ensure_formatted(st, cfg)
    t0 = time.monotonic()
    pid = st.start_daemon(NAME, java_argv(st, "kafka.Kafka", str(cfg), heap=heap_size(st)), cwd=home(st),
                          marker=str(cfg))
    log(f"Kafka {VERSION} starting (pid {pid}) at {bootstrap(st)}")
    wait_ready(st, pid)
    log(f"Kafka answered after {time.monotonic() - t0:.1f}s")
    return pid


def up(st: Stack, *, heap: str | None = None) -> dict[str, str]:
    """Start the broker of ``st`` (or reuse it). ``heap``: its JVM heap from now on, restarts included (kept in
    ``<state>/kafka/heap``); a test's private broker (``Stack(state=...)``, tests/harness/private.py) takes less."""
    require_tool("java", JAVA_HINT)
    ensure_libs(st)
    if heap is not None:
        (home(st) / "heap").write_text(heap)
    pid = st.running_pid(NAME)
    if pid is not None and not config_current(st):
        # Started by older code (e.g. without the SASL_SSL listener): same ports and data, new config.
        log("the running Kafka broker's configuration is out of date; restarting it")
        restart(st)
    elif pid is not None:
        wait_ready(st, pid)  # reuse the running broker (it may still be starting)
    else:
        _start(st)
    kafka_security.ensure_admin(st)
    return {"KAFKA_BOOTSTRAP": bootstrap(st), **kafka_security.env(st)}


def down(st: Stack, purge: bool = False) -> None:
    st.stop_daemon(NAME, grace=STOP_GRACE)
    if purge:
        shutil.rmtree(st.state / "kafka", ignore_errors=True)
        st.drop_env(["KAFKA_BOOTSTRAP", *kafka_security.ENV_KEYS])


def status(st: Stack) -> tuple[str, str]:
    if not libs_dir(st).is_dir():
        return "missing", f"jars not resolved ({libs_dir(st)})"
    pid = st.running_pid(NAME)
    if pid is None:
        return "stopped", f"Kafka {VERSION}" + (" (data kept)" if formatted(st) else "")
    if not port_open(ports(st)["client"]):
        return "stopped", f"pid {pid} alive but {bootstrap(st)} is not answering (starting?)"
    return "running", (f"Kafka {VERSION} at {bootstrap(st)}, SASL_SSL at {kafka_security.secure_bootstrap(st)} "
                       f"(pid {pid})")


# -- chaos helpers -------------------------------------------------------------
def restart(st: Stack) -> None:
    """Clean stop (SIGTERM, controlled shutdown) and start again: same ports, same data."""
    pid = st.running_pid(NAME)
    st.stop_daemon(NAME, grace=STOP_GRACE)
    if pid is not None:
        _reap(pid)
    _start(st)


def hard_kill(st: Stack, *, start: bool = True) -> None:
    """SIGKILL the broker (no shutdown, no flush) and, unless ``start=False``, start it
    again on the same ports and data; the broker then recovers its logs."""
    pid = st.running_pid(NAME)
    if pid is not None:
        log(f"killing Kafka (pid {pid}) with SIGKILL")
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and st.running_pid(NAME) is not None:
            _reap(pid)
            time.sleep(0.1)
        st.pidfile(NAME).unlink(missing_ok=True)
    if start:
        _start(st)


def _reap(pid: int) -> None:
    """Collect the exit status if the broker is our own child (started in this process),
    so killed brokers do not linger as zombies in a long test session."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
