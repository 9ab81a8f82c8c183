package sink

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/jsonscan"
)

// Envelopes (op x): one source transaction's change events for a queue in one message (pg_cdc's
// envelopes, docs/source.md). Mode cdc applies an envelope's events in order in the batch's
// transaction, so the transaction lands whole or not at all.

// eventHead is how pg_cdc begins every change event and envelope: its op first.
const eventHead = `{"op":"`

// isEnvelope reports whether payload begins as pg_cdc writes an envelope (op x first), which
// readChange then reads in one pass.
func isEnvelope(payload []byte) bool { return bytes.HasPrefix(payload, []byte(eventHead+`x",`)) }

// readChange reads m: a change event into ev, for the caller to decode (env false), or an
// envelope, whose events it decodes through decode (their table read as table says) into o
// (env true). An envelope that does not begin with its op is read twice: once as an event, to find
// its op, then as an envelope. (The event is left to the caller rather than handed to decode:
// through a function value it would move to the heap, an allocation per event.)
func readChange(m *Message, table tableRead, ev *event, decode func(ev *event) (op, error)) (o op, env bool, err error) {
	if isEnvelope(m.Payload) {
		if o, err = decodeEnvelope(m, table, decode); err != errNotEnvelope {
			return o, true, err
		}
	}
	if *ev, err = readEvent(m.Payload, table); err != nil || ev.Op != "x" {
		return op{}, false, err
	}
	o, err = decodeEnvelope(m, table, decode)
	return o, true, err
}

// decodeEnvelope decodes an envelope (op x: one source transaction's change events for a queue, or
// one part of them, docs/source.md) as one op whose sub ops are its events', decoded by decode in
// order. The envelope is one message, applied in the batch's one transaction, so the source
// transaction lands whole or not at all: an event that cannot be applied fails the message, naming
// the event, and none of its events is written.
func decodeEnvelope(m *Message, table tableRead, decode func(ev *event) (op, error)) (op, error) {
	o := op{msg: m, kind: opEnvelope, sub: make([]op, 0, envelopeEvents(m.Payload))}
	err := readEnvelope(m.Payload, table, func(i int, ev *event) error {
		if i == 0 {
			o.sub = o.sub[:0] // events named again
		}
		sub, err := decode(ev)
		o.sub = append(o.sub, sub)
		return err
	})
	if err != nil {
		return op{}, err
	}
	return o, nil
}

// envelopeEvents estimates the events of an envelope as pg_cdc writes them (each begins with its
// op), to size what holds them: more only when a value holds an object that begins the same way.
func envelopeEvents(payload []byte) int {
	return max(bytes.Count(payload, []byte(eventHead))-1, 0)
}

// errNotEnvelope is readEnvelope's answer for a payload that began as an envelope and whose op
// (the last one it names) is not x after all: it is read as one change event.
var errNotEnvelope = errors.New("not an envelope")

// readEnvelope reads the envelope payload in one pass (validating it whole), handing each of its
// events, read as readEvent reads one, to each in order (i from 0). Its own members are checked as
// an event's; a member named twice counts by its last value, events too (each then sees i = 0
// again). The first event that cannot be read, or that each refuses, fails the envelope, named; the
// events after it are only validated.
func readEnvelope(payload []byte, table tableRead, each func(i int, ev *event) error) error {
	t, err := objectBytes(payload)
	if err != nil {
		return err
	}
	var r eventReader // the envelope's own members
	var ev event      // one for all its events: each reads it before the next
	n, events := 0, false
	var failed error
	end, err := jsonscan.MembersAt(t, 0, func(k []byte, _ bool, v0 int) (int, error) {
		name, err := jsonscan.Text(k)
		if err != nil {
			return v0, err
		}
		if string(name) != "events" || v0 == len(t) || t[v0] != '[' {
			v1, err := jsonscan.SkipAt(t, v0)
			if err == nil {
				err = r.member(k, t[v0:v1])
			}
			if string(name) == "events" {
				events, failed = false, nil
			}
			return v1, err
		}
		events, n, failed = true, 0, nil
		return jsonscan.ElementsAt(t, v0, func(e0 int) (int, error) {
			if failed != nil || e0 == len(t) || t[e0] != '{' {
				e1, err := jsonscan.SkipAt(t, e0)
				if err == nil && failed == nil {
					failed = inEnvelope(n, badPayload("not an object: %s", excerpt(t[e0:e1])))
				}
				return e1, err
			}
			var e1 int
			ev, e1, err = readEventAt(t, e0, table)
			if err != nil && !errcode.Is(err, errcode.BadPayload) {
				return e1, err // not JSON
			}
			if err == nil && ev.Op == "x" {
				err = badPayload("an envelope inside an envelope")
			}
			if err == nil {
				err = each(n, &ev)
			}
			if err != nil {
				failed = inEnvelope(n, err)
			}
			n++
			return e1, nil
		})
	})
	if err == nil && end != len(t) {
		err = fmt.Errorf("unexpected data after the value at byte %d", end)
	}
	if err != nil {
		return badPayload("payload is not valid JSON (%v): %s", err, excerpt(t))
	}
	own, err := r.finish(tableSkipped)
	switch {
	case err != nil:
		return err
	case own.Op != "x":
		return errNotEnvelope
	case !events:
		return badPayload("envelope (op x) without an events array: %s", excerpt(t))
	}
	return failed
}

// inEnvelope names envelope event i (from 0, its index in events) in err, keeping err's code.
func inEnvelope(i int, err error) error {
	e, ok := errors.AsType[*errcode.Error](err)
	if !ok {
		return fmt.Errorf("envelope event %d: %w", i, err)
	}
	return errcode.Wrap(e.Code, e.Err, fmt.Sprintf("envelope event %d: %s", i, e.Msg), e.Fix)
}

// flat is ops with every envelope replaced by its events' ops, in order (ops itself when there
// is none).
func flat(ops []op) []op {
	n, envelopes := 0, false
	for i := range ops {
		if ops[i].kind == opEnvelope {
			n, envelopes = n+len(ops[i].sub), true
		} else {
			n++
		}
	}
	if !envelopes {
		return ops
	}
	out := make([]op, 0, n)
	for i := range ops {
		if ops[i].kind == opEnvelope {
			out = append(out, ops[i].sub...)
		} else {
			out = append(out, ops[i])
		}
	}
	return out
}
