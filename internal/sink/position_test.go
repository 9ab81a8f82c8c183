package sink

import (
	"testing"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// TestEntryWithoutOffsetFails: a message whose entry had no off field arrives with offset 0. The
// sink cannot tell it from a repeat, so it must fail it (coded bad_metadata, dead-lettered after
// its attempts) and hold its shard's later messages, not skip it as already applied; other shards
// commit. In every mode's path: append (streamed COPY and the fast path) and upsert.
func TestEntryWithoutOffsetFails(t *testing.T) {
	for _, mode := range []Mode{ModeAppend, ModeUpsert} {
		t.Run(string(mode), func(t *testing.T) {
			f := startPG(t)
			tbl := f.name("t")
			f.exec(t, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
			a := f.applier(t, Config{Table: "public." + tbl, Mode: mode})
			res := write(t, a, msg("q", 0, 0, `{"id":1}`), msg("q", 0, 1, `{"id":2}`), msg("q", 1, 1, `{"id":3}`))
			if res.Outcomes[0] != Failed || !errcode.Is(res.Errs[0], errcode.BadMetadata) {
				t.Fatalf("offset 0: outcome %v, error %v", res.Outcomes[0], res.Errs[0])
			}
			if res.Outcomes[1] != Blocked || res.Outcomes[2] != Applied {
				t.Fatalf("outcomes %v errs %v", res.Outcomes, res.Errs)
			}
			if got := f.one(t, `SELECT string_agg(id::text, ',' ORDER BY id) FROM `+tbl); got != "3" {
				t.Fatalf("rows %s", got)
			}
		})
	}
}
