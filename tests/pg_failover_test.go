package tests

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// failoverPair is a primary and a synchronous physical standby set up for failover slots
// (PostgreSQL 17+): the standby runs with sync_replication_slots = on, the primary names it in
// synchronous_standby_names and synchronized_standby_slots. dsn lists both servers with
// target_session_attrs=read-write, as docs/operations.md tells users to.
type failoverPair struct {
	primary, standby *testenv.Postgres
	dsn              string
}

func startFailoverPair(t *testing.T) failoverPair {
	t.Helper()
	primary := testenv.StartPostgres(t)
	if primary.Version < 17 {
		t.Skipf("failover slots need PostgreSQL 17+, this is %d", primary.Version)
	}
	standby := testenv.StartStandby(t, primary, testenv.WithPGSetting("sync_replication_slots = on"))
	primary.Exec(fmt.Sprintf(`ALTER SYSTEM SET synchronous_standby_names = '"%s"'`, standby.StandbyName))
	primary.Exec(fmt.Sprintf(`ALTER SYSTEM SET synchronized_standby_slots = '%s'`, standby.StandbyName))
	primary.Exec(`SELECT pg_reload_conf()`)
	return failoverPair{primary: primary, standby: standby, dsn: fmt.Sprintf(
		"postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		primary.Port, standby.Port)}
}

// failOver kills the primary under the writer, stops the writer, promotes the standby and points
// the environment (the writer, the oracle) at it; it returns when the promotion is done.
func (f failoverPair) failOver(e *cdcEnv, stopWriter chan struct{}, wait func() int) (committed int, promoted time.Time) {
	f.primary.Kill()
	close(stopWriter)
	committed = wait()
	f.standby.Promote()
	promoted = time.Now()
	e.pg = f.standby
	return committed, promoted
}

// waitCovered waits until the pointer is at or past lsn with no transaction half in.
func (e *cdcEnv) waitCovered(lsn pglogrepl.LSN) {
	e.t.Helper()
	cdctest.WaitCovered(e.t, 60*time.Second, 20*time.Millisecond, lsn, e.pointer)
}

// waitWAL waits until the server has written n more bytes of WAL (the writer's work).
func (e *cdcEnv) waitWAL(n uint64) {
	e.t.Helper()
	target := e.currentLSN() + pglogrepl.LSN(n)
	cdctest.WaitEvery(e.t, 60*time.Second, 20*time.Millisecond, fmt.Sprintf("the writer to write %d bytes of WAL", n), func() (bool, string) {
		lsn := e.currentLSN()
		return lsn >= target, "at " + lsn.String()
	})
}

func (e *cdcEnv) currentLSN() pglogrepl.LSN { return cdctest.CurrentLSN(e.t, e.pg.Pool()) }

// TestPostgresFailoverResumesOnSyncedSlot: pg_cdc with slot.failover: true on a multi-host DSN;
// once the standby holds a failover-ready copy of the slot, the primary is SIGKILLed under a random
// writer and the standby promoted. pg_cdc must resume from its pointer on the synced slot of the
// new primary, in the same epoch and generation, without slot_lost, and the queue must replay to
// the new primary's table exactly. It logs the time from the promotion to the first commit on the
// new primary being in the queue.
func TestPostgresFailoverResumesOnSyncedSlot(t *testing.T) {
	f := startFailoverPair(t)
	e := newCDCEnvOn(t, f.primary, f.dsn, "fo", `[{table: w, queue: q}]`, "slot: {failover: true}")
	e.pg.Exec(writerTable)
	p := e.start()
	e.waitPointer()
	cdctest.Wait(t, 60*time.Second, "a failover-ready copy of the slot on the standby", func() (bool, string) {
		var ready bool
		err := f.standby.Pool().QueryRow(e.ctx, `SELECT synced AND NOT temporary AND NOT conflicting
			FROM pg_replication_slots WHERE slot_name = 'pgrelay_fo'`).Scan(&ready)
		return err == nil && ready, fmt.Sprintf("ready %v (%v)", ready, err)
	})
	stopWriter := make(chan struct{})
	wait := e.randomWriter(11, stopWriter)
	e.waitWAL(256 << 10)
	before := e.pointer()
	committed, promoted := f.failOver(e, stopWriter, wait)

	e.pg.Exec(`INSERT INTO w VALUES (-1, 'first on the new primary', 0, '{}', 0)`)
	e.waitCovered(e.currentLSN())
	resumed := time.Since(promoted)
	after := e.pointer()
	if after.Epoch != before.Epoch || after.Gen != before.Gen {
		t.Errorf("epoch %s gen %d after the failover, was %s gen %d", after.Epoch, after.Gen, before.Epoch, before.Gen)
	}
	var synced, active bool
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT synced, active FROM pg_replication_slots WHERE slot_name = 'pgrelay_fo'`).
		Scan(&synced, &active); err != nil || !synced || !active {
		t.Errorf("slot on the new primary: synced %v active %v (%v), want the synced slot in use", synced, active, err)
	}

	stopWriter = make(chan struct{})
	wait = e.randomWriter(12, stopWriter)
	e.waitWAL(128 << 10)
	e.waitCovered(e.currentLSN())
	close(stopWriter)
	committed += wait()
	res := e.converge("public.w", "id")
	if strings.Contains(p.Output(), "slot_lost") {
		t.Error("slot_lost in the output of a failover onto a synced slot")
	}
	t.Logf("resumed %.2f s after the promotion; %d transactions, %d events, pointer %s -> %s",
		resumed.Seconds(), committed, res.Events, before.LSN, after.LSN)
}

// TestPostgresFailoverWithoutFailoverSlotIsSlotLost: the same failover with slot.failover: false.
// The standby has no copy of the slot, so pg_cdc on the new primary stops with slot_lost (in its
// status and in `pgrelay status`) and never recreates the slot; `pgrelay resync` starts a new
// epoch whose full snapshot and stream replay to the new primary's table exactly.
func TestPostgresFailoverWithoutFailoverSlotIsSlotLost(t *testing.T) {
	f := startFailoverPair(t)
	e := newCDCEnvOn(t, f.primary, f.dsn, "nofo", `[{table: w, queue: q}]`, "slot: {failover: false}")
	e.pg.Exec(writerTable)
	e.start()
	e.waitPointer()
	stopWriter := make(chan struct{})
	wait := e.randomWriter(21, stopWriter)
	e.waitWAL(256 << 10)
	first := e.pointer()
	f.failOver(e, stopWriter, wait)

	stopWriter = make(chan struct{})
	wait = e.randomWriter(22, stopWriter)
	e.waitStatus(`"code":"slot_lost"`)
	out, _ := runStatus(t, e.config, false)
	if !strings.Contains(out, "slot_lost") {
		t.Errorf("pgrelay status does not show slot_lost:\n%s", out)
	}
	var slots int
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'pgrelay_nofo'`).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("the slot on the new primary before resync: %d (%v), want none", slots, err)
	}
	e.resync(first)
	e.waitWAL(128 << 10)
	e.waitCovered(e.currentLSN())
	close(stopWriter)
	wait()
	e.convergeEpoch("public.w", "id")
}
