package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/source"
)

// The text form of a source's status shows the owner's phase, the pointer as fields, the lag, each
// refused table with its error, the publications, the snapshot's progress line and a pending
// re-read (`pgrelay snapshot`); the JSON form
// keeps the fields of earlier versions and adds the new ones.
func TestPrintSourceStatus(t *testing.T) {
	lag := int64(4096)
	st := &source.Status{Name: "bench", Owner: "host:1:ab|3", LeaseTTLLeftMs: 2500, Slot: "pgrelay_bench", SlotExists: true,
		Publication: "pgrelay_bench", InsertPublication: "pgrelay_bench_insert", Phase: "snapshot",
		Pointer: json.RawMessage(`{"v":1}`), Epoch: "0a1b2c3d", Generation: 2, LSN: "0/1570EA0", PointerUpdatedAt: "2026-11-30T10:00:00.000000Z", LagBytes: &lag,
		RefusedTables: []source.RefusedTable{{Table: "public.audit", Code: errcode.ReplicaIdentity, Error: "tables[4] (public.audit): replica_identity: no key"}},
		Snapshot: &source.SnapshotProgress{Table: "public.pgbench_accounts", Tables: 3, RowsDone: 40000, Estimate: 100000, Percent: 40,
			RowsPerSec: 5000, ETASec: 12, At: "2026-11-30T10:00:00Z"},
		Reread: &source.RereadRequest{Tables: []string{"public.orders"}, RequestedAt: "2026-11-30T09:59:00Z", By: "ops:42"}}
	var text bytes.Buffer
	if err := printSource(&text, st, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"  phase:       snapshot\n",
		"  pointer:     lsn 0/1570EA0, epoch 0a1b2c3d, generation 2, updated 2026-11-30T10:00:00.000000Z\n",
		"  lag:         4096 bytes of WAL not yet in the queue\n",
		"  refused:     public.audit: tables[4] (public.audit): replica_identity: no key\n",
		"  publication: pgrelay_bench, pgrelay_bench_insert (append-only tables: insert, truncate)\n",
		"  snapshot:    public.pgbench_accounts (table 1 of 3): 40000 of ~100000 rows (40.0%), 5000 rows/s, ETA 12s\n",
		"  re-read:     public.orders, requested 2026-11-30T09:59:00Z by ops:42, pending: the owner reads them within heartbeat/2, or at its next start\n",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
	// PostgreSQL not reached: the slot is not said to be missing
	unread := *st
	unread.SlotExists, unread.SlotUnread, unread.PostgresProblem = false, true, "pg_unreachable: PostgreSQL does not answer at 127.0.0.1:1"
	var down bytes.Buffer
	if err := printSource(&down, &unread, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(down.String(), "  slot:        pgrelay_bench not read (PostgreSQL: below)\n") || strings.Contains(down.String(), "exists=false") ||
		!strings.Contains(down.String(), "  postgres:    pg_unreachable:") {
		t.Errorf("PostgreSQL not reached:\n%s", down.String())
	}
	var js bytes.Buffer
	if err := printSource(&js, st, true); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"name", "owner", "lease_ttl_left_ms", "replicas", "pointer", "slot", "slot_exists", "slot_lag_bytes", "publication",
		"snapshot", "phase", "epoch", "generation", "lsn", "pointer_updated_at", "lag_bytes", "insert_publication", "refused_tables", "reread"} {
		if _, ok := got[k]; !ok {
			t.Errorf("--json lacks %q: %s", k, js.String())
		}
	}
	snap, _ := got["snapshot"].(map[string]any)
	for _, k := range []string{"table", "table_index", "tables", "rows_done", "estimate", "percent", "rows_per_s", "eta_s", "at"} {
		if _, ok := snap[k]; !ok {
			t.Errorf("--json snapshot lacks %q: %s", k, js.String())
		}
	}
}
