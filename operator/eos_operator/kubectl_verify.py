"""``kubectl eos verify NAME``: audit a live stream's sink against its ledger (see eos_job.audit).

It reads the stream's spec from the API server, the sink's credentials from the Secrets the spec names
(the user's own RBAC: ``get`` on those Secrets in the stream's namespace), then the sink topic, the
dead-letter topic and the ledger read_committed, as a downstream consumer would. Each (slot, batch) the
ledger recorded is compared with the records labelled with it: a lost or doubled slot is reported with
its batch, slot and offsets. It checks what reached the sink against what the protocol committed; it
does not re-read the source.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_VIOLATION = 6
EXIT_NOTHING_TO_CHECK = 4


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="audit the sink against the ledger: every committed slot once")
    p.add_argument("name")
    p.add_argument("--from-batch", type=int, default=0, help="check batches from this one on (default 0)")
    p.add_argument("--topic", action="append", default=[],
                   help="another topic the transformation routes records to (repeatable)")
    p.add_argument("--bootstrap", help="reach the sink here instead of spec.sink.bootstrapServers "
                                       "(a port-forward from outside the cluster)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to read each topic (default 120)")


def _secret_values(api, ns: str, sink) -> dict[str, str]:
    from eos_job.kafka_security import secret_refs

    from .adapters import key_value
    return {value: key_value(api.secret(ns, ref.name), ns, ref, f"sink ({value})")
            for value, ref in secret_refs(sink.credentials, sink.tls).items()}


def verify(args: argparse.Namespace, api, ns: str, stream: dict[str, Any], emit) -> int:
    from eos_job.kafka_security import KafkaSecrets
    from eos_job.ledger import sink_security
    from eos_job.spec import ExactlyOnceStreamSpec
    from eos_job.spec_rules import default_ledger_topic
    from eos_job.verify import audit_sink

    spec = ExactlyOnceStreamSpec.model_validate(stream.get("spec") or {})
    sink = spec.sink
    if not sink.audit_headers:
        print(f"error: {ns}/{args.name} writes its records without audit headers (spec.sink.auditHeaders: false), "
              "so nothing names the batch and slot of a record: set spec.sink.auditHeaders to true (a restart) "
              "and verify the batches written after it with --from-batch", file=sys.stderr)
        return EXIT_NOTHING_TO_CHECK
    extra = sink_security(sink, KafkaSecrets(_secret_values(api, ns, sink)))
    ledger = sink.ledger_topic or default_ledger_topic(sink.topic, ns, args.name)
    topics = [sink.topic, *[t for t in args.topic if t != sink.topic]]
    print(f"reading {', '.join(topics)}{', ' + sink.dead_letter_topic if sink.dead_letter_topic else ''} and the "
          f"ledger {ledger} read_committed ...", file=sys.stderr, flush=True)
    result = audit_sink(args.bootstrap or sink.bootstrap_servers, topics, ledger,
                        dead_letter_topic=sink.dead_letter_topic, from_batch=args.from_batch, extra=extra,
                        timeout_s=args.timeout)
    doc = {"stream": f"{ns}/{args.name}", "exact": result.exact, "summary": result.summary(),
           "slotsChecked": result.slots_checked, "digestsChecked": result.digests_checked,
           "records": result.records, "unlabelled": result.unlabelled, "unrecorded": result.unrecorded,
           "findings": [{"kind": f.kind, "batch": f.batch, "slot": f.slot, "run": f.run, "committed": f.committed,
                         "found": f.found, "message": f.describe(),
                         "offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in f.where[:1000]]}
                        for f in result.findings]}

    def text() -> str:
        lines = [f"{ns}/{args.name}: {result.summary()}"]
        lines += [f"  {f.kind.upper():8} {f.describe()}" for f in result.findings]
        if result.slots_checked == 0:
            lines.append("  nothing to check: the ledger holds no slot record from batch "
                         f"{args.from_batch} on (has the stream committed a batch?)")
        return "\n".join(lines)
    emit(doc, args.output, text)
    if result.findings:
        return EXIT_VIOLATION
    return 0 if result.slots_checked else EXIT_NOTHING_TO_CHECK
