package convert

import (
	"bytes"
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzTypes are the conversions FuzzAppend picks from (by its first argument).
var fuzzTypes = []*Type{
	ScalarType(16),                            // bool
	ScalarType(20),                            // int8
	ScalarType(1700),                          // numeric
	ScalarType(701),                           // float8
	ScalarType(114),                           // json
	ScalarType(3802),                          // jsonb
	ScalarType(1184),                          // timestamptz
	ScalarType(1114),                          // timestamp
	ScalarType(25),                            // text
	ScalarType(16385),                         // a composite or enum: its printed text
	ArrayOf(1007, ScalarType(23), ','),        // int4[]
	ArrayOf(1231, ScalarType(1700), ','),      // numeric[]
	ArrayOf(1009, ScalarType(25), ','),        // text[]
	ArrayOf(1185, ScalarType(1184), ','),      // timestamptz[]
	ArrayOf(3807, ScalarType(3802), ','),      // jsonb[]
	ArrayOf(1020, ScalarType(603), ';'),       // box[]
	ArrayOf(16386, ScalarType(16385), ','),    // composite[]
	ArrayOf(1000, ScalarType(16), ','),        // bool[]
	ArrayOf(1115, ScalarType(1114), ','),      // timestamp[]
	ArrayOf(199, ScalarType(114), ','),        // json[]
	ArrayOf(1022, ScalarType(701), ','),       // float8[]
	ArrayOf(16387, ScalarType(16385), '\x7f'), // an odd delimiter
	ArrayOf(16388, ScalarType(16385), ' '),    // a delimiter that is also white space
	ArrayOf(16389, ScalarType(16385), '"'),    // a delimiter that is also the quote
	ArrayOf(16390, ScalarType(1700), '\\'),    // a delimiter that is also the escape
	ArrayOf(16391, ScalarType(3802), '}'),     // a delimiter that closes
}

// jsonNumber is RFC 8259's number grammar, the reference for KindNumber.
var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// isoInput is PostgreSQL's ISO timestamp output, the reference for the timestamp kinds.
var isoInput = regexp.MustCompile(`^([0-9]{4,}-[0-9]{2}-[0-9]{2}) ([0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?)(([+-][0-9]{2})(:[0-9]{2}(:[0-9]{2})?)?)?$`)

// asString is what a value that no rule accepts must become: the text as a JSON string, invalid
// UTF-8 bytes replaced one by one, as encoding/json does.
func asString(text []byte) string {
	b, _ := json.Marshal(string(text))
	return string(b)
}

// sameJSON reports whether a and b decode to the same value (numbers compared as written).
func sameJSON(a, b string) bool {
	var va, vb any
	da := json.NewDecoder(strings.NewReader(a))
	da.UseNumber()
	db := json.NewDecoder(strings.NewReader(b))
	db.UseNumber()
	return da.Decode(&va) == nil && db.Decode(&vb) == nil && reflect.DeepEqual(va, vb)
}

// appendSeeds are FuzzAppend's seed corpus; TestAppendSeedsAsEveryType runs each as every type.
var appendSeeds = []string{
	"t", "false", "0", "-0", "123456789012345678901234567890", "-0.000000000000000000000000000001",
	"1e+300", "1.", "01", "NaN", "-Infinity", `{"a": [1, 2.50, {"b": null}]}`, ` "str" `, "{bad",
	"2026-10-03 06:14:39.365472+00", "2026-10-03 06:14:39+05:30", "12345-01-01 00:00:00+00",
	"2026-10-03 06:14:39", "0044-03-15 12:00:00 BC", "infinity", "1889-12-31 23:59:59-00:01:15",
	"{1,2,3}", "{{1,2},{3,4}}", "[0:1]={7,8}", "{}", `{"a,b","c\"d","e\\f","{g}","NULL",NULL," sp ",""}`,
	`{"(1,2),(0,0)";"(3,3),(2,2)"}`, `{"(1,\"a b\")","(2,x)"}`, `{"{\"a\": {\"b\": [1, 2]}}"}`,
	`{{{{{{1}}}}}}`, `{{{{{{{1}}}}}}}`, `{1.5,NaN,-Infinity}`, `{"2026-01-01 00:00:00+00"}`,
	"{a\\ ,b}", "\x01\xff", "é€😀", "\u2028", `{"\u00e9": "\ud83d"}`, "{\"k\": \"\xff\"}",
}

// FuzzAppend converts arbitrary text as each kind of type (checkAppend).
func FuzzAppend(f *testing.F) {
	for i, seed := range appendSeeds {
		f.Add(uint8(i), []byte(seed))
	}
	f.Fuzz(func(t *testing.T, sel uint8, text []byte) {
		checkAppend(t, fuzzTypes[int(sel)%len(fuzzTypes)], text)
	})
}

func TestAppendSeedsAsEveryType(t *testing.T) {
	for _, seed := range appendSeeds {
		for _, typ := range fuzzTypes {
			checkAppend(t, typ, []byte(seed))
		}
	}
}

// checkAppend converts text as typ: the output is always valid UTF-8 JSON, and each kind's rule
// (DESIGN §2) is checked against a reference: numbers keep their exact digits, booleans, embedded
// JSON and ISO timestamps are rewritten only when the text has their shape, and anything else is the
// text as a JSON string.
func checkAppend(t *testing.T, typ *Type, text []byte) {
	t.Helper()
	out := string(Append(nil, typ, text))
	if !json.Valid([]byte(out)) || !utf8.ValidString(out) {
		t.Fatalf("kind %d: %q became %q: not valid UTF-8 JSON", typ.Kind, text, out)
	}
	if typ.Kind == KindArray {
		if out[0] != '[' && !sameJSON(out, asString(text)) {
			t.Fatalf("array %q: neither an array nor the text: %s", text, out)
		}
		return
	}
	// want is the exact output when a rule rewrites the text; otherwise the output must decode
	// to the text as a string.
	want := ""
	switch typ.Kind {
	case KindBool:
		switch string(text) {
		case "t", "true":
			want = "true"
		case "f", "false":
			want = "false"
		}
	case KindNumber:
		if jsonNumber.Match(text) {
			want = string(text)
		}
	case KindJSON:
		if j := bytes.Trim(text, " \t\n\r"); len(j) > 0 && json.Valid(j) { // JSON white space only
			want = string(replaceInvalid(j))
		}
	case KindTimestamptz, KindTimestamp:
		m := isoInput.FindSubmatch(text)
		zoned := typ.Kind == KindTimestamptz
		if m != nil && (len(m[4]) > 0) == zoned {
			iso := string(m[1]) + "T" + string(m[2]) + string(m[4])
			if len(m[4]) > 0 && len(m[6]) == 0 {
				iso += ":00"
			}
			want = `"` + iso + `"`
		}
	}
	if want == "" {
		if !sameJSON(out, asString(text)) || out[0] != '"' {
			t.Fatalf("kind %d: %q became %s, want it as a string", typ.Kind, text, out)
		}
	} else if out != want {
		t.Fatalf("kind %d: %q became %s, want %s", typ.Kind, text, out, want)
	}
}

// replaceInvalid replaces each byte of b that is not part of valid UTF-8 with U+FFFD.
func replaceInvalid(b []byte) []byte {
	var out []byte
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, b[:size]...)
		}
		b = b[size:]
	}
	return out
}

// arrayOut quotes elements as PostgreSQL's array_out does: quoted when empty, "NULL" in any case,
// or holding the delimiter, a quote, a backslash, a brace or white space; `"` and `\` escaped.
func arrayOut(elems []*string, delim byte) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, e := range elems {
		if i > 0 {
			b.WriteByte(delim)
		}
		if e == nil {
			b.WriteString("NULL")
			continue
		}
		quote := *e == "" || strings.EqualFold(*e, "NULL")
		for j := 0; j < len(*e); j++ {
			switch c := (*e)[j]; c {
			case '"', '\\', '{', '}', delim, ' ', '\t', '\n', '\r', '\v', '\f':
				quote = true
			}
		}
		if !quote {
			b.WriteString(*e)
			continue
		}
		b.WriteByte('"')
		for j := 0; j < len(*e); j++ {
			if c := (*e)[j]; c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte((*e)[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// FuzzArrayRoundTrip prints elements as PostgreSQL prints an array (NULLs, quoting, escapes, an
// optional lower bound, optionally as a two-dimensional array of one-element rows) and checks the
// converter gives back exactly those elements: text elements as strings (invalid UTF-8 replaced),
// numeric elements as numbers with their exact digits when they are JSON numbers, NULL as null.
func FuzzArrayRoundTrip(f *testing.F) {
	f.Add("a\x00b c\x00\x01\x00NULL\x00\x00x\"y\\z{}", false, false, false)
	f.Add("1\x0012.50\x00-0.000000000000000000000000000001\x00NaN\x00\x01\x00123456789012345678901234567890", true, false, true)
	f.Add("(1,2),(0,0)\x00(3,3),(2,2)", false, true, false)
	f.Add(" lead\x00trail \x00\v\x00é€\x00\xff", false, false, true)
	f.Fuzz(func(t *testing.T, data string, numeric, semicolon, nested bool) {
		delim := byte(',')
		if semicolon {
			delim = ';'
		}
		elemType := ScalarType(25)
		if numeric {
			elemType = ScalarType(1700)
		}
		var elems []*string
		for _, e := range strings.Split(data, "\x00") {
			if e == "\x01" {
				elems = append(elems, nil)
				continue
			}
			elems = append(elems, &e)
		}
		var lit string
		if nested {
			rows := make([]string, len(elems))
			for i, e := range elems {
				rows[i] = arrayOut([]*string{e}, delim)
			}
			lit = "{" + strings.Join(rows, string(delim)) + "}"
		} else {
			lit = "[3:" + string(rune('0'+len(elems)%10)) + "]=" + arrayOut(elems, delim)
		}
		want := make([]string, len(elems))
		for i, e := range elems {
			switch {
			case e == nil:
				want[i] = "null"
			case numeric && jsonNumber.MatchString(*e):
				want[i] = *e
			default:
				want[i] = asString([]byte(*e))
			}
			if nested {
				want[i] = "[" + want[i] + "]"
			}
		}
		got := string(Append(nil, ArrayOf(1, elemType, delim), []byte(lit)))
		if w := "[" + strings.Join(want, ",") + "]"; !sameJSON(got, w) {
			t.Fatalf("%q became\n%s, want\n%s", lit, got, w)
		}
	})
}
