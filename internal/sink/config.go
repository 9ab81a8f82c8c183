// Package sink is the machinery of the pg_sink output: it writes queue messages into a PostgreSQL
// table exactly once, by committing each batch's rows together with the per-shard progress rows
// (DESIGN §7). The Benthos plugin (output/pg_sink.go) is a thin shell over Applier.
//
// Files by job: target.go reads the target table from pg_catalog; progress.go creates, checks, locks
// and advances the progress table; payload.go decodes payloads and params paths exactly; writer.go
// builds and runs the set-based statements per column set; modes.go turns messages into operations
// (append, upsert, cdc, sql) and folds repeated keys; envelope.go reads cdc's envelopes (one source
// transaction per message); routes.go and routed.go map cdc events to several targets (tables);
// classify.go sorts errors by SQLSTATE class;
// applier.go runs one batch: the transaction, skipping, isolation of bad messages, retries.
package sink

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// Mode is how messages become changes of the target table.
type Mode string

// The modes of DESIGN §7.
const (
	ModeAppend Mode = "append"
	ModeUpsert Mode = "upsert"
	ModeCDC    Mode = "cdc"
	ModeSQL    Mode = "sql"
)

// MetadataColumns names target columns filled from each message's metadata; empty names are unused.
type MetadataColumns struct {
	Partition, Shard, Offset, MessageID, TransactionID, CreatedAt, Payload string
}

// names lists the configured column names.
func (m MetadataColumns) names() []string {
	var out []string
	for _, n := range []string{m.Partition, m.Shard, m.Offset, m.MessageID, m.TransactionID, m.CreatedAt, m.Payload} {
		if n != "" {
			out = append(out, n)
		}
	}
	return out
}

// Config is a parsed pg_sink configuration (without the connection).
type Config struct {
	Name  string // the sink's identity in the progress table
	Table string // target table, schema.name (SQL quoting rules)
	// Tables, in mode cdc instead of Table, maps the events' tables to targets (see Routes).
	Tables              map[string]string
	SkipUnmapped        bool    // with Tables: an event of a table no entry maps is skipped, not failed
	routes              *Routes // Tables, read by Validate
	Mode                Mode
	Key                 []string // conflict key; empty = primary key, else replica-identity index
	Statement           string   // sql mode
	Params              []string // sql mode: paths and @metadata
	Metadata            MetadataColumns
	ProgressTable       string // default DefaultProgressTable
	CreateProgressTable bool
	RequireProgress     bool          // messages without queue/shard/offset metadata are refused
	RetryMax            time.Duration // the longest wait between retries (default 10s)
	UnknownKeys         UnknownKeys   // a payload key that names no column (default warn)
	// OnUnknownKey is told, once per key, of a payload key that names no column of the table, with
	// UnknownKeys warn: a coded warning naming the key and the fix, for the log. It may be called
	// from concurrent batches.
	OnUnknownKey func(warning error)
	// OnUnmapped is told, once per table, that events of a table no entry of Tables maps are
	// skipped (SkipUnmapped), for the log. It may be called from concurrent batches.
	OnUnmapped func(table string)
	// OnOtherTable is told, once per table, that with Table in mode cdc events of table reach the
	// one target besides those of first (the first event table met): every event is applied to
	// it whatever its table, for the log. It may be called from concurrent batches.
	OnOtherTable func(first, table string)
}

// Into names where the sink writes, for people: its table, or its tables entries
// ("tables public.* → copy.*, public.t → x.t"); "" in mode sql.
func (c *Config) Into() string {
	if len(c.Tables) == 0 {
		return c.Table
	}
	var out []string
	for _, from := range slices.Sorted(maps.Keys(c.Tables)) {
		out = append(out, from+" → "+c.Tables[from])
	}
	return "tables " + strings.Join(out, ", ")
}

// Validate checks the combinations the linter also catches, for users of the Go API.
func (c *Config) Validate() error {
	if c.Name == "" {
		return errcode.New(errcode.SinkConfig, "name is empty", "set `name`, the sink's identity in the progress table")
	}
	switch c.Mode {
	case ModeAppend, ModeUpsert, ModeCDC:
		switch {
		case len(c.Tables) > 0 && c.Mode != ModeCDC:
			return errcode.New(errcode.SinkConfig, fmt.Sprintf("tables is for mode cdc, not %s", c.Mode), "set `table`, or use mode: cdc")
		case len(c.Tables) > 0 && c.Table != "":
			return errcode.New(errcode.SinkConfig, "table and tables are both set", "keep `tables` (several tables) or `table` (one)")
		case len(c.Tables) == 0 && c.SkipUnmapped:
			return errcode.New(errcode.SinkConfig, "on_unmapped_table is for mode cdc with tables", "remove `on_unmapped_table`, or set `tables`")
		case len(c.Tables) > 0 && len(c.Key) > 0:
			return errcode.New(errcode.SinkConfig, "key is not used with tables (each target's primary key or replica-identity index is its key)", "remove `key`")
		case len(c.Tables) > 0:
			r, err := ParseRoutes(c.Tables)
			if err != nil {
				return err
			}
			c.routes = &r
		case c.Table == "":
			return errcode.New(errcode.SinkConfig, fmt.Sprintf("mode %s needs a table", c.Mode), "set `table`")
		}
		if c.Statement != "" || len(c.Params) > 0 {
			return errcode.New(errcode.SinkConfig, fmt.Sprintf("statement and params are for mode sql, not %s", c.Mode), "remove them or use mode: sql")
		}
	case ModeSQL:
		if len(c.Tables) > 0 {
			return errcode.New(errcode.SinkConfig, "tables is for mode cdc, not sql", "name the tables in the statement")
		}
		if c.SkipUnmapped {
			return errcode.New(errcode.SinkConfig, "on_unmapped_table is for mode cdc with tables", "remove `on_unmapped_table`")
		}
		if len(splitStatement(c.Statement)) == 0 {
			return errcode.New(errcode.SinkConfig, "mode sql needs a statement", "set `statement`")
		}
		if len(c.Key) > 0 || c.Metadata != (MetadataColumns{}) {
			return errcode.New(errcode.SinkConfig, "key and metadata columns are not used in mode sql", "pass metadata as @params instead")
		}
		if err := checkParamCount(c.Statement, c.Params); err != nil {
			return err
		}
	default:
		return errcode.New(errcode.SinkConfig, fmt.Sprintf("unknown mode %q", c.Mode), "use append, upsert, cdc or sql")
	}
	if c.Mode == ModeAppend && len(c.Key) > 0 {
		return errcode.New(errcode.SinkConfig, "key is not used in mode append", "remove `key` or use mode upsert")
	}
	switch c.UnknownKeys {
	case "":
		c.UnknownKeys = UnknownKeysWarn
	case UnknownKeysIgnore, UnknownKeysWarn:
	case UnknownKeysPause:
		if c.Mode == ModeSQL {
			return errcode.New(errcode.SinkConfig, "unknown_keys: pause is not used in mode sql (its params name what they read)", "remove `unknown_keys`")
		}
	default:
		return errcode.New(errcode.SinkConfig, fmt.Sprintf("unknown unknown_keys %q", c.UnknownKeys), "use ignore, warn or pause")
	}
	if c.ProgressTable == "" {
		c.ProgressTable = DefaultProgressTable
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 10 * time.Second
	}
	return nil
}

// checkParamCount requires exactly len(params) distinct placeholders $1..$n in the statement.
func checkParamCount(stmt string, params []string) error {
	max, seen := placeholders(stmt)
	if seen[0] {
		return errcode.New(errcode.SQLParamsMismatch, "statement uses $0", "number the placeholders from $1")
	}
	for i := 1; i <= max; i++ {
		if !seen[i] {
			return errcode.New(errcode.SQLParamsMismatch, fmt.Sprintf("statement uses $%d but not $%d", max, i),
				"number the placeholders $1..$n without gaps")
		}
	}
	if max != len(params) {
		return errcode.New(errcode.SQLParamsMismatch, fmt.Sprintf("statement has %d placeholders ($1..$%d) but params lists %d paths", max, max, len(params)),
			"give exactly one params entry per $n, in order")
	}
	for _, p := range params {
		if _, err := newParam(p); err != nil {
			return err
		}
	}
	return nil
}
