package source

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/snapshot"
)

// The operator's actions on a source, outside a running pipeline (pgrelay status, resync and
// teardown): each connects, does its one thing and closes.

// Status is what `pgrelay status` shows for one source. The JSON form (`--json`) only ever gains
// fields.
type Status struct {
	Name              string                     `json:"name"`
	Owner             string                     `json:"owner"`
	LeaseTTLLeftMs    int64                      `json:"lease_ttl_left_ms"`
	Replicas          map[string]json.RawMessage `json:"replicas"`
	Pointer           json.RawMessage            `json:"pointer"`
	Slot              string                     `json:"slot"`
	SlotExists        bool                       `json:"slot_exists"`
	SlotActivePID     int                        `json:"slot_active_pid,omitempty"`
	ConfirmedFlush    string                     `json:"confirmed_flush_lsn,omitempty"`
	WALStatus         string                     `json:"wal_status,omitempty"`
	SlotLagBytes      int64                      `json:"slot_lag_bytes"`
	Publication       string                     `json:"publication"`
	InsertPublication string                     `json:"insert_publication,omitempty"` // with append-only tables
	PostgresProblem   string                     `json:"postgres_error,omitempty"`
	// SlotUnread: PostgreSQL could not be read, so the slot fields say nothing (PostgresProblem
	// says why).
	SlotUnread bool              `json:"-"`
	Snapshot   *SnapshotProgress `json:"snapshot,omitempty"`

	// The owner's phase and last error code (from its entry in Replicas).
	Phase     string       `json:"phase,omitempty"`
	ErrorCode errcode.Code `json:"error_code,omitempty"`
	// The pointer's fields: every commit at or below LSN is in the queue.
	Epoch            string `json:"epoch,omitempty"`
	Generation       uint32 `json:"generation,omitempty"` // 1 on the first start, +1 per resync
	LSN              string `json:"lsn,omitempty"`
	InTransaction    bool   `json:"in_transaction,omitempty"` // the queue holds part of the next transaction
	PointerUpdatedAt string `json:"pointer_updated_at,omitempty"`
	// LagBytes is how much WAL the queue is behind: the server's current WAL position − (LSN + 1),
	// LSN being inclusive (0 once every byte of WAL is covered).
	LagBytes *int64 `json:"lag_bytes,omitempty"`
	// RefusedTables are the configured tables the owner's last start refused and does not stream.
	RefusedTables []RefusedTable `json:"refused_tables,omitempty"`
	// Reread is the last `pgrelay snapshot` request: pending until a start applies it, then read
	// while the snapshot runs (Snapshot shows its progress).
	Reread *RereadRequest `json:"reread,omitempty"`
}

// RereadRequest is a `pgrelay snapshot` request as `pgrelay status` shows it.
type RereadRequest struct {
	Tables      []string `json:"tables"`
	RequestedAt string   `json:"requested_at"`
	By          string   `json:"by"`
	Applied     bool     `json:"applied"` // a start took it (from the pointer's pos AppliedPos)
}

// ReadStatus gathers a source's status from Redis and PostgreSQL.
func ReadStatus(ctx context.Context, cfg Config) (*Status, error) {
	rdb, keys, err := adminRedis(ctx, &cfg, redisconn.UseStatus)
	if err != nil {
		return nil, err
	}
	defer rdb.Close()
	st := &Status{Name: cfg.Name, Slot: cfg.Slot, Publication: cfg.Publication, Replicas: map[string]json.RawMessage{}}
	if cfg.anyAppendOnly() {
		st.InsertPublication = cfg.InsertPublication
	}
	owner, ttl, err := lease.Holder(ctx, rdb, keys.Lease)
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	st.Owner, st.LeaseTTLLeftMs = owner, ttl.Milliseconds()
	if raw, err := rdb.Get(ctx, keys.Pointer).Bytes(); err == nil {
		st.Pointer = raw
	} else if !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("redis: %w", err)
	}
	var rr rereadMark
	if raw, err := rdb.Get(ctx, keys.Reread).Bytes(); err == nil && json.Unmarshal(raw, &rr) == nil {
		st.Reread = &RereadRequest{Tables: rr.Tables, RequestedAt: rr.RequestedAt, By: rr.By, Applied: rr.AppliedPos != ""}
	}
	reps, _ := rdb.HGetAll(ctx, keys.Status).Result()
	for k, v := range reps {
		st.Replicas[k] = json.RawMessage(v)
	}
	var own ReplicaStatus
	ownerID, _, _ := strings.Cut(owner, "|") // the lease holds "<owner id>|<fence sequence>"
	if raw, ok := st.Replicas[ownerID]; ok && owner != "" && json.Unmarshal(raw, &own) == nil {
		st.Phase, st.ErrorCode, st.RefusedTables = own.Phase, own.Code, own.Refused
	}
	var ptr *pointer.Pointer
	if len(st.Pointer) > 0 {
		if p, err := pointer.Parse(st.Pointer); err == nil {
			ptr = &p
			st.Epoch, st.Generation, st.LSN, st.InTransaction, st.PointerUpdatedAt = p.Epoch, p.Gen, p.LSN, p.InTxn != nil, p.UpdatedAt
		}
	}
	pool, err := connectPool(ctx, cfg)
	if err != nil {
		st.PostgresProblem, st.SlotUnread = pgconnect.Explain(err).Error(), true
		return st, nil
	}
	defer pool.Close()
	if err := st.readSlot(ctx, pool, cfg, ptr); err != nil {
		st.PostgresProblem = pgconnect.Explain(err).Error()
		st.SlotUnread = !st.SlotExists
	}
	if err := st.readSnapshot(ctx, pool, ptr, own.Snapshot); err != nil && st.PostgresProblem == "" {
		st.PostgresProblem = pgconnect.Explain(err).Error()
	}
	return st, nil
}

// readSlot reads the slot and both lags: the slot's (WAL PostgreSQL keeps) and the queue's.
func (st *Status) readSlot(ctx context.Context, pool *pgxpool.Pool, cfg Config, ptr *pointer.Pointer) error {
	slot, err := ReadSlot(ctx, pool, cfg.Slot)
	if err != nil {
		return err
	}
	st.SlotExists, st.SlotActivePID, st.WALStatus = slot.Exists, slot.ActivePID, slot.WALStatus
	if slot.Exists {
		st.ConfirmedFlush = slot.ConfirmedFlush.String()
		if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - $1::text::pg_lsn`, st.ConfirmedFlush).Scan(&st.SlotLagBytes); err != nil {
			return err
		}
	}
	if ptr != nil {
		var lag int64
		if err := pool.QueryRow(ctx, `SELECT greatest(pg_current_wal_lsn() - $1::text::pg_lsn - 1, 0)::bigint`, ptr.LSN).Scan(&lag); err != nil {
			return err
		}
		st.LagBytes = &lag
	}
	return nil
}

// adminRedis opens cfg's Redis for a command of use, with its ACL checked: the client (the caller
// closes it) and the source's keys.
func adminRedis(ctx context.Context, cfg *Config, use redisconn.Use) (redis.UniversalClient, Keys, error) {
	rdb, err := cfg.Redis.Client()
	if err != nil {
		return nil, Keys{}, err
	}
	if err := cfg.Redis.CheckACL(ctx, rdb, cfg.Tables[0].Queue, use); err != nil {
		rdb.Close()
		return nil, Keys{}, err
	}
	return rdb, KeysFor(cfg), nil
}

// requester names who wrote a request key: host:pid.
func requester() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid())
}

func connectPool(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	pcfg, err := cfg.PG.PoolConfig(1)
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(ctx, pcfg)
}

// RequestResync writes the source's resync key. The replica owning the source acts on it within a
// heartbeat (or at its next start); a source with no running replica resyncs when one starts.
func RequestResync(ctx context.Context, cfg Config, w io.Writer) error {
	rdb, keys, err := adminRedis(ctx, &cfg, redisconn.UseResync)
	if err != nil {
		return err
	}
	defer rdb.Close()
	req, _ := json.Marshal(map[string]string{"requested_at": time.Now().UTC().Format(time.RFC3339Nano), "by": requester()})
	if err := rdb.Set(ctx, keys.Resync, req, 0).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	fmt.Fprintf(w, "resync of %s requested (%s): the owning pgrelay drops and recreates slot %s, starts a new epoch and snapshots every table\n",
		cfg.Name, keys.Resync, cfg.Slot)
	return nil
}

// Teardown drops the slot and (when managed) the publication, then deletes the pointer, lease
// status and resync keys. It refuses while a replica holds the lease, unless force.
func Teardown(ctx context.Context, cfg Config, force bool, w io.Writer) error {
	rdb, keys, err := adminRedis(ctx, &cfg, redisconn.UseTeardown)
	if err != nil {
		return err
	}
	defer rdb.Close()
	if owner, _, err := lease.Holder(ctx, rdb, keys.Lease); err != nil {
		return fmt.Errorf("redis: %w", err)
	} else if owner != "" && !force {
		return fmt.Errorf("%s holds the lease: stop pgrelay first (or use --force)", owner)
	}
	pool, err := connectPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	slot, err := ReadSlot(ctx, pool, cfg.Slot)
	if err != nil {
		return err
	}
	if slot.Exists {
		if slot.ActivePID != 0 {
			if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, slot.ActivePID); err != nil {
				return fmt.Errorf("stop the walsender of slot %s: %w", cfg.Slot, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
		if _, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, cfg.Slot); err != nil {
			return fmt.Errorf("drop slot %s: %w", cfg.Slot, err)
		}
		fmt.Fprintf(w, "dropped slot %s\n", cfg.Slot)
	}
	if cfg.ManagePublication {
		rows, err := pool.Query(ctx, `SELECT pubname FROM pg_catalog.pg_publication WHERE pubname IN ($1, $2) ORDER BY pubname`,
			cfg.Publication, cfg.InsertPublication)
		if err != nil {
			return fmt.Errorf("read pg_publication: %w", err)
		}
		pubs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("read pg_publication: %w", err)
		}
		for _, pub := range pubs {
			if _, err := pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{pub}.Sanitize()); err != nil {
				return fmt.Errorf("drop publication %s: %w", pub, err)
			}
			fmt.Fprintf(w, "dropped publication %s\n", pub)
		}
	}
	if err := rdb.Del(ctx, keys.Pointer, keys.Status, keys.Resync, keys.Rejoin, keys.Reread).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	fmt.Fprintf(w, "deleted %s\n", keys.Pointer)
	return nil
}

// readSnapshot fills st.Snapshot from the pointer's cursor (nothing when no snapshot runs): rows
// done as the queue holds them, the table's estimate (the owner's when the configured name finds
// no table), and the rate and time left the owner last reported for that table.
func (st *Status) readSnapshot(ctx context.Context, pool *pgxpool.Pool, ptr *pointer.Pointer, live *SnapshotProgress) error {
	if ptr == nil || !ptr.SnapshotRuns() {
		return nil
	}
	var cur snapshot.Cursor
	if err := json.Unmarshal(ptr.Snapshot, &cur); err != nil || cur.Table == "" {
		return nil
	}
	p := newProgress(cur, 0, time.Now()).SnapshotProgress
	st.Snapshot = &p
	if live != nil && live.Table == cur.Table {
		p.RowsPerSec, p.ETASec, p.At = live.RowsPerSec, live.ETASec, live.At
	}
	est, err := estimateRows(ctx, pool, cur.Table, 0)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if est <= 0 && live != nil && live.Table == cur.Table {
		// no table of the configured name (renamed while its snapshot runs): the owner's estimate,
		// read by the table's oid
		est = live.Estimate
	}
	p.Estimate, p.Percent = est, percentOf(p.RowsDone, est)
	return nil
}
