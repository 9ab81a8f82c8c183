package sink

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// param is one entry of the sql mode's `params`: a JSON path into the payload or a @metadata name.
type param struct {
	text  string
	meta  string     // "partition", "shard", ... when the entry is @name
	steps []pathStep // JSON path, when meta is ""
}

// MetaParams are the metadata a params entry may name as @name.
var MetaParams = []string{"partition", "shard", "offset", "message_id", "transaction_id", "created_at", "queue"}

var metaParams = func() map[string]bool {
	m := map[string]bool{}
	for _, p := range MetaParams {
		m[p] = true
	}
	return m
}()

// newParam parses one params entry.
func newParam(p string) (param, error) {
	if len(p) > 1 && p[0] == '@' {
		if !metaParams[p[1:]] {
			return param{}, errcode.New(errcode.SQLParamUnknown, fmt.Sprintf("params entry %q is not a known metadata name", p),
				"use @partition, @shard, @offset, @message_id, @transaction_id, @created_at or @queue")
		}
		return param{text: p, meta: p[1:]}, nil
	}
	steps, err := parsePath(p)
	if err != nil {
		return param{}, errcode.Wrap(errcode.SQLParamPath, err, fmt.Sprintf("params entry %q is not a path", p),
			`write paths as $, $.a.b, $.lines[0] or $["odd.key"]`)
	}
	return param{text: p, steps: steps}, nil
}

// needsJSON reports whether the param reads inside the payload (so the payload must be JSON).
func (p param) needsJSON() bool { return p.meta == "" && len(p.steps) > 0 }

// value returns the param's text for message m (nil = SQL NULL: a missing path or a JSON null).
func (p param) value(m *Message, doc json.RawMessage) (any, error) {
	switch p.meta {
	case "partition":
		return m.Partition, nil
	case "queue":
		return m.Queue, nil
	case "message_id":
		return m.MessageID, nil
	case "transaction_id":
		return nullIfEmpty(m.TransactionID), nil
	case "shard":
		if !m.HasPosition {
			return nil, nil
		}
		return strconv.Itoa(int(m.Shard)), nil
	case "offset":
		if !m.HasPosition {
			return nil, nil
		}
		return strconv.FormatInt(m.Offset, 10), nil
	case "created_at":
		if m.CreatedAt == 0 {
			return nil, nil
		}
		return strconv.FormatInt(m.CreatedAt, 10), nil
	}
	if len(p.steps) == 0 {
		return string(bytes.TrimSpace(m.Payload)), nil
	}
	raw, found, err := lookup(doc, p.steps)
	if err != nil {
		return nil, badPayload("params %s: %v", p.text, err)
	}
	if !found {
		return nil, nil
	}
	v, err := textOf(raw)
	if err != nil {
		return nil, badPayload("params %s: %v", p.text, err)
	}
	if !v.Valid {
		return nil, nil
	}
	return v.String, nil
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
