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
    """The control: every cluster shares one pool of asyncio's default size on two cores."""

    def pool(self, purpose: str, cluster: str):
        return super().pool("shared", "all")


def config(name: str, bootstrap: str) -> RunConfig:
    doc = colors_manifest(name, bootstrap, "iso-events", "iso-counts", "/tmp/unused", namespace="iso")
    spec = ExactlyOnceStreamSpec.model_validate(doc["spec"])
    return RunConfig(stream=StreamIdentity(name=name, namespace="iso", uid=f"uid-{name}"), spec=spec,
                     checkpoint_dir="/tmp/unused")


def finish_times(pools: Pools, good_bootstrap: str, bad_bootstrap: list[str]) -> tuple[list[float], list[float]]:
    # The black-holed reads wait this long: far longer than fifty healthy reads take on a busy two-core machine
    # (a clean-clone run beside two e2e tests saw them end 0.5 s after a 10 s timeout).
    progress = LedgerProgress(min_interval=0, timeout_s=BLACK_HOLE_TIMEOUT_S, pools=pools)
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
        bad = [asyncio.create_task(read(config(f"bad-{i}", b))) for i, b in enumerate(bad_bootstrap)]
        await asyncio.sleep(0.5)   # the black-holed reads hold their threads first
        good = [asyncio.create_task(read(config(f"good-{i}", good_bootstrap))) for i in range(GOOD)]
        return await asyncio.gather(*good), await asyncio.gather(*bad)

    return asyncio.run(scenario())


def test_a_black_holed_cluster_delays_only_its_own_streams(stack_env):
    holes = [BlackHole() for _ in range(BAD)]
    try:
        bad_bootstrap = [f"127.0.0.1:{hole.port}" for hole in holes]
        good, bad = finish_times(Pools(), stack_env["KAFKA_BOOTSTRAP"], bad_bootstrap)
        assert max(good) < min(bad), (f"healthy reads finished up to {max(good) - min(bad):.1f}s after the first "
                                      "black-holed one: they waited behind the unreachable cluster")
        # The control: one shared pool. The same check sees the healthy streams stuck behind the black hole.
        good, bad = finish_times(OnePool(default_workers=6), stack_env["KAFKA_BOOTSTRAP"], bad_bootstrap)
        assert max(good) > min(bad), "the control did not show the starvation the pools prevent"
    finally:
        for hole in holes:
            hole.close()
