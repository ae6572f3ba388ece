"""The unique-id stream, with a driver that grows its own memory until the container's limit stops it.

For trying ``job.driver.memory`` on a cluster and for the real-node OOM test
(``tests/e2e/test_real_node_oom.py``): the driver's Python process holds ``growMiB`` more memory every
``growEverySeconds`` (``job.args``; defaults 64 and 0.5), writing to every page so the memory is really used,
until the kernel kills the container (``OOMKilled``). The stream itself is the ids job's.
"""
import threading
import time

from examples.colors.ids import transform as ids_transform

PAGE = 4096


def _grow(step_mib: int, every: float) -> None:
    held = []
    while True:
        chunk = bytearray(step_mib * 1024 * 1024)
        chunk[::PAGE] = b"\x01" * (len(chunk) // PAGE)     # touch every page: resident, not just reserved
        held.append(chunk)
        time.sleep(every)


def transform(df, ctx):
    step = int(ctx.args.get("growMiB", "64"))
    every = float(ctx.args.get("growEverySeconds", "0.5"))
    threading.Thread(target=_grow, args=(step, every), name="hog", daemon=True).start()
    return ids_transform(df, ctx)
