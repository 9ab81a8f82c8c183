package source_test

import (
	"context"
	"testing"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// The server checks of DESIGN §5 refuse what logical replication cannot work with, each with its
// code in the source's status: wal_level below logical, and slot.failover before PostgreSQL 17.
// Nothing is created on a refused server: no publication, no slot.
func TestServerChecksRefuseWithCodes(t *testing.T) {
	for _, c := range []struct {
		name  string
		opts  []testenv.PGOption
		extra string
		code  string
	}{
		{"wal_level replica", []testenv.PGOption{testenv.WithPGSetting("wal_level = replica")}, "", `"code":"wal_level"`},
		{"failover on 15", []testenv.PGOption{testenv.WithPGVersion(15)}, "slot: {failover: true}", `"code":"version"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := &env{t: t, pg: testenv.StartPostgres(t, c.opts...), rd: testenv.StartRedis(t), ctx: context.Background()}
			e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY, v text)`)
			stop := e.run("chk", `[{table: s, queue: q}]`, c.extra)
			e.waitStatus("q", "chk", c.code)
			stop()
			var pubs, slots int
			e.pg.Pool().QueryRow(e.ctx, `SELECT (SELECT count(*) FROM pg_publication), (SELECT count(*) FROM pg_replication_slots)`).Scan(&pubs, &slots)
			if pubs != 0 || slots != 0 {
				t.Errorf("a refused server got %d publications and %d slots", pubs, slots)
			}
			if n := e.rd.Client().Exists(e.ctx, "pgrelay:{q}:src:chk:ptr").Val(); n != 0 {
				t.Error("a refused source wrote a pointer")
			}
		})
	}
}
