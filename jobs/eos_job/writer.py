"""The foreachBatch function: one exactly-once write per micro-batch (see shared/design/exactly-once-protocol.md).

Before batch N's slots run, the driver checks that N is the input the ledger recorded for N (a batch is its
input, not its number) and records N's input; the slot tasks (``sink``) fence, read their ledger record and
skip or write; once every slot reported, the driver marks N complete and Spark writes ``commits/N``.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from . import __version__, checkpoint, faults, protocol, slot_stats, source_slots
from .contract import BatchRefused, DriverSuperseded, JobFailed
from .ledger import admin_client, base_config, ledger_consumer, read_history, sink_java_security, sink_security
from .log_format import log_context
from .request_limits import SinkLimits
from .sink import COMMIT_SCHEMA, SlotWriterConfig, slot_task
from .spec import RunConfig

log = logging.getLogger("eos_job")


class StopRequested(RuntimeError):
    """Raised inside a batch that started after a graceful stop was requested: nothing of it is written."""


@dataclass
class RunSummary:
    reason: str
    last_committed_batch: int | None = None
    batches: int = 0
    records: int = 0
    skipped_slots: int = 0
    dead_letters: int = 0
    nondeterministic_slots: int = 0
    snapshot: str | None = None
    error: str | None = None

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in self.__dict__.items() if v is not None}, sort_keys=True)


class BatchWriter:
    """The ``foreachBatch`` function: one exactly-once write per micro-batch."""

    def __init__(self, config: RunConfig, limits: SinkLimits | None = None):
        """``limits``: what the start check (``runtime.preflight``) read of the sink topics."""
        self.config = config
        limits = limits or SinkLimits()
        spec = config.spec
        self.slots = spec.job.parallelism
        self.slots_from = spec.job.slots_from
        self.sink_writer = spec.sink.writer   # python, or jvm: the JVM slot writer (jvm_writer)
        self.lock = threading.Lock()
        self.stopping = False
        self.summary = RunSummary(reason="Running")
        self.last_done: int | None = None
        self._ckpt_id: str | None = None
        self._producer = None   # the driver's partition-0 writer (epoch.driver_producer), from claim
        self._watch = None      # epoch.EpochWatch, from claim
        self._generations = None   # the ledger's generation history, from claim
        self._nondet_total: int | None = None   # continued from the ledger's last batch record
        # The ledger's batch history of this checkpoint beyond its last commit (load_history): what each
        # batch number was, so a batch is checked to be that input before it runs.
        self.history: dict[int, protocol.BatchHistoryRecord] = {}
        self.output_hash = spec.output_hash()
        unsafe = faults.unsafe_switches()      # the driver's own environment only (faults)
        self.checked = not faults.unsafe("input-check", unsafe)
        # Slots fixed by the input: any spec may finish a batch another one left partial (amendment A1).
        self.input_slots = self.slots_from == "sourcePartitions" or faults.unsafe("spec-check", unsafe)
        sec = sink_security(spec.sink)
        self.base = dict(bootstrap=spec.sink.bootstrap_servers,
                         producer_config={**spec.sink.producer_config, **limits.producer_overrides(), **sec},
                         topic=spec.sink.topic, dead_letter_topic=spec.sink.dead_letter_topic,
                         ledger_topic=config.ledger_topic(), tx_prefix=config.stream.transactional_prefix,
                         generation=config.stream.generation, stream_uid=config.stream.uid,
                         spec_hash=spec.spec_hash(), transaction_timeout_ms=spec.sink.transaction_timeout_ms,
                         slots=self.slots, epoch=0, audit=spec.sink.audit_headers, unsafe=unsafe,
                         topic_limits=dict(limits.topic_bytes))
        self.sec = sec
        # sink.writer jvm: producerConfig mapped and the same security for the Java clients, handed to the slot
        # tasks with their config (jvm_writer), never through Spark settings, which the UI's environment page shows.
        self.java_sec = {}
        if self.sink_writer == "jvm":
            from .jvm_writer import java_producer_settings
            self.java_sec = {**java_producer_settings({**spec.sink.producer_config, **limits.producer_overrides()}),
                             **sink_java_security(spec.sink)}
        self.slot_stats = slot_stats.SlotStats()   # every slot task's counters of this run, summed (slot_stats)

    def checkpoint_identity(self) -> str:
        if self._ckpt_id is None:
            self._ckpt_id = checkpoint.checkpoint_id(self.config.checkpoint_dir)
            if not self._ckpt_id:
                raise JobFailed(f"checkpoint {self.config.checkpoint_dir} has no metadata file after the query "
                                "started; is the checkpoint store writable?")
        return self._ckpt_id

    def claim(self, ckpt: Path) -> int:
        """This driver's generation (the ledger's history may know a later one) and epoch (the next of the
        stream, marked in every slot partition under every generation's transactional id, and stamped on every
        slot of the checkpoint). Returns the epoch."""
        from . import epoch
        b = self.base
        last = checkpoint.last_committed_batch(ckpt)
        # First fence the previous driver's partition-0 writer (its next batch record fails; a transaction it
        # left open there no longer holds back the reads below).
        self._producer = epoch.driver_producer(b["bootstrap"], self.sec, b["tx_prefix"], b["unsafe"])
        b["generation"], self._generations = epoch.claim_generation(b["bootstrap"], self.sec, b["ledger_topic"],
                                                          b["stream_uid"], b["generation"], self.slots,
                                                          0 if last is None else last + 1, self.slots_from)
        e, since = epoch.take(b["bootstrap"], self.sec, b["ledger_topic"], b["stream_uid"])
        # A fresh checkpoint has no records to stamp (its keys are new); its generation's ids are marked.
        epoch.mark(bootstrap=b["bootstrap"], sec=self.sec, ledger_topic=b["ledger_topic"], tx_prefix=b["tx_prefix"],
                   history=self._generations, generation=b["generation"], stream_uid=b["stream_uid"],
                   checkpoint_id=checkpoint.checkpoint_id(ckpt), epoch=e,
                   transaction_timeout_ms=b["transaction_timeout_ms"])
        if not faults.unsafe("stream-epoch", b["unsafe"]):
            self._watch = epoch.EpochWatch(b["bootstrap"], self.sec, b["ledger_topic"], b["stream_uid"], e, since)
        b["epoch"] = e
        return e

    def load_history(self, ckpt: Path) -> None:
        """Read what the ledger recorded of this checkpoint's batches after its last commit, and refuse to go on
        from a last commit that the ledger records as another input."""
        ckpt_id = checkpoint.checkpoint_id(ckpt)
        if ckpt_id is None:
            return
        consumer = ledger_consumer(self.base["bootstrap"], self.sec)
        try:
            raw = read_history(consumer, self.base["ledger_topic"],
                               protocol.history_prefix(self.base["stream_uid"], ckpt_id),
                               checkpoint.last_committed_batch(ckpt))
        finally:
            consumer.close()
        self.history = {n: protocol.newest_history(values) for n, values in raw.items()}
        last = checkpoint.last_committed_batch(ckpt)
        if last is not None and last in self.history:
            problem = protocol.committed_mismatch(last, checkpoint.batch_input(ckpt, last), self.history[last])
            if problem:
                raise BatchRefused(problem)
        self._resume_generation(ckpt_id, 0 if last is None else last + 1)

    def _resume_generation(self, ckpt_id: str, first: int) -> None:
        """The first batch the ledger holds incomplete, left partial by another generation with this spec's slot
        layout, is finished under that generation (its transactional ids and slot keys) instead of refused, and
        the batches after it run under it too. The way out when a later generation started before the batch
        was finished (a zombie's slot commit, a rescale that ran ahead of a drain): run the spec with the
        old slot count, which finishes the batch, then change it again."""
        partial = [n for n in sorted(self.history) if n >= first and not self.history[n].complete]
        gen, generations = self.base["generation"], getattr(self, "_generations", None)
        if not partial or generations is None or self.history[partial[0]].generation == gen:
            return
        rec = self.history[partial[0]]
        layout = (generations.slots_of().get(rec.generation), generations.slots_from(rec.generation))
        if layout != (self.slots, self.slots_from) or self._untouched(rec, ckpt_id, partial[0]):
            return
        log.warning("batch %d is partially committed under generation %d, whose slot layout (%d slots from %s) "
                    "this spec has: finishing it under that generation, not %d", partial[0], rec.generation,
                    self.slots, self.slots_from, gen)
        self.base["generation"] = rec.generation

    def __call__(self, df, batch_id: int) -> None:
        with log_context(batch=batch_id):   # every record of this batch's write carries its number
            self._write(df, batch_id)

    def _write(self, df, batch_id: int) -> None:
        with self.lock:
            if self.stopping:
                raise StopRequested(f"stop requested before batch {batch_id}; it is replayed on the next start")
            t0 = time.monotonic()
            ckpt_id = self.checkpoint_identity()
            ckpt = self.config.checkpoint_dir
            planned = checkpoint.batch_input(ckpt, batch_id)
            # Before anything is recorded of the batch: a plan job.slotsFrom cannot take leaves no trace.
            slot_map = self._slot_map(df, planned)
            gen = self.base["generation"]
            recorded = self.history.get(batch_id)
            if self.checked:
                inputs = self.input_slots
                verdict = protocol.judge_batch(batch_id, planned, recorded, gen, self.output_hash, input_slots=inputs)
                if verdict.action == "refuse" and self._untouched(recorded, ckpt_id, batch_id):
                    verdict = protocol.judge_batch(batch_id, planned, recorded, gen, self.output_hash, untouched=True,
                                                   input_slots=inputs)
                if verdict.action == "refuse":
                    raise BatchRefused(verdict.reason)
                if recorded is not None and not recorded.complete and verdict.action == "run":
                    log.info("batch %d: %s", batch_id, verdict.reason)   # finishing a partial batch
                if verdict.action == "replan":
                    raise JobFailed(verdict.reason)
                if verdict.action == "skip":
                    # The plan still runs (a stateful job's state must advance with the batch); no slot writes.
                    cfg = SlotWriterConfig(**self.base, checkpoint_id=ckpt_id, batch=batch_id, skip_all=True,
                                           slot_map=slot_map)
                    self._run_slots(df, cfg)
                    log.info("batch %d skipped as a whole: %s", batch_id, verdict.reason)
                    self._done(batch_id, 0, self.slots, 0, 0, self._nondeterministic_total())
                    return
            intent = protocol.BatchHistoryRecord(batch_id, gen, self.slots, planned,
                                                 checkpoint.offset_log_text(ckpt, batch_id), self.output_hash,
                                                 epoch=self.base["epoch"])
            if recorded is None or not recorded.complete:
                # Before any slot commits: the ledger knows what batch N is even if this driver dies mid-batch.
                self._write_ledger(protocol.history_key(self.base["stream_uid"], ckpt_id, batch_id), intent.encode())
                self.history[batch_id] = intent
            # A batch complete in the sink is skipped whole by its slots whatever spec wrote it (after a
            # rollback, say); only a partial one must be finished by the spec that started it.
            complete = recorded is not None and recorded.complete
            cfg = SlotWriterConfig(**self.base, checkpoint_id=ckpt_id, batch=batch_id,
                                   input=protocol.input_digest(planned) if self.checked else "",
                                   output_hash="" if complete else self.output_hash, slot_map=slot_map)
            ran, rows = self._run_slots(df, cfg)
            commits, stats = self._commits(rows)
            protocol.check_batch_commits(batch_id, ran, commits)
            count = sum(c.count for c in commits if not c.skipped)
            skipped = sum(1 for c in commits if c.skipped)
            dead = sum(c.dead_letters for c in commits if not c.skipped)
            nondet = sum(1 for c in commits if c.nondeterministic)
            nondet_total = self._nondeterministic_total() + nondet
            record = protocol.BatchCompleteRecord(batch_id, self.slots, count, skipped, dead,
                                                  self._source_positions(batch_id), nondet, nondet_total,
                                                  runtime_version=__version__)
            done_record = replace(self.history.get(batch_id) or intent, complete=True)
            uid = self.base["stream_uid"]
            old = batch_id - protocol.HISTORY_BATCHES
            more = [(protocol.batch_key(uid, ckpt_id, gen), record.encode())]   # stays the partition's last
            if old >= 0:
                more.insert(0, (protocol.history_key(uid, ckpt_id, old), None))
            self._write_ledger(protocol.history_key(uid, ckpt_id, batch_id), done_record.encode(), more=tuple(more))
            self.history[batch_id] = done_record
            faults.batch_in_sink(batch_id)
            self._done(batch_id, count, skipped, dead, nondet, nondet_total)
            log.info("batch %d committed: %d records, %d/%d slots skipped as already committed, %d dead letters%s "
                     "(%.0f ms)", batch_id, count, skipped, self.slots, dead,
                     f", {nondet} NON-DETERMINISTIC slots" if nondet else "", (time.monotonic() - t0) * 1000)
            log.info("batch %d %s", batch_id, stats.summary())

    def _untouched(self, recorded: protocol.BatchHistoryRecord, ckpt_id: str, batch_id: int) -> bool:
        """No slot of the generation that recorded the batch holds it or a later one. Read after this driver's
        start fenced every generation's transactional ids (``epoch.mark``), so none of them commits later."""
        from .ledger_scan import read_latest_many
        uid, topic = self.base["stream_uid"], self.base["ledger_topic"]
        wants = {protocol.ledger_partition(s): protocol.slot_key(uid, ckpt_id, recorded.generation, s)
                 for s in range(recorded.slots)}
        with admin_client(base_config(self.base["bootstrap"], self.sec)) as admin:
            consumer = ledger_consumer(self.base["bootstrap"], self.sec)
            try:
                latest = read_latest_many(admin, consumer, topic, wants)
            finally:
                consumer.close()
        return all(raw is None or protocol.SlotLedgerRecord.decode(raw).batch < batch_id for raw in latest.values())

    def _commits(self, rows: list) -> tuple[list[protocol.SlotCommit], slot_stats.SlotStats]:
        """The slots' commit rows: their commits, and their counters summed (also into the run's)."""
        split = [slot_stats.split_row(r if isinstance(r, dict) else r.asDict()) for r in rows]
        total = slot_stats.batch_total([s for _, s in split])
        self.slot_stats.add(total)
        return [protocol.SlotCommit.from_row(c) for c, _ in split], total

    def _slot_map(self, df, planned: protocol.Ranges) -> tuple[int, ...]:
        """job.slotsFrom sourcePartitions: the slot of each of the batch's tasks (source_slots); () by key."""
        if self.slots_from == "key":
            return ()
        return source_slots.slot_map(source_slots.scan_partitions(df._jdf), planned, self.slots)

    def _run_slots(self, df, cfg: SlotWriterConfig) -> tuple[list[int], list]:
        """Run the batch's slot tasks; the slots that ran and their commit rows. With source slots the tasks
        are those of the batch's RDD that ``_slot_map`` read (a foreachBatch DataFrame scans that RDD).
        ``sink.writer: jvm``: the same tasks on the JVM slot writer (``jvm_writer``)."""
        ran = list(range(self.slots)) if self.slots_from == "key" else sorted(set(cfg.slot_map))
        if self.sink_writer == "jvm":
            from . import jvm_writer
            return ran, jvm_writer.run_slots(df, cfg, security=self.java_sec)
        if self.slots_from == "key":
            return ran, df.repartition(self.slots, "key").mapInArrow(slot_task(cfg), COMMIT_SCHEMA).collect()
        return ran, df.mapInArrow(slot_task(cfg), COMMIT_SCHEMA).collect()

    def _done(self, batch_id: int, count: int, skipped: int, dead: int, nondet: int, nondet_total: int) -> None:
        s = self.summary
        s.batches += 1
        s.records += count
        s.skipped_slots += skipped
        s.dead_letters += dead
        s.nondeterministic_slots += nondet
        s.last_committed_batch = batch_id
        self.last_done = batch_id
        self._nondet_total = nondet_total

    def _write_ledger(self, key: str, value: bytes, more: tuple = ()) -> None:
        if self._watch is not None:
            # Once, before the run's first partition-0 write: a newer epoch, another stream's records. Later
            # writes need no look: a newer driver's start fences this driver's writer (write_driver_record).
            watch, self._watch = self._watch, None
            try:
                watch.check()
            finally:
                watch.close()
        from .epoch import newest_epoch, write_driver_record
        try:
            write_driver_record(self._producer, self.base["ledger_topic"], key, value, more=more)
        except DriverSuperseded as exc:
            b = self.base
            newest = newest_epoch(b["bootstrap"], self.sec, b["ledger_topic"], b["stream_uid"])
            # Not chained: the driver's exit reads the first DriverSuperseded of the query's traceback.
            if newest > b["epoch"]:
                raise DriverSuperseded(f"a newer driver (epoch {newest}) runs this stream; this one (epoch "
                                       f"{b['epoch']}) stops: {exc}") from None
            # No newer epoch yet: the resolution before a newer driver's start fenced the writer (a driver on a
            # lost node, replaced while it runs: docs/operations.md#node-loss).
            raise DriverSuperseded(f"a newer driver of this stream is starting (its resolution fenced this "
                                   f"driver's writer; no epoch above this one's, {b['epoch']}, yet): this one "
                                   f"stops: {exc}") from None

    def _nondeterministic_total(self) -> int:
        """Detections so far, from the ledger's last batch record (read once per driver)."""
        if self._nondet_total is None:
            from .resolution import last_batch_record

            last = last_batch_record(self.config, timeout_s=10.0)
            self._nondet_total = last.nondeterministic_slots_total if last is not None else 0
        return self._nondet_total

    def _source_positions(self, batch_id: int) -> dict[str, dict[str, int]]:
        """offsets/<batch_id> of the checkpoint (Spark logs it before the batch runs); {} if unreadable.

        Informative only (the operator's replay-horizon check): never a reason to fail the batch.
        """
        try:
            return checkpoint.kafka_offsets(self.config.checkpoint_dir, batch_id)
        except (OSError, ValueError) as exc:
            log.debug("source offsets of batch %d not read: %s", batch_id, exc)
            return {}


