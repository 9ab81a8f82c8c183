package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestValueAgreesWithEncodingJSON: Value accepts exactly the UTF-8 documents encoding/json
// accepts, up to MaxDepth.
func TestValueAgreesWithEncodingJSON(t *testing.T) {
	for _, d := range []string{
		`1`, `-0.5e+10`, `"x\"y"`, `[1,{"d":null}]`, `true`, `false`, `null`, ` {"a" : [ ] } `, `"\u20ac\ud83d\ude00"`,
		`123456789012345678901234567890`, strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth),
		``, `01`, `1.`, `.5`, `-`, `1e`, `tru`, `nul`, `"\x"`, `"\u12"`, "\"ctl\x01\"", `[1,]`, `{"a":1,}`, `1 2`, `{a:1}`,
		`"unterminated`, "\"\xff\"",
	} {
		want := json.Valid([]byte(d)) && utf8.ValidString(d)
		if got := Value([]byte(d)) == nil; got != want {
			t.Errorf("%q: Value accepts %v, encoding/json %v", d, got, want)
		}
	}
	deep := strings.Repeat("[", MaxDepth+2) + strings.Repeat("]", MaxDepth+2)
	if Value([]byte(deep)) == nil {
		t.Error("nesting over MaxDepth accepted")
	}
}

// TestMembersAndText: each member's key and exact value bytes, and keys and string values read
// with Text (escapes decoded only where there are any).
func TestMembersAndText(t *testing.T) {
	doc := []byte(` {"a": 1, "b\"c" :"x\u00e9y", "d":{"e":[1,2]},"f":"plain"} `)
	var got []string
	err := Members(doc, func(key []byte, escaped bool, v0, v1 int) error {
		k, err := Text(key)
		if err != nil {
			return err
		}
		if escaped != strings.Contains(string(key), `\`) {
			t.Errorf("key %s: escaped %v", key, escaped)
		}
		v := doc[v0:v1]
		if v[0] == '"' {
			if v, err = Text(v); err != nil {
				return err
			}
		}
		got = append(got, string(k)+"="+string(v))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := `a=1 b"c=xéy d={"e":[1,2]} f=plain`; strings.Join(got, " ") != want {
		t.Errorf("members %q, want %q", strings.Join(got, " "), want)
	}
	for _, bad := range []string{``, `"`, `x`, `1`} {
		if _, err := Text([]byte(bad)); err == nil {
			t.Errorf("Text(%q) accepted", bad)
		}
	}
}

// TestTextAgreesWithEncodingJSON: escapes are decoded exactly as encoding/json decodes them, lone
// and mismatched surrogates included, and an escape JSON does not allow is refused.
func TestTextAgreesWithEncodingJSON(t *testing.T) {
	for _, q := range []string{`"a\"b\\c\/d"`, `"\b\f\n\r\t"`, `"caf\u00e9 \u20AC"`, `"\ud83d\ude00!"`, `"x\ud83dy"`,
		`"\ude00"`, `"\ud83d\u0041"`, `"\ud83d"`, `"\ud83d\ud83d\ude00"`, `"{\"color\": \"c5\"}"`, `"plain"`, `""`, `"\u0000"`} {
		var want string
		if err := json.Unmarshal([]byte(q), &want); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if got, err := Text([]byte(q)); err != nil || string(got) != want {
			t.Errorf("Text(%s) = %q, %v; want %q", q, got, err, want)
		}
	}
	for _, q := range []string{`"\x"`, `"\u12"`, `"\u12g4"`, `"a\"`} {
		if _, ok := AppendUnquoted(nil, q[1:len(q)-1]); ok {
			t.Errorf("AppendUnquoted(%s) accepted", q)
		}
	}
}

// TestElements: each element's exact bytes, and what is not one array refused.
func TestElements(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want []string // nil: refused
	}{
		{` [ {"a":[1,2]} , "x,y", 3 ,null] `, []string{`{"a":[1,2]}`, `"x,y"`, `3`, `null`}},
		{`[]`, []string{}},
		{`[{"off":1}]`, []string{`{"off":1}`}},
		{`{"a":1}`, nil},
		{`[1,]`, nil},
		{`[1] 2`, nil},
		{`[1`, nil},
		{``, nil},
	} {
		got := []string{}
		err := Elements([]byte(tc.doc), func(v0, v1 int) error {
			got = append(got, tc.doc[v0:v1])
			return nil
		})
		if tc.want == nil {
			if err == nil {
				t.Errorf("%q accepted as %q", tc.doc, got)
			}
			continue
		}
		if err != nil || strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("%q: %q, %v; want %q", tc.doc, got, err, tc.want)
		}
	}
}

// TestReadingAt: MembersAt, ElementsAt and SkipAt read a document inside a larger one in one pass,
// each value read where it is reached: an object of arrays of objects walked whole gives every
// leaf and ends where the document does, and they accept exactly what Value accepts (nothing after
// the object is checked: the caller does).
func TestReadingAt(t *testing.T) {
	doc := `xx {"op":"x", "events" : [ {"a":1,"b":[2,{"c":3}]}, {"a":"4"} ], "last":true} yy`
	var got []string
	end, err := MembersAt([]byte(doc), 2, func(key []byte, _ bool, v0 int) (int, error) {
		if string(key) != `"events"` {
			v1, err := SkipAt([]byte(doc), v0)
			got = append(got, string(key)+"="+doc[v0:v1])
			return v1, err
		}
		return ElementsAt([]byte(doc), v0, func(e0 int) (int, error) {
			return MembersAt([]byte(doc), e0, func(key []byte, _ bool, v0 int) (int, error) {
				v1, err := SkipAt([]byte(doc), v0)
				got = append(got, "events."+string(key)+"="+doc[v0:v1])
				return v1, err
			})
		})
	})
	if err != nil || doc[end:] != " yy" {
		t.Fatalf("end %d (%q), %v", end, doc[end:], err)
	}
	if want := `"op"="x" events."a"=1 events."b"=[2,{"c":3}] events."a"="4" "last"=true`; strings.Join(got, " ") != want {
		t.Errorf("read %q, want %q", strings.Join(got, " "), want)
	}
	for _, d := range []string{`{"a":[1,{"b":2}]}`, `{}`, `{"a":[]}`, `{"a":[1,]}`, `{"a":[1}`, `{"a" 1}`, `{"a":1,}`, `[1]`, `{"a":"\x"}`, `{"a":[{"b":1,}]}`} {
		_, err := MembersAt([]byte(d), 0, func(_ []byte, _ bool, v0 int) (int, error) {
			if d[v0] != '[' {
				return SkipAt([]byte(d), v0)
			}
			return ElementsAt([]byte(d), v0, func(e0 int) (int, error) { return SkipAt([]byte(d), e0) })
		})
		if want := Value([]byte(d)) == nil && d[0] == '{'; (err == nil) != want {
			t.Errorf("%s: read %v, Value accepts %v", d, err, want)
		}
	}
}
