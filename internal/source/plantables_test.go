package source

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/snapshot"
)

func TestPlanTables(t *testing.T) {
	cursor := func(c snapshot.Cursor) json.RawMessage { b, _ := json.Marshal(c); return b }
	base := pointer.New(1, "e", "s", "x", 100)
	with := func(tables []string, snap json.RawMessage) pointer.Pointer {
		p := base
		p.Tables, p.Snapshot = tables, snap
		return p
	}
	a, b, c := "public.a", "public.b", "public.c"
	for _, tc := range []struct {
		name       string
		in         pointer.Pointer
		configured []string
		snapNew    bool
		wantAdded  []string
		wantTables []string
		wantSnap   *snapshot.Cursor // nil: unchanged
	}{
		{"a pointer from before the field: nothing is new", with(nil, nil), []string{a, b}, true, nil, []string{a, b}, nil},
		{"same tables", with([]string{a, b}, nil), []string{a, b}, true, nil, []string{a, b}, nil},
		{"added, snapshot initial: a snapshot of it alone", with([]string{a}, nil), []string{a, b}, true,
			[]string{b}, []string{a, b}, &snapshot.Cursor{Tables: []string{b}, Table: b}},
		{"added, snapshot never: only streamed", with([]string{a}, nil), []string{a, b}, false, []string{b}, []string{a, b}, nil},
		{"added while a snapshot runs: appended to it", with([]string{a, b}, cursor(snapshot.Cursor{Tables: []string{a, b}, Table: a, After: []string{"7"}, Rows: 7})),
			[]string{a, b, c}, true, []string{c}, []string{a, b, c},
			&snapshot.Cursor{Tables: []string{a, b, c}, Table: a, After: []string{"7"}, Rows: 7}},
		{"removed: leaves the list, so adding it back snapshots it again", with([]string{a, b}, nil), []string{a}, true, nil, []string{a}, nil},
	} {
		got, added, err := PlanTables(tc.in, tc.configured, tc.snapNew)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !reflect.DeepEqual(added, tc.wantAdded) || !reflect.DeepEqual(got.Tables, tc.wantTables) {
			t.Errorf("%s: added %v tables %v, want %v %v", tc.name, added, got.Tables, tc.wantAdded, tc.wantTables)
		}
		if tc.wantSnap == nil {
			if string(got.Snapshot) != string(tc.in.Snapshot) {
				t.Errorf("%s: snapshot changed to %s", tc.name, got.Snapshot)
			}
			continue
		}
		var cur snapshot.Cursor
		if err := json.Unmarshal(got.Snapshot, &cur); err != nil || !reflect.DeepEqual(cur, *tc.wantSnap) {
			t.Errorf("%s: snapshot %s, want %+v", tc.name, got.Snapshot, *tc.wantSnap)
		}
		if got.Position() != tc.in.Position() {
			t.Errorf("%s: the position moved", tc.name)
		}
	}
}
