package source_test

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
)

// TestQueueWithoutMetadataIsTheSame: two sources stream the same two tables, one with pg_cdc's
// metadata (queues ma, mb) and one without (metadata: false, queues na, nb; with one batch in
// flight and with two, as the shipped config runs it), through snapshots, transactions touching
// both tables, and a transaction larger than a batch. Each queue replays exactly to its table, and
// the streamed entries of the two sources are the same, queue for queue: partition, id and
// transaction (but for the source's epoch) and payload, in order. Without metadata the redis_queue
// output takes those keys from pg_cdc's batch.
func TestQueueWithoutMetadataIsTheSame(t *testing.T) {
	for _, inFlight := range []int{1, 2} {
		t.Run(fmt.Sprintf("max_in_flight=%d", inFlight), func(t *testing.T) { queueWithoutMetadata(t, inFlight) })
	}
}

func queueWithoutMetadata(t *testing.T, inFlight int) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE a (id int PRIMARY KEY, v text); CREATE TABLE b (k text PRIMARY KEY, n int);
		INSERT INTO a SELECT i, md5(i::text) FROM generate_series(1, 120) i;
		INSERT INTO b SELECT 'k' || i, i FROM generate_series(1, 80) i`)
	extra := "snapshot: initial\nchunk_rows: 25\nmax_bundle_messages: 40"
	e.run("withmeta", `[{table: a, queue: ma}, {table: b, queue: mb}]`, extra)
	startStream(t, cdctest.Pipeline{Name: "nometa", DSN: e.pg.DSN(), Tables: `[{table: a, queue: na}, {table: b, queue: nb}]`,
		Redis: e.rd.URL(), Source: extra + "\nmetadata: false", Output: fmt.Sprintf("max_in_flight: %d", inFlight)}.YAML())
	e.waitTables("withmeta", "ma", "public.a", "public.b")
	e.waitTables("nometa", "na", "public.a", "public.b")
	for i := 0; i < 20; i++ {
		e.pg.Exec(fmt.Sprintf(`BEGIN; UPDATE a SET v = 'u%[1]d' WHERE id %% 7 = %[2]d; DELETE FROM b WHERE k = 'k%[1]d';
			INSERT INTO b VALUES ('new%[1]d', %[1]d); INSERT INTO a VALUES (1000 + %[1]d, 'n'); COMMIT`, i, i%7))
	}
	e.pg.Exec(`UPDATE a SET v = 'all'`) // 140 changes: in pieces of 40
	tables := map[string]map[string][]string{
		"ma": {"public.a": {"id"}}, "mb": {"public.b": {"k"}}, "na": {"public.a": {"id"}}, "nb": {"public.b": {"k"}},
	}
	for q, tb := range tables {
		e.waitOracle(q, 60*time.Second, tb)
	}
	epoch := regexp.MustCompile(`^pg:[^:]+:`)
	for _, pair := range [][2]string{{"ma", "na"}, {"mb", "nb"}} {
		var streamed [2][]oracle.Entry
		for k, q := range pair {
			entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", q)
			if err != nil {
				t.Fatal(err)
			}
			for _, en := range entries {
				if strings.Contains(en.ID, ":s:") || bytes.Contains(en.Payload, []byte(`"op":"r"`)) {
					continue // a snapshot row: its id names the source's own watermark
				}
				en.ID, en.Tx = epoch.ReplaceAllString(en.ID, ""), epoch.ReplaceAllString(en.Tx, "")
				streamed[k] = append(streamed[k], en)
			}
		}
		if len(streamed[0]) == 0 || len(streamed[0]) != len(streamed[1]) {
			t.Fatalf("%s: %d streamed entries with metadata, %d without", pair, len(streamed[0]), len(streamed[1]))
		}
		for i, m := range streamed[0] {
			n := streamed[1][i]
			if m.Partition != n.Partition || m.ID != n.ID || m.Tx != n.Tx || !bytes.Equal(m.Payload, n.Payload) {
				t.Errorf("%s entry %d: with metadata %q %q %q %s; without %q %q %q %s", pair, i,
					m.Partition, m.ID, m.Tx, m.Payload, n.Partition, n.ID, n.Tx, n.Payload)
			}
		}
	}
}
