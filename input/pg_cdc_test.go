package input

import (
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/source"
)

func TestConfigRefusesOutOfRangeValuesWithThePath(t *testing.T) {
	base := "name: x\ndsn: postgres://127.0.0.1/db\ntables: [{table: t, queue: q}]\n"
	for _, c := range []struct{ extra, want string }{
		{"lease_ttl: 1s", "lease_ttl:"},
		{"max_bundle_messages: 0", "max_bundle_messages:"},
		{"max_bundle_bytes: 100", "max_bundle_bytes:"},
		{"heartbeat: 2h", "heartbeat:"},
		{"linger: 6s", "linger:"},
		{"truncate: emit", "truncate:"},
		{"chunk_rows: 0", "chunk_rows:"},
		{"chunk_rows: 100001", "chunk_rows:"},
		{"tables: [{table: t, queue: q}, {table: public.t, queue: r}]", "tables[1].table:"},
		{"tables: [{table: t, queue: q, partition_by: nope}]", "tables[0].partition_by:"},
		{"tls: {mode: verify-full, root_ca_file: /x, client_cert_file: /c}", "tls.client_cert_file:"},
	} {
		yaml := base + c.extra
		if strings.HasPrefix(c.extra, "tables:") {
			yaml = "name: x\ndsn: postgres://127.0.0.1/db\n" + c.extra
		}
		conf, err := PgCDCSpec().ParseYAML(yaml, nil)
		if err != nil {
			t.Fatalf("%s: %v", c.extra, err)
		}
		_, err = PgCDCConfigFromParsed(conf)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.extra, err, c.want)
		}
	}
	conf, _ := PgCDCSpec().ParseYAML(base, nil)
	c, err := PgCDCConfigFromParsed(conf)
	if err != nil || c.Slot != "pgrelay_x" || c.Publication != "pgrelay_x" || c.InsertPublication != "pgrelay_x_insert" || c.StopOnRefusedTable ||
		c.Tables[0].AppendOnly || c.LeaseTTL != 10*time.Second || c.MaxBundleMessages != 1000 || c.ChunkRows != source.DefaultChunkRows || c.SnapshotInitial {
		t.Errorf("defaults: %+v %v", c, err)
	}
}
