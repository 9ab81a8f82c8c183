// Package oracle is the replay oracle of docs/design.md §10, shared by the source's package tests and
// the end-to-end tests (stream and snapshot alike): it reads a queue back with plain Redis commands, checks the
// queue's invariants, replays every partition (c/r set the row, u merges keeping `unchanged`
// columns, d deletes, t clears; an envelope's events in their order, its parts checked to come
// 1, 2, ... once each up to the one marked last) and compares the result with the source table,
// column by column, through the same text converter, so numbers are compared exactly.
package oracle

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// Entry is one queue entry.
type Entry struct {
	Shard     int
	Off       int64
	Partition string
	ID, Tx    string
	Payload   []byte
}

// Event is a decoded change event (DESIGN §2).
type Event struct {
	Op        string                     `json:"op"`
	Table     string                     `json:"table"`
	Key       map[string]json.RawMessage `json:"key"`
	After     map[string]json.RawMessage `json:"after"`
	Before    map[string]json.RawMessage `json:"before"`
	Unchanged []string                   `json:"unchanged"`
	LSN       string                     `json:"lsn"`
	Xid       *uint64                    `json:"xid"`
	TS        string                     `json:"ts"`
	Seq       uint64                     `json:"seq"`
}

// ReadQueue reads every entry of every shard of queue, in shard then offset order. The shards are
// read in one MULTI, so the result is one moment of the queue: a caller that waits for a marker
// entry and then checks what came before it never sees the marker without the entries written
// before it in other shards (the shard keys share the queue's hash slot, so this holds in a cluster
// too).
func ReadQueue(ctx context.Context, rdb redis.Cmdable, prefix, queue string) ([]Entry, error) {
	shardsText, err := rdb.HGet(ctx, redisconn.Key(prefix, queue, "meta"), "shards").Result()
	if err == redis.Nil {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	shards, _ := strconv.Atoi(shardsText)
	reads := make([]*redis.XMessageSliceCmd, shards)
	if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for n := range reads {
			reads[n] = p.XRange(ctx, redisconn.Key(prefix, queue, "s", strconv.Itoa(n)), "-", "+")
		}
		return nil
	}); err != nil {
		return nil, err
	}
	var out []Entry
	for n, read := range reads {
		for _, m := range read.Val() {
			out = append(out, entriesOf(n, m)...)
		}
	}
	return out, nil
}

// entriesOf reads the messages of a stream entry of shard n in any layout version of DESIGN §4
// (version 2: the fields in the JSON object m; version 3: m an array of them, each with len, and d
// their payloads one after another), with encoding/json, not the product's decoder.
func entriesOf(n int, m redis.XMessage) []Entry {
	type fields struct {
		Off int64  `json:"off"`
		Len int    `json:"len"`
		P   string `json:"p"`
		ID  string `json:"id"`
		Tx  string `json:"tx"`
	}
	d := fmt.Sprint(m.Values["d"])
	meta, ok := m.Values["m"].(string)
	if ok && strings.HasPrefix(strings.TrimSpace(meta), "[") {
		var fs []fields
		if err := json.Unmarshal([]byte(meta), &fs); err != nil || len(fs) == 0 {
			return []Entry{{Shard: n, Off: -1, Payload: []byte(d)}} // Check finds the offset out of sequence
		}
		out := make([]Entry, len(fs))
		at := 0
		for i, f := range fs {
			if f.Len < 0 || at+f.Len > len(d) {
				f.Off, f.Len = -1, 0
			}
			out[i] = Entry{Shard: n, Off: f.Off, Partition: f.P, ID: f.ID, Tx: f.Tx, Payload: []byte(d[at : at+f.Len])}
			at += f.Len
		}
		if at != len(d) {
			out[len(out)-1].Off = -1
		}
		return out
	}
	if ok {
		var f fields
		if err := json.Unmarshal([]byte(meta), &f); err != nil {
			f.Off = -1 // an m that is not JSON: Check finds the offset out of sequence
		}
		return []Entry{{Shard: n, Off: f.Off, Partition: f.P, ID: f.ID, Tx: f.Tx, Payload: []byte(d)}}
	}
	off, _ := strconv.ParseInt(fmt.Sprint(m.Values["off"]), 10, 64)
	return []Entry{{Shard: n, Off: off, Partition: fmt.Sprint(m.Values["p"]), ID: fmt.Sprint(m.Values["id"]),
		Tx: fmt.Sprint(m.Values["tx"]), Payload: []byte(d)}}
}

// Row is a row as column → JSON value text.
type Row map[string]string

// missing marks a column whose value the queue never gave (unchanged with no earlier value).
const missing = "<MISSING>"

// Envelope is a decoded envelope (DESIGN §2): one transaction's (or part's) events for a queue.
type Envelope struct {
	Op     string            `json:"op"`
	ID     string            `json:"id"`
	LSN    string            `json:"lsn"`
	Xid    *uint64           `json:"xid"`
	TS     string            `json:"ts"`
	Part   uint64            `json:"part"`
	Last   bool              `json:"last"`
	Events []json.RawMessage `json:"events"`
}

// Result is a replay: table → key text → row, plus every invariant broken on the way.
type Result struct {
	Tables    map[string]map[string]Row
	Problems  []string
	Events    int // change events, those in envelopes included
	Envelopes int
	ByID      map[string]int
	// Parts is, per transaction id of the envelopes, the parts read; a transaction whose last
	// part was read is in Complete.
	Parts    map[string]uint64
	Complete map[string]bool
}

// Replay checks the invariants of entries and replays them.
func Replay(entries []Entry) *Result {
	r := &Result{Tables: map[string]map[string]Row{}, ByID: map[string]int{}, Parts: map[string]uint64{}, Complete: map[string]bool{}}
	lastOff := map[int]int64{}
	lastLSN := map[string]pglogrepl.LSN{}
	keyPart := map[string]string{}
	for _, e := range entries {
		r.ByID[e.ID]++
		if r.ByID[e.ID] == 2 {
			r.problem("id %s appears more than once", e.ID)
		}
		if want := lastOff[e.Shard] + 1; e.Off != want && lastOff[e.Shard] != 0 {
			r.problem("shard %d: offset %d after %d", e.Shard, e.Off, lastOff[e.Shard])
		}
		lastOff[e.Shard] = e.Off
		var ev Event
		if err := json.Unmarshal(e.Payload, &ev); err != nil {
			r.problem("id %s: payload is not an event: %v", e.ID, err)
			continue
		}
		if ev.Op == "x" {
			r.envelope(e, lastLSN, keyPart)
			continue
		}
		r.event(e, ev, lastLSN, keyPart)
	}
	for tx, n := range r.Parts {
		if !r.Complete[tx] {
			r.problem("transaction %s: parts 1-%d, none marked last", tx, n)
		}
	}
	return r
}

// envelope checks an envelope's part number and replays its events.
func (r *Result) envelope(e Entry, lastLSN map[string]pglogrepl.LSN, keyPart map[string]string) {
	var env Envelope
	if err := json.Unmarshal(e.Payload, &env); err != nil {
		r.problem("id %s: payload is not an envelope: %v", e.ID, err)
		return
	}
	r.Envelopes++
	if want := r.Parts[env.ID] + 1; env.Part != want || r.Complete[env.ID] {
		r.problem("id %s: transaction %s part %d, want %d (complete %v)", e.ID, env.ID, env.Part, want, r.Complete[env.ID])
	}
	r.Parts[env.ID] = env.Part
	if env.Last {
		r.Complete[env.ID] = true
	}
	for i, raw := range env.Events {
		var ev Event
		if err := json.Unmarshal(raw, &ev); err != nil {
			r.problem("id %s: event %d is not an event: %v", e.ID, i, err)
			continue
		}
		if ev.LSN != env.LSN || (ev.Xid == nil) != (env.Xid == nil) || (ev.Xid != nil && *ev.Xid != *env.Xid) || ev.TS != env.TS {
			r.problem("id %s: event %d (lsn %s, ts %s) is not of the envelope's transaction (lsn %s, ts %s)", e.ID, i, ev.LSN, ev.TS, env.LSN, env.TS)
		}
		r.event(e, ev, lastLSN, keyPart)
	}
}

// event checks one change event of entry e and replays it.
func (r *Result) event(e Entry, ev Event, lastLSN map[string]pglogrepl.LSN, keyPart map[string]string) {
	r.Events++
	lsn, err := pglogrepl.ParseLSN(ev.LSN)
	if err != nil {
		r.problem("id %s: lsn %q", e.ID, ev.LSN)
	}
	if lsn < lastLSN[e.Partition] {
		r.problem("partition %q: lsn %s after %s (id %s)", e.Partition, ev.LSN, lastLSN[e.Partition], e.ID)
	}
	lastLSN[e.Partition] = lsn
	if ev.Op == "m" { // a pgrelay.publish() message: no row to replay
		return
	}
	if ev.Op == "t" {
		r.Tables[ev.Table] = map[string]Row{}
		return
	}
	if ev.Key == nil && (ev.Op == "c" || ev.Op == "r") { // a table without a key: its rows are a multiset
		r.addKeyless(ev)
		return
	}
	k := ev.Table + " " + KeyText(ev.Key)
	if p, seen := keyPart[k]; seen && p != e.Partition {
		r.problem("key %s in partitions %q and %q", k, p, e.Partition)
	}
	keyPart[k] = e.Partition
	r.apply(e, ev)
}

func (r *Result) problem(format string, args ...any) {
	if len(r.Problems) < 50 {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	}
}

func (r *Result) apply(e Entry, ev Event) {
	rows := r.Tables[ev.Table]
	if rows == nil {
		rows = map[string]Row{}
		r.Tables[ev.Table] = rows
	}
	key := KeyText(ev.Key)
	switch ev.Op {
	case "c", "r":
		row := Row{}
		for c, v := range ev.After {
			row[c] = string(v)
		}
		for _, c := range ev.Unchanged {
			row[c] = missing
		}
		rows[key] = row
	case "u":
		prev := rows[key]
		if ev.Before != nil && prev == nil { // a key change under partition_by single
			prev = rows[KeyText(pick(ev.Before, ev.Key))]
			delete(rows, KeyText(pick(ev.Before, ev.Key)))
		}
		row := Row{}
		for c, v := range ev.After {
			row[c] = string(v)
		}
		for _, c := range ev.Unchanged {
			if prev == nil { // a row not yet snapshotted: its r (or a fill) brings the value later
				row[c] = missing
			} else if prev[c] == "" {
				r.problem("id %s: %s unchanged with no earlier value", e.ID, c)
				row[c] = missing
			} else {
				row[c] = prev[c]
			}
		}
		rows[key] = row
	case "d":
		delete(rows, key)
	default:
		r.problem("id %s: op %q", e.ID, ev.Op)
	}
}

// addKeyless adds the row of an event of a table without a key (append-only): such rows are
// compared as a multiset, each under its whole text and its occurrence, so a duplicate shows.
func (r *Result) addKeyless(ev Event) {
	rows := r.Tables[ev.Table]
	if rows == nil {
		rows = map[string]Row{}
		r.Tables[ev.Table] = rows
	}
	row := Row{}
	for c, v := range ev.After {
		row[c] = string(v)
	}
	rows[multisetKey(rows, row)] = row
}

// multisetKey names a row of a table without a key: its columns and values, and #n for the n-th
// equal row.
func multisetKey(rows map[string]Row, row Row) string {
	base := canonical(row)
	for n := 1; ; n++ {
		if k := base + "#" + strconv.Itoa(n); rows[k] == nil {
			return k
		}
	}
}

// pick returns the entries of from named by the keys of like.
func pick(from, like map[string]json.RawMessage) map[string]json.RawMessage {
	out := map[string]json.RawMessage{}
	for k := range like {
		out[k] = from[k]
	}
	return out
}

// KeyText renders a key object canonically (columns sorted).
func KeyText(key map[string]json.RawMessage) string { return canonical(key) }

// canonical renders column=value pairs sorted by column.
func canonical[V ~string | ~[]byte](m map[string]V) string {
	cols := make([]string, 0, len(m))
	for c := range m {
		cols = append(cols, c)
	}
	sort.Strings(cols)
	var b strings.Builder
	for _, c := range cols {
		b.WriteString(c)
		b.WriteByte('=')
		b.WriteString(string(m[c]))
		b.WriteByte(';')
	}
	return b.String()
}

// TableRows reads a table through the converter: key text → row (without keyCols, a table without
// a key: the rows as a multiset, as Replay keeps them). conn must use the session settings of
// convert.SessionSettings.
func TableRows(ctx context.Context, conn *pgx.Conn, table string, keyCols []string) (map[string]Row, error) {
	schema, name, _ := strings.Cut(table, ".")
	res := conn.PgConn().ExecParams(ctx, "SELECT * FROM "+pgx.Identifier{schema, name}.Sanitize(), nil, nil, nil, nil).Read()
	if res.Err != nil {
		return nil, res.Err
	}
	reg := convert.NewRegistry()
	var oids []uint32
	for _, f := range res.FieldDescriptions {
		oids = append(oids, f.DataTypeOID)
	}
	if err := reg.Load(ctx, conn, oids); err != nil {
		return nil, err
	}
	out := map[string]Row{}
	for _, vals := range res.Rows {
		row := Row{}
		key := map[string]json.RawMessage{}
		for i, f := range res.FieldDescriptions {
			var v []byte
			if vals[i] == nil {
				v = convert.AppendNull(nil)
			} else {
				v = convert.Append(nil, reg.Lookup(f.DataTypeOID), vals[i])
			}
			row[f.Name] = string(v)
			for _, k := range keyCols {
				if k == f.Name {
					key[k] = v
				}
			}
		}
		if len(keyCols) == 0 {
			out[multisetKey(out, row)] = row
		} else {
			out[KeyText(key)] = row
		}
	}
	return out, nil
}

// Compare lists the differences between a replayed table and the real one.
func Compare(replayed, actual map[string]Row) []string {
	var diffs []string
	for k, want := range actual {
		got, ok := replayed[k]
		if !ok {
			diffs = append(diffs, "missing row "+k)
			continue
		}
		for c, v := range want {
			if got[c] != v {
				diffs = append(diffs, fmt.Sprintf("row %s column %s: queue %s, table %s", k, c, got[c], v))
			}
		}
		if len(got) != len(want) {
			diffs = append(diffs, fmt.Sprintf("row %s: %d columns in the queue, %d in the table", k, len(got), len(want)))
		}
	}
	for k := range replayed {
		if _, ok := actual[k]; !ok {
			diffs = append(diffs, "extra row "+k)
		}
	}
	sort.Strings(diffs)
	return diffs
}

// Equal reports whether two payloads are the same JSON text.
func Equal(a, b []byte) bool { return bytes.Equal(a, b) }
