package sink

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

func TestCDC(t *testing.T) {
	f := startPG(t)
	newTable := func(t *testing.T) (string, *Applier) {
		table := f.name("cdc")
		f.exec(t, `CREATE TABLE `+table+` (id int PRIMARY KEY, a text, b text DEFAULT 'dflt', big text)`)
		return table, f.applier(t, Config{Table: table, Mode: ModeCDC})
	}
	rows := func(t *testing.T, table string) string {
		return strings.Join(f.queryStrings(t, `SELECT concat_ws('/', id, a, b, big) FROM `+table+` ORDER BY id`), ",")
	}
	ev := func(op, key, after, before string, unchanged ...string) string {
		s := `{"op":"` + op + `","table":"public.x","key":` + key + `,"after":` + after + `,"before":` + before
		if len(unchanged) > 0 {
			s += `,"unchanged":["` + strings.Join(unchanged, `","`) + `"]`
		}
		return s + `,"lsn":"0/1","ts":"2026-10-03T06:15:03.583036Z","seq":0}`
	}
	cases := []struct {
		name    string
		batches [][]string
		want    string
	}{
		{"c and r insert, u merges keeping unchanged TOASTed columns", [][]string{
			{ev("c", `{"id":1}`, `{"id":1,"a":"x","b":"y","big":"LONG"}`, "null"), ev("r", `{"id":2}`, `{"id":2,"a":"r","b":"r","big":"r"}`, "null")},
			{ev("u", `{"id":1}`, `{"id":1,"a":"x2","b":"y2"}`, "null", "big")},
		}, "1/x2/y2/LONG,2/r/r/r"},
		{"d deletes by key", [][]string{
			{ev("c", `{"id":1}`, `{"id":1,"a":"x","b":"y","big":"z"}`, "null"), ev("c", `{"id":2}`, `{"id":2,"a":"x","b":"y","big":"z"}`, "null")},
			{ev("d", `{"id":1}`, "null", `{"id":1}`)},
		}, "2/x/y/z"},
		{"d then c of the same key in one batch recreates the row (absent columns DEFAULT)", [][]string{
			{ev("c", `{"id":1}`, `{"id":1,"a":"old","b":"old","big":"old"}`, "null")},
			{ev("d", `{"id":1}`, "null", `{"id":1}`), ev("c", `{"id":1}`, `{"id":1,"a":"new"}`, "null"), ev("u", `{"id":1}`, `{"id":1,"big":"B"}`, "null")},
		}, "1/new/dflt/B"},
		{"c then d in one batch leaves nothing", [][]string{
			{ev("c", `{"id":5}`, `{"id":5,"a":"x"}`, "null"), ev("d", `{"id":5}`, "null", `{"id":5}`)},
		}, ""},
		{"key change in one u event moves the row and keeps unchanged columns", [][]string{
			{ev("c", `{"id":1}`, `{"id":1,"a":"x","b":"y","big":"LONG"}`, "null")},
			{ev("u", `{"id":7}`, `{"id":7,"a":"moved"}`, `{"id":1}`, "big"), ev("u", `{"id":7}`, `{"id":7,"b":"after-move"}`, "null")},
		}, "7/moved/after-move/LONG"},
		{"REPLICA IDENTITY FULL: a u whose before is the whole old row updates it, or moves it when the key changed", [][]string{
			{ev("c", `{"id":1}`, `{"id":1,"a":"x","b":"y","big":"L1"}`, "null"), ev("c", `{"id":2}`, `{"id":2,"a":"x","b":"y","big":"L2"}`, "null")},
			{ev("u", `{"id":1}`, `{"id":1,"a":"x2","b":"y","big":"L1"}`, `{"id":1,"a":"x","b":"y","big":"L1"}`),
				ev("u", `{"id":8}`, `{"id":8,"a":"moved","b":"y","big":"L2"}`, `{"id":2,"a":"x","b":"y","big":"L2"}`)},
		}, "1/x2/y/L1,8/moved/y/L2"},
		{"t truncates, later events of the batch apply", [][]string{
			{ev("c", `{"id":1}`, `{"id":1,"a":"x"}`, "null"), ev("c", `{"id":2}`, `{"id":2,"a":"x"}`, "null")},
			{ev("c", `{"id":3}`, `{"id":3,"a":"gone"}`, "null"), `{"op":"t","table":"public.x"}`, ev("c", `{"id":4}`, `{"id":4,"a":"kept"}`, "null")},
		}, "4/kept/dflt"},
		{"m (published message) is ignored", [][]string{
			{`{"op":"m","table":"","key":null,"after":{"anything":1}}`, ev("c", `{"id":1}`, `{"id":1,"a":"x"}`, "null")},
		}, "1/x/dflt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			table, a := newTable(t)
			off := int64(0)
			for _, b := range c.batches {
				var msgs []*Message
				for _, p := range b {
					off++
					msgs = append(msgs, msg("q", 0, off, p))
				}
				if res := write(t, a, msgs...); res.Applied != len(b) {
					t.Fatalf("applied %d of %d: %v", res.Applied, len(b), res.Errs)
				}
			}
			if got := rows(t, table); got != c.want {
				t.Fatalf("rows %q, want %q", got, c.want)
			}
		})
	}
	t.Run("unreadable events are data errors and block the rest of their shard", func(t *testing.T) {
		table, a := newTable(t)
		res := write(t, a,
			msg("q", 0, 1, ev("c", `{"id":1}`, `{"id":1,"a":"ok"}`, "null")),
			msg("q", 0, 2, `{"op":"z","key":{"id":1}}`),
			msg("q", 0, 3, ev("c", `{"id":3}`, `{"id":3,"a":"blocked"}`, "null")),
			msg("q", 1, 1, `not json at all`),
			msg("q", 2, 1, `{"op":"c","after":{"a":"no key"}}`),
			msg("q", 3, 1, ev("c", `{"id":4}`, `{"id":4,"a":"other shard"}`, "null")),
		)
		want := []Outcome{Applied, Failed, Blocked, Failed, Failed, Applied}
		for i, o := range want {
			if res.Outcomes[i] != o {
				t.Fatalf("outcomes %v, want %v (errs %v)", res.Outcomes, want, res.Errs)
			}
		}
		for i, sub := range map[int]string{1: `unknown change event op "z"`, 3: "payload is not JSON", 4: "no non-null value for key"} {
			if !errcode.Is(res.Errs[i], errcode.BadPayload) || !strings.Contains(res.Errs[i].Error(), sub) {
				t.Errorf("message %d: %v lacks %q", i, res.Errs[i], sub)
			}
		}
		if !errcode.Is(res.Errs[2], errcode.Blocked) {
			t.Errorf("message 2: %v", res.Errs[2])
		}
		if got := rows(t, table); got != "1/ok/dflt,4/other shard/dflt" {
			t.Fatalf("rows %q", got)
		}
		got := strings.Join(f.queryStrings(t, `SELECT shard || ':' || last_offset FROM pgrelay.sink_progress WHERE sink = $1 ORDER BY shard`, a.cfg.Name), ",")
		if got != "0:1,1:0,2:0,3:1" {
			t.Fatalf("progress %s", got)
		}
	})
}

func TestSQLMode(t *testing.T) {
	f := startPG(t)
	f.exec(t, `CREATE TABLE accounts (id bigint PRIMARY KEY, balance numeric NOT NULL DEFAULT 0 CHECK (balance < 1e40), memo text)`)
	f.exec(t, `INSERT INTO accounts (id) SELECT generate_series(1, 3)`)
	f.exec(t, `CREATE TABLE audit (id bigserial, part text, shard int, off bigint, mid text, tx text, created bigint, whole jsonb, first_line text, odd text)`)
	t.Run("non-idempotent statement runs exactly once per message", func(t *testing.T) {
		a := f.applier(t, Config{Mode: ModeSQL, Statement: `UPDATE accounts SET balance = balance + $1::numeric WHERE id = $2::bigint`,
			Params: []string{"$.amount", "$.id"}})
		b1 := []*Message{msg("q", 0, 1, `{"id":1,"amount":123456789012345678901234567890}`), msg("q", 0, 2, `{"id":1,"amount":"0.000000000000000000000000000001"}`),
			msg("q", 1, 1, `{"id":2,"amount":5}`)}
		write(t, a, b1...)
		res := write(t, a, append(b1, msg("q", 1, 2, `{"id":2,"amount":-7}`))...) // redelivery + one new
		if res.Skipped != 3 || res.Applied != 1 {
			t.Fatalf("outcomes %v", res.Outcomes)
		}
		got := strings.Join(f.queryStrings(t, `SELECT balance::text FROM accounts ORDER BY id`), ",")
		if got != "123456789012345678901234567890.000000000000000000000000000001,-2,0" {
			t.Fatalf("balances %s", got)
		}
	})
	t.Run("params from paths and metadata; a missing path is NULL", func(t *testing.T) {
		a := f.applier(t, Config{Mode: ModeSQL,
			Statement: `INSERT INTO audit (part, shard, off, mid, tx, created, whole, first_line, odd)
			            VALUES ($1, $2::int, $3::bigint, $4, $5, $6::bigint, $7::jsonb, $8, $9)`,
			Params: []string{"@partition", "@shard", "@offset", "@message_id", "@transaction_id", "@created_at", "$", "$.lines[0].sku", `$["odd.key"]`}})
		m := msg("q", 4, 9, `{"lines":[{"sku":"A-1"}],"odd.key":"dotted"}`)
		m.TransactionID, m.CreatedAt = "pg:1:2", 1700000000123
		write(t, a, m, msg("q", 4, 10, `{}`))
		got := strings.Join(f.queryStrings(t, `SELECT concat_ws('|', part, shard, off, mid, tx, created, whole->'lines'->0->>'sku', first_line, coalesce(odd, 'NULL')) FROM audit ORDER BY id`), ",")
		if got != "p4|4|9|m-4-9|pg:1:2|1700000000123|A-1|A-1|dotted,p4|4|10|m-4-10|NULL" {
			t.Fatalf("audit %s", got)
		}
	})
	t.Run("a data error isolates its message, the rest of the batch commits", func(t *testing.T) {
		a := f.applier(t, Config{Mode: ModeSQL, Statement: `UPDATE accounts SET balance = balance + $1::numeric WHERE id = $2::bigint`,
			Params: []string{"$.amount", "$.id"}})
		f.exec(t, `UPDATE accounts SET balance = 0`)
		res := write(t, a,
			msg("q", 0, 1, `{"id":3,"amount":1}`),
			msg("q", 0, 2, `{"id":3,"amount":1e41}`), // CHECK violation
			msg("q", 0, 3, `{"id":3,"amount":100}`),
			msg("q", 1, 1, `{"id":2,"amount":"abc"}`), // 22P02
			msg("q", 2, 1, `{"id":1,"amount":2}`),
		)
		want := []Outcome{Applied, Failed, Blocked, Failed, Applied}
		for i, o := range want {
			if res.Outcomes[i] != o {
				t.Fatalf("outcomes %v, want %v (%v)", res.Outcomes, want, res.Errs)
			}
		}
		if e := res.Errs[1].Error(); !strings.HasPrefix(e, `23514: new row for relation "accounts" violates check constraint`) || !strings.Contains(e, "(Failing row contains") {
			t.Errorf("error text %q", e)
		}
		if e := res.Errs[3].Error(); !strings.HasPrefix(e, `22P02: invalid input syntax for type numeric: "abc"`) {
			t.Errorf("error text %q", e)
		}
		if got := strings.Join(f.queryStrings(t, `SELECT balance::text FROM accounts ORDER BY id`), ","); got != "2,0,1" {
			t.Fatalf("balances %s", got)
		}
		got := strings.Join(f.queryStrings(t, `SELECT shard || ':' || last_offset FROM pgrelay.sink_progress WHERE sink = $1 ORDER BY shard`, a.cfg.Name), ",")
		if got != "0:1,1:0,2:1" {
			t.Fatalf("progress %s", got)
		}
	})
}

func TestTransientErrorsRetried(t *testing.T) {
	f := startPG(t)
	table := f.name("flaky")
	f.exec(t, `CREATE TABLE `+table+` (id int PRIMARY KEY, v int)`)
	f.exec(t, `CREATE SEQUENCE flaky_calls`)
	// the first call raises a serialization failure, the second kills its own connection
	f.exec(t, `CREATE FUNCTION flaky() RETURNS trigger LANGUAGE plpgsql AS $$
		DECLARE n bigint := nextval('flaky_calls');
		BEGIN
			IF n = 1 THEN RAISE EXCEPTION 'simulated' USING ERRCODE = '40001'; END IF;
			IF n = 2 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
			RETURN NEW;
		END $$`)
	f.exec(t, `CREATE TRIGGER flaky BEFORE INSERT ON `+table+` FOR EACH STATEMENT EXECUTE FUNCTION flaky()`)
	var mu sync.Mutex
	var classes []string
	cfg := Config{Name: "flaky", Table: table, Mode: ModeUpsert, ProgressTable: DefaultProgressTable, CreateProgressTable: true,
		RequireProgress: true, RetryMax: 100 * time.Millisecond}
	a, err := NewApplier(context.Background(), f.pool, cfg, func(err error, c Class, _ time.Duration) {
		mu.Lock()
		classes = append(classes, c.String())
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	res := write(t, a, msg("q", 0, 1, `{"id":1,"v":1}`), msg("q", 0, 2, `{"id":1,"v":2}`))
	if res.Applied != 2 {
		t.Fatalf("outcomes %v %v", res.Outcomes, res.Errs)
	}
	if got := f.one(t, `SELECT v::text FROM `+table); got != "2" {
		t.Fatalf("v = %s", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(classes) != "[transient transient]" {
		t.Fatalf("retries %v", classes)
	}
}

// TestRepeatedKeyPoison: a message that violates a CHECK is caught even when a later message of the
// same key in the batch would have fixed the row (each message's write really runs).
func TestRepeatedKeyPoison(t *testing.T) {
	f := startPG(t)
	table := f.name("chk")
	f.exec(t, `CREATE TABLE `+table+` (id int PRIMARY KEY, v int CHECK (v >= 0))`)
	a := f.applier(t, Config{Table: table, Mode: ModeUpsert})
	res := write(t, a, msg("q", 0, 1, `{"id":1,"v":1}`), msg("q", 0, 2, `{"id":1,"v":-1}`), msg("q", 0, 3, `{"id":1,"v":5}`),
		msg("q", 1, 1, `{"id":2,"v":-1}`), msg("q", 2, 1, `{"id":3,"v":3}`), msg("q", 2, 2, `{"id":3,"v":4}`))
	want := []Outcome{Applied, Failed, Blocked, Failed, Applied, Applied}
	for i, o := range want {
		if res.Outcomes[i] != o {
			t.Fatalf("outcomes %v, want %v (%v)", res.Outcomes, want, res.Errs)
		}
	}
	if got := strings.Join(f.queryStrings(t, `SELECT id || '=' || v FROM `+table+` ORDER BY id`), ","); got != "1=1,3=4" {
		t.Fatalf("rows %s", got)
	}
}

func TestSQLStatementCheckedAtStart(t *testing.T) {
	f := startPG(t)
	for stmt, code := range map[string]errcode.Code{
		"UPDAT accounts SET x = $1":            errcode.SQLStatement,
		"UPDATE no_such_table SET x = $1::int": errcode.SQLStatement,
	} {
		_, err := f.applierErr(Config{Mode: ModeSQL, Statement: stmt, Params: []string{"$.x"}})
		if !errcode.Is(err, code) {
			t.Errorf("%q: %v, want %s", stmt, err, code)
		}
	}
	_, err := f.applierErr(Config{Mode: ModeSQL, Statement: "SELECT $1::int, $3::int", Params: []string{"$.a", "$.b", "$.c"}})
	if !errcode.Is(err, errcode.SQLParamsMismatch) {
		t.Errorf("gap: %v", err)
	}
}

// TestUpsertEmptyStringKey: an empty string is a key value like any other (a text key may hold
// it); only an absent or null key column refuses the message. Two writes of the key "" in one
// batch fold into rounds, so the later one wins without a 21000.
func TestUpsertEmptyStringKey(t *testing.T) {
	f := startPG(t)
	for _, c := range []struct {
		name, ddl, key string
		msgs           []string
		want           []Outcome
		rows           string
	}{
		{"one key column", `(id text PRIMARY KEY, v int)`, "id",
			[]string{`{"id":"","v":1}`, `{"id":"","v":2}`, `{"id":null,"v":3}`, `{"v":4}`, `{"id":"a","v":5}`},
			[]Outcome{Applied, Applied, Failed, Failed, Applied}, "=2,a=5"},
		{"two key columns", `(id text, k text, v int, PRIMARY KEY (id, k))`, "id,k",
			[]string{`{"id":"","k":"","v":1}`, `{"id":"","k":"","v":2}`, `{"id":"","k":null,"v":3}`, `{"id":"","k":"x","v":4}`},
			[]Outcome{Applied, Applied, Failed, Applied}, "=2,x=4"},
	} {
		t.Run(c.name, func(t *testing.T) {
			table := f.name("ek")
			f.exec(t, `CREATE TABLE `+table+` `+c.ddl)
			a := f.applier(t, Config{Table: table, Mode: ModeUpsert})
			var msgs []*Message
			for i, p := range c.msgs {
				// the first two (the same key) in shard 0 in order, the rest one shard each: a
				// refused message blocks no other
				shard, off := int32(max(i-1, 0)), int64(1)
				if i == 1 {
					off = 2
				}
				msgs = append(msgs, msg("q", shard, off, p))
			}
			res := write(t, a, msgs...)
			for i, o := range c.want {
				if res.Outcomes[i] != o {
					t.Fatalf("outcomes %v, want %v (%v)", res.Outcomes, c.want, res.Errs)
				}
			}
			last := "id"
			if strings.Contains(c.key, ",") {
				last = "k"
			}
			if got := strings.Join(f.queryStrings(t, `SELECT `+last+` || '=' || v FROM `+table+` ORDER BY 1`), ","); got != c.rows {
				t.Fatalf("rows %s, want %s", got, c.rows)
			}
		})
	}
}

// TestModeMismatchHints: change events and envelopes (DESIGN §2) sent to upsert have no key column
// at the top level; the refusal says what they are and names mode cdc, while a row without its
// key, and an event-shaped payload for a table with an op column, keep the plain one. A row sent to
// cdc has no op; its refusal names mode upsert. An envelope or an event sent to append is refused
// as one too, unless the table has an op or after column (a log of events) or keeps the payload
// whole (metadata payload).
func TestModeMismatchHints(t *testing.T) {
	f := startPG(t)
	rowsTable, opTable := f.name("rows"), f.name("ops")
	f.exec(t, `CREATE TABLE `+rowsTable+` (id int PRIMARY KEY, v text)`)
	f.exec(t, `CREATE TABLE `+opTable+` (id int PRIMARY KEY, op text, "table" text, after jsonb)`)
	event := `{"op":"c","table":"public.x","key":{"id":1},"after":{"id":1,"v":"x"},"before":null,"lsn":"0/1","ts":"2026-10-03T06:15:03.583036Z","seq":0}`
	for _, c := range []struct {
		table, payload string
		cdcHint        bool
	}{
		{rowsTable, event, true},
		{rowsTable, `{"op":"d","table":"public.t","key":{"id":1}}`, true},
		{rowsTable, `{"table":"public.t","op":"c","after":{"id":1}}`, true}, // op not first: found by its missing key
		{rowsTable, `{"op":"x","id":"pg:1","lsn":"0/1","part":1,"last":true,"events":[` + event + `]}`, true},
		{rowsTable, `{"v":"no key"}`, false},
		{opTable, `{"op":"c","table":"public.t","after":{"id":1}}`, false},
	} {
		a := f.applier(t, Config{Table: c.table, Mode: ModeUpsert})
		res := write(t, a, msg("q", 0, 1, c.payload))
		err := res.Errs[0]
		if res.Outcomes[0] != Failed || !errcode.Is(err, errcode.BadPayload) || !strings.Contains(err.Error(), "no non-null value for key") && !strings.Contains(err.Error(), "not a row") {
			t.Fatalf("%s: %v %v, want bad_payload", c.payload, res.Outcomes, err)
		}
		if hint := (strings.Contains(err.Error(), "is a change event") || strings.Contains(err.Error(), "is an envelope")) &&
			strings.Contains(err.Error(), "Fix: set mode: cdc"); hint != c.cdcHint {
			t.Errorf("%s: %v, want the cdc hint %v", c.payload, err, c.cdcHint)
		}
	}
	a := f.applier(t, Config{Table: rowsTable, Mode: ModeCDC})
	res := write(t, a, msg("q", 0, 1, `{"id":1,"v":"a row"}`))
	if err := res.Errs[0]; res.Outcomes[0] != Failed || !errcode.Is(err, errcode.BadPayload) ||
		!strings.Contains(err.Error(), "Fix: if the queue holds rows rather than change events, set mode: upsert") {
		t.Errorf("a row in mode cdc: %v %v", res.Outcomes, err)
	}
	// append takes an envelope or a change event for what it is too, in its streamed COPY and after
	// it, unless the table has the columns to hold it
	env := `{"op":"x","id":"pg:1","lsn":"0/1","part":1,"last":true,"events":[` + event + `]}`
	app := f.applier(t, Config{Table: rowsTable, Mode: ModeAppend})
	res = write(t, app, msg("q", 0, 1, `{"id":7,"v":"a"}`), msg("q", 0, 2, env), msg("q", 1, 1, `{"id":8,"v":"b"}`), msg("q", 2, 1, event))
	if res.Outcomes[0] != Applied || res.Outcomes[2] != Applied || !errcode.Is(res.Errs[1], errcode.BadPayload) || !errcode.Is(res.Errs[3], errcode.BadPayload) ||
		!strings.Contains(res.Errs[1].Error(), "is an envelope") || !strings.Contains(res.Errs[3].Error(), "is a change event") ||
		!strings.Contains(res.Errs[1].Error(), "set mode: cdc") {
		t.Errorf("an envelope and an event in mode append: %v %v", res.Outcomes, res.Errs)
	}
	logTable, bodyTable := f.name("log"), f.name("body")
	f.exec(t, `CREATE TABLE `+logTable+` (op text, "table" text, key jsonb, after jsonb);
		CREATE TABLE `+bodyTable+` (message_id text, body jsonb)`)
	log := f.applier(t, Config{Table: logTable, Mode: ModeAppend})
	if res := write(t, log, msg("q", 0, 1, event)); res.Applied != 1 {
		t.Errorf("a change event appended to a log of events: %v", res.Errs)
	}
	body := f.applier(t, Config{Table: bodyTable, Mode: ModeAppend, UnknownKeys: UnknownKeysIgnore,
		Metadata: MetadataColumns{MessageID: "message_id", Payload: "body"}})
	if res := write(t, body, msg("q", 0, 1, event), msg("q", 0, 2, env)); res.Applied != 2 {
		t.Errorf("events kept whole in a payload column: %v", res.Errs)
	}
}

// TestPartialRowsKeepRequiredColumns: PostgreSQL checks NOT NULL on the row an upsert would insert
// before it finds the conflict, so a cdc u whose unchanged TOASTed value is in a NOT NULL column
// (or an upsert payload that leaves such a column out) must still update the stored row, keeping
// that column; where no row is stored the write is the data error it always was. Batches mix the
// partial and whole rows, and a key change moves a row keeping the column. A c that lists
// unchanged columns writes only over a stored row.
func TestPartialRowsKeepRequiredColumns(t *testing.T) {
	f := startPG(t)
	rows := func(t *testing.T, table string) string {
		return strings.Join(f.queryStrings(t, `SELECT concat_ws('/', id, a, big, n, dom, dd, ck) FROM `+table+` ORDER BY id`), ",")
	}
	f.exec(t, `CREATE DOMAIN required_text AS text NOT NULL; CREATE DOMAIN defaulted_text AS text NOT NULL DEFAULT 'd'`)
	ddl := ` (id int PRIMARY KEY, a text, big text NOT NULL, n int NOT NULL DEFAULT 7, g int GENERATED ALWAYS AS (n * 2) STORED,
		dom required_text, dd defaulted_text, ck text, CHECK (ck IS NOT NULL))`
	t.Run("cdc", func(t *testing.T) {
		table := f.name("nn")
		f.exec(t, `CREATE TABLE `+table+ddl)
		a := f.applier(t, Config{Table: table, Mode: ModeCDC})
		ev := func(op, id, after, before, unchanged string) string {
			return `{"op":"` + op + `","table":"public.x","key":{"id":` + id + `},"after":` + after + `,"before":` + before + `,"unchanged":` + unchanged + `}`
		}
		res := write(t, a, msg("q", 0, 1, ev("c", "1", `{"id":1,"a":"x","big":"LONG1","n":1,"dom":"D1","ck":"K1"}`, "null", "null")),
			msg("q", 0, 2, ev("c", "2", `{"id":2,"a":"x","big":"LONG2","n":2,"dom":"D2","ck":"K2"}`, "null", "null")),
			msg("q", 0, 3, ev("c", "3", `{"id":3,"a":"x","big":"LONG3","n":3,"dom":"D3","ck":"K3"}`, "null", "null")))
		if res.Applied != 3 {
			t.Fatal(res.Errs)
		}
		res = write(t, a,
			msg("q", 0, 4, ev("u", "1", `{"id":1,"a":"y","n":10}`, "null", `["big"]`)),
			msg("q", 0, 5, ev("u", "2", `{"id":2,"a":"z","big":"NEW2","n":20}`, "null", "null")),
			msg("q", 0, 6, ev("u", "9", `{"id":9,"a":"moved","n":30}`, `{"id":3}`, `["big"]`)),
			msg("q", 1, 1, ev("u", "5", `{"id":5,"a":"never stored","n":5}`, "null", `["big"]`)))
		if want := []Outcome{Applied, Applied, Applied, Failed}; !slices.Equal(res.Outcomes, want) {
			t.Fatalf("outcomes %v, want %v: %v", res.Outcomes, want, res.Errs)
		}
		if !strings.Contains(res.Errs[3].Error(), "23502") {
			t.Errorf("the row never stored: %v", res.Errs[3])
		}
		if got := rows(t, table); got != "1/y/LONG1/10/D1/d/K1,2/z/NEW2/20/D2/d/K2,9/moved/LONG3/30/D3/d/K3" {
			t.Fatalf("rows %q", got)
		}

		// A c that lists unchanged columns (pg_cdc's key change whose new row was gone when its
		// values were read back; its d follows) writes only over a stored row: absent, it is
		// applied as nothing, whether the column is required or not, on the path that maps after
		// from its bytes and on the one through a map (after names a column unchanged lists).
		res = write(t, a,
			msg("q", 2, 1, ev("c", "7", `{"id":7,"a":"gone","n":7,"dom":"D7","ck":"K7"}`, "null", `["big"]`)),
			msg("q", 2, 2, ev("c", "8", `{"id":8,"big":"B8","n":8,"dom":"D8","ck":"K8"}`, "null", `["a"]`)),
			msg("q", 2, 3, ev("c", "6", `{"id":6,"a":"gone","big":"dropped","n":6,"dom":"D6","ck":"K6"}`, "null", `["big"]`)),
			msg("q", 2, 4, ev("c", "1", `{"id":1,"a":"over stored","n":11}`, "null", `["big"]`)),
			msg("q", 3, 1, ev("c", "10", `{"id":10,"a":"x","n":1,"dom":"D","ck":"K"}`, "null", `["big"]`)),
			msg("q", 3, 2, `{"op":"d","table":"public.x","key":{"id":10},"after":null,"before":{"id":10}}`))
		if res.Applied != 6 {
			t.Fatalf("c with unchanged columns: %v %v", res.Outcomes, res.Errs)
		}
		if got := rows(t, table); got != "1/over stored/LONG1/11/D1/d/K1,2/z/NEW2/20/D2/d/K2,9/moved/LONG3/30/D3/d/K3" {
			t.Fatalf("rows after c with unchanged columns %q", got)
		}
	})
	t.Run("upsert", func(t *testing.T) {
		table := f.name("nn")
		f.exec(t, `CREATE TABLE `+table+ddl)
		a := f.applier(t, Config{Table: table, Mode: ModeUpsert})
		res := write(t, a, msg("q", 0, 1, `{"id":1,"a":"x","big":"B","dom":"D","ck":"K"}`), msg("q", 0, 2, `{"id":1,"a":"updated"}`),
			msg("q", 0, 3, `{"id":2,"a":"no big"}`))
		if want := []Outcome{Applied, Applied, Failed}; !slices.Equal(res.Outcomes, want) {
			t.Fatalf("outcomes %v, want %v: %v", res.Outcomes, want, res.Errs)
		}
		if got := rows(t, table); got != "1/updated/B/7/D/d/K" {
			t.Fatalf("rows %q", got)
		}
	})
}
