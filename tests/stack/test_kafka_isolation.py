"""One unreachable Kafka cluster delays only its own streams (operator/eos_operator/pools.py).

Eight streams point at eight black holes (TCP listeners that accept and never answer, as firewalled
brokers do); fifty point at the local Kafka. Through the operator's real progress reader (reads batched per
cluster), every healthy stream's ledger read must finish while the black-holed ones still wait for their
timeouts. The control runs the same reads through one shared pool (as asyncio's default executor would): there
the healthy clusters' batch waits behind the black holes' batches, which the same check reports.
"""
from __future__ import annotations

import asyncio
import socket
import threading
import time

from eos_job.spec import ExactlyOnceStreamSpec, RunConfig, StreamIdentity
from eos_operator.progress import LedgerProgress
from eos_operator.pools import Pools
from examples.colors.manifest import colors_manifest

BAD, GOOD = 8, 50
BLACK_HOLE_TIMEOUT_S = 25.0


class BlackHole:
    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.held: list[socket.socket] = []
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)   # read nothing, answer nothing

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


class OnePool(Pools):
    """The control: every cluster shares one pool of asyncio's default size on two cores (six threads: the eight
    black-holed batches take them all, and the healthy cluster's batch waits for the first to time out)."""

    def pool(self, purpose: str, cluster: str):
        return super().pool("shared", "all")


def config(name: str, bootstrap: str) -> RunConfig:
    doc = colors_manifest(name, bootstrap, "iso-events", "iso-counts", "/tmp/unused", namespace="iso")
    spec = ExactlyOnceStreamSpec.model_validate(doc["spec"])
    return RunConfig(stream=StreamIdentity(name=name, namespace="iso", uid=f"uid-{name}"), spec=spec,
                     checkpoint_dir="/tmp/unused")


def finish_times(pools: Pools, good_bootstrap: str, bad_bootstrap: list[str]) -> tuple[list[float], list[float]]:
    # The black-holed reads wait this long: far longer than fifty healthy reads take on a busy two-core machine.
    # ``first_wait``: a stream's first ``ledger_tip`` returns when its read ends, not after the operator's usual
    # one second (then None, the read going on): the times below are the reads' own. (With the usual second,
    # every black-holed call returned at 1.0 s, so the check compared healthy reads with that second, failed
    # when they took over 0.5 s beside two e2e tests, and its control passed without any starvation.)
    progress = LedgerProgress(min_interval=0, timeout_s=BLACK_HOLE_TIMEOUT_S, pools=pools,
                              first_wait=3 * BLACK_HOLE_TIMEOUT_S)
    try:
        return _finish_times(progress, good_bootstrap, bad_bootstrap)
    finally:
        progress.clients.close()   # no client of this test lives on into the next one
        pools.close(wait=True)


def _finish_times(progress: LedgerProgress, good_bootstrap: str,
                  bad_bootstrap: list[str]) -> tuple[list[float], list[float]]:

    async def read(cfg: RunConfig) -> float:
        await progress.ledger_tip(cfg)
        return time.monotonic()

    async def scenario():
        start = time.monotonic()
        bad = [asyncio.create_task(read(config(f"bad-{i}", b))) for i, b in enumerate(bad_bootstrap)]
        await asyncio.sleep(0.5)   # the black-holed reads hold their threads first
        good = [asyncio.create_task(read(config(f"good-{i}", good_bootstrap))) for i in range(GOOD)]
        good, bad = await asyncio.gather(*good), await asyncio.gather(*bad)
        return [t - start for t in good], [t - start for t in bad]

    return asyncio.run(scenario())


def test_a_black_holed_cluster_delays_only_its_own_streams(stack_env):
    holes = [BlackHole() for _ in range(BAD)]
    try:
        bad_bootstrap = [f"127.0.0.1:{hole.port}" for hole in holes]
        good, bad = finish_times(Pools(), stack_env["KAFKA_BOOTSTRAP"], bad_bootstrap)
        # The black holes held their reads to the timeout (else this test would compare nothing).
        assert min(bad) >= BLACK_HOLE_TIMEOUT_S, f"a black-holed read ended after {min(bad):.1f}s"
        assert max(good) < min(bad), (f"healthy reads finished up to {max(good) - min(bad):.1f}s after the first "
                                      "black-holed one: they waited behind the unreachable cluster")
        # The control: one shared pool. The same check sees the healthy streams stuck behind the black hole.
        control_good, control_bad = finish_times(OnePool(default_workers=6), stack_env["KAFKA_BOOTSTRAP"],
                                                 bad_bootstrap)
        assert min(control_bad) >= BLACK_HOLE_TIMEOUT_S, f"a black-holed read ended after {min(control_bad):.1f}s"
        assert max(control_good) > min(control_bad), "the control did not show the starvation the pools prevent"
        print(f"healthy reads ended by {max(good):.1f}s with a pool per cluster, by {max(control_good):.1f}s with "
              f"one shared pool; the black-holed ones at {min(bad):.1f}s and later")
    finally:
        for hole in holes:
            hole.close()
