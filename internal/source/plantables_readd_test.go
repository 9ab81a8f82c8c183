package source

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/snapshot"
)

// TestPlanTablesReaddedWhileSnapshotRuns: a table removed from `tables` and added back while the
// snapshot still runs must be read again (its changes in between were not streamed), also when the
// running snapshot already read it (it is before the cursor's table) or was reading it.
func TestPlanTablesReaddedWhileSnapshotRuns(t *testing.T) {
	a, b, c := "public.a", "public.b", "public.c"
	for _, tc := range []struct {
		name string
		cur  snapshot.Cursor
		want snapshot.Cursor
	}{
		{"already read (before the cursor's table)", snapshot.Cursor{Tables: []string{a, b, c}, Table: b, After: []string{"7"}, Rows: 7},
			snapshot.Cursor{Tables: []string{b, c, a}, Table: b, After: []string{"7"}, Rows: 7}},
		{"being read", snapshot.Cursor{Tables: []string{a, b, c}, Table: a, After: []string{"7"}, Rows: 7},
			snapshot.Cursor{Tables: []string{a, b, c}, Table: a}},
	} {
		raw, _ := json.Marshal(tc.cur)
		p := pointer.New(1, "e", "s", "x", 100)
		p.Tables, p.Snapshot = []string{b, c}, raw // a was removed from tables at the last start
		got, added, err := PlanTables(p, []string{a, b, c}, true)
		if err != nil || !reflect.DeepEqual(added, []string{a}) {
			t.Fatalf("%s: added %v err %v", tc.name, added, err)
		}
		var cur snapshot.Cursor
		if err := json.Unmarshal(got.Snapshot, &cur); err != nil {
			t.Fatal(err)
		}
		// Read the tables through as the snapshotter does: a must be read from its start.
		if !reflect.DeepEqual(cur, tc.want) {
			t.Errorf("%s: cursor %+v, want %+v (a is not read again from its start)", tc.name, cur, tc.want)
		}
	}
}
