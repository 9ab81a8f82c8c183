package sink

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/jsonscan"
)

// refDecode is the reference reading of a payload: encoding/json with numbers kept as written.
// ok is false when the payload is not one JSON value in UTF-8.
func refDecode(b []byte) (v any, ok bool) {
	if !utf8.Valid(b) {
		return nil, false
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if d.Decode(&v) != nil {
		return nil, false
	}
	if len(bytes.Trim(b[d.InputOffset():], " \t\n\r")) > 0 {
		return nil, false // more than one value
	}
	return v, true
}

// nesting is the deepest bracket nesting of b outside strings (an upper bound when b is not JSON).
func nesting(b []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case !inString && (c == '{' || c == '['):
			depth++
			deepest = max(deepest, depth)
		case !inString && (c == '}' || c == ']'):
			depth--
		}
	}
	return deepest
}

// FuzzScanObject checks the scanner against encoding/json: it accepts exactly the UTF-8 JSON
// objects (up to its nesting limit) and returns the same top-level members with their exact bytes;
// decodeObject's errors are coded bad_payload.
func FuzzScanObject(f *testing.F) {
	for _, seed := range []string{
		`{}`, ` { } `, `{"a":1}`, `{"a":-0.5e+10,"b":"x\"y","c":[1,{"d":null}],"e":true,"f":false}`,
		`{"k\u00e9y":"v","k\\n":1}`, `{"big":123456789012345678901234567890}`, `{"a":{"b":{"c":[[],{}]}}}`,
		`{"a":1,"a":2}`, `{"u":"\u20ac\ud83d\ude00"}`, `{"lone":"\ud83d"}`, "{\"bad\":\"\xff\"}", "{\"\xc3\":1}",
		`{`, `{"a"}`, `{"a":01}`, `{"a":1.}`, `{"a":tru}`, `{"a":"\x"}`, `{"a":"\u12"}`, "{\"a\":\"ctl\x01\"}",
		`{"a":[1,]}`, `{"a":1} x`, `{"a":1}{}`, `[1]`, `"s"`, `{"a":nul}`, "\t{\"a\":1}\n", "{\"a\":1}\f",
		strings.Repeat(`{"a":`, 999) + "1" + strings.Repeat("}", 999),
		strings.Repeat(`{"a":`, 1001) + "1" + strings.Repeat("}", 1001),
		`{"a":[` + strings.Repeat("[", 998) + strings.Repeat("]", 998) + `]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := scanObject(b)
		ref, ok := refDecode(b)
		obj, isObj := ref.(map[string]any)
		if err != nil {
			if ok && isObj && nesting(b) <= jsonscan.MaxDepth {
				t.Fatalf("%q refused (%v), but it is a UTF-8 JSON object", b, err)
			}
			if _, derr := decodeObject(b); derr != nil && !errcode.Is(derr, errcode.BadPayload) {
				t.Fatalf("%q: decodeObject error %v is not bad_payload", b, derr)
			}
			return
		}
		if !ok || !isObj {
			t.Fatalf("%q accepted, but it is not a UTF-8 JSON object", b)
		}
		var want map[string]json.RawMessage
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("%q: encoding/json: %v", b, err)
		}
		if !reflect.DeepEqual(map[string]json.RawMessage(got), want) || len(got) != len(obj) {
			t.Fatalf("%q: scan %v, encoding/json %v", b, got, want)
		}
	})
}

// pathText renders steps as a canonical path: $["key"] and [n].
func pathText(steps []pathStep) string {
	var b strings.Builder
	b.WriteByte('$')
	for _, s := range steps {
		if s.isIdx {
			fmt.Fprintf(&b, "[%d]", s.index)
			continue
		}
		k, _ := json.Marshal(s.key)
		b.WriteString("[" + string(k) + "]")
	}
	return b.String()
}

// refLookup walks steps through a decoded value; found is false when a step is missing.
func refLookup(v any, steps []pathStep) (any, bool) {
	for _, s := range steps {
		switch cur := v.(type) {
		case map[string]any:
			if s.isIdx {
				return nil, false
			}
			next, ok := cur[s.key]
			if !ok {
				return nil, false
			}
			v = next
		case []any:
			if !s.isIdx || s.index >= len(cur) {
				return nil, false
			}
			v = cur[s.index]
		default:
			return nil, false
		}
	}
	return v, true
}

// FuzzParamValue runs an sql-mode params entry over a payload, as the sink does: entries that do not
// parse are coded errors; a parsed path prints back to a path that parses to the same steps; and the
// parameter equals the reference reading of the payload: NULL for a missing path or JSON null, a
// string unquoted, numbers with their exact digits, objects and arrays as the same JSON. A payload
// that is not UTF-8 JSON is a coded bad_payload whenever the path reads inside it.
func FuzzParamValue(f *testing.F) {
	doc := `{"a":{"b":"x"},"lines":[{"amt":12.50},{"amt":"3"}],"odd.key":7,"n":null,"big":123456789012345678901234567890,"e":"\u00e9\n"}`
	for _, seed := range [][2]string{
		{"$", doc}, {"$.a.b", doc}, {"$.a", doc}, {"$.lines[0].amt", doc}, {"$.lines[1].amt", doc},
		{"$.lines[5]", doc}, {`$["odd.key"]`, doc}, {"$.n", doc}, {"$.missing.deeper", doc}, {"$.big", doc},
		{"$.e", doc}, {`$["a"]["b"]`, doc}, {`$[ "a" ].b`, doc}, {"$.lines[-1]", doc}, {"$.lines[+1]", doc},
		{"$[0]", `[1,2]`}, {"$.a", "{\"a\":\"\xff\"}"}, {"$.a", `{"a":1,"a":2}`}, {"$.a", `{"a":1`}, {"$", "not json"},
		{"@partition", doc}, {"@nope", doc}, {"a.b", doc}, {"$.", doc}, {"$[x]", doc}, {`$["unterminated`, doc},
		{"$.a]", doc}, {`$["a\u0000b"]`, `{"a\u0000b":true}`}, {"$[99999999999999999999]", `[]`},
	} {
		f.Add(seed[0], []byte(seed[1]))
	}
	f.Fuzz(func(t *testing.T, path string, payload []byte) {
		p, err := newParam(path)
		if err != nil {
			if !errcode.Is(err, errcode.SQLParamPath) && !errcode.Is(err, errcode.SQLParamUnknown) {
				t.Fatalf("%q: uncoded error %v", path, err)
			}
			return
		}
		if p.meta != "" {
			return
		}
		if utf8.ValidString(path) {
			again, err := parsePath(pathText(p.steps))
			if err != nil || !reflect.DeepEqual(again, p.steps) {
				t.Fatalf("%q → %s → %v (%v), want %v", path, pathText(p.steps), again, err, p.steps)
			}
		}
		mode, err := newSQLMode("SELECT $1", []string{path})
		if err != nil {
			t.Fatalf("%q: %v", path, err)
		}
		o, err := mode.decode(&Message{Payload: payload}, nil)
		if len(p.steps) == 0 {
			if err != nil || o.params[0] != string(bytes.TrimSpace(payload)) {
				t.Fatalf("$ of %q: %v, %v", payload, o.params, err)
			}
			return
		}
		ref, ok := refDecode(bytes.TrimSpace(payload))
		if !ok || nesting(payload) > jsonscan.MaxDepth {
			if err == nil && !ok {
				t.Fatalf("%q over %q accepted a payload that is not UTF-8 JSON: %v", path, payload, o.params)
			}
			if err != nil && !errcode.Is(err, errcode.BadPayload) {
				t.Fatalf("%q over %q: uncoded error %v", path, payload, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("%q over %q: %v", path, payload, err)
		}
		got := o.params[0]
		want, found := refLookup(ref, p.steps)
		switch w := want.(type) {
		case nil:
			if got != nil {
				t.Fatalf("%q over %q = %q, want NULL (found %v)", path, payload, got, found)
			}
		case string:
			if got != w {
				t.Fatalf("%q over %q = %q, want %q", path, payload, got, w)
			}
		case json.Number:
			if got != w.String() {
				t.Fatalf("%q over %q = %q, want the exact digits %s", path, payload, got, w)
			}
		case bool:
			if got != strconv.FormatBool(w) {
				t.Fatalf("%q over %q = %q, want %v", path, payload, got, w)
			}
		default:
			s, isStr := got.(string)
			back, ok := refDecode([]byte(s))
			if !isStr || !ok || !reflect.DeepEqual(back, want) {
				t.Fatalf("%q over %q = %q, want %v", path, payload, got, want)
			}
		}
	})
}

// fuzzTarget is a table (id int key, v text, j jsonb, arr int[], g generated) for decoding without
// a server.
func fuzzTarget() *Target {
	cols := []Column{
		{Name: "id", Num: 1, CastType: "integer", Kind: kindText},
		{Name: "v", Num: 2, CastType: "text", Kind: kindText},
		{Name: "j", Num: 3, CastType: "jsonb", Kind: kindJSON},
		{Name: "arr", Num: 4, CastType: "integer[]", Kind: kindPopulate},
		{Name: "g", Num: 5, CastType: "integer", Kind: kindText, Generated: true},
	}
	t := &Target{Schema: "public", Name: "t", Columns: cols, byName: map[string]int{}, Key: []string{"id"}}
	for i, c := range cols {
		t.byName[c.Name] = i
	}
	return t
}

// refText is the text a reference value reaches PostgreSQL as (textOf): ok is false for null and
// for objects and arrays (whose text is the producer's JSON, compared by value instead).
func refText(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case json.Number:
		return v.String(), true
	case bool:
		return strconv.FormatBool(v), true
	}
	return "", false
}

// checkRow checks the mapped row against the reference object: every named, non-generated column
// and nothing else, each with the value's text (exact digits; objects and arrays the same JSON).
func checkRow(t *testing.T, w *writer, rv rowVals, obj map[string]any, payload []byte) {
	t.Helper()
	named := 0
	for i, c := range w.t.Columns {
		if _, ok := obj[c.Name]; ok && !c.Generated {
			named++
			j := -1
			for n, col := range rv.cols {
				if col == i {
					j = n
				}
			}
			if j < 0 {
				t.Fatalf("%q: column %s not written", payload, c.Name)
			}
			got, want := rv.vals[j], obj[c.Name]
			if want == nil {
				if got.Valid {
					t.Fatalf("%q: column %s = %q, want NULL", payload, c.Name, got.String)
				}
				continue
			}
			if s, ok := refText(want); ok && (c.Kind == kindText || !strings.HasPrefix(got.String, `"`)) {
				if !got.Valid || got.String != s {
					t.Fatalf("%q: column %s = %q, want %q", payload, c.Name, got.String, s)
				}
				continue
			}
			back, ok := refDecode([]byte(got.String))
			if !got.Valid || !ok || !reflect.DeepEqual(back, want) {
				t.Fatalf("%q: column %s = %q, want the JSON %v", payload, c.Name, got.String, want)
			}
		}
	}
	if len(rv.cols) != named {
		t.Fatalf("%q: %d columns written, %d named", payload, len(rv.cols), named)
	}
}

// refCDC is the reference reading of a change event (DESIGN §2, exact member names): the op kind,
// or ok=false when the sink must refuse it. anyKind is set when either a write or a move is right
// (a key that is an object or array, compared as the producer's text).
func refCDC(obj map[string]any) (kind opKind, ok, anyKind bool) {
	op, isStr := obj["op"].(string)
	key, keyIsObj := obj["key"].(map[string]any)
	if !isStr || obj["key"] != nil && !keyIsObj {
		return 0, false, false
	}
	var unchanged []string
	switch u := obj["unchanged"].(type) {
	case nil:
	case []any:
		for _, e := range u {
			s, ok := e.(string)
			if !ok {
				return 0, false, false
			}
			unchanged = append(unchanged, s)
		}
	default:
		return 0, false, false
	}
	before, beforeIsObj := obj["before"].(map[string]any)
	switch op {
	case "x": // an envelope: every event an object the reference accepts, none an envelope
		events, isArr := obj["events"].([]any)
		if !isArr {
			return 0, false, false
		}
		for _, e := range events {
			ev, isObj := e.(map[string]any)
			if !isObj || ev["op"] == "x" {
				return 0, false, false
			}
			if _, ok, _ := refCDC(ev); !ok {
				return 0, false, false
			}
		}
		return opEnvelope, true, false
	case "t":
		return opTruncate, true, false
	case "m":
		return opNone, true, false
	case "d":
		src := key
		if len(src) == 0 && beforeIsObj {
			src = before
		}
		return opDelete, src["id"] != nil, false
	case "c", "r", "u":
		after, isObj := obj["after"].(map[string]any)
		if !isObj {
			return 0, false, false
		}
		id := after["id"]
		for _, u := range unchanged {
			if u == "id" {
				id = nil
			}
		}
		if id == nil {
			id = key["id"]
		}
		if id == nil {
			return 0, false, false
		}
		if op != "u" || obj["before"] == nil {
			return opWrite, true, false
		}
		if !beforeIsObj {
			return 0, false, false
		}
		if before["id"] == nil {
			return opWrite, true, false
		}
		newText, ok1 := refText(id)
		oldText, ok2 := refText(before["id"])
		if !ok1 || !ok2 {
			return opWrite, true, true
		}
		if newText == oldText {
			return opWrite, true, false
		}
		return opMove, true, false
	}
	return 0, false, false
}

// FuzzDecode decodes payloads in the append, upsert and cdc modes: never a panic; a refused payload
// is a coded bad_payload; an accepted one is a UTF-8 JSON object (a change event with exact member
// names in cdc) whose columns carry the values' exact text, and the reference decides every case.
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		`{"id":1,"v":"x","j":{"a":[1,2.50]},"arr":[1,null,3],"g":9}`, `{"id":"7","v":null}`, `{"v":"no key"}`,
		`{"id":123456789012345678901234567890,"v":12.50}`, `{"id":null}`, `[1]`, `not json`, "{\"id\":1,\"v\":\"\xff\"}",
		`{"op":"c","table":"public.t","key":{"id":1},"after":{"id":1,"v":"x"},"before":null,"lsn":"0/1","seq":0}`,
		`{"op":"u","key":{"id":2},"after":{"id":2,"v":"moved"},"before":{"id":1},"unchanged":["j"]}`,
		`{"op":"u","key":{"id":1},"after":{"v":"x"},"unchanged":["id"]}`, `{"op":"d","key":{"id":1},"after":null,"before":{"id":1}}`,
		`{"op":"d","key":{},"before":{"id":3}}`, `{"op":"t","table":"public.t"}`, `{"op":"m","after":{"x":1}}`,
		`{"op":"x","key":{"id":1}}`, `{"op":"c","after":{"v":"no key"}}`, `{"op":5}`, `{"op":"c","key":[1],"after":{"id":1}}`,
		`{"op":"c","after":{"id":1},"unchanged":"v"}`, `{"op":"c","after":{"id":1},"unchanged":[1]}`, `{"OP":"t"}`,
		`{"Op":"c","Key":{"id":1},"After":{"id":1}}`, `{"op":"t","op":"x"}`, `{"op":"c","after":"{\"id\":1}"}`,
		`{"op":"u","after":{"id":1},"before":5}`, `{"op":"u","after":{"id":{"a":1}},"before":{"id":{"a": 1}}}`,
		`{"op":"x","id":"pg:1","events":[{"op":"c","key":{"id":1},"after":{"id":1,"v":"x"}},{"op":"d","key":{"id":1}},{"op":"m"}]}`,
		`{"op":"x","events":[]}`, `{"op":"x","events":[{"op":"x","events":[]}]}`, `{"op":"x","events":[5,{"op":"t"}]}`,
		`{"op":"x","events":[{"op":"c","after":{"v":1}}],"events":[{"op":"t"}]}`, `{"op":"x","events":[{"op":5}],"op":"c","after":{"id":1}}`,
		`{"events":[{"op":"t"}],"op":"x"}`, `{"op":"x","key":5,"events":[]}`, `{"op":"x","events":{"op":"t"}}`,
	} {
		for mode := 0; mode < 3; mode++ {
			f.Add(uint8(mode), []byte(seed))
		}
	}
	target := fuzzTarget()
	f.Fuzz(func(t *testing.T, sel uint8, payload []byte) {
		w := newWriter(target, MetadataColumns{})
		m := &Message{Payload: payload}
		var o op
		var err error
		mode := sel % 3
		switch mode {
		case 0:
			o, err = appendMode{w: w}.decode(m, nil)
		case 1:
			o, err = upsertMode{w: w}.decode(m, nil)
		default:
			o, err = cdcMode{w: w}.decode(m, nil)
		}
		if err != nil && !errcode.Is(err, errcode.BadPayload) {
			t.Fatalf("mode %d, %q: uncoded error %v", mode, payload, err)
		}
		ref, ok := refDecode(bytes.TrimSpace(payload))
		obj, isObj := ref.(map[string]any)
		if !ok || !isObj || nesting(payload) > jsonscan.MaxDepth {
			if err == nil && (!ok || !isObj) {
				t.Fatalf("mode %d accepted %q, not a UTF-8 JSON object", mode, payload)
			}
			return
		}
		switch mode {
		case 0, 1:
			// a change event or an envelope as pg_cdc writes them (op first; the target has no op,
			// after or events column) is refused by both, and upsert refuses a row without its key
			_, op := obj["op"]
			_, table := obj["table"]
			_, key := obj["key"]
			_, after := obj["after"]
			_, events := obj["events"]
			change := bytes.HasPrefix(payload, []byte(`{"op":"`)) && op && (table && (key || after) || events)
			wantErr := change || mode == 1 && obj["id"] == nil
			if (err != nil) != wantErr {
				t.Fatalf("mode %d, %q: error %v, want an error: %v", mode, payload, err, wantErr)
			}
			if err == nil {
				checkRow(t, w, o.vals, obj, payload)
			}
		default:
			kind, accept, anyKind := refCDC(obj)
			if (err == nil) != accept {
				t.Fatalf("cdc %q: error %v, want accepted: %v", payload, err, accept)
			}
			if err == nil && o.kind != kind && !(anyKind && (o.kind == opWrite || o.kind == opMove)) {
				t.Fatalf("cdc %q: kind %d, want %d", payload, o.kind, kind)
			}
			if after, ok := obj["after"].(map[string]any); err == nil && o.mapped && ok {
				// the hot path (decodeWhole) writes exactly the after object's columns
				checkRow(t, w, o.vals, after, payload)
			}
			if err == nil && o.kind == opDelete {
				// decodeDelete reads the key as a map of the key object (or of before) would give it
				row, _ := decodeObject(payload)
				src, _ := decodeObject(row["key"])
				if len(src) == 0 {
					src, _ = decodeObject(row["before"])
				}
				want, werr := w.keyValues(src)
				text, _ := w.keyText(src)
				if werr != nil || !reflect.DeepEqual(want, o.oldKey) || text != o.key {
					t.Fatalf("cdc %q: delete key %v %q, want %v %q (%v)", payload, o.oldKey, o.key, want, text, werr)
				}
			}
		}
	})
}

// FuzzSplitStatement splits any statement the config check accepts (with one params entry per
// $n): each part's placeholders are exactly $1..$k, each stands for a params entry that exists, and
// renumbering them back gives the part as written; picking a part's arguments never fails.
func FuzzSplitStatement(f *testing.F) {
	for _, seed := range []string{
		"UPDATE a SET b = $2 WHERE id = $1", "INSERT INTO c VALUES ($1, $2); UPDATE d SET n = n + 1 WHERE id = $1",
		"SELECT $2; SELECT $3::int, $1, $3", " ; SELECT 1;; -- just a comment\n; /* c */ ;\n",
		`SELECT ';$9', ";$8", $$ ; $7 $$, $f$ ; $f$, E'\'; $6', $1 -- ; $5` + "\n" + `/* ; /* nested ; */ $4 */; SELECT $1`,
		"SELECT a$1 FROM t$2; SELECT $1", `SELECT 'a\'; SELECT $1`, "SELECT $0, $1", "SELECT $01; SELECT $1",
		"SELECT $99999999999999999999", "SELECT $1$", "SELECT $a$ $1 $a$; SELECT $1", "SELECT /* unterminated $1",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, stmt string) {
		largest, _ := placeholders(stmt)
		if largest > 50 {
			return
		}
		params := make([]string, largest)
		for i := range params {
			params[i] = "@partition"
		}
		if err := checkParamCount(stmt, params); err != nil {
			return
		}
		all := make([]any, largest)
		for i := range all {
			all[i] = i
		}
		for _, p := range splitStatement(stmt) {
			k, seen := placeholders(p.sql)
			if k != len(p.params) || len(seen) != k {
				t.Fatalf("%q: part %q has placeholders %v for %d params", stmt, p.sql, seen, len(p.params))
			}
			for i, n := range p.params {
				if n < 0 || n >= largest || i > 0 && n <= p.params[i-1] {
					t.Fatalf("%q: part %q stands for params %v of %d", stmt, p.sql, p.params, largest)
				}
			}
			if args := p.args(all); len(args) != k {
				t.Fatalf("%q: part %q got %d args for %d placeholders", stmt, p.sql, len(args), k)
			}
			back := mapPlaceholders(p.sql, func(n int) int { return p.params[n-1] + 1 })
			if whole := mapPlaceholders(stmt, func(n int) int { return n }); !strings.Contains(whole, back) {
				t.Fatalf("%q: part %q renumbered back is %q, not a part of %q", stmt, p.sql, back, whole)
			}
		}
	})
}

// mapPlaceholders rewrites each placeholder $n of s (as walkSQL finds them) as $f(n).
func mapPlaceholders(s string, f func(int) int) string {
	var b strings.Builder
	at := 0
	walkSQL(s, func(tok sqlToken) {
		if tok.kind == tokParam {
			b.WriteString(s[at:tok.pos] + "$" + strconv.Itoa(f(tok.n)))
			at = tok.end
		}
	})
	return b.String() + s[at:]
}
