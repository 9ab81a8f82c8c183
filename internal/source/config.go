package source

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/pgrelay/pgrelay/internal/partition"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// PartitionMode is how a table's changes are spread over partitions.
type PartitionMode int

// Partition modes (`partition_by`).
const (
	PartitionByKey     PartitionMode = iota // the key columns (default)
	PartitionBySingle                       // one partition, `all`
	PartitionByColumns                      // the listed columns
)

// Table is one configured table.
type Table struct {
	Schema, Name string
	Queue        string
	Mode         PartitionMode
	Columns      []string // for PartitionByColumns
	// AppendOnly streams only the table's inserts (and truncates): it is published by the
	// insert-only publication, so it needs no key, and its updates and deletes are not streamed.
	AppendOnly bool
	// ColumnList is the columns streamed and snapshotted (`columns`: a publication column list,
	// PostgreSQL 15 or newer); nil streams them all. LoadTables puts it in table order.
	ColumnList []string
	// Exclude names tables a pattern entry does not stream ("schema.name" or "name", patterns too).
	Exclude []string
	// From is the pattern entry that matched the table (ExpandTables); "" for an entry by name.
	From string
}

// Full is "schema.name" as it appears in events.
func (t Table) Full() string { return t.Schema + "." + t.Name }

// tableList is the tables' names as tables[].table writes them.
func tableList(tables []Table) []string {
	out := make([]string, len(tables))
	for i, t := range tables {
		out[i] = t.Full()
	}
	return out
}

// Pattern reports whether the entry names tables by a pattern: a `*` in the name stands for any
// characters (`sales.*`, `public.order_*`).
func (t Table) Pattern() bool {
	return strings.Contains(t.Schema, "*") || strings.Contains(t.Name, "*")
}

// Names reports whether full ("schema.name") is a table the entry names: by name, or matched by
// its pattern.
func (t Table) Names(full string) bool {
	schema, name := ParseTable(full)
	return t.matchesSchema(schema) && glob(t.Name, name)
}

// matchesSchema reports whether schema is one the entry names: as written, or matched by a pattern
// in the schema, which never matches a system schema (systemSchema).
func (t Table) matchesSchema(schema string) bool {
	if !strings.Contains(t.Schema, "*") {
		return schema == t.Schema
	}
	return glob(t.Schema, schema) && !systemSchema(schema)
}

// glob reports whether s matches pattern, where each * stands for any characters (none too).
func glob(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return s == pattern
	}
	if !strings.HasPrefix(s, parts[0]) || len(s) < len(parts[0])+len(parts[len(parts)-1]) || !strings.HasSuffix(s, parts[len(parts)-1]) {
		return false
	}
	rest := s[len(parts[0]) : len(s)-len(parts[len(parts)-1])]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// systemSchema reports a schema a pattern in the schema never matches: PostgreSQL's own
// (pg_catalog, information_schema, pg_toast, the temporary ones: pg_*) and pgrelay's (its publish
// function, and a sink's progress table when it writes into the source's database). Named
// outright, such a schema is taken as written.
func systemSchema(schema string) bool {
	return strings.HasPrefix(schema, "pg_") || schema == "information_schema" || schema == "pgrelay"
}

// excludes reports whether the entry's exclude list names full.
func (t Table) excludes(full string) bool {
	for _, x := range t.Exclude {
		schema, name := ParseTable(x)
		if (Table{Schema: schema, Name: name}).Names(full) {
			return true
		}
	}
	return false
}

// ref is how errors name the table: its entry's index, and the pattern that matched it.
func (t Table) ref(i int) string {
	if t.From != "" {
		return fmt.Sprintf("%s (matched by %s)", t.Full(), t.From)
	}
	return fmt.Sprintf("tables[%d] (%s)", i, t.Full())
}

// EnvelopeQueue is a queue whose stream changes go one transaction per message: an envelope holding
// the transaction's change events for that queue (DESIGN §2), in one partition.
type EnvelopeQueue struct {
	Queue     string
	Partition string // the partition of every envelope of the queue
	// MaxEvents and MaxBytes bound one envelope: a transaction with more events (or bytes) for
	// the queue goes in parts.
	MaxEvents int
	MaxBytes  int
}

// Config is a parsed pg_cdc configuration.
type Config struct {
	Name               string
	PG                 PGConfig
	Tables             []Table
	Publication        string
	InsertPublication  string // the append-only tables' publication: Publication + InsertPublicationSuffix
	ManagePublication  bool
	StopOnRefusedTable bool // on_refused_table: stop; false (skip) streams the other tables
	PublishFunction    bool // install pgrelay.publish() at start when missing
	Slot               string
	SlotFailover       bool
	Redis              redisconn.Config
	LeaseTTL           time.Duration
	MaxBundleMessages  int
	MaxBundleBytes     int
	Linger             time.Duration
	LoadLinger         time.Duration // under sustained load, how long after an ack the next batch waits to fill
	Heartbeat          time.Duration
	TruncateEmit       bool
	SnapshotInitial    bool
	ChunkRows          int // rows per snapshot chunk
	Envelopes          []EnvelopeQueue
}

// Envelope returns the envelope configuration of queue, nil when its changes go one per message.
func (c *Config) Envelope(queue string) *EnvelopeQueue {
	for i := range c.Envelopes {
		if c.Envelopes[i].Queue == queue {
			return &c.Envelopes[i]
		}
	}
	return nil
}

// PGConfig is how to reach PostgreSQL (shared with pg_sink).
type PGConfig = pgconnect.Config

// Limits of the numeric fields; a value outside is refused with its path, never clamped.
const (
	MinLeaseTTL, MaxLeaseTTL             = 3 * time.Second, 120 * time.Second
	MinBundleMessages, MaxBundleMessages = 1, 50000
	MinBundleBytes, MaxBundleBytes       = 64 << 10, 64 << 20
	MaxLinger                            = 5 * time.Second
	DefaultLoadLinger                    = 2 * time.Millisecond // load_linger's default
	MinHeartbeat, MaxHeartbeat           = 1 * time.Second, time.Hour
	MaxTables                            = 256
	MinChunkRows, MaxChunkRows           = 1, 100000
	DefaultChunkRows                     = 8000 // see docs/operations.md, "Snapshot time"
	MaxQueueBytes                        = 128  // a table's queue name
	MinEnvelopeEvents, MaxEnvelopeEvs    = 1, 1000000
	DefaultEnvelopeEvents                = 10000
	MinEnvelopeBytes                     = MinBundleBytes // an envelope's bytes are also at most max_bundle_bytes
	DefaultEnvelopeBytes                 = 4 << 20
	MaxPublicationBytes                  = 63 // PostgreSQL's identifier limit
	// InsertPublicationSuffix names the publication of the append-only tables after the main one.
	InsertPublicationSuffix = "_insert"
)

// The names a config gives, as regular expressions (the spec's lint rules use the same).
const (
	NamePattern  = `^[a-z0-9][a-z0-9_-]{0,47}$` // name
	SlotPattern  = `^[a-z_][a-z0-9_]{0,62}$`    // slot.name, after its default
	TablePattern = `^[^.]+([.].+)?$`            // tables[].table: what ParseTable splits into a schema and a name
)

var (
	namePattern  = regexp.MustCompile(NamePattern)
	identPattern = regexp.MustCompile(SlotPattern)
)

// ClusterSlot is Redis Cluster's hash slot of key: CRC16 of its hash tag (the text between the
// first "{" and the next "}", when not empty), else of the whole key, mod 16384.
func ClusterSlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return clusterSlot(key)
}

// fieldErr is a config error naming the field's path.
func fieldErr(path, format string, args ...any) error {
	return fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...))
}

// DefaultObjectName is the slot and publication name for a connector: pgrelay_<name, - → _>.
func DefaultObjectName(name string) string {
	return "pgrelay_" + strings.ReplaceAll(name, "-", "_")
}

// ParseTable splits `schema.name` or `name` (schema public).
func ParseTable(s string) (schema, name string) {
	if i := strings.IndexByte(s, '.'); i >= 0 {
		return s[:i], s[i+1:]
	}
	return "public", s
}

// Validate checks every field; the error starts with the field's path.
func (c *Config) Validate() error {
	if !namePattern.MatchString(c.Name) {
		return fieldErr("name", "%q must match %s", c.Name, namePattern)
	}
	if c.Slot == "" {
		c.Slot = DefaultObjectName(c.Name)
	}
	if c.Publication == "" {
		c.Publication = DefaultObjectName(c.Name)
	}
	if !identPattern.MatchString(c.Slot) {
		return fieldErr("slot.name", "%q must match %s", c.Slot, identPattern)
	}
	if len(c.Publication) == 0 || len(c.Publication) > MaxPublicationBytes {
		return fieldErr("publication.name", "%q must be 1-%d bytes", c.Publication, MaxPublicationBytes)
	}
	c.InsertPublication = c.Publication + InsertPublicationSuffix
	if c.anyAppendOnly() && len(c.InsertPublication) > MaxPublicationBytes {
		return fieldErr("publication.name", "%q is too long: the append-only tables' publication %q must be at most %d bytes, so use at most %d",
			c.Publication, c.InsertPublication, MaxPublicationBytes, MaxPublicationBytes-len(InsertPublicationSuffix))
	}
	if err := c.validateTables(); err != nil {
		return err
	}
	if err := c.validateLimits(); err != nil {
		return err
	}
	if err := c.validateEnvelopes(); err != nil {
		return err
	}
	if err := c.checkClusterSlots(); err != nil {
		return err
	}
	if err := c.PG.Validate(); err != nil {
		return err
	}
	return nil
}

// anyAppendOnly reports whether some table is append-only (and so needs the insert publication).
func (c *Config) anyAppendOnly() bool {
	for _, t := range c.Tables {
		if t.AppendOnly {
			return true
		}
	}
	return false
}

func (c *Config) validateTables() error {
	if len(c.Tables) == 0 || len(c.Tables) > MaxTables {
		return fieldErr("tables", "list 1-%d tables (got %d)", MaxTables, len(c.Tables))
	}
	seen := map[string]bool{}
	allSingle := true
	for i, t := range c.Tables {
		path := fmt.Sprintf("tables[%d]", i)
		if t.Schema == "" || t.Name == "" {
			return fieldErr(path+".table", "use schema.name or name")
		}
		if len(t.Exclude) > 0 && !t.Pattern() {
			return fieldErr(path+".exclude", "is for an entry whose table is a pattern (%s names one table)", t.Full())
		}
		for _, x := range t.Exclude {
			if schema, name := ParseTable(x); schema == "" || name == "" || strings.ContainsAny(x, `"`) {
				return fieldErr(path+".exclude", "%q: name tables as table takes them (schema.name or name, a * for any characters, no SQL quotes)", x)
			}
		}
		if t.Pattern() && (len(t.ColumnList) > 0 || t.Mode == PartitionByColumns) {
			return fieldErr(path+".table", "%s is a pattern: its tables share the entry's options, so columns and partition_by columns are for tables listed by name", t.Full())
		}
		if strings.Contains(t.Full(), `"`) {
			return fieldErr(path+".table", "%s is taken as written, without SQL quotes (names are case-sensitive): use %s", t.Full(), strings.ReplaceAll(t.Full(), `"`, ""))
		}
		if seen[t.Full()] {
			return fieldErr(path+".table", "%s is listed twice", t.Full())
		}
		seen[t.Full()] = true
		if t.Queue == "" || len(t.Queue) > MaxQueueBytes || strings.ContainsAny(t.Queue, "{}") {
			return fieldErr(path+".queue", "%q must be 1-%d bytes without { or }", t.Queue, MaxQueueBytes)
		}
		if t.Mode == PartitionByColumns && len(t.Columns) == 0 {
			return fieldErr(path+".partition_by", "list at least one column, or use key or single")
		}
		if t.Mode != PartitionBySingle {
			allSingle = false
		}
		for j, c := range t.ColumnList {
			if c == "" || slices.Contains(t.ColumnList[:j], c) {
				return fieldErr(path+".columns", "list each column once, by name (%q)", c)
			}
		}
	}
	if c.TruncateEmit && !allSingle {
		return fieldErr("truncate", "emit needs partition_by: single on every table (a truncate has no key)")
	}
	return nil
}

func (c *Config) validateLimits() error {
	switch {
	case c.LeaseTTL < MinLeaseTTL || c.LeaseTTL > MaxLeaseTTL:
		return fieldErr("lease_ttl", "%s is not in %s-%s", c.LeaseTTL, MinLeaseTTL, MaxLeaseTTL)
	case c.MaxBundleMessages < MinBundleMessages || c.MaxBundleMessages > MaxBundleMessages:
		return fieldErr("max_bundle_messages", "%d is not in %d-%d", c.MaxBundleMessages, MinBundleMessages, MaxBundleMessages)
	case c.MaxBundleBytes < MinBundleBytes || c.MaxBundleBytes > MaxBundleBytes:
		return fieldErr("max_bundle_bytes", "%d is not in %d-%d", c.MaxBundleBytes, MinBundleBytes, MaxBundleBytes)
	case c.Linger < 0 || c.Linger > MaxLinger:
		return fieldErr("linger", "%s is not in 0s-%s", c.Linger, MaxLinger)
	case c.LoadLinger < 0 || c.LoadLinger > MaxLinger:
		return fieldErr("load_linger", "%s is not in 0s-%s", c.LoadLinger, MaxLinger)
	case c.Heartbeat < MinHeartbeat || c.Heartbeat > MaxHeartbeat:
		return fieldErr("heartbeat", "%s is not in %s-%s", c.Heartbeat, MinHeartbeat, MaxHeartbeat)
	case c.ChunkRows < MinChunkRows || c.ChunkRows > MaxChunkRows:
		return fieldErr("chunk_rows", "%d is not in %d-%d", c.ChunkRows, MinChunkRows, MaxChunkRows)
	}
	return nil
}

func (c *Config) validateEnvelopes() error {
	seen := map[string]bool{}
	for i, e := range c.Envelopes {
		path := fmt.Sprintf("envelopes[%d]", i)
		if e.Queue == "" || len(e.Queue) > MaxQueueBytes || strings.ContainsAny(e.Queue, "{}") {
			return fieldErr(path+".queue", "%q must be 1-%d bytes without { or }", e.Queue, MaxQueueBytes)
		}
		if seen[e.Queue] {
			return fieldErr(path+".queue", "%s is listed twice", e.Queue)
		}
		seen[e.Queue] = true
		switch {
		case e.Partition == "" || len(e.Partition) > partition.MaxLen:
			return fieldErr(path+".partition", "%q must be 1-%d bytes", e.Partition, partition.MaxLen)
		case e.MaxEvents < MinEnvelopeEvents || e.MaxEvents > MaxEnvelopeEvs:
			return fieldErr(path+".max_events", "%d is not in %d-%d", e.MaxEvents, MinEnvelopeEvents, MaxEnvelopeEvs)
		case e.MaxBytes < MinEnvelopeBytes || e.MaxBytes > c.MaxBundleBytes:
			return fieldErr(path+".max_bytes", "%d is not in %d-%d (max_bundle_bytes: an envelope goes whole in one batch; raise both to allow larger parts)",
				e.MaxBytes, MinEnvelopeBytes, c.MaxBundleBytes)
		}
	}
	return nil
}
