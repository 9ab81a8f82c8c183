package source_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
)

// TestSlotFailoverFlagFollowsTheConfig: on PostgreSQL 17+ a slot created without failover becomes a
// failover slot when the source restarts with `slot.failover: true` (before, it silently stayed
// unprotected until a resync), and turns back with `false`; the pointer and epoch stay, and changes
// made while the source was stopped still arrive.
func TestSlotFailoverFlagFollowsTheConfig(t *testing.T) {
	e := newEnv(t)
	if e.pg.Version < 17 {
		t.Skipf("failover slots need PostgreSQL 17, this is %d", e.pg.Version)
	}
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY)`)
	failover := func() bool {
		var on bool
		if err := e.pg.Pool().QueryRow(e.ctx, `SELECT failover FROM pg_replication_slots WHERE slot_name = 'pgrelay_fo'`).Scan(&on); err != nil {
			t.Fatal(err)
		}
		return on
	}
	waitFailover := func(want bool) {
		t.Helper()
		cdctest.Wait(t, 30*time.Second, fmt.Sprintf("slot failover %t", want), func() (bool, string) {
			return failover() == want, fmt.Sprintf("slot failover is %t", !want)
		})
	}
	stop := e.run("fo", `[{table: s, queue: q}]`, "")
	e.waitPointer("fo", "q")
	stop()
	if failover() {
		t.Fatal("a slot made with slot.failover: false is a failover slot")
	}
	want := 0
	for _, on := range []bool{true, false} {
		want++
		e.pg.Exec(`INSERT INTO s VALUES ($1)`, want)
		extra := "slot: {failover: false}"
		if on {
			extra = "slot: {failover: true}"
		}
		stop = e.run("fo", `[{table: s, queue: q}]`, extra)
		waitFailover(on)
		e.waitEntries("q", want)
		stop()
	}
	e.checkOracle("q", "public.s", "id")
}
