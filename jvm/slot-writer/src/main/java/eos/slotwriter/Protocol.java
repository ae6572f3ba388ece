package eos.slotwriter;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import java.nio.charset.StandardCharsets;
import java.util.Objects;

/**
 * The protocol's pure pieces the slot writer needs, byte for byte as the Python reference has them
 * (jobs/eos_job/ledger_format.py, protocol.py, audit.py): transactional ids, ledger keys and partitions, the
 * slot ledger record's JSON, digests, the audit headers and {@code decide_slot}. Checked against
 * tests/conformance/vectors.json by {@code VectorsTest}, which the Python suite checks too.
 */
public final class Protocol {
    private Protocol() {}

    static final ObjectMapper JSON = new ObjectMapper();
    public static final String BATCH_HEADER = "eos.batch";
    public static final String SLOT_HEADER = "eos.slot";

    public static int ledgerPartition(int slot) { return slot + 1; }

    public static String transactionalId(String prefix, int generation, int slot) {
        return prefix + "-" + generation + "-" + slot;
    }

    public static String slotKey(String streamUid, String checkpointId, int generation, int slot) {
        return streamUid + "/" + checkpointId + "/" + generation + "/" + slot;
    }

    public static String epochKey(String streamUid) { return streamUid + "/epoch"; }

    /** {@code f"{digest:016x}"}: the unsigned 64-bit sum as 16 hex digits. */
    public static String hex(long digest) {
        String h = Long.toHexString(digest);
        return "0".repeat(16 - h.length()) + h;
    }

    /** The slot digest: the sum of the records' 64-bit hashes modulo 2**64 (Java's long addition wraps). */
    public static long digestOf(long[] hashes) {
        long d = 0;
        for (long h : hashes) d += h;
        return d;
    }

    /** audit.run_label + slot: {@code <checkpoint id, 8 chars>/<generation>/<slot>}. */
    public static String slotHeader(String checkpointId, int generation, int slot) {
        String run = checkpointId.length() > 8 ? checkpointId.substring(0, 8) : checkpointId;
        return run + "/" + generation + "/" + slot;
    }

    /** Python's {@code json.dumps} string form (ensure_ascii): what the ledger's records hold. */
    static String pyString(String s) {
        StringBuilder b = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                case '\b': b.append("\\b"); break;
                case '\f': b.append("\\f"); break;
                default:
                    if (c < 0x20 || c > 0x7e) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
            }
        }
        return b.append('"').toString();
    }

    /** ledger_format.SlotLedgerRecord. */
    public record SlotRecord(long batch, long count, long digest, long deadLetters, String specHash, String input,
                             String outputHash, long epoch) {
        public SlotRecord {
            specHash = Objects.requireNonNullElse(specHash, "");
            input = Objects.requireNonNullElse(input, "");
            outputHash = Objects.requireNonNullElse(outputHash, "");
        }

        /** {@code json.dumps(asdict(self), sort_keys=True)}, the digest as 16 hex digits. */
        public byte[] encode() {
            String s = "{\"batch\": " + batch + ", \"count\": " + count + ", \"dead_letters\": " + deadLetters
                    + ", \"digest\": " + pyString(hex(digest)) + ", \"epoch\": " + epoch
                    + ", \"input\": " + pyString(input) + ", \"output_hash\": " + pyString(outputHash)
                    + ", \"spec_hash\": " + pyString(specHash) + "}";
            return s.getBytes(StandardCharsets.UTF_8);
        }

        public static SlotRecord decode(byte[] raw) {
            try {
                JsonNode d = JSON.readTree(raw);
                return new SlotRecord(d.path("batch").asLong(), d.path("count").asLong(),
                        Long.parseUnsignedLong(d.path("digest").asText(), 16), d.path("dead_letters").asLong(0),
                        d.path("spec_hash").asText(""), d.path("input").asText(""),
                        d.path("output_hash").asText(""), d.path("epoch").asLong(0));
            } catch (java.io.IOException e) {
                throw new IllegalArgumentException("not a slot ledger record: " + e.getMessage(), e);
            }
        }
    }

    /** ledger_format.EpochRecord's epoch. */
    public static long epochOf(byte[] raw) {
        try {
            return JSON.readTree(raw).path("epoch").asLong(0);
        } catch (java.io.IOException e) {
            throw new IllegalArgumentException("not an epoch record: " + e.getMessage(), e);
        }
    }

    public enum Action { WRITE, SKIP, SUPERSEDED, REPLAN, REFUSE;
        public String value() { return name().toLowerCase(); }
    }

    public record Decision(Action action, String reason) {}

    /** protocol.decide_slot: step 2 of the write path, after the fence. */
    public static Decision decideSlot(long batch, SlotRecord recorded, String input, String outputHash, long epoch,
                                      long streamEpoch, boolean inputSlots) {
        if (epoch != 0 && streamEpoch > epoch) {
            return new Decision(Action.SUPERSEDED, "a newer driver (epoch " + streamEpoch + ") runs this stream; "
                    + "this one (epoch " + epoch + ") stops without writing");
        }
        if (recorded == null) return new Decision(Action.WRITE, "no ledger record for this slot");
        if (epoch != 0 && recorded.epoch() > epoch) {
            return new Decision(Action.SUPERSEDED, "a newer driver (epoch " + recorded.epoch() + ") runs this "
                    + "stream; this one (epoch " + epoch + ") stops without writing");
        }
        if (recorded.batch() == batch && !input.isEmpty() && !recorded.input().isEmpty()
                && !input.equals(recorded.input())) {
            return new Decision(Action.REPLAN, "batch " + batch + " was committed for another input (ledger "
                    + recorded.input() + ", now " + input + ")");
        }
        if (recorded.batch() == batch && !outputHash.isEmpty() && !recorded.outputHash().isEmpty()
                && !outputHash.equals(recorded.outputHash())) {
            if (inputSlots) {
                return new Decision(Action.SKIP, "batch " + batch + " committed by another spec (output hash "
                        + recorded.outputHash() + ") from this slot's own source partitions");
            }
            return new Decision(Action.REFUSE, "batch " + batch + " was partially committed by another spec "
                    + "(output hash " + recorded.outputHash() + ", now " + outputHash + "); finish it with that "
                    + "spec first (see docs/exactly-once.md)");
        }
        if (recorded.batch() >= batch) {
            return new Decision(Action.SKIP, recorded.batch() == batch ? "batch already committed"
                    : "a later batch (" + recorded.batch() + ") is already committed");
        }
        return new Decision(Action.WRITE, "last committed batch is " + recorded.batch());
    }
}
