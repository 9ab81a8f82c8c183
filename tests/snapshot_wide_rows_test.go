package tests

import (
	"testing"
)

// TestSnapshotOfWideRowsKeepsChunksSmall: a table of 320 rows of 512 KiB each (160 MiB of text) is
// snapshotted with the default chunk_rows. Chunks are cut to about 2 MiB of values (after a first
// chunk of 16 rows that measures them), so pgrelay's peak resident set stays below the table's
// size, where chunks of chunk_rows rows would hold the whole table at once, as values and again as
// events (about 850 MiB); and the queue replays to the table exactly.
func TestSnapshotOfWideRowsKeepsChunksSmall(t *testing.T) {
	const rows, rowBytes = 320, 512 << 10
	e := newCDCEnv(t, "widerows", `[{table: wide, queue: q}]`, "snapshot: initial")
	e.pg.Exec(`CREATE TABLE wide (id int PRIMARY KEY, doc text)`)
	e.pg.Exec(`INSERT INTO wide SELECT g, repeat(md5(g::text), $1::int / 32) FROM generate_series(1, $2::int) g`, rowBytes, rows)
	p := e.start()
	e.waitPointer()
	res := e.converge("public.wide", "id")
	if res.Events != rows {
		t.Errorf("%d events, want %d r", res.Events, rows)
	}
	peak := peakRSS(t, p.Pid())
	t.Logf("peak RSS %d MiB", peak>>20)
	if peak > rows*rowBytes {
		t.Errorf("peak RSS %d MiB while snapshotting %d MiB of %d KiB rows, want below the table's size", peak>>20, rows*rowBytes>>20, rowBytes>>10)
	}
}
