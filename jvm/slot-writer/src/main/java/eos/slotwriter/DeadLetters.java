package eos.slotwriter;

import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.record.AbstractRecords;
import org.apache.kafka.common.record.CompressionType;
import org.apache.kafka.common.record.RecordBatch;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * Poison records and their dead letters, as eos_job.poison has them (pinned by the golden vectors): a record
 * the transformation marked (its {@code error} column), or one over its topic's max.message.bytes by itself
 * (read at start; the Java producer sends records uncompressed), or over the producer's max.request.size by
 * itself (what the Java producer refuses alone, as librdkafka's produce() refuses a record over
 * message.max.bytes). Its dead letter goes to sink.deadLetterTopic in the slot's transaction: the record's key
 * and value (the value cut to fit the dead-letter topic), why, where it was going, and the audit headers.
 *
 * Not here yet: the Python writer's rounds for records the broker refuses in a request of several (suspects,
 * sent alone next time). The JVM writer fences again on such a refusal and the task fails if it persists:
 * stuck, never a good record dead-lettered.
 */
final class DeadLetters {
    private DeadLetters() {}

    static final int BATCH_HEADER = 61;                  // poison.BATCH_HEADER: a v2 batch of one record
    static final int MAX_VALUE = 512 * 1024;             // poison.DEAD_LETTER_MAX_VALUE
    static final int MAX_WHY = 4000;                     // characters of the reason kept
    static final int DEFAULT_MAX_REQUEST = 1048576;      // the Java producer's max.request.size default

    /** Why the record is poison by itself, or null (poison.too_large, then the producer's own limit). */
    static String tooLarge(Config cfg, String topic, Rec r) {
        // poison.checked_limits: a compressed record over its topic's limit may still fit; the broker decides.
        String codec = cfg.producerConfig.getOrDefault("compression.type", "none");
        Integer limit = codec.equals("none") || codec.isEmpty() ? cfg.topicLimits.get(topic) : null;
        long size = BATCH_HEADER + len(r.key) + len(r.value);
        if (limit != null && size > limit) {
            return "MSG_SIZE_TOO_LARGE: the record takes at least " + size + " bytes in a batch of its own, over "
                    + "max.message.bytes " + limit + " of topic '" + topic + "'";   // Python's repr of a topic name
        }
        Header[] hs = r.headers == null ? new Header[0] : r.headers.toArray(new Header[0]);
        int estimate = AbstractRecords.estimateSizeInBytesUpperBound(RecordBatch.CURRENT_MAGIC_VALUE,
                CompressionType.NONE, r.key, r.value, hs);
        int max = Integer.parseInt(cfg.producerConfig.getOrDefault("max.request.size",
                String.valueOf(DEFAULT_MAX_REQUEST)));
        if (estimate > max) {
            return "MSG_SIZE_TOO_LARGE: the record takes up to " + estimate + " bytes, over the producer's "
                    + "max.request.size " + max;
        }
        return null;
    }

    /** The dead letter of a poison record (poison.dead_letter). */
    static ProducerRecord<byte[], byte[]> of(Config cfg, String topic, Rec r, String why, int slot) {
        if (cfg.deadLetterTopic == null) {
            throw new IllegalStateException("a record for topic '" + topic + "' cannot be written ("
                    + why + ") and sink.deadLetterTopic is not set: set it so poison records are kept, or fix the "
                    + "transformation. The stream stops here rather than drop the record");
        }
        List<Header> headers = new ArrayList<>(List.of(
                new RecordHeader("eos.error", cut(why).getBytes(StandardCharsets.UTF_8)),
                new RecordHeader("eos.topic", topic.getBytes(StandardCharsets.UTF_8))));
        headers.addAll(SlotWriter.auditHeaders(cfg, slot));
        long room = MAX_VALUE;
        Integer limit = cfg.topicLimits.get(cfg.deadLetterTopic);
        if (limit != null) {   // keep the dead letter itself writable under its topic's limit
            long framing = BATCH_HEADER + 64 + len(r.key);
            for (Header h : headers) framing += h.key().length() + h.value().length + 8;
            room = Math.max(0, Math.min(room, limit - framing));
        }
        byte[] value = r.value;
        if (value != null && value.length > room) value = java.util.Arrays.copyOf(value, (int) room);
        return new ProducerRecord<>(cfg.deadLetterTopic, null, r.key, value, headers);
    }

    private static String cut(String why) {
        return why.codePointCount(0, why.length()) <= MAX_WHY ? why : why.substring(0, why.offsetByCodePoints(0, MAX_WHY));
    }

    private static long len(byte[] b) { return b == null ? 0 : b.length; }
}
