package eos.slotwriter;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;

/**
 * A slot's records as they arrive, counted and digested on the way (eos_job.slot_rows), and kept for a second
 * round of the same task (a fresh fence after a producer error). Kept in memory: this first landing has no
 * spill to disk, so a slot's batch must fit the executor's heap (the Python writer spills past 64 MiB).
 */
final class Rows implements Iterable<Rec> {
    private Iterator<Rec> source;
    private final List<Rec> kept = new ArrayList<>();
    long count;
    long digest;

    Rows(Iterator<Rec> source) { this.source = source; }

    private Rec take() {
        if (source == null) return null;
        if (!source.hasNext()) {
            source = null;
            return null;
        }
        Rec r = source.next();
        count++;
        digest += r.hash;
        kept.add(r);
        return r;
    }

    boolean anyRows() {
        return count > 0 || take() != null;
    }

    void drain() {
        while (take() != null) { /* counted */ }
    }

    /** Every record: those already seen, then the rest as it arrives. */
    @Override
    public Iterator<Rec> iterator() {
        return new Iterator<>() {
            int i = 0;
            Rec next;

            @Override
            public boolean hasNext() {
                if (next != null) return true;
                if (i < kept.size()) {
                    next = kept.get(i++);
                    return true;
                }
                Rec r = take();
                if (r != null) {
                    i++;
                    next = r;
                }
                return next != null;
            }

            @Override
            public Rec next() {
                if (!hasNext()) throw new NoSuchElementException();
                Rec r = next;
                next = null;
                return r;
            }
        };
    }
}
