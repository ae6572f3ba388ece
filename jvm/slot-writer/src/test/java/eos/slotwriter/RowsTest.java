package eos.slotwriter;

import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** A slot's records read once from Spark, counted and digested on the way, handed out again on a second round. */
class RowsTest {
    private static Iterator<Rec> source(int n, int[] pulled) {
        return new Iterator<>() {
            int i = 0;
            @Override public boolean hasNext() { return i < n; }
            @Override public Rec next() {
                pulled[0]++;
                i++;
                return new Rec(new byte[]{(byte) i}, new byte[]{(byte) i}, null, null, null, -1L);   // hash -1
            }
        };
    }

    @Test
    void aSecondRoundAfterAnInterruptedFirstYieldsEveryRecordOnceAndReadsTheSourceOnce() {
        int[] pulled = {0};
        Rows rows = new Rows(source(5, pulled));
        assertTrue(rows.anyRows());
        Iterator<Rec> first = rows.iterator();
        first.next();
        first.next();                                  // the round fails here (a fenced producer, say)
        List<Byte> second = new ArrayList<>();
        for (Rec r : rows) second.add(r.key[0]);
        assertEquals(List.of((byte) 1, (byte) 2, (byte) 3, (byte) 4, (byte) 5), second);
        assertEquals(5, pulled[0]);
        assertEquals(5, rows.count);
        assertEquals("fffffffffffffffb", Protocol.hex(rows.digest));   // 5 × -1, modulo 2**64
    }

    @Test
    void drainCountsWhatWasNotHandedOutAndAnEmptySlotHasNoRows() {
        int[] pulled = {0};
        Rows rows = new Rows(source(3, pulled));
        rows.drain();
        assertEquals(3, rows.count);
        assertFalse(new Rows(source(0, pulled)).anyRows());
    }
}
