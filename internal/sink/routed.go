package sink

import (
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
	o, env, err := readChange(m, tableRequired, &ev, func(ev *event) (op, error) { return r.decodeEvent(m, ev, buf) })
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
	if to == nil {
		if _, ok := r.routes.Target(string(ev.Table)); ok {
			return op{}, &unresolvedError{table: string(ev.Table)}
		}
		if r.skip != nil {
			r.skip(string(ev.Table))
			return op{msg: m, kind: opNone}, nil // applied as nothing: its offset moves on
		}
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

// unresolvedError is decode's answer for an event of a table that an entry maps but whose target
// the mode does not know yet: the caller resolves it (resolve) and decodes the message again. It is
// no error of the message's.
type unresolvedError struct{ table string }

func (e *unresolvedError) Error() string { return "the target of " + e.table + " is not resolved yet" }

// resolve returns h with the target of event table (which an entry maps) inspected now: a missing
// target is an environment error, and the batch waits for it. The targets are found as their
// events are decoded, so a batch is read once.
func (a *Applier) resolve(ctx context.Context, h *routedMode, table string) (*routedMode, error) {
	target, _ := h.routes.Target(table)
	next := &routedMode{routes: h.routes, targets: maps.Clone(h.targets), skip: h.skip}
	to, err := a.routeTo(ctx, next, target)
	if err != nil {
		return nil, err
	}
	next.targets[table] = to
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
