package source

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/queue"
)

// A Finding is one start check a preflight ran: what it checked, and why it failed (nil: passed).
type Finding struct {
	What string
	Err  error
}

// Preflight runs a source's start checks against its servers and changes nothing (`pgrelay
// check`): the Redis user's ACL on every queue and Redis' memory policy; the PostgreSQL
// connection, server settings and version; EXECUTE on the functions pg_cdc calls; each table
// (refused ones with their codes); the publications (their statements run in a transaction
// rolled back, so a managed one shows whether the role may create or correct it); and the
// replication connection (the REPLICATION attribute, a free WAL sender). The slot and the pointer are not checked: `pgrelay status` shows
// them. A failure that stops the later checks (no connection) is the last finding.
func Preflight(ctx context.Context, cfg Config) []Finding {
	var out []Finding
	add := func(what string, err error) bool {
		out = append(out, Finding{What: what, Err: err})
		return err == nil
	}
	rdb, err := cfg.Redis.Client()
	if err == nil {
		if err = checkACL(ctx, cfg, rdb); err == nil {
			err = queue.CheckEviction(ctx, rdb)
		}
		_ = rdb.Close()
	}
	add("Redis: the user's commands and keys, the memory policy", cfg.Redis.Explain(err))

	pool, err := connectPool(ctx, cfg)
	if err != nil {
		add("PostgreSQL: connection settings", err)
		return out
	}
	defer pool.Close()
	version, err := CheckServer(ctx, pool, cfg.SlotFailover)
	what := "PostgreSQL: connection and server settings"
	if err == nil {
		what = fmt.Sprintf("PostgreSQL %d.%d: connection and server settings", version/10000, version%10000)
	}
	if !add(what, pgconnect.Explain(err)) {
		return out
	}
	add("PostgreSQL: EXECUTE on the functions pg_cdc calls", CheckFunctions(ctx, pool))
	expanded, err := ExpandTables(ctx, pool, cfg.Tables)
	if err != nil {
		add("PostgreSQL: the tables", err)
		return out
	}
	tables, refused, err := LoadTables(ctx, pool, expanded, version)
	if err == nil {
		tables, refused, _, err = RefuseUnpublished(ctx, pool, &cfg, tables, refused, version)
	}
	if err != nil {
		add("PostgreSQL: the tables", err)
		return out
	}
	for _, t := range tables {
		add("table "+t.Full(), nil)
	}
	for _, r := range refused {
		add("table "+r.Table, r.Err)
	}
	what = "publications " + cfg.Publication + " (publication.manage: false: as they are)"
	if cfg.ManagePublication {
		what = "publications " + cfg.Publication + " (managed: created or corrected in a transaction rolled back)"
	}
	pubs, err := publicationsCheck(ctx, pool, &cfg, tables, refused, version)
	if len(pubs.Broader) > 0 {
		what += "; beyond the tables (their changes are sent and dropped): " + strings.Join(pubs.Broader, ", ")
	}
	add(what, err)
	add("PostgreSQL: the replication connection", replicationCheck(ctx, cfg))
	return out
}

// publicationsCheck runs the start's publication statements in a transaction it rolls back (DDL
// is transactional in PostgreSQL): a managed publication is created or corrected with the role's
// rights and then undone, an unmanaged one only read.
func publicationsCheck(ctx context.Context, pool *pgxpool.Pool, cfg *Config, tables []TableInfo, refused []Refusal, version int) (Publications, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return Publications{}, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // nothing of it may stay
	return EnsurePublications(ctx, tx, cfg, tables, refused, version)
}

// replicationCheck opens the replication connection pg_cdc streams on and identifies the system.
func replicationCheck(ctx context.Context, cfg Config) error {
	rcfg, err := cfg.PG.ReplicationConfig()
	if err != nil {
		return err
	}
	repl, err := pgconn.ConnectConfig(ctx, rcfg)
	if err != nil {
		return pgconnect.Explain(fmt.Errorf("open the replication connection: %w", err))
	}
	defer repl.Close(context.Background())
	if _, err := pglogrepl.IdentifySystem(ctx, repl); err != nil {
		return fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	return nil
}
