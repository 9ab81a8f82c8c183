package sink

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

func TestSplitStatement(t *testing.T) {
	cases := []struct {
		name, stmt string
		want       []string // each part as "sql | params"
	}{
		{"one statement is left as written", "UPDATE a SET b = $2 WHERE id = $1", []string{"UPDATE a SET b = $2 WHERE id = $1 | [0 1]"}},
		{"two statements share the numbering", "INSERT INTO c VALUES ($1, $2); UPDATE d SET n = n + 1 WHERE id = $1",
			[]string{"INSERT INTO c VALUES ($1, $2) | [0 1]", "UPDATE d SET n = n + 1 WHERE id = $1 | [0]"}},
		{"a part that skips a number is renumbered", "SELECT $2; SELECT $3::int, $1, $3",
			[]string{"SELECT $1 | [1]", "SELECT $2::int, $1, $2 | [0 2]"}},
		{"empty parts and comment-only parts are left out", " ; SELECT 1;; -- just a comment\n; /* c */ ;\n",
			[]string{"SELECT 1 | []"}},
		{"a statement without params", "DELETE FROM x; SELECT $1", []string{"DELETE FROM x | []", "SELECT $1 | [0]"}},
		{"semicolons and $n inside literals, identifiers, dollar quotes and comments stay",
			`SELECT ';$9', ";$8", $$ ; $7 $$, $f$ ; $f$, E'\'; $6', $1 -- ; $5` + "\n" + `/* ; /* nested ; */ $4 */; SELECT $1`,
			[]string{`SELECT ';$9', ";$8", $$ ; $7 $$, $f$ ; $f$, E'\'; $6', $1 -- ; $5` + "\n" + `/* ; /* nested ; */ $4 */ | [0]`, "SELECT $1 | [0]"}},
		{"a $n glued to an identifier is not a placeholder", "SELECT a$1 FROM t$2; SELECT $1", []string{"SELECT a$1 FROM t$2 | []", "SELECT $1 | [0]"}},
		{"a standard string does not escape with a backslash", `SELECT 'a\'; SELECT $1`, []string{`SELECT 'a\' | []`, "SELECT $1 | [0]"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, p := range splitStatement(c.stmt) {
				got = append(got, fmt.Sprintf("%s | %v", p.sql, p.params))
			}
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Fatalf("split %q:\n got  %q\n want %q", c.stmt, got, c.want)
			}
		})
	}
}

func TestStatements(t *testing.T) {
	sqls, params := Statements("SELECT $2; SELECT $1, $3")
	if fmt.Sprint(sqls, params) != "[SELECT $1 SELECT $1, $2] [[1] [0 2]]" {
		t.Fatalf("Statements: %q %v", sqls, params)
	}
}

func TestSQLPartArgs(t *testing.T) {
	all := []any{"a", "b", "c"}
	for _, c := range []struct {
		params []int
		want   string
	}{{nil, "[]"}, {[]int{1}, "[b]"}, {[]int{0, 2}, "[a c]"}, {[]int{0, 1, 2}, "[a b c]"}} {
		if got := fmt.Sprint(sqlPart{params: c.params}.args(all)); got != c.want {
			t.Errorf("params %v: %s, want %s", c.params, got, c.want)
		}
	}
}

func TestParamCountAcrossStatements(t *testing.T) {
	for _, c := range []struct {
		stmt   string
		params int
		ok     bool
	}{
		{"SELECT $1; SELECT $2", 2, true},
		{"SELECT $2; SELECT $1", 2, true},
		{"SELECT $1; SELECT $3", 3, false},
		{"SELECT $1; SELECT $2", 1, false},
		{"SELECT '$2'; SELECT $1", 1, true},
	} {
		params := make([]string, c.params)
		for i := range params {
			params[i] = "$"
		}
		err := checkParamCount(c.stmt, params)
		if (err == nil) != c.ok || err != nil && !errcode.Is(err, errcode.SQLParamsMismatch) {
			t.Errorf("%q with %d params: err = %v", c.stmt, c.params, err)
		}
	}
	cfg := Config{Name: "s", Mode: ModeSQL, Statement: " ;\n -- nothing\n;"}
	if err := cfg.Validate(); !errcode.Is(err, errcode.SinkConfig) {
		t.Errorf("a statement of only semicolons and comments: %v", err)
	}
}

// TestSQLModeSeveralStatements: the statements of one message run in order in the batch's
// transaction (the second sees what the first wrote, and what earlier messages wrote), share the
// params, are checked one by one at start, and a data error in any of them rolls back the whole
// message only.
func TestSQLModeSeveralStatements(t *testing.T) {
	f := startPG(t)
	f.exec(t, `CREATE TABLE lines (doc bigint, line int, amount numeric NOT NULL CHECK (amount >= 0), PRIMARY KEY (doc, line))`)
	f.exec(t, `CREATE TABLE totals (doc bigint PRIMARY KEY, total numeric NOT NULL, line_count int NOT NULL, last_offset bigint)`)
	const stmt = `
		INSERT INTO lines VALUES ($1::bigint, $2::int, $3::numeric)
		ON CONFLICT (doc, line) DO UPDATE SET amount = EXCLUDED.amount;
		-- rebuilt from the lines, which include the one just written
		INSERT INTO totals
		SELECT $1::bigint, sum(amount), count(*), $4::bigint FROM lines WHERE doc = $1::bigint
		ON CONFLICT (doc) DO UPDATE SET total = EXCLUDED.total, line_count = EXCLUDED.line_count, last_offset = EXCLUDED.last_offset;`
	params := []string{"$.doc", "$.line", "$.amount", "@offset"}
	a := f.applier(t, Config{Mode: ModeSQL, Statement: stmt, Params: params})

	t.Run("later statements see earlier ones, also of earlier messages of the batch", func(t *testing.T) {
		res := write(t, a,
			msg("q", 0, 1, `{"doc":1,"line":1,"amount":"10.50"}`),
			msg("q", 0, 2, `{"doc":1,"line":2,"amount":2}`),
			msg("q", 1, 1, `{"doc":2,"line":1,"amount":7}`),
			msg("q", 0, 3, `{"doc":1,"line":1,"amount":"0.25"}`))
		if res.Applied != 4 {
			t.Fatalf("outcomes %v %v", res.Outcomes, res.Errs)
		}
		got := strings.Join(f.queryStrings(t, `SELECT concat_ws(':', doc, total, line_count, last_offset) FROM totals ORDER BY doc`), ",")
		if got != "1:2.25:2:3,2:7:1:1" {
			t.Fatalf("totals %s", got)
		}
	})
	t.Run("a data error in the second statement rolls back the first of its message only", func(t *testing.T) {
		f.exec(t, `ALTER TABLE totals ADD CHECK (total < 1000)`)
		res := write(t, a,
			msg("q", 2, 1, `{"doc":3,"line":1,"amount":5}`),
			msg("q", 2, 2, `{"doc":3,"line":2,"amount":5000}`), // the line is fine, the total is not
			msg("q", 3, 1, `{"doc":4,"line":1,"amount":-1}`),   // the first statement fails
			msg("q", 4, 1, `{"doc":5,"line":1,"amount":1}`))
		want := []Outcome{Applied, Failed, Failed, Applied}
		for i, o := range want {
			if res.Outcomes[i] != o {
				t.Fatalf("outcomes %v, want %v (%v)", res.Outcomes, want, res.Errs)
			}
		}
		if e := res.Errs[1].Error(); !strings.HasPrefix(e, "23514: ") || !strings.Contains(e, `"totals"`) {
			t.Errorf("error of the second statement: %q", e)
		}
		if got := strings.Join(f.queryStrings(t, `SELECT doc || '/' || line || '=' || amount FROM lines WHERE doc >= 3 ORDER BY doc, line`), ","); got != "3/1=5,5/1=1" {
			t.Fatalf("lines %s", got)
		}
		if got := strings.Join(f.queryStrings(t, `SELECT doc || '=' || total FROM totals WHERE doc >= 3 ORDER BY doc`), ","); got != "3=5,5=1" {
			t.Fatalf("totals %s", got)
		}
	})
	t.Run("each statement is checked at start", func(t *testing.T) {
		_, err := f.applierErr(Config{Mode: ModeSQL, Statement: "SELECT $1::int; UPDATE no_such_table SET x = $2::int", Params: []string{"$.a", "$.b"}})
		if !errcode.Is(err, errcode.SQLStatement) || !strings.Contains(err.Error(), "statement 2 of 2") {
			t.Errorf("missing table in the second statement: %v", err)
		}
	})
}
