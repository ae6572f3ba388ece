"""``python -m eos_operator run [--namespace NS ... | --all-namespaces] [--kubeconfig PATH]``.

Also ``python -m eos_operator crd`` (same as ``python -m eos_operator.crd``).
``--help`` needs no cluster: kopf and the Kubernetes client load only for ``run``.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import sys

from eos_job.log_format import FORMAT_ENV, format_argument
from eos_job.log_format import configure as configure_logging

ENV_INTERVAL = "EOS_OPERATOR_INTERVAL"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m eos_operator",
                                 description="The ExactlyOnceStream operator (streaming.eos.dev/v1beta1).")
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator against a cluster",
                         description="Watch ExactlyOnceStream resources and run their Spark drivers.")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], metavar="NS",
                       help="watch this namespace (repeatable; globs like 'team-*' work)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG or ~/.kube/config)")
    run.add_argument("--interval", type=float, default=float(os.environ.get(ENV_INTERVAL, "5")),
                     help=f"seconds between periodic reconciles of each stream (default 5, or ${ENV_INTERVAL})")
    run.add_argument("--resolution-timeout", type=float, default=60.0,
                     help="seconds resolution may take before the start counts as failed (default 60)")
    run.add_argument("--progress-interval", type=float, default=15.0,
                     help="seconds between reads of a running stream's last committed batch from its ledger "
                          "(default 15; each new batch seen is one status write, the operator's main steady "
                          "API traffic)")
    run.add_argument("--horizon-interval", type=float, default=30.0,
                     help="seconds between checks of a stream's replay horizon: its checkpointed source "
                          "positions versus what the source still retains (default 30)")
    run.add_argument("--metrics-port", type=int, metavar="PORT",
                     help="serve Prometheus metrics of the streams and of the operator itself on "
                          "http://<address>:PORT/metrics (default: off)")
    run.add_argument("--metrics-address", default="0.0.0.0", metavar="ADDRESS",
                     help="address the metrics endpoint listens on (default 0.0.0.0)")
    peering = run.add_mutually_exclusive_group()
    peering.add_argument("--standalone", action="store_true", default=True,
                         help="no peering with other operator instances (default; run one replica)")
    peering.add_argument("--peering", metavar="NAME",
                         help="use kopf peering NAME so only one of several replicas acts at a time")
    run.add_argument("--leader-election", action="store_true",
                     help="of several replicas only the holder of a coordination.k8s.io Lease acts; the others "
                          "stand by and take over within the lease duration of the leader's death")
    run.add_argument("--leader-election-namespace", default=os.environ.get("POD_NAMESPACE"), metavar="NS",
                     help="the Lease's namespace (default: $POD_NAMESPACE, the chart sets it to the operator's)")
    run.add_argument("--leader-election-id", default="spark-eos-operator", metavar="NAME",
                     help="the Lease's name (default spark-eos-operator)")
    run.add_argument("--lease-duration", type=float, default=10.0, metavar="SECONDS",
                     help="a Lease not renewed for this long is taken over (default 10; the leader renews every "
                          "second and stops if it could not for 70%% of this)")
    run.add_argument("--liveness", metavar="URL",
                     help="serve a liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument("--allow-local-store", action="store_true",
                     help="accept checkpoint.store local (a directory on the driver's node): tests and single-node "
                          "labs only, where every Pod runs on one machine")
    run.add_argument("--allow-ambient-s3-credentials", action="store_true",
                     help="accept checkpoint.s3.credentials ambient: the operator reads such a stream's bucket "
                          "with its own identity (environment, instance profile, IRSA, Workload Identity); off, "
                          "such a stream is InvalidSpec")
    run.add_argument("--no-informers", action="store_true",
                     help="read Pods, streams and snapshots with a request per reconcile instead of from watches "
                          "(needs no list/watch on Pods; costs a few API requests per stream every interval)")
    run.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    run.add_argument("--log-format", type=format_argument, default=os.environ.get(FORMAT_ENV, "text"),
                     help="text (default) or json: one object per line on stderr with time, level, logger, message "
                          "and the stream and namespace where known; the Pods the operator makes log the same way "
                          f"(default: ${FORMAT_ENV})")
    crd = sub.add_parser("crd", help="write (or --check) crds/exactlyoncestreams.streaming.eos.dev.yaml")
    crd.add_argument("--check", action="store_true")
    crd.add_argument("--stdout", action="store_true")
    return ap


class WaitingIsNotAnError(logging.Filter):
    """kopf logs every retry of a handler at ERROR ("failed temporarily"), also when the handler only
    waits (a deletion waiting for its driver to stop). Those of ours say "(not an error)": log them at INFO,
    so ERROR lines stay worth an alert."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and "(not an error)" in record.getMessage():
            record.levelno, record.levelname = logging.INFO, "INFO"
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "crd":
        from . import crd
        return crd.main((["--check"] if args.check else []) + (["--stdout"] if args.stdout else []))
    return run(args)


def older_crds(request) -> str | None:
    """Why this operator cannot run on the cluster's CRDs, or None. ``request`` is KubernetesApi.request_sync.

    Helm never upgrades ``crds/``: after ``helm upgrade`` alone the cluster may serve only an older version of the
    group, and the operator, which watches API_VERSION, would silently see no stream. No CRD at all is left to
    kopf (it waits for the CRD to appear and warns)."""
    from eos_job.spec import API_GROUP, API_VERSION

    from .kube_errors import KubeError
    try:
        group = request("GET", f"/apis/{API_GROUP}") or {}
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise
    served = [v.get("version") for v in group.get("versions") or []]
    if API_VERSION in served:
        return None
    return (f"the cluster serves {API_GROUP} {', '.join(served) or 'in no version'}, not {API_VERSION}, which this "
            f"operator uses: apply its CRDs (`kubectl apply --server-side -f charts/spark-eos-operator/crds/`; "
            f"Helm does not upgrade them), then run `kubectl eos migrate-storage` (docs/api-policy.md)")


def run(args: argparse.Namespace) -> int:
    import kopf

    from .handlers import OperatorConfig, build_registry
    from .validation import allow_ambient_s3_credentials, allow_local_store

    allow_local_store(args.allow_local_store)
    allow_ambient_s3_credentials(args.allow_ambient_s3_credentials)

    configure_logging(args.log_format, logging.DEBUG if args.verbose else logging.INFO)
    for noisy in ("kubernetes", "urllib3", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args.verbose:
        # kopf reports every successful timer tick; our own log lines say what changed.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("kopf.objects").addFilter(WaitingIsNotAnError())
    if args.kubeconfig:
        # kopf's login (through the kubernetes client) reads it from the environment, but the client
        # captured $KUBECONFIG as its default file when kopf imported it: point that default here too.
        import kubernetes.config.kube_config as kube_config
        os.environ["KUBECONFIG"] = args.kubeconfig
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = args.kubeconfig
    config = OperatorConfig(interval=args.interval, resolution_timeout=args.resolution_timeout,
                            progress_interval=args.progress_interval, horizon_interval=args.horizon_interval,
                            metrics_port=args.metrics_port, metrics_address=args.metrics_address,
                            kubeconfig=args.kubeconfig, namespaces=tuple(args.namespace),
                            informers=not args.no_informers,
                            exact_namespaces=bool(args.namespace) and all(
                                re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", ns) for ns in args.namespace))
    from .kube_api import KubernetesApi
    why = older_crds(KubernetesApi.from_kubeconfig(args.kubeconfig, threads=1).request_sync)
    if why:
        print(f"eos-operator: {why}", file=sys.stderr)
        return 1
    registry = build_registry(config)
    elector = None
    if args.leader_election:
        from .leader import LeaseSettings, default_identity, lead
        namespace = args.leader_election_namespace or (args.namespace[0] if config.exact_namespaces else None)
        if not namespace:
            print("--leader-election needs the Lease's namespace: set --leader-election-namespace or $POD_NAMESPACE",
                  file=sys.stderr)
            return 2
        elector = lead(LeaseSettings(namespace, args.leader_election_id, default_identity(), args.lease_duration,
                                     round(args.lease_duration * 0.7, 3), min(1.0, args.lease_duration / 10)),
                       args.kubeconfig, args.liveness)
    try:
        kopf.run(registry=registry,
                 clusterwide=not args.namespace,
                 namespaces=args.namespace,
                 standalone=args.peering is None,
                 peering_name=args.peering,
                 liveness_endpoint=args.liveness)
    finally:
        if elector is not None:
            elector.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
