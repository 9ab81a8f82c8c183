package sink

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"
)

// routedMode is mode cdc over several targets (Config.Tables): each change event goes to the table
// its `table` maps to, and a batch's events of every table commit in its one transaction with the
// progress rows. It is never changed once made: resolving new event tables makes a new one.
type routedMode struct {
	routes  Routes
	targets map[string]*routed // event table → its target (events of tables not here are unmapped)
	skip    func(table string) // on_unmapped_table: skip (nil: fail): told of each skipped event's table
}

// routed is one target of a routedMode, shared by the event tables that map to it, so their ops
// are planned together, in message order.
type routed struct {
	t    *Target
	mode cdcMode
}

// decode reads m's event and decodes it for its table's target. The batch's row memory (buf) is
// shared by the targets: its remembered member order is checked by name, and a row's column-set
// signature depends only on the column indexes.
func (r *routedMode) decode(m *Message, buf *rowBuf) (op, error) {
	var ev event
	o, env, err := readChange(m, true, &ev, func(ev *event) (op, error) { return r.decodeEvent(m, ev, buf) })
	if env || err != nil {
		return o, err
	}
	return r.decodeEvent(m, &ev, buf)
}

// decodeEvent decodes a read change event of m for its table's target.
func (r *routedMode) decodeEvent(m *Message, ev *event, buf *rowBuf) (op, error) {
	if ev.Op == "m" { // a published message: no table, nothing to write
		return op{msg: m, kind: opNone}, nil
	}
	to := r.targets[string(ev.Table)]
	if to == nil && r.skip != nil {
		r.skip(string(ev.Table))
		return op{msg: m, kind: opNone}, nil // applied as nothing: its offset moves on
	}
	if to == nil {
		return op{}, unmappedError(string(ev.Table))
	}
	o, err := to.mode.decodeEvent(m, ev, buf)
	o.to = to
	return o, err
}

// plan plans the ops in runs: a run of truncates (adjacent t events, as one TRUNCATE of several
// tables at the source gives) is one TRUNCATE of their targets, so copies that reference each other
// by foreign keys can be emptied as the source was; between them, each target's ops (in message
// order) are planned by its cdc mode, the targets in the order their first op comes.
func (r *routedMode) plan(ops []op) ([]stmt, error) { return r.planBy(ops, r.planRun) }

// planInOrder plans ops in their order, as the source applied them: between truncate runs, each
// run of adjacent ops of one target in turn. It is the plan of one message run alone (the
// applier's isolation), so an envelope whose source transaction changed tables that reference each
// other applies as that transaction did, whatever order plan's grouping by target would give.
func (r *routedMode) planInOrder(ops []op) ([]stmt, error) {
	return r.planBy(ops, func(stmts []stmt, ops []op) ([]stmt, error) {
		for start := 0; start < len(ops); {
			end := start + 1
			for end < len(ops) && ops[end].to == ops[start].to {
				end++
			}
			var err error
			if stmts, err = r.planRun(stmts, ops[start:end]); err != nil {
				return nil, err
			}
			start = end
		}
		return stmts, nil
	})
}

// planBy splits ops (envelopes opened) into truncate runs and the runs between, which run plans.
func (r *routedMode) planBy(ops []op, run func(stmts []stmt, ops []op) ([]stmt, error)) ([]stmt, error) {
	ops = flat(ops)
	var stmts []stmt
	for start := 0; start < len(ops); {
		end, truncate := start, ops[start].kind == opTruncate
		for end < len(ops) && (ops[end].kind == opTruncate) == truncate {
			end++
		}
		var err error
		if truncate {
			stmts = append(stmts, truncateStmt(ops[start:end]))
		} else if stmts, err = run(stmts, ops[start:end]); err != nil {
			return nil, err
		}
		start = end
	}
	return stmts, nil
}

// truncateStmt truncates the targets of ops (truncates), each once.
func truncateStmt(ops []op) stmt {
	var names []string
	for _, o := range ops {
		if name := o.to.t.Ident(); !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return stmt{sql: "TRUNCATE " + strings.Join(names, ", ")}
}

// planRun appends the statements of ops (no truncate among them), target by target. Ops of
// different tables may so run in another order than the messages'; the transaction commits them
// together, and a constraint between the tables that this order violates fails the batch, which
// then runs message by message (the applier's isolation).
func (r *routedMode) planRun(stmts []stmt, ops []op) ([]stmt, error) {
	var order []*routed
	by := map[*routed][]op{}
	for _, o := range ops {
		if o.to == nil {
			continue // opNone
		}
		if _, ok := by[o.to]; !ok {
			order = append(order, o.to)
		}
		by[o.to] = append(by[o.to], o)
	}
	for _, to := range order {
		s, err := to.mode.plan(by[to])
		if err != nil {
			return nil, err
		}
		stmts = append(stmts, s...)
	}
	return stmts, nil
}

// targetList lists the distinct targets.
func (r *routedMode) targetList() []*Target {
	var out []*Target
	seen := map[*routed]bool{}
	for _, to := range r.targets {
		if !seen[to] {
			seen[to] = true
			out = append(out, to.t)
		}
	}
	return out
}

// resolve returns h with the targets of every event table of msgs that h does not know yet and an
// entry maps (inspected now: a missing target is an environment error, and the batch waits for
// it), or h itself when there are none. Tables no entry maps stay out: decode fails their events.
func (a *Applier) resolve(ctx context.Context, h *routedMode, msgs []*Message) (*routedMode, error) {
	var next *routedMode
	known := h.targets // next's, once there is a next
	var tables []string
	for _, m := range msgs {
		tables = eventTables(tables[:0], m.Payload)
		for _, table := range tables {
			if _, ok := known[table]; ok || table == "" {
				continue
			}
			target, ok := h.routes.Target(table)
			if !ok {
				continue
			}
			if next == nil {
				next = &routedMode{routes: h.routes, targets: maps.Clone(h.targets), skip: h.skip}
				known = next.targets
			}
			to, err := a.routeTo(ctx, next, target)
			if err != nil {
				return nil, err
			}
			next.targets[table] = to
		}
	}
	if next == nil {
		return h, nil
	}
	a.mu.Lock()
	if a.handler == modeHandler(h) {
		a.handler = next
	}
	a.mu.Unlock()
	return next, nil
}

// routeTo is target's routed in r (one per table, whatever event tables map to it), inspected anew
// when r has none.
func (a *Applier) routeTo(ctx context.Context, r *routedMode, target string) (*routed, error) {
	t, err := Inspect(ctx, a.pool, target, a.needs())
	if err != nil {
		return nil, err
	}
	for _, to := range r.targets {
		if to.t.OID == t.OID {
			return to, nil
		}
	}
	return &routed{t: t, mode: cdcMode{w: newWriter(t, a.cfg.Metadata).watching(a.keysFor(t.Ident()))}}, nil
}

// eventTables appends to dst the tables of a message's change events: its event's `table`, or an
// envelope's events' tables, each once (empty names left out).
func eventTables(dst []string, payload []byte) []string {
	if !isEnvelope(payload) {
		if table := eventTable(payload); table != "" {
			return append(dst, table)
		}
		const head = eventHead
		if len(payload) > len(head)+1 && bytes.HasPrefix(payload, []byte(head)) && payload[len(head)] != 'x' && payload[len(head)+1] == '"' {
			return dst // an event of another op (a published m) as pg_cdc writes it: not read again
		}
		if ev, err := readEvent(payload, false); err != nil || ev.Op != "x" {
			return dst
		}
	}
	n := len(dst)
	err := readEnvelope(payload, true, func(i int, ev *event) error {
		if i == 0 {
			dst = dst[:n] // events named again
		}
		if len(ev.Table) > 0 && !slices.ContainsFunc(dst[n:], func(s string) bool { return s == string(ev.Table) }) {
			dst = append(dst, string(ev.Table))
		}
		return nil
	})
	switch {
	case err == errNotEnvelope:
		if table := eventTable(payload); table != "" {
			return append(dst[:n], table)
		}
		return dst[:n]
	case err != nil:
		return dst[:n] // the message fails: its tables need no target
	}
	return dst
}

// eventTable is a change event's `table` ("" when it has none or is not an object): read from the
// front of the payload when it begins as pg_cdc writes events (`{"op":"c","table":"…"`), else
// parsed.
func eventTable(payload []byte) string {
	const head, mid = eventHead, `","table":"`
	if len(payload) > len(head)+1+len(mid) && bytes.HasPrefix(payload, []byte(head)) && bytes.HasPrefix(payload[len(head)+1:], []byte(mid)) {
		rest := payload[len(head)+1+len(mid):]
		if end := bytes.IndexByte(rest, '"'); end >= 0 && bytes.IndexByte(rest[:end], '\\') < 0 {
			return string(rest[:end])
		}
	}
	row, err := decodeObject(payload)
	if err != nil || isNull(row["table"]) || row["table"][0] != '"' {
		return ""
	}
	table, err := textOf(row["table"])
	if err != nil {
		return ""
	}
	return table.String
}
