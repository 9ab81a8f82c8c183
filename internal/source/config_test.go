package source

import (
	"strings"
	"testing"
)

func TestClusterSlotMatchesRedis(t *testing.T) {
	// Known slots from Redis' CLUSTER KEYSLOT.
	for tag, want := range map[string]uint16{"foo": 12182, "bar": 5061} {
		if got := clusterSlot(tag); got != want {
			t.Errorf("%s: slot %d, want %d", tag, got, want)
		}
	}
	c := Config{Tables: []Table{{Queue: "foo"}, {Queue: "bar"}}}
	c.Redis.ClusterURLs = []string{"redis://127.0.0.1:7000"}
	if err := c.checkClusterSlots(); err == nil || !strings.Contains(err.Error(), "cluster_slot") {
		t.Errorf("different slots accepted: %v", err)
	}
	c.Tables[1].Queue = "foo"
	if err := c.checkClusterSlots(); err != nil {
		t.Error(err)
	}
}

// TestTableNames: an entry names a table by name, or by a pattern whose * stands for any
// characters (none too), in the table's name or the schema's; a pattern in the schema never names a
// system schema (PostgreSQL's pg_* and information_schema, pgrelay's own), which a schema named
// outright can.
func TestTableNames(t *testing.T) {
	for _, c := range []struct {
		entry, table string
		want         bool
	}{
		{"public.orders", "public.orders", true},
		{"public.orders", "public.orders2", false},
		{"public.orders", "sales.orders", false},
		{"sales.*", "sales.orders", true},
		{"sales.*", "public.orders", false},
		{"public.order_*", "public.order_items", true},
		{"public.order_*", "public.order_", true},
		{"public.order_*", "public.orders", false},
		{"public.*_log", "public.audit_log", true},
		{"public.*_log", "public.audit_log2", false},
		{"public.a*b*c", "public.abc", true},
		{"public.a*b*c", "public.axxbyyc", true},
		{"public.a*b*c", "public.acb", false},
		{"public.ab*ba", "public.aba", false},
		{"public.Order*", "public.orders", false},
		{"tenant_*.orders", "tenant_a.orders", true},
		{"tenant_*.orders", "tenant_a.orders2", false},
		{"tenant_*.orders", "public.orders", false},
		{"*.orders", "public.orders", true},
		{"*.*", "sales.t", true},
		{"*.*", "pg_catalog.pg_class", false},
		{"*.*", "information_schema.tables", false},
		{"*.*", "pgrelay.sink_progress", false},
		{"pgrelay.*", "pgrelay.sink_progress", true},
		{"t*_*.o*", "t1_x.orders", true},
	} {
		schema, name := ParseTable(c.entry)
		if got := (Table{Schema: schema, Name: name}).Names(c.table); got != c.want {
			t.Errorf("%s names %s: %v, want %v", c.entry, c.table, got, c.want)
		}
	}
}
