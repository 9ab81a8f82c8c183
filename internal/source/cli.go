package source

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/urfave/cli/v2"
	"gopkg.in/yaml.v3"

	pcli "github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/configfile"
	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/sinkstatus"
)

func init() {
	pcli.Register(statusCommand())
	pcli.Register(teardownCommand())
	pcli.Register(resyncCommand())
}

func configFlag() cli.Flag {
	return &cli.StringFlag{Name: "config", Aliases: []string{"c"}, Usage: "the pipeline config holding the pg_cdc input", Required: true}
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "Show each pg_cdc source of a config (owner, phases, pointer, slot and lag), then each pg_sink and redis_queue input (applied offsets per shard, group lag, pending, dead letters)",
		Flags: []cli.Flag{configFlag(), &cli.BoolFlag{Name: "json", Usage: "print JSON"}},
		Action: sinkstatus.WithSinks(func(c *cli.Context) error {
			return forEachSource(c, func(ctx context.Context, cfg Config) error {
				st, err := ReadStatus(ctx, cfg)
				if err != nil {
					return err
				}
				return printStatus(c.App.Writer, st, c.Bool("json"))
			})
		}),
	}
}

func teardownCommand() *cli.Command {
	return &cli.Command{
		Name:  "teardown",
		Usage: "Drop a pg_cdc source's slot and managed publication and delete its pointer (stop pgrelay first)",
		Flags: []cli.Flag{configFlag(), &cli.BoolFlag{Name: "force", Usage: "even while a replica holds the lease"}},
		Action: func(c *cli.Context) error {
			return forEachSource(c, func(ctx context.Context, cfg Config) error {
				return Teardown(ctx, cfg, c.Bool("force"), c.App.Writer)
			})
		},
	}
}

// forEachSource parses the config file and runs fn for every pg_cdc input in it.
func forEachSource(c *cli.Context, fn func(context.Context, Config) error) error {
	cfgs, err := ConfigsFromFile(c.String("config"))
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if len(cfgs) == 0 {
		return cli.Exit("no pg_cdc input in "+c.String("config"), 2)
	}
	ctx, cancel := context.WithTimeout(c.Context, 30*time.Second)
	defer cancel()
	for _, cfg := range cfgs {
		if err := fn(ctx, cfg); err != nil {
			return cli.Exit(fmt.Sprintf("%s: %v", cfg.Name, err), 1)
		}
	}
	return nil
}

// ConfigsFromFile finds every pg_cdc input of a pipeline config (env references resolved as
// Benthos does: ${VAR} or ${VAR:default}) and parses each.
func ConfigsFromFile(path string) ([]Config, error) {
	doc, err := configfile.Load(path)
	if err != nil {
		return nil, err
	}
	var out []Config
	var walk func(v any) error
	walk = func(v any) error {
		switch v := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if k == "pg_cdc" {
					b, _ := yaml.Marshal(v[k])
					pc, err := Spec().ParseYAML(string(b), nil)
					if err != nil {
						return fmt.Errorf("pg_cdc: %w", err)
					}
					cfg, err := ParseConfig(pc)
					if err != nil {
						return fmt.Errorf("pg_cdc: %w", err)
					}
					out = append(out, cfg)
					continue
				}
				if err := walk(v[k]); err != nil {
					return err
				}
			}
		case []any:
			for _, x := range v {
				if err := walk(x); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, walk(doc)
}

// Status is what `pgrelay status` shows for one source.
type Status struct {
	Name            string                     `json:"name"`
	Owner           string                     `json:"owner"`
	LeaseTTLLeftMs  int64                      `json:"lease_ttl_left_ms"`
	Replicas        map[string]json.RawMessage `json:"replicas"`
	Pointer         json.RawMessage            `json:"pointer"`
	Slot            string                     `json:"slot"`
	SlotExists      bool                       `json:"slot_exists"`
	SlotActivePID   int                        `json:"slot_active_pid,omitempty"`
	ConfirmedFlush  string                     `json:"confirmed_flush_lsn,omitempty"`
	WALStatus       string                     `json:"wal_status,omitempty"`
	SlotLagBytes    int64                      `json:"slot_lag_bytes"`
	Publication     string                     `json:"publication"`
	PostgresProblem string                     `json:"postgres_error,omitempty"`
	Snapshot        *SnapshotProgress          `json:"snapshot,omitempty"`
}

// ReadStatus gathers a source's status from Redis and PostgreSQL.
func ReadStatus(ctx context.Context, cfg Config) (*Status, error) {
	rdb, err := cfg.Redis.Client()
	if err != nil {
		return nil, err
	}
	defer rdb.Close()
	keys := KeysFor(&cfg)
	st := &Status{Name: cfg.Name, Slot: cfg.Slot, Publication: cfg.Publication, Replicas: map[string]json.RawMessage{}}
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
	reps, _ := rdb.HGetAll(ctx, keys.Status).Result()
	for k, v := range reps {
		st.Replicas[k] = json.RawMessage(v)
	}
	if err := st.readSlot(ctx, cfg); err != nil {
		st.PostgresProblem = err.Error()
	}
	if err := st.readSnapshot(ctx, cfg); err != nil && st.PostgresProblem == "" {
		st.PostgresProblem = pgconnect.Explain(err).Error()
	}
	return st, nil
}

func (st *Status) readSlot(ctx context.Context, cfg Config) error {
	pool, err := connectPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	slot, err := ReadSlot(ctx, pool, cfg.Slot)
	if err != nil {
		return pgconnect.Explain(err)
	}
	st.SlotExists, st.SlotActivePID, st.WALStatus = slot.Exists, slot.ActivePID, slot.WALStatus
	if slot.Exists {
		st.ConfirmedFlush = slot.ConfirmedFlush.String()
		return pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - $1::text::pg_lsn`, st.ConfirmedFlush).Scan(&st.SlotLagBytes)
	}
	return nil
}

func connectPool(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	qcfg, err := cfg.PG.ConnConfig()
	if err != nil {
		return nil, err
	}
	pcfg, _ := pgxpool.ParseConfig("")
	pcfg.ConnConfig.Config = *qcfg
	pcfg.MaxConns = 1
	return pgxpool.NewWithConfig(ctx, pcfg)
}

func printStatus(w io.Writer, st *Status, asJSON bool) error {
	if asJSON {
		b, _ := json.MarshalIndent(st, "", "  ")
		_, err := fmt.Fprintln(w, string(b))
		return err
	}
	fmt.Fprintf(w, "source %s\n", st.Name)
	if st.Owner == "" {
		fmt.Fprintln(w, "  owner:       none")
	} else {
		fmt.Fprintf(w, "  owner:       %s (lease %.1fs left)\n", st.Owner, float64(st.LeaseTTLLeftMs)/1000)
	}
	reps := make([]string, 0, len(st.Replicas))
	for k := range st.Replicas {
		reps = append(reps, k)
	}
	sort.Strings(reps)
	for _, k := range reps {
		fmt.Fprintf(w, "  replica:     %s %s\n", k, st.Replicas[k])
	}
	fmt.Fprintf(w, "  pointer:     %s\n", orNone(string(st.Pointer)))
	fmt.Fprintf(w, "  slot:        %s exists=%v active_pid=%d confirmed_flush=%s wal_status=%s lag_bytes=%d\n",
		st.Slot, st.SlotExists, st.SlotActivePID, orNone(st.ConfirmedFlush), orNone(st.WALStatus), st.SlotLagBytes)
	fmt.Fprintf(w, "  publication: %s\n", st.Publication)
	if sp := st.Snapshot; sp != nil && sp.Estimate > 0 {
		fmt.Fprintf(w, "  snapshot:    table %s (%d of %d), %d rows done of ~%d (%.1f%%)\n",
			sp.Table, sp.TableIndex+1, sp.Tables, sp.RowsDone, sp.Estimate, sp.Percent)
	} else if sp != nil {
		fmt.Fprintf(w, "  snapshot:    table %s (%d of %d), %d rows done (no estimate: the table was never analyzed)\n",
			sp.Table, sp.TableIndex+1, sp.Tables, sp.RowsDone)
	}
	if st.PostgresProblem != "" {
		fmt.Fprintf(w, "  postgres:    %s\n", st.PostgresProblem)
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// Teardown drops the slot and (when managed) the publication, then deletes the pointer, lease
// status and resync keys. It refuses while a replica holds the lease, unless force.
func Teardown(ctx context.Context, cfg Config, force bool, w io.Writer) error {
	rdb, err := cfg.Redis.Client()
	if err != nil {
		return err
	}
	defer rdb.Close()
	keys := KeysFor(&cfg)
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
		if _, err := pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{cfg.Publication}.Sanitize()); err != nil {
			return fmt.Errorf("drop publication %s: %w", cfg.Publication, err)
		}
		fmt.Fprintf(w, "dropped publication %s\n", cfg.Publication)
	}
	if err := rdb.Del(ctx, keys.Pointer, keys.Status, keys.Resync).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	fmt.Fprintf(w, "deleted %s\n", keys.Pointer)
	return nil
}
