package eos.slotwriter;

import org.apache.kafka.common.header.Header;

import java.util.List;

/** One output record of a slot: the transformation's columns (eos_job.contract) and its record hash. */
public final class Rec {
    final byte[] key;
    final byte[] value;
    final String topic;          // null: the sink's topic
    final Integer partition;     // null: the producer's partitioner (murmur2 of the key)
    final List<Header> headers;  // the transformation's own; the audit headers are added
    final long hash;             // the __eos_hash column: F.xxhash64 of the record
    final String error;          // the error column: set, the record is poison (a dead letter)

    public Rec(byte[] key, byte[] value, String topic, Integer partition, List<Header> headers, long hash) {
        this(key, value, topic, partition, headers, hash, null);
    }

    public Rec(byte[] key, byte[] value, String topic, Integer partition, List<Header> headers, long hash,
               String error) {
        this.key = key;
        this.value = value;
        this.topic = topic;
        this.partition = partition;
        this.headers = headers;
        this.hash = hash;
        this.error = error;
    }
}
