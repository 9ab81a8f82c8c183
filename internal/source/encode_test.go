package source

import (
	"context"
	"encoding/json"
	"reflect"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/snapshot"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// positionFields are the parts of an event that differ between the stream's and the snapshot's
// event of one row: op, and the tail lsn, xid, ts, seq.
var (
	opField    = regexp.MustCompile(`^\{"op":"[a-z]"`)
	tailFields = regexp.MustCompile(`,"lsn":"[^"]*"(,"xid":[0-9]+)?,"ts":"[^"]*","seq":[0-9]+\}$`)
)

func withoutPosition(t *testing.T, payload []byte) string {
	t.Helper()
	if !opField.Match(payload) || !tailFields.Match(payload) {
		t.Fatalf("event without op or position tail: %s", payload)
	}
	return tailFields.ReplaceAllString(opField.ReplaceAllString(string(payload), `{"op":_`), `}`)
}

// TestStreamAndSnapshotEncodeARowAlike feeds one row of many types through both paths, on a real
// server: inserted, it comes from pgoutput through the decoder as a `c`; read by a chunk, it is an
// `r`. Updated with its TOASTed column untouched, the stream gives a `u` with that column
// unchanged; a fill restoring every other column is the snapshot's `u` of the same shape. Each
// pair is byte-identical but for op, lsn, xid, ts and seq, and goes to the same partition.
func TestStreamAndSnapshotEncodeARowAlike(t *testing.T) {
	pg := testenv.StartPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg.Exec(`CREATE DOMAIN posnum AS numeric CHECK (VALUE > 0);
		CREATE TYPE mood AS ENUM ('ok', 'so "so"', 'é\');
		CREATE TABLE t (id int8, k character(4), i2 int2, i4 int4, n numeric, nnan numeric, f8 float8, finf float8, f4 real,
			bo bool, js json, jb jsonb, arr int[], tarr text[], nested numeric[], bparr character(3)[], ts timestamptz,
			tsn timestamp, d date, iv interval, by bytea, u uuid, e text, empty text, nul text, nularr int[], dom posnum,
			en mood, enarr mood[], toast text,
			PRIMARY KEY (id, k));
		ALTER TABLE t ALTER COLUMN toast SET STORAGE EXTERNAL;
		CREATE PUBLICATION p FOR TABLE t`)
	pg.Exec(`SELECT pg_create_logical_replication_slot('identity', 'pgoutput')`)
	pg.Exec(`INSERT INTO t VALUES (9007199254740993, 'ab', -32768, 2147483647, 123456789012345678901234567890.123456789, 'NaN',
			0.1, '-Infinity', 3.14, true, '{"a": [1, 2.50, "x"],  "b" : null}', '{"big": 12345678901234567890, "s": "é\n"}',
			'{1,NULL,3}', '{"a\"b","c,d",NULL,"NULL",""}', '{{1.5,2},{3,4}}', '{a,bc}', '2026-10-03 06:14:39.365472+02',
			'2026-10-03 06:14:39', '2026-10-03', '1 day 02:03:04.5', '\x00ff', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
			E'x|y\\z "q"\t\u2028é', '', NULL, NULL, 12.50, 'so "so"', '{ok,"so \"so\"","é\\"}', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 100) i))`)
	pg.Exec(`UPDATE t SET i4 = i4`)

	pgc := pgconnect.Config{DSN: pg.DSN()}
	pcfg, err := pgc.PoolConfig(2)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tables, _, err := LoadTables(ctx, pool, []Table{{Schema: "public", Name: "t", Queue: "q", Mode: PartitionByKey}}, 170000)
	if err != nil {
		t.Fatal(err)
	}

	// The stream: the insert's c and the update's u.
	stream := streamEvents(t, ctx, pool, pgc, tables, 2)
	if len(stream) != 2 || stream[0].Op != "c" || stream[1].Op != "u" {
		t.Fatalf("stream events: %+v", stream)
	}
	var u struct {
		Key       json.RawMessage `json:"key"`
		Unchanged []string        `json:"unchanged"`
	}
	if err := json.Unmarshal(stream[1].Payload, &u); err != nil || !slices.Equal(u.Unchanged, []string{"toast"}) {
		t.Fatalf("the update did not leave the TOASTed column unchanged (%v): %s", err, stream[1].Payload)
	}

	// The snapshot: one chunk read as it is (an r), and read again with a window that drops the row
	// and restores every column but toast (a fill).
	sn := &snapshotter{ss: testSession(100, pointer.Pointer{}), pool: pool, epoch: "e", reg: convert.NewRegistry(),
		tables: map[string]*snapTable{"public.t": {info: &tables[0], full: "public.t"}}}
	sn.ss.src.cfg.ChunkRows = 10
	tab, err := sn.load(ctx, "public.t")
	if err != nil {
		t.Fatal(err)
	}
	cur, _ := snapshot.Start([]string{"public.t"})
	ch, err := sn.read(ctx, tab, cur)
	if err != nil || ch.Rows.Len() != 1 {
		t.Fatalf("chunk: %v, %v", ch, err)
	}
	readItems, err := sn.build(&pendingChunk{win: snapshot.NewWindow(), table: tab, cursor: cur, chunk: ch}, 0x1000)
	if err != nil {
		t.Fatal(err)
	}
	// The chunk read as the snapshotter reads it, its rows rendered while they arrive: the same
	// events as rendering the chunk after its read.
	rows := &rowRender{}
	rows.reset(tab)
	sch, hw, err := sn.readBetween(ctx, tab, cur, "test:1", rows)
	if err != nil || sch.Rows.Len() != 1 {
		t.Fatalf("chunk between watermarks: %v, %v", sch, err)
	}
	streamed, _ := rows.finish(sn.tx(hw), sn.position(hw, sch), sch.ReadAt.UnixMilli())
	rendered, _ := sn.render(&pendingChunk{table: tab, chunk: sch}, hw)
	if !reflect.DeepEqual(streamed, rendered) {
		t.Fatalf("rendered while read:\n%+v\nrendered after:\n%+v", streamed, rendered)
	}
	restore := slices.DeleteFunc(slices.Clone(tab.nonKey), func(c string) bool { return c == "toast" })
	win := snapshot.NewWindow()
	win.LowWatermark()
	win.Observe(snapshot.Commit{Xid: uint32(ch.Snapshot.Xmax), Effects: []snapshot.Effect{{Key: string(u.Key), Unchanged: restore}}})
	fillItems, err := sn.build(&pendingChunk{win: win, table: tab, cursor: cur, chunk: ch}, 0x1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(readItems) != 1 || len(readItems[0].events) != 1 || len(fillItems) != 1 || len(fillItems[0].events) != 1 {
		t.Fatalf("snapshot items: %+v / %+v", readItems, fillItems)
	}
	read, fill := readItems[0].events[0], fillItems[0].events[0]
	if read.Op != "r" || fill.Op != "u" {
		t.Fatalf("snapshot ops %s and %s", read.Op, fill.Op)
	}

	for _, pair := range []struct {
		what           string
		stream, snaped Event
	}{{"c and r", stream[0], read}, {"c and r rendered while read", stream[0], streamed[0]}, {"stream u and fill", stream[1], fill}} {
		s, r := withoutPosition(t, pair.stream.Payload), withoutPosition(t, pair.snaped.Payload)
		if s != r {
			i := 0
			for i < min(len(s), len(r)) && s[i] == r[i] {
				i++
			}
			from := max(0, i-200)
			t.Errorf("%s differ at byte %d:\nstream   …%.300s\nsnapshot …%.300s", pair.what, i, s[from:], r[from:])
		}
		if pair.stream.Partition != pair.snaped.Partition {
			t.Errorf("%s: partitions %q and %q", pair.what, pair.stream.Partition, pair.snaped.Partition)
		}
	}
}

// streamEvents decodes the slot `identity` with the session's decoder until n events came.
func streamEvents(t *testing.T, ctx context.Context, pool *pgxpool.Pool, pgc pgconnect.Config, tables []TableInfo, n int) []Event {
	t.Helper()
	rcfg, err := pgc.ReplicationConfig()
	if err != nil {
		t.Fatal(err)
	}
	repl, err := pgconn.ConnectConfig(ctx, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer repl.Close(context.Background())
	if err := pglogrepl.StartReplication(ctx, repl, "identity", 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'p'", "messages 'true'"}}); err != nil {
		t.Fatal(err)
	}
	reg := convert.NewRegistry()
	dec := &decoder{epoch: "e", tables: map[string]*TableInfo{"public.t": &tables[0]}, reg: reg, rels: map[uint32]*relation{},
		loadType: func(ctx context.Context, oids []uint32) error { return reg.Load(ctx, pool, oids) },
		readback: func(ctx context.Context, rel *relation, key event.Row, cols []int, xid uint32) (event.Row, error) {
			return readback(ctx, pool, rel, key, cols, xid)
		}}
	var events []Event
	emit := func(it item) error { events = append(events, it.events...); return nil }
	for len(events) < n {
		raw, err := repl.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("receive (after %d events): %v", len(events), err)
		}
		cd, ok := raw.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 || cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		x, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			t.Fatal(err)
		}
		if err := dec.decode(ctx, x.WALData, emit); err != nil {
			t.Fatal(err)
		}
	}
	return events
}
