package eos.slotwriter;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.junit.jupiter.api.Test;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.util.HashSet;
import java.util.Set;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The JVM writer's protocol pieces against the Python reference's golden vectors (tests/conformance). */
class VectorsTest {
    private static final JsonNode V = load();

    private static JsonNode load() {
        try {
            return new ObjectMapper().readTree(new File(System.getProperty("eos.vectors")));
        } catch (java.io.IOException e) {
            throw new IllegalStateException("tests/conformance/vectors.json not read (-Deos.vectors): " + e, e);
        }
    }

    private static Protocol.SlotRecord record(JsonNode r) {
        if (r == null || r.isNull()) return null;
        return new Protocol.SlotRecord(r.get("batch").asLong(), r.get("count").asLong(),
                Long.parseUnsignedLong(r.get("digest").asText(), 16), r.get("dead_letters").asLong(),
                r.get("spec_hash").asText(), r.get("input").asText(), r.get("output_hash").asText(),
                r.get("epoch").asLong());
    }

    @Test
    void transactionalIds() {
        assertTrue(V.get("transactional_ids").size() > 0);
        for (JsonNode t : V.get("transactional_ids")) {
            assertEquals(t.get("transactional_id").asText(), Protocol.transactionalId(t.get("prefix").asText(),
                    t.get("generation").asInt(), t.get("slot").asInt()));
        }
    }

    @Test
    void keysPartitionsAndAuditHeaders() {
        for (JsonNode k : V.get("keys")) {
            String uid = k.get("stream_uid").asText(), ckpt = k.get("checkpoint_id").asText();
            int gen = k.get("generation").asInt(), slot = k.get("slot").asInt();
            assertEquals(k.get("slot_key").asText(), Protocol.slotKey(uid, ckpt, gen, slot));
            assertEquals(k.get("ledger_partition").asInt(), Protocol.ledgerPartition(slot));
            assertEquals(k.get("epoch_key").asText(), Protocol.epochKey(uid));
            JsonNode h = k.get("audit_headers");
            assertEquals(Protocol.BATCH_HEADER, h.get(0).get(0).asText());
            assertEquals("41", h.get(0).get(1).asText());
            assertEquals(Protocol.SLOT_HEADER, h.get(1).get(0).asText());
            assertEquals(h.get(1).get(1).asText(), Protocol.slotHeader(ckpt, gen, slot));
        }
    }

    @Test
    void slotRecordBytesAndDecoding() {
        assertTrue(V.get("records").size() >= 3);
        for (JsonNode r : V.get("records")) {
            Protocol.SlotRecord rec = record(r.get("record"));
            assertEquals(r.get("encoded").asText(), new String(rec.encode(), StandardCharsets.UTF_8));
            assertEquals(rec, Protocol.SlotRecord.decode(r.get("encoded").asText().getBytes(StandardCharsets.UTF_8)));
        }
    }

    @Test
    void digests() {
        for (JsonNode d : V.get("digests")) {
            long[] hashes = new long[d.get("hashes").size()];
            for (int i = 0; i < hashes.length; i++) hashes[i] = d.get("hashes").get(i).asLong();
            assertEquals(d.get("digest").asText(), Protocol.hex(Protocol.digestOf(hashes)));
        }
    }

    @Test
    void decisionTable() {
        Set<String> seen = new HashSet<>();
        for (JsonNode d : V.get("decisions")) {
            Protocol.Decision got = Protocol.decideSlot(d.get("batch").asLong(), record(d.get("recorded")),
                    d.get("input").asText(), d.get("output_hash").asText(), d.get("epoch").asLong(),
                    d.get("stream_epoch").asLong(), d.get("input_slots").asBoolean());
            assertEquals(d.get("action").asText(), got.action().value(), d.toString());
            seen.add(got.action().value());
        }
        assertEquals(Set.of("write", "skip", "superseded", "replan", "refuse"), seen);
    }

    private static byte[] hex(JsonNode n) {
        return n == null || n.isNull() ? null : java.util.HexFormat.of().parseHex(n.asText());
    }

    @Test
    void deadLetters() {
        assertTrue(V.get("dead_letters").size() >= 5);
        int poison = 0;
        for (JsonNode d : V.get("dead_letters")) {
            String json = "{\"bootstrap\":\"\",\"topic\":\"out\",\"ledger_topic\":\"l\",\"tx_prefix\":\"p\","
                    + "\"generation\":" + d.get("generation") + ",\"stream_uid\":\"u\",\"checkpoint_id\":"
                    + d.get("checkpoint_id") + ",\"transaction_timeout_ms\":1,\"batch\":" + d.get("batch")
                    + ",\"dead_letter_topic\":" + d.get("dead_letter_topic") + ",\"topic_limits\":"
                    + d.get("topic_limits") + "}";
            Config cfg = Config.parse(json);
            String topic = d.get("topic").asText();
            Rec r = new Rec(hex(d.get("key")), hex(d.get("value")), topic, null, null, 0,
                    d.get("error").isNull() ? null : d.get("error").asText());
            String why = r.error != null ? r.error : DeadLetters.tooLarge(cfg, topic, r);
            assertEquals(d.get("poison").isNull() ? null : d.get("poison").asText(), why, d.toString());
            if (why == null) continue;
            poison++;
            var letter = DeadLetters.of(cfg, topic, r, why, d.get("slot").asInt());
            JsonNode want = d.get("dead_letter");
            assertEquals(want.get("topic").asText(), letter.topic());
            assertEquals(want.get("key").isNull() ? null : want.get("key").asText(),
                    letter.key() == null ? null : java.util.HexFormat.of().formatHex(letter.key()));
            assertEquals(want.get("value").isNull() ? null : want.get("value").asText(),
                    letter.value() == null ? null : java.util.HexFormat.of().formatHex(letter.value()));
            StringBuilder got = new StringBuilder("[");
            for (var h : letter.headers()) {
                got.append(got.length() > 1 ? "," : "").append("[\"").append(h.key()).append("\",\"")
                        .append(java.util.HexFormat.of().formatHex(h.value())).append("\"]");
            }
            assertEquals(want.get("headers").toString(), got.append("]").toString());
        }
        assertEquals(V.get("dead_letters").size() - 1, poison);
    }

    @Test
    void theTableCheckCanFail() {
        // Negative control of the check above: a decision with the ledger skip left out answers otherwise.
        Protocol.SlotRecord committed = new Protocol.SlotRecord(5, 1, 1, 0, "", "", "", 0);
        assertNotEquals(Protocol.Action.WRITE, Protocol.decideSlot(5, committed, "", "", 0, 0, false).action());
    }
}
