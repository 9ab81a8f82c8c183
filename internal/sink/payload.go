package sink

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgrelay/pgrelay/internal/jsonscan"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// Row is a decoded payload object: each top-level key with the exact JSON text the producer wrote.
// Values are never decoded through float64, so 30-digit numerics and bigints past 2^53 stay exact.
type Row map[string]json.RawMessage

// MaxPayloadBytes is the largest payload the sink reads: 64 MiB. A larger one is refused with
// payload_too_large before any parsing (a data error: dead-lettered after max_attempts), so a
// runaway producer costs the sink the message's bytes and nothing more.
const MaxPayloadBytes = 64 << 20

// checkSize refuses a payload over MaxPayloadBytes.
func checkSize(m *Message) error {
	if len(m.Payload) <= MaxPayloadBytes {
		return nil
	}
	return errcode.New(errcode.PayloadTooLarge,
		fmt.Sprintf("payload is %d bytes, over the sink's limit of %d (64 MiB)", len(m.Payload), MaxPayloadBytes),
		"keep large values elsewhere and send a reference, or split the message; the input dead-letters this message after max_attempts")
}

// badPayload is the data error for a payload the mode cannot read.
func badPayload(format string, args ...any) error {
	return errcode.New(errcode.BadPayload, fmt.Sprintf(format, args...),
		"fix the producer; the input dead-letters this message after max_attempts")
}

// decodeObject reads a payload that must be one JSON object.
func decodeObject(b []byte) (Row, error) {
	t, err := objectBytes(b)
	if err != nil {
		return nil, err
	}
	r, err := scanObject(t)
	if err != nil {
		return nil, badPayload("payload is not valid JSON (%v): %s", err, excerpt(t))
	}
	return r, nil
}

// objectBytes trims b and refuses, with a clear message, anything that does not start an object.
func objectBytes(b []byte) ([]byte, error) {
	t := bytes.TrimSpace(b)
	if len(t) == 0 {
		return nil, badPayload("payload is empty, expected a JSON object")
	}
	if t[0] != '{' {
		if !json.Valid(t) {
			return nil, badPayload("payload is not JSON: %s", excerpt(t))
		}
		return nil, badPayload("payload is JSON but not an object: %s", excerpt(t))
	}
	return t, nil
}

// excerpt shortens a payload for error messages.
func excerpt(b []byte) string {
	const max = 120
	if len(b) > max {
		return strconv.Quote(string(b[:max])) + "..."
	}
	return strconv.Quote(string(b))
}

// isNull reports whether raw is absent or the JSON null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// textOf turns a JSON value into the text PostgreSQL receives: nil for null, the unquoted string for
// a JSON string, and the value exactly as written (numbers, booleans, objects, arrays) otherwise.
func textOf(raw json.RawMessage) (pgtype.Text, error) {
	return stringText(string(bytes.TrimSpace(raw)), nil)
}

// stringText is textOf for a value already trimmed and held as a string: an unescaped JSON string's
// text is a substring of s, an escaped one is decoded into buf (allocated when buf is nil).
func stringText(s string, buf *rowBuf) (pgtype.Text, error) {
	if s == "" || s == "null" {
		return pgtype.Text{}, nil
	}
	if s[0] != '"' {
		return pgtype.Text{String: s, Valid: true}, nil
	}
	if len(s) < 2 || s[len(s)-1] != '"' {
		return pgtype.Text{}, fmt.Errorf("unterminated string %s", excerpt([]byte(s)))
	}
	if strings.IndexByte(s, '\\') < 0 {
		return pgtype.Text{String: s[1 : len(s)-1], Valid: true}, nil
	}
	if buf == nil {
		buf = &rowBuf{}
	}
	var ok bool
	if buf.scratch, ok = jsonscan.AppendUnquoted(buf.scratch[:0], s[1:len(s)-1]); !ok {
		return pgtype.Text{}, fmt.Errorf("bad escape in %s", excerpt([]byte(s)))
	}
	return pgtype.Text{String: buf.keep(buf.scratch), Valid: true}, nil
}

// valueFor converts a payload value for column c (see valueKind).
func valueFor(c *Column, raw json.RawMessage) (pgtype.Text, error) {
	return valueOf(c, string(bytes.TrimSpace(raw)), nil)
}

// valueOf is valueFor for a value already trimmed and held as a string (escapes decoded into buf).
func valueOf(c *Column, s string, buf *rowBuf) (pgtype.Text, error) {
	if c.Kind == kindText {
		v, err := stringText(s, buf)
		if err != nil {
			return v, badPayload("column %q: %v", c.Name, err)
		}
		return v, nil
	}
	if s == "" || s == "null" {
		return pgtype.Text{}, nil
	}
	return pgtype.Text{String: s, Valid: true}, nil
}

// pathStep is one step of a params path: an object key or an array index.
type pathStep struct {
	key   string
	index int
	isIdx bool
}

// parsePath reads `$`, `$.a.b`, `$.lines[0]`, `$["odd.key"]` and combinations.
func parsePath(p string) ([]pathStep, error) {
	if !strings.HasPrefix(p, "$") {
		return nil, fmt.Errorf("path %q must start with $", p)
	}
	var steps []pathStep
	rest := p[1:]
	for rest != "" {
		switch {
		case rest[0] == '.':
			end := 1
			for end < len(rest) && rest[end] != '.' && rest[end] != '[' && rest[end] != ']' {
				end++
			}
			if end == 1 {
				return nil, fmt.Errorf("path %q: empty key after '.'", p)
			}
			steps = append(steps, pathStep{key: rest[1:end]})
			rest = rest[end:]
		case strings.HasPrefix(rest, `["`):
			dec := json.NewDecoder(strings.NewReader(rest[1:]))
			var key string
			if err := dec.Decode(&key); err != nil {
				return nil, fmt.Errorf("path %q: bad quoted key: %v", p, err)
			}
			after := strings.TrimLeft(rest[1+int(dec.InputOffset()):], " ")
			if !strings.HasPrefix(after, "]") {
				return nil, fmt.Errorf("path %q: missing ] after quoted key", p)
			}
			steps = append(steps, pathStep{key: key})
			rest = after[1:]
		case rest[0] == '[':
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				return nil, fmt.Errorf("path %q: missing ]", p)
			}
			n, err := strconv.Atoi(rest[1:end])
			if err != nil || n < 0 {
				return nil, fmt.Errorf("path %q: %q is not an array index", p, rest[1:end])
			}
			steps = append(steps, pathStep{index: n, isIdx: true})
			rest = rest[end+1:]
		default:
			return nil, fmt.Errorf("path %q: unexpected %q (use .key, [n] or [\"key\"])", p, rest[:1])
		}
	}
	return steps, nil
}

// lookup follows steps into doc; found is false when any step is missing.
func lookup(doc json.RawMessage, steps []pathStep) (json.RawMessage, bool, error) {
	cur := doc
	for _, s := range steps {
		t := bytes.TrimSpace(cur)
		if len(t) == 0 {
			return nil, false, nil
		}
		if s.isIdx {
			if t[0] != '[' {
				return nil, false, nil
			}
			var arr []json.RawMessage
			if err := json.Unmarshal(t, &arr); err != nil {
				return nil, false, err
			}
			if s.index >= len(arr) {
				return nil, false, nil
			}
			cur = arr[s.index]
			continue
		}
		if t[0] != '{' {
			return nil, false, nil
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(t, &obj); err != nil {
			return nil, false, err
		}
		v, ok := obj[s.key]
		if !ok {
			return nil, false, nil
		}
		cur = v
	}
	return cur, true, nil
}
