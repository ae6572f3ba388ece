package eos.slotwriter;

import com.fasterxml.jackson.databind.JsonNode;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;

/** sink.SlotWriterConfig as the driver sends it (eos_job.jvm_writer): JSON, snake_case, one per batch. */
public final class Config implements java.io.Serializable {
    final String bootstrap;
    final Map<String, String> producerConfig;   // Java client settings: the producer's, security.*, sasl.*, ssl.*
    final String topic;
    final String deadLetterTopic;                // null: none (a poison record stops the stream)
    final Map<String, Integer> topicLimits;      // max.message.bytes of the sink topics, read at start
    final String ledgerTopic;
    final String txPrefix;
    final int generation;
    final String streamUid;
    final String checkpointId;
    final String specHash;
    final int transactionTimeoutMs;
    final long batch;
    final String input;
    final String outputHash;
    final long epoch;
    final boolean skipAll;
    final boolean audit;
    final List<Integer> slotMap = new ArrayList<>();
    final Set<String> unsafe = new HashSet<>();
    final int faultCommitReturnedSlot;   // test-only fault points (eos_job.jvm_writer), -1: none
    final int faultFailSlot;

    Config(JsonNode d) {
        bootstrap = d.get("bootstrap").asText();
        producerConfig = new java.util.TreeMap<>();
        for (Iterator<Map.Entry<String, JsonNode>> it = d.path("producer_config").fields(); it.hasNext(); ) {
            Map.Entry<String, JsonNode> e = it.next();
            producerConfig.put(e.getKey(), e.getValue().asText());
        }
        topic = d.get("topic").asText();
        deadLetterTopic = d.path("dead_letter_topic").isTextual() ? d.get("dead_letter_topic").asText() : null;
        topicLimits = new java.util.TreeMap<>();
        d.path("topic_limits").fields().forEachRemaining(e -> topicLimits.put(e.getKey(), e.getValue().asInt()));
        ledgerTopic = d.get("ledger_topic").asText();
        txPrefix = d.get("tx_prefix").asText();
        generation = d.get("generation").asInt();
        streamUid = d.get("stream_uid").asText();
        checkpointId = d.get("checkpoint_id").asText();
        specHash = d.path("spec_hash").asText("");
        transactionTimeoutMs = d.get("transaction_timeout_ms").asInt();
        batch = d.get("batch").asLong();
        input = d.path("input").asText("");
        outputHash = d.path("output_hash").asText("");
        epoch = d.path("epoch").asLong(0);
        skipAll = d.path("skip_all").asBoolean(false);
        audit = d.path("audit").asBoolean(true);
        d.path("slot_map").forEach(n -> slotMap.add(n.asInt()));
        d.path("unsafe").forEach(n -> unsafe.add(n.asText()));
        faultCommitReturnedSlot = d.path("fault_commit_returned_slot").asInt(-1);
        faultFailSlot = d.path("fault_fail_slot").asInt(-1);
    }

    public static Config parse(String json) {
        try {
            return new Config(Protocol.JSON.readTree(json));
        } catch (com.fasterxml.jackson.core.JsonProcessingException e) {
            // The original message only: Jackson's full one quotes the source, which may carry credentials.
            throw new IllegalArgumentException("the slot writer's configuration is not JSON: "
                    + e.getOriginalMessage());
        }
    }

    /** A client's settings: the brokers, the sink's security settings, and for a producer its own settings too. */
    Properties clientProps(boolean producer) {
        Properties p = new Properties();
        producerConfig.forEach((k, v) -> {
            if (producer || k.startsWith("security.") || k.startsWith("sasl.") || k.startsWith("ssl.")) p.put(k, v);
        });
        p.put("bootstrap.servers", bootstrap);
        return p;
    }

    @Override
    public String toString() {   // never the producer settings: they may carry credentials
        return "Config(" + txPrefix + "-" + generation + ", batch " + batch + ")";
    }
}
