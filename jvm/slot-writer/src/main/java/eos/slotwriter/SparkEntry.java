package eos.slotwriter;

import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.types.StructType;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;

/**
 * What the PySpark driver calls through py4j (eos_job.jvm_writer): the batch's slot tasks, each writing its
 * slot with {@link SlotWriter}, and their commit rows (JSON) back. By key, the slots are
 * {@code repartition(slots, key)}, the same hash partitioning as the Python writer's, so both writers cut a
 * batch into the same slots; by source partitions, the config's slot map names each task's slot.
 */
public final class SparkEntry {
    private SparkEntry() {}

    public static List<String> run(Dataset<Row> df, String configJson, int slots) {
        Config cfg = Config.parse(configJson);   // fails here, in the driver, on a bad config
        Dataset<Row> parts = cfg.slotMap.isEmpty() ? df.repartition(slots, df.col("key")) : df;
        return parts.toJavaRDD().mapPartitions(new SlotTask(configJson, df.schema())).collect();
    }

    static final class SlotTask implements FlatMapFunction<Iterator<Row>, String> {
        private final String configJson;
        private final int key, value, topic, partition, headers, hash, error;

        SlotTask(String configJson, StructType schema) {
            this.configJson = configJson;
            List<String> names = List.of(schema.fieldNames());
            key = names.indexOf("key");
            value = names.indexOf("value");
            topic = names.indexOf("topic");
            partition = names.indexOf("partition");
            headers = names.indexOf("headers");
            hash = names.indexOf("__eos_hash");
            error = names.indexOf("error");
            if (value < 0 || hash < 0) {
                throw new IllegalArgumentException("the batch has no value or __eos_hash column: " + names);
            }
        }

        @Override
        public Iterator<String> call(Iterator<Row> it) {
            TaskContext ctx = TaskContext.get();
            Config cfg = Config.parse(configJson);
            int slot = ctx.partitionId();
            if (!cfg.slotMap.isEmpty()) {
                if (slot >= cfg.slotMap.size()) {
                    throw new IllegalStateException("task " + slot + " of batch " + cfg.batch + ": the driver "
                            + "mapped " + cfg.slotMap.size() + " tasks to slots; nothing was written");
                }
                slot = cfg.slotMap.get(slot);
            }
            Iterator<Rec> recs = new Iterator<>() {
                @Override public boolean hasNext() { return it.hasNext(); }
                @Override public Rec next() { return rec(it.next()); }
            };
            return List.of(SlotWriter.writeSlot(cfg, slot, ctx.attemptNumber(), recs)).iterator();
        }

        private Rec rec(Row r) {
            List<Header> hs = null;
            if (headers >= 0 && !r.isNullAt(headers)) {
                hs = new ArrayList<>();
                for (Row h : r.<Row>getList(headers)) {
                    hs.add(new RecordHeader(h.getString(0), h.isNullAt(1) ? null : (byte[]) h.get(1)));
                }
            }
            return new Rec(bytes(r, key), bytes(r, value), topic >= 0 && !r.isNullAt(topic) ? r.getString(topic) : null,
                    partition >= 0 && !r.isNullAt(partition) ? r.getInt(partition) : null, hs, r.getLong(hash),
                    error >= 0 && !r.isNullAt(error) ? r.getString(error) : null);
        }

        private static byte[] bytes(Row r, int i) {
            if (i < 0 || r.isNullAt(i)) return null;
            Object o = r.get(i);
            return o instanceof String s ? s.getBytes(StandardCharsets.UTF_8) : (byte[]) o;
        }
    }
}
