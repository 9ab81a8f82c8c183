package source_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/source"
)

// TestPartitionedTable: a partitioned table is streamed as one table. Its rows in every partition
// are read by the snapshot, its partitions' changes (inserts, updates, a row moved to another
// partition, deletes, rows of a partition created while pg_cdc streams) arrive as the table's
// (`"table":"public.ev"`), and the queue replays to the table. The managed publication publishes
// partitions' changes as the table's; an unmanaged one that does not is refused with the ALTER
// PUBLICATION that fixes it (else the partitions' changes would be dropped as other tables'); a
// partition listed beside its table is refused, the table streamed.
func TestPartitionedTable(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE ev (id bigint, at date, v text, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
		CREATE TABLE ev_2026 PARTITION OF ev FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
		CREATE TABLE ev_2027 PARTITION OF ev FOR VALUES FROM ('2027-01-01') TO ('2028-01-01');
		INSERT INTO ev SELECT g, date '2026-01-01' + (g * 7 % 700), 'v' || g FROM generate_series(1, 3000) g;
		ANALYZE ev_2026, ev_2027`)
	e.run("part", `[{table: ev, queue: qp}]`, "snapshot: initial\nchunk_rows: 500")
	e.waitSnapshotDone("part", "qp", 60*time.Second)
	e.pg.Exec(`INSERT INTO ev VALUES (5001, '2026-03-01', 'new 2026'), (5002, '2027-03-01', 'new 2027');
		UPDATE ev SET v = 'changed' WHERE id IN (1, 2, 3);
		UPDATE ev SET at = '2027-12-31' WHERE id = 10 AND at < '2027-01-01';
		DELETE FROM ev WHERE id BETWEEN 20 AND 30;
		CREATE TABLE ev_2028 PARTITION OF ev FOR VALUES FROM ('2028-01-01') TO ('2029-01-01');
		INSERT INTO ev VALUES (6001, '2028-06-01', 'in a new partition')`)
	var entries []oracle.Entry
	cdctest.Wait(t, 30*time.Second, "the new partition's row in the queue", func() (bool, string) {
		var err error
		if entries, err = oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "qp"); err != nil {
			t.Fatal(err)
		}
		for _, en := range entries {
			if strings.Contains(string(en.Payload), `"v":"in a new partition"`) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d entries", len(entries))
	})
	for _, en := range entries {
		if ev := event(t, en); string(ev["table"]) != `"public.ev"` {
			t.Fatalf("entry %s: table %s, want public.ev", en.ID, ev["table"])
		}
	}
	e.checkOracle("qp", "public.ev", "id", "at")

	e.pg.Exec(`CREATE TABLE ev2 (id int, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
		CREATE TABLE ev2_all PARTITION OF ev2 FOR VALUES FROM (MINVALUE) TO (MAXVALUE);
		CREATE PUBLICATION byleaf FOR TABLE ev2`)
	e.run("leaf", `[{table: ev2, queue: ql}]`, "publication: {name: byleaf, manage: false}")
	e.waitStatus("ql", "leaf", `publishes the changes of a partitioned table's partitions as theirs`)
	e.waitStatus("ql", "leaf", `publish_via_partition_root = true`)

	// A partition listed beside its table would get none of its changes: refused, the table streams.
	e.run("both", `[{table: ev, queue: qb}, {table: ev_2026, queue: qb}]`, "")
	e.waitStatus("qb", "both", `public.ev_2026 is a partition of public.ev, which is listed too`)
	e.waitStatus("qb", "both", `"phase":"streaming"`)
}

// TestPartitionsWithoutIdentity: a published partitioned table's partitions without a replica
// identity (REPLICA IDENTITY NOTHING, or no primary key) are each a replica_identity warning naming
// the ALTER that fixes it; partitions with the table's key are not, nor an append-only table's.
func TestPartitionsWithoutIdentity(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE pw (id int, at int, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
		CREATE TABLE pw_ok PARTITION OF pw FOR VALUES FROM (0) TO (10);
		CREATE TABLE pw_nothing PARTITION OF pw FOR VALUES FROM (10) TO (20);
		ALTER TABLE pw_nothing REPLICA IDENTITY NOTHING;
		CREATE TABLE pw_sub PARTITION OF pw FOR VALUES FROM (20) TO (30) PARTITION BY RANGE (at);
		CREATE TABLE pw_sub_leaf PARTITION OF pw_sub FOR VALUES FROM (20) TO (30);
		ALTER TABLE pw_sub_leaf REPLICA IDENTITY NOTHING;
		CREATE TABLE lg (id int, at int) PARTITION BY RANGE (at);
		CREATE TABLE lg_all PARTITION OF lg FOR VALUES FROM (MINVALUE) TO (MAXVALUE)`)
	tables, refused, err := source.LoadTables(e.ctx, e.pg.Pool(), []source.Table{{Schema: "public", Name: "pw", Queue: "q"},
		{Schema: "public", Name: "lg", Queue: "q", AppendOnly: true, Mode: source.PartitionBySingle}}, e.pg.Version*10000)
	if err != nil || len(refused) > 0 {
		t.Fatal(err, refused)
	}
	var got []string
	for _, tb := range tables {
		warnings, err := source.PartitionsWithoutIdentity(e.ctx, e.pg.Pool(), tb)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range warnings {
			if errcode.Of(w) != errcode.ReplicaIdentity {
				t.Errorf("%v: not replica_identity", w)
			}
			got = append(got, w.Error())
		}
	}
	if len(got) != 2 || !strings.Contains(got[0], "partition public.pw_nothing of public.pw has no replica identity (REPLICA IDENTITY NOTHING)") ||
		!strings.Contains(got[0], `ALTER TABLE "public"."pw_nothing" REPLICA IDENTITY FULL`) || !strings.Contains(got[1], "public.pw_sub_leaf") {
		t.Fatalf("warnings:\n%s", strings.Join(got, "\n"))
	}
}
