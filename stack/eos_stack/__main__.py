"""``python -m eos_stack up|down|status [part ...]`` (PYTHONPATH=stack)."""
from __future__ import annotations

import argparse
import fcntl
import sys
import time

from . import gitops, helm, kafka, kube, node, prometheus, registry, s3, spark
from .common import Stack, StackError, log

PARTS = {"kafka": kafka, "s3": s3, "kube": kube, "spark": spark, "helm": helm,
         "prometheus": prometheus, "gitops": gitops, "node": node,
         "registry": registry}
# Start order: downloads first, servers after; stop in reverse. gitops last: its Go build reuses the packages
# the kube build compiled (gitops.py).
ORDER = ["spark", "helm", "prometheus", "registry", "kafka", "s3", "kube", "node", "gitops"]
# Started only when named (`up node`): a cold node build takes minutes, and only what runs Pods needs them (the
# tests, the demo, the benchmarks; node.py). A plain `down` stops them too, before the API server they report to.
ON_DEMAND = {"node"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eos-stack", description=__doc__)
    ap.add_argument("action", choices=["up", "down", "status"])
    ap.add_argument("parts", nargs="*", help=f"any of {', '.join(ORDER)} (default: all)")
    ap.add_argument("--purge", action="store_true", help="with down: also delete the state folder's data")
    args = ap.parse_intermixed_args(argv)
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        ap.error(f"unknown part(s) {unknown}; choose from {ORDER}")
    st = Stack()
    default = ORDER if args.action == "down" else [p for p in ORDER if p not in ON_DEMAND]
    parts = [p for p in ORDER if p in (args.parts or default)]
    try:
        if args.action == "up":
            # One `up` at a time (pytest-xdist workers each make sure the stack runs): a second one waits, then
            # finds every part running.
            st.dir()   # the state folder exists
            lock = open(st.state / "up.lock", "w")
            fcntl.flock(lock, fcntl.LOCK_EX)
            for name in parts:
                t0 = time.monotonic()
                log(f"{name}: starting")
                env = PARTS[name].up(st)
                st.update_env(env)
                log(f"{name}: ready in {time.monotonic() - t0:.1f}s")
            log(f"connection details in {st.env_file}")
        elif args.action == "down":
            for name in reversed(parts):
                PARTS[name].down(st, purge=args.purge)
        else:
            ok = True
            for name in parts:
                state, detail = PARTS[name].status(st)
                ok &= state in ("running", "ready")
                print(f"{name:10} {state:8} {detail}")
            return 0 if ok else 3
    except StackError as exc:
        print(f"stack {args.action} failed: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
