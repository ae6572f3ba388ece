package eos.slotwriter;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;

/**
 * One slot of one batch written exactly once, the path of jobs/eos_job/sink.py on Kafka's Java producer: fence
 * ({@code initTransactions}) → the slot's newest ledger record (read_committed) → {@code decideSlot} → one
 * transaction with every record and the slot's ledger record → commit → the commit row. Producers are held per
 * transactional id in the executor JVM; a held one clean since its last commit, of the same ledger key and
 * driver epoch, skips the fence and the read (amendment A2). Any Kafka failure discards it and fences again.
 *
 * A task checks its slot's producer out of the pool and back in when it ends well: the executor's task threads
 * share the pool, and two attempts of one slot at once (a speculative or retried task beside a zombie) must never
 * share a producer, as two Python workers never do. The second attempt makes its own producer, whose fence
 * fails the first one's transaction.
 *
 * Poison records go to the dead-letter topic in the slot's transaction ({@link DeadLetters}). Not in this
 * landing: the broker-refusal rounds of poison.Verdicts, the held-back check's negative control, the fault points
 * of faults.py other than {@code commit-returned}.
 */
public final class SlotWriter {
    private SlotWriter() {}

    static final int MAX_FENCE_ROUNDS = 5;
    static final Map<String, Held> POOL = new ConcurrentHashMap<>();

    /** A slot's transactional producer and ledger readers, kept across batches in the executor JVM. */
    static final class Held {
        final KafkaProducer<byte[], byte[]> producer;
        final KafkaConsumer<byte[], byte[]> reader;       // read_committed
        final KafkaConsumer<byte[], byte[]> ends;         // read_uncommitted: the partition's real end
        final double fenceMs;
        boolean fresh = true;
        boolean clean = false;
        Protocol.SlotRecord last;
        String lastScope;
        double commitMs;

        Held(Config cfg, String txid) {
            Properties p = cfg.clientProps(true);
            p.putIfAbsent("linger.ms", "5");   // sink.producerConfig's linger.ms (queue.buffering.max.ms) wins
            p.put("transactional.id", cfg.unsafe.contains("fence") ? txid + "-unfenced-" + System.nanoTime() : txid);
            p.put("enable.idempotence", "true");
            p.put("acks", "all");
            p.put("transaction.timeout.ms", String.valueOf(cfg.transactionTimeoutMs));
            p.put("key.serializer", ByteArraySerializer.class.getName());
            p.put("value.serializer", ByteArraySerializer.class.getName());
            producer = new KafkaProducer<>(p);
            long t0 = System.nanoTime();
            try {
                producer.initTransactions();   // the fence: aborts or completes an older attempt's transaction
            } catch (RuntimeException e) {
                producer.close(Duration.ZERO);
                throw e;
            }
            fenceMs = (System.nanoTime() - t0) / 1e6;
            reader = consumer(cfg, "read_committed");
            ends = consumer(cfg, "read_uncommitted");
        }

        private static KafkaConsumer<byte[], byte[]> consumer(Config cfg, String isolation) {
            Properties c = cfg.clientProps(false);
            c.put("isolation.level", isolation);
            c.put("enable.auto.commit", "false");
            c.put("key.deserializer", ByteArrayDeserializer.class.getName());
            c.put("value.deserializer", ByteArrayDeserializer.class.getName());
            return new KafkaConsumer<>(c);
        }

        void close() {
            for (AutoCloseable c : new AutoCloseable[]{reader, ends}) {
                try { c.close(); } catch (Exception ignored) { /* best effort: being discarded */ }
            }
            try { producer.close(Duration.ZERO); } catch (RuntimeException ignored) { /* discarded */ }
        }
    }

    /** The commit row of sink.COMMIT_SCHEMA (the protocol's SlotCommit and slot_stats' counters). */
    static final class Commit {
        final Map<String, Object> row = new LinkedHashMap<>();
        final Map<String, Number> stats = new LinkedHashMap<>();

        Commit() {
            for (String k : new String[]{"tasks", "whole_skips", "pool_hits", "new_producers", "stale_producers",
                    "fences", "ledger_reads", "trusted", "trusted_fallbacks"}) stats.put(k, 0);
            for (String k : new String[]{"fence_ms", "ledger_ms", "commit_ms"}) stats.put(k, 0.0);
        }

        void inc(String k) { stats.put(k, stats.get(k).intValue() + 1); }
        void ms(String k, double v) { stats.put(k, stats.get(k).doubleValue() + v); }

        Commit done(int slot, long batch, long count, long digest, boolean skipped, long dead, boolean nondet,
                    int attempt) {
            row.put("slot", slot); row.put("batch", batch); row.put("count", count);
            row.put("digest", Protocol.hex(digest)); row.put("skipped", skipped); row.put("dead_letters", dead);
            row.put("nondeterministic", nondet); row.put("attempt", attempt);
            return this;
        }

        String json() {
            Map<String, Object> all = new LinkedHashMap<>(row);
            all.putAll(stats);
            try {
                return Protocol.JSON.writeValueAsString(all);
            } catch (java.io.IOException e) {
                throw new IllegalStateException(e);
            }
        }
    }

    /** The slot's producer, checked out of the pool (a new, fenced one if none is held or {@code old} is stale). */
    static Held checkout(Config cfg, int slot, Held old) {
        String txid = Protocol.transactionalId(cfg.txPrefix, cfg.generation, slot);
        if (old != null) old.close();
        Held held = old == null ? POOL.remove(txid) : null;
        return held != null ? held : new Held(cfg, txid);
    }

    /** Back to the pool for the slot's next task; a producer a concurrent attempt put there since stays. */
    static String checkin(Config cfg, int slot, Held held, String row) {
        if (POOL.putIfAbsent(Protocol.transactionalId(cfg.txPrefix, cfg.generation, slot), held) != null) held.close();
        return row;
    }

    /** Write one slot of one batch exactly once; the commit row as JSON. Throws when the outcome is not certain. */
    public static String writeSlot(Config cfg, int slot, int attempt, Iterator<Rec> source) {
        if (cfg.faultFailSlot == slot) {
            throw new IllegalStateException("fault: slot " + slot + "'s task failed before it wrote (fail_slot)");
        }
        Rows rows = new Rows(source);
        Commit c = new Commit();
        c.inc("tasks");
        if (cfg.skipAll) {
            rows.drain();
            c.inc("whole_skips");
            return c.done(slot, cfg.batch, rows.count, rows.digest, true, 0, false, attempt).json();
        }
        String key = Protocol.slotKey(cfg.streamUid, cfg.checkpointId, cfg.generation, slot);
        String scope = cfg.ledgerTopic + "\u0000" + key + "\u0000" + cfg.epoch;
        RuntimeException last = null;
        for (int round = 0; round < MAX_FENCE_ROUNDS; round++) {
            Held held = checkout(cfg, slot, null);
            boolean trusted = !held.fresh && held.clean && scope.equals(held.lastScope);
            if (!trusted && !held.fresh) {
                c.inc("stale_producers");
                held = checkout(cfg, slot, held);
            }
            if (held.fresh) {
                c.inc("new_producers");
                c.inc("fences");
                c.ms("fence_ms", held.fenceMs);
            }
            try {
                Protocol.SlotRecord recorded;
                long streamEpoch = 0;
                if (trusted) {
                    c.inc("pool_hits");
                    c.inc("trusted");
                    recorded = held.last;
                } else {
                    long t0 = System.nanoTime();
                    long[] epochSeen = {0};
                    recorded = LedgerRead.latest(held, cfg, slot, key, epochSeen);
                    c.inc("ledger_reads");
                    c.ms("ledger_ms", (System.nanoTime() - t0) / 1e6);
                    streamEpoch = cfg.unsafe.contains("stream-epoch") ? 0 : epochSeen[0];
                    held.last = recorded;
                    held.lastScope = scope;
                }
                held.fresh = false;
                Protocol.Decision d = Protocol.decideSlot(cfg.batch, recorded, cfg.input, cfg.outputHash, cfg.epoch,
                        streamEpoch, !cfg.slotMap.isEmpty() || cfg.unsafe.contains("spec-check"));
                switch (d.action()) {
                    case SUPERSEDED:
                        throw new IllegalStateException("DriverSuperseded: slot " + slot + ": " + d.reason());
                    case REFUSE:
                        throw new IllegalStateException("BatchRefused: slot " + slot + ": " + d.reason()
                                + "; nothing was written");
                    case REPLAN:
                        throw new IllegalStateException("slot " + slot + ": " + d.reason() + "; nothing was written, "
                                + "and the restart re-runs the ledger's batches before planning new ones");
                    default:
                }
                if (d.action() == Protocol.Action.SKIP && !cfg.unsafe.contains("ledger-skip")) {
                    rows.drain();
                    boolean sameSpec = recorded.outputHash().isEmpty() || cfg.outputHash.isEmpty()
                            || recorded.outputHash().equals(cfg.outputHash);
                    boolean nondet = recorded.batch() == cfg.batch && sameSpec
                            && (recorded.count() != rows.count || recorded.digest() != rows.digest);
                    return checkin(cfg, slot, held, c.done(slot, cfg.batch, recorded.count(), recorded.digest(), true,
                            recorded.deadLetters(), nondet, attempt).json());
                }
                if (!rows.anyRows()) {
                    return checkin(cfg, slot, held, c.done(slot, cfg.batch, 0, 0, false, 0, false, attempt).json());
                }
                long dead = transaction(cfg, held, slot, key, rows);
                c.ms("commit_ms", held.commitMs);
                if (cfg.faultCommitReturnedSlot == slot) {
                    // Test-only (eos_job.jvm_writer's faults): the commit landed, its answer is lost.
                    throw new IllegalStateException("fault: the answer to slot " + slot + "'s commit of batch "
                            + cfg.batch + " was lost (commit-returned)");
                }
                return checkin(cfg, slot, held, c.done(slot, cfg.batch, rows.count, rows.digest, false, dead, false,
                        attempt).json());
            } catch (KafkaException e) {
                last = e;
                if (trusted) c.inc("trusted_fallbacks");
                try { held.producer.abortTransaction(); } catch (RuntimeException ignored) { /* fenced, fatal */ }
                held.close();
                sleep(Math.min(200L << round, 5000L));
            } catch (RuntimeException e) {
                held.close();
                throw e;
            }
        }
        throw new IllegalStateException("slot " + slot + " of batch " + cfg.batch + ": could not commit after "
                + MAX_FENCE_ROUNDS + " fenced attempts; last error: " + last, last);
    }

    /** The audit headers (eos_job.audit): every record's when sink.auditHeaders, every dead letter's always. */
    static List<Header> auditHeaders(Config cfg, int slot) {
        return List.of(
                new RecordHeader(Protocol.BATCH_HEADER, Long.toString(cfg.batch).getBytes(StandardCharsets.UTF_8)),
                new RecordHeader(Protocol.SLOT_HEADER, Protocol.slotHeader(cfg.checkpointId, cfg.generation, slot)
                        .getBytes(StandardCharsets.UTF_8)));
    }

    /** One transaction: every record (poison ones as dead letters), the slot's ledger record; the dead letters. */
    private static long transaction(Config cfg, Held held, int slot, String key, Rows rows) {
        List<Header> audit = cfg.audit ? auditHeaders(cfg, slot) : List.of();
        KafkaProducer<byte[], byte[]> producer = held.producer;
        held.clean = false;   // A2: from here until commitTransaction returns, the outcome is not known
        producer.beginTransaction();
        long dead = 0;
        for (Iterator<Rec> it = rows.iterator(); it.hasNext(); ) {
            Rec r = it.next();
            String topic = r.topic != null ? r.topic : cfg.topic;
            String why = r.error != null ? r.error : DeadLetters.tooLarge(cfg, topic, r);
            if (why != null) {
                dead++;
                producer.send(DeadLetters.of(cfg, topic, r, why, slot));
                continue;
            }
            List<Header> headers = audit;
            if (r.headers != null && !r.headers.isEmpty()) {
                headers = new ArrayList<>(r.headers);
                headers.addAll(audit);
            }
            producer.send(new ProducerRecord<>(topic, r.partition, r.key, r.value, headers));
        }
        Protocol.SlotRecord record = new Protocol.SlotRecord(cfg.batch, rows.count, rows.digest, dead, cfg.specHash,
                cfg.input, cfg.outputHash, cfg.epoch);
        producer.send(new ProducerRecord<>(cfg.ledgerTopic, Protocol.ledgerPartition(slot),
                key.getBytes(StandardCharsets.UTF_8), record.encode()));
        long t0 = System.nanoTime();
        producer.commitTransaction();   // flushes; a record the broker refused fails it
        held.commitMs = (System.nanoTime() - t0) / 1e6;
        held.last = record;
        held.clean = true;
        return dead;
    }

    private static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted between fences", e);
        }
    }

    /** Step 2 of the write path: the slot's newest ledger record, and the newest epoch marker met after it. */
    static final class LedgerRead {
        static Protocol.SlotRecord latest(Held held, Config cfg, int slot, String key, long[] epochSeen) {
            TopicPartition tp = new TopicPartition(cfg.ledgerTopic, Protocol.ledgerPartition(slot));
            Duration timeout = Duration.ofSeconds(30);
            long low = held.reader.beginningOffsets(List.of(tp), timeout).get(tp);
            long stable = held.reader.endOffsets(List.of(tp), timeout).get(tp);    // read_committed: the LSO
            long high = held.ends.endOffsets(List.of(tp), timeout).get(tp);
            if (stable < high && !cfg.unsafe.contains("fence")) {
                throw new IllegalStateException("ledger " + tp + ": an open transaction holds its last stable "
                        + "offset at " + stable + ", below its end " + high + ", so a read_committed read stops "
                        + "short and could miss committed records; it is not taken as the answer");
            }
            byte[] want = key.getBytes(StandardCharsets.UTF_8);
            byte[] marker = Protocol.epochKey(cfg.streamUid).getBytes(StandardCharsets.UTF_8);
            long end = stable;
            long window = 8;
            try {
                while (end > low) {
                    long start = Math.max(low, end - window);
                    byte[] found = scan(held.reader, tp, start, end, want, marker, epochSeen);
                    if (found != null) return Protocol.SlotRecord.decode(found);
                    end = start;
                    window *= 8;
                }
                return null;
            } finally {
                held.reader.assign(List.of());   // left assigned, it would fetch the partition until the next batch
            }
        }

        private static byte[] scan(KafkaConsumer<byte[], byte[]> reader, TopicPartition tp, long start, long end,
                                   byte[] want, byte[] marker, long[] epochSeen) {
            reader.assign(List.of(tp));
            reader.seek(tp, start);
            byte[] found = null;
            long deadline = System.nanoTime() + 30_000_000_000L;
            while (reader.position(tp) < end) {
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("timed out reading ledger " + tp + " from offset " + start);
                }
                for (ConsumerRecord<byte[], byte[]> m : reader.poll(Duration.ofMillis(200)).records(tp)) {
                    if (m.offset() >= end) break;
                    if (java.util.Arrays.equals(m.key(), want)) found = m.value();
                    else if (java.util.Arrays.equals(m.key(), marker) && m.value() != null) {
                        epochSeen[0] = Math.max(epochSeen[0], Protocol.epochOf(m.value()));
                    }
                }
            }
            return found;
        }
    }
}
