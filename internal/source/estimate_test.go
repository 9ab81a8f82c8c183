package source

import (
	"context"
	"testing"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestEstimateRows: a table's row estimate by its name or, when known, its oid (a table renamed
// since keeps it), a partitioned table's as the sum of its partitions', and none (0, no error) for
// a name that no longer exists.
func TestEstimateRows(t *testing.T) {
	pg := testenv.StartPostgres(t)
	ctx := context.Background()
	pg.Exec(`CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t SELECT generate_series(1, 500);
		CREATE TABLE p (id int PRIMARY KEY) PARTITION BY RANGE (id);
		CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100); CREATE TABLE p2 PARTITION OF p FOR VALUES FROM (100) TO (1000);
		INSERT INTO p SELECT generate_series(1, 300);
		ANALYZE t, p1, p2`)
	var oid uint32
	if err := pg.Pool().QueryRow(ctx, `SELECT 'public.t'::regclass::oid`).Scan(&oid); err != nil {
		t.Fatal(err)
	}
	pg.Exec(`ALTER TABLE t RENAME TO t_renamed; CREATE TABLE t (id int PRIMARY KEY)`)
	for _, c := range []struct {
		table string
		oid   uint32
		want  int64
	}{
		{"public.t_renamed", 0, 500},
		{"public.t", oid, 500}, // renamed since: by its oid
		{"public.t", 0, -1},    // the new table of that name, never analyzed
		{"public.p", 0, 300},
		{"public.gone", 0, 0},
	} {
		got, err := estimateRows(ctx, pg.Pool(), c.table, c.oid)
		if err != nil || got != c.want {
			t.Errorf("estimateRows(%s, %d) = %d, %v; want %d", c.table, c.oid, got, err, c.want)
		}
	}
}
