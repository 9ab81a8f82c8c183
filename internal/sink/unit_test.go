package sink

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

func TestParamPaths(t *testing.T) {
	doc := json.RawMessage(`{"a":{"b":"x"},"lines":[{"amt":12.50},{"amt":"3"}],"odd.key":7,"n":null,"big":123456789012345678901234567890}`)
	m := &Message{Queue: "q", Shard: 3, Offset: 9, HasPosition: true, Partition: "p|1", MessageID: "id-1",
		TransactionID: "tx", CreatedAt: 1700000000123, Payload: doc}
	cases := []struct {
		path string
		want any
	}{
		{"$", string(doc)},
		{"$.a.b", "x"},
		{"$.a", `{"b":"x"}`},
		{"$.lines[0].amt", "12.50"},
		{"$.lines[1].amt", "3"},
		{"$.lines[5]", nil},
		{`$["odd.key"]`, "7"},
		{"$.n", nil},
		{"$.missing.deeper", nil},
		{"$.big", "123456789012345678901234567890"},
		{"@partition", "p|1"},
		{"@shard", "3"},
		{"@offset", "9"},
		{"@message_id", "id-1"},
		{"@transaction_id", "tx"},
		{"@created_at", "1700000000123"},
	}
	for _, c := range cases {
		p, err := newParam(c.path)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		got, err := p.value(m, doc)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s = %v, want %v", c.path, got, c.want)
		}
	}
	for _, bad := range []string{"a.b", "$.", "$[x]", `$["unterminated`, "@nope", "$.a]"} {
		if _, err := newParam(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParamCount(t *testing.T) {
	cases := []struct {
		stmt   string
		params int
		ok     bool
	}{
		{"UPDATE a SET b = b + $1::numeric WHERE id = $2::bigint", 2, true},
		{"UPDATE a SET b = $1 WHERE id = $2", 1, false},
		{"SELECT $1, $1", 1, true},
		{"SELECT $2", 2, false},
		{"SELECT '$3', \"$4\", $1 -- $5\n /* $6 */", 1, true},
		{"SELECT $fn$ $9 $fn$, $1", 1, true},
		{"SELECT $$ $2 $$ || $1", 1, true},
	}
	for _, c := range cases {
		params := make([]string, c.params)
		for i := range params {
			params[i] = "$"
		}
		err := checkParamCount(c.stmt, params)
		if (err == nil) != c.ok {
			t.Errorf("%q with %d params: err = %v", c.stmt, c.params, err)
		}
		if err != nil && !errcode.Is(err, errcode.SQLParamsMismatch) {
			t.Errorf("%q: error not coded: %v", c.stmt, err)
		}
	}
}

// TestEnvironmentErrorCodes: an environment error gets the code that names its fix.
func TestEnvironmentErrorCodes(t *testing.T) {
	for _, c := range []struct {
		err  error
		want errcode.Code
	}{
		{&pgconn.PgError{Code: "25006", Message: "cannot execute INSERT in a read-only transaction"}, errcode.PGReadOnly},
		{&pgconn.PgError{Code: "42P01"}, errcode.TargetMissing},
		{&pgconn.PgError{Code: "42501"}, errcode.TargetPrivileges},
		{&pgconn.PgError{Code: "42703"}, errcode.TargetChanged},
		{&pgconn.PgError{Code: "XX001"}, errcode.SinkError},
		{errors.New("no SQLSTATE"), errcode.SinkError},
		{errcode.New(errcode.TargetNoKey, "x", "y"), errcode.TargetNoKey},
	} {
		if got := errcode.Of(environmentError(c.err)); got != c.want {
			t.Errorf("%v: %s, want %s", c.err, got, c.want)
		}
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		err  error
		want Class
	}{
		{&pgconn.PgError{Code: "23514"}, Data},
		{&pgconn.PgError{Code: "22P02"}, Data},
		{&pgconn.PgError{Code: "21000"}, Data},
		{&pgconn.PgError{Code: "P0001"}, Data},
		{&pgconn.PgError{Code: "54000"}, Data},
		{&pgconn.PgError{Code: "40001"}, Transient},
		{&pgconn.PgError{Code: "40P01"}, Transient},
		{&pgconn.PgError{Code: "08006"}, Transient},
		{&pgconn.PgError{Code: "53300"}, Transient},
		{&pgconn.PgError{Code: "57P01"}, Transient},
		{&pgconn.PgError{Code: "55P03"}, Transient},
		{&pgconn.PgError{Code: "42P01"}, Environment},
		{&pgconn.PgError{Code: "42501"}, Environment},
		{&pgconn.PgError{Code: "42703"}, Environment},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "23505"}), Data},
		{badPayload("x"), Data},
		{checkSize(&Message{Payload: make([]byte, MaxPayloadBytes+1)}), Data},
		{errcode.New(errcode.TargetMissing, "x", "y"), Environment},
		{fmt.Errorf("read tcp: connection reset by peer"), Transient},
		{errcode.Wrap(errcode.PGUnreachable, errors.New("dial tcp: connection refused"), "PostgreSQL does not answer", "check"), Transient},
		{errcode.Wrap(errcode.PGPassword, &pgconn.PgError{Code: "28P01"}, "refused", "set it"), Environment},
	}
	for _, c := range cases {
		if got := Classify(c.err); got != c.want {
			t.Errorf("%v: %v, want %v", c.err, got, c.want)
		}
	}
	e := DataError(&pgconn.PgError{Code: "23514", Message: `new row for relation "t" violates check constraint "c"`, Detail: "Failing row contains (1)."})
	if e.Error() != `23514: new row for relation "t" violates check constraint "c" (Failing row contains (1).)` {
		t.Errorf("DataError = %q", e)
	}
}

// TestPayloadLimit: MaxPayloadBytes is accepted, one byte more is payload_too_large, and the
// error names the size, not the payload.
func TestPayloadLimit(t *testing.T) {
	if err := checkSize(&Message{Payload: make([]byte, MaxPayloadBytes)}); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, MaxPayloadBytes+1)
	for i := range big {
		big[i] = 'x'
	}
	err := checkSize(&Message{Payload: big})
	if !errcode.Is(err, errcode.PayloadTooLarge) || !containsStr(err.Error(), "67108865 bytes") || len(err.Error()) > 300 {
		t.Fatalf("%v", err)
	}
}

func TestDecodeObject(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{``, "empty"}, {`not json`, "not JSON"}, {`[1]`, "not an object"}, {`"s"`, "not an object"}, {`{"a":`, "not valid JSON"},
	} {
		_, err := decodeObject([]byte(c.in))
		if !errcode.Is(err, errcode.BadPayload) {
			t.Errorf("%q: %v", c.in, err)
		}
		if err != nil && !containsStr(err.Error(), c.want) {
			t.Errorf("%q: %v lacks %q", c.in, err, c.want)
		}
	}
}

func containsStr(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && indexFrom(s, sub, 0) >= 0)
}

// TestUnquoteAgreesWithEncodingJSON: escaped strings are decoded exactly as encoding/json decodes
// them, lone and mismatched surrogates included.
func TestUnquoteAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range []string{`"a\"b\\c\/d"`, `"\b\f\n\r\t"`, `"caf\u00e9 \u20AC"`, `"\ud83d\ude00!"`, `"x\ud83dy"`,
		`"\ude00"`, `"\ud83d\u0041"`, `"\ud83d"`, `"\ud83d\ud83d\ude00"`, `"{\"color\": \"c5\"}"`, `"plain"`, `""`, `"\u0000"`} {
		var want string
		if err := json.Unmarshal([]byte(s), &want); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		for _, buf := range []*rowBuf{nil, {}} {
			got, err := stringText(s, buf)
			if err != nil || !got.Valid || got.String != want {
				t.Errorf("%s = %q, %v; want %q", s, got.String, err, want)
			}
		}
	}
}
