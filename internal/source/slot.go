package source

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/pointer"
)

// SlotState is a replication slot as pg_replication_slots shows it.
type SlotState struct {
	Exists         bool
	Logical        bool
	Plugin         string
	Database       string
	ActivePID      int
	ConfirmedFlush pglogrepl.LSN
	WALStatus      string
	Invalidated    bool
	Failover       bool // a failover slot (PostgreSQL 17+; false before)
}

// ReadSlot reads the slot's row (Exists false when there is none).
func ReadSlot(ctx context.Context, q queryer, name string) (SlotState, error) {
	var st SlotState
	var cf *string
	var active *int
	var plugin, db, wal *string
	err := q.QueryRow(ctx, `SELECT slot_type = 'logical', plugin, database::text, active_pid, confirmed_flush_lsn::text,
		wal_status, coalesce(to_jsonb(s)->>'invalidation_reason', '') <> '' OR wal_status = 'lost',
		coalesce((to_jsonb(s)->>'failover')::bool, false)
		FROM pg_catalog.pg_replication_slots s WHERE slot_name = $1`, name).
		Scan(&st.Logical, &plugin, &db, &active, &cf, &wal, &st.Invalidated, &st.Failover)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("read pg_replication_slots: %w", err)
	}
	st.Exists = true
	st.Plugin, st.Database, st.WALStatus = deref(plugin), deref(db), deref(wal)
	if active != nil {
		st.ActivePID = *active
	}
	if cf != nil {
		st.ConfirmedFlush, _ = pglogrepl.ParseLSN(*cf)
	}
	return st, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// CreateSlot creates the logical pgoutput slot and returns its consistent point.
func CreateSlot(ctx context.Context, q queryer, name string, failover bool) (pglogrepl.LSN, error) {
	var lsn string
	var err error
	if failover {
		err = q.QueryRow(ctx, `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`, name).Scan(&lsn)
	} else {
		err = q.QueryRow(ctx, `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')`, name).Scan(&lsn)
	}
	if err != nil {
		return 0, pgconnect.Explain(fmt.Errorf("create slot %s: %w", name, err)) // pg_limit: every slot in use
	}
	return pglogrepl.ParseLSN(lsn)
}

// AlterSlotFailover makes an existing slot a failover slot or not (ALTER_REPLICATION_SLOT,
// PostgreSQL 17+), on a replication connection while no one streams from the slot.
func AlterSlotFailover(ctx context.Context, repl *pgconn.PgConn, name string, failover bool) error {
	_, err := repl.Exec(ctx, fmt.Sprintf("ALTER_REPLICATION_SLOT %s (FAILOVER %t)", pgx.Identifier{name}.Sanitize(), failover)).ReadAll()
	return err
}

// CheckSlot applies the slot start checks of DESIGN §5 to an existing slot and the pointer.
func CheckSlot(st SlotState, slot, database string, ptr pointer.Pointer) error {
	if !st.Logical || st.Plugin != "pgoutput" || st.Database != database {
		return errcode.New(errcode.SlotMismatch, fmt.Sprintf("slot %s is not a logical pgoutput slot of database %s (plugin %q, database %q)",
			slot, database, st.Plugin, st.Database), "drop it, or set slot.name to another name")
	}
	if st.Invalidated {
		return errcode.New(errcode.SlotInvalidated, "slot "+slot+" was invalidated: the WAL it needed is gone (wal_status "+st.WALStatus+")",
			"run `pgrelay resync -c <config>` (drops and recreates the slot, new epoch, full snapshot), and raise max_slot_wal_keep_size")
	}
	// A fresh slot's confirmed_flush is the pointer's lsn + 1 (the pointer covers commits < it).
	if st.ConfirmedFlush > ptr.LSNValue()+1 {
		return errcode.New(errcode.SlotAhead, fmt.Sprintf("slot %s is confirmed at %s, past the pointer %s: something else consumed it, or Redis lost acknowledged data",
			slot, st.ConfirmedFlush, ptr.LSN), "run `pgrelay resync -c <config>` (new slot, new epoch, full snapshot)")
	}
	return nil
}

// CheckPointer compares a stored pointer with the configured slot and the server.
func CheckPointer(ptr pointer.Pointer, slot, systemID string, st SlotState) error {
	if ptr.Slot != slot {
		return errcode.New(errcode.SlotMismatch, "the pointer belongs to slot "+ptr.Slot+", the config names "+slot,
			"set slot.name back to "+ptr.Slot+", or run `pgrelay resync`")
	}
	if ptr.SystemID != systemID {
		return errcode.New(errcode.SystemChanged, "the pointer was written for PostgreSQL system "+ptr.SystemID+", this server is "+systemID+
			" (restored from a backup, or another cluster)", "run `pgrelay resync -c <config>` (new slot on this server, new epoch, full snapshot)")
	}
	if !st.Exists {
		return errcode.New(errcode.SlotLost, "slot "+slot+" is gone but the pointer says the queue was fed from it: changes since the pointer are lost to pg_cdc",
			"run `pgrelay resync -c <config>` (new slot, new epoch, full snapshot); the slot is never recreated silently")
	}
	return nil
}
