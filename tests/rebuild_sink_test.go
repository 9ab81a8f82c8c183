package tests

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// tableDump is rt's whole content as text, in key order, and its md5.
func tableDump(ctx context.Context, pool *pgxpool.Pool) (dump, sum string, err error) {
	err = pool.QueryRow(ctx, `SELECT coalesce(string_agg(t::text, E'\n' ORDER BY id), ''),
		md5(coalesce(string_agg(t::text, E'\n' ORDER BY id), '')) FROM rt t`).Scan(&dump, &sum)
	return dump, sum, err
}

// TestRebuildFromTheQueueStart: after the round trip has built B incrementally (two writers, the
// sink following them), a second sink with a new name and consumer group reads queue q from its
// first entry (start_from: earliest) into an empty table in database C: C is byte-identical to B
// (and both equal A).
func TestRebuildFromTheQueueStart(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	rt := newRoundTrip(t, "rebuild")
	dsnB := rt.database("b")
	incremental := startSinkPipeline(t, rt.sinkConfig(dsnB, "copy_b", "copy_b"))
	committed := rt.writers(7, 5*time.Second)()
	t.Logf("writers committed %d transactions", committed)
	rt.waitSourceDone()
	rt.waitApplied("b", "copy_b", incremental)

	dsnC := rt.database("c")
	start := time.Now()
	rebuild := startSinkPipeline(t, rt.sinkConfig(dsnC, "rebuild_c", "rebuild_c"))
	rt.waitApplied("c", "rebuild_c", rebuild)
	t.Logf("rebuilt C from the queue in %s", time.Since(start).Round(time.Millisecond))

	dumpB, sumB, err := tableDump(rt.ctx, rt.pools["b"])
	if err != nil {
		t.Fatal(err)
	}
	dumpC, sumC, err := tableDump(rt.ctx, rt.pools["c"])
	if err != nil {
		t.Fatal(err)
	}
	if dumpB != dumpC || sumB != sumC {
		t.Fatalf("C (md5 %s, %d bytes) differs from B (md5 %s, %d bytes)", sumC, len(dumpC), sumB, len(dumpB))
	}
	hashesB, err := rowHashes(rt.ctx, rt.pools["b"])
	if err != nil {
		t.Fatal(err)
	}
	hashesC, err := rowHashes(rt.ctx, rt.pools["c"])
	if err != nil {
		t.Fatal(err)
	}
	if d := hashDiff(hashesB, hashesC); len(d) > 0 || len(hashesB) == 0 {
		t.Fatalf("rows of C differ from B (%d rows): %v", len(hashesB), d)
	}
	t.Logf("B and C: %d rows, %d bytes of text, md5 %s", len(hashesB), len(dumpB), sumB)
	rt.assertProgressAtQueueEnd("b", "copy_b")
	rt.assertProgressAtQueueEnd("c", "rebuild_c")
	if ok, state := rt.sameRows("b"); !ok { // the round trip's claim (TestRoundTripAToQueueToB explains a difference)
		t.Errorf("B differs from A: %s", state)
	}
}
