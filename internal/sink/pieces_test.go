package sink

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPieceBounds(t *testing.T) {
	for _, c := range []struct {
		n    int
		want string
	}{
		{0, ""},
		{63, ""},
		{64, "0-32 32-64"},
		{100, "0-32 32-100"},
		{128, "0-32 32-128"},
		{300, "0-75 75-300"},
		{2000, "0-500 500-2000"},
	} {
		var got []string
		end := 0
		for _, p := range pieceBounds(c.n) {
			if p[0] != end || p[1] <= p[0] {
				t.Errorf("n=%d: piece %v after %d", c.n, p, end)
			}
			end = p[1]
			got = append(got, fmt.Sprintf("%d-%d", p[0], p[1]))
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("n=%d: %q, want %q", c.n, strings.Join(got, " "), c.want)
		}
	}
}

// A batch of 300 messages goes in two pieces (one INSERT each, counted by a statement trigger),
// and the table is what applying the messages one by one in offset order gives: a key written in
// the first piece and again in the second keeps the last value; in cdc mode a key inserted in the
// first piece and deleted in the second is gone, and a key change in the second piece moves the
// row. A payload that does not decode in the second piece, after the first was sent, rolls it
// back and the batch goes the regular way: that message fails (its shard's later messages wait),
// the others are applied. A redelivered batch whose first messages were applied before is refused
// by the guard in the first piece and applied past them.
func TestLargeBatchGoesInPieces(t *testing.T) {
	f := startPG(t)
	type row struct{ v, n string }
	for _, mode := range []Mode{ModeUpsert, ModeCDC} {
		t.Run(string(mode), func(t *testing.T) {
			table := f.name("pieces")
			f.exec(t, `CREATE TABLE `+table+` (id int PRIMARY KEY, v text, n int)`)
			f.exec(t, `CREATE TABLE `+table+`_stmts (n int)`)
			f.exec(t, `CREATE FUNCTION `+table+`_count() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN INSERT INTO `+table+`_stmts VALUES (1); RETURN NULL; END $$`)
			f.exec(t, `CREATE TRIGGER count_inserts AFTER INSERT ON `+table+` FOR EACH STATEMENT EXECUTE FUNCTION `+table+`_count()`)
			a := f.applier(t, Config{Table: table, Mode: mode})
			model := map[string]row{}
			payload := func(op string, id int, v string, n int) string {
				if mode == ModeUpsert {
					return fmt.Sprintf(`{"id":%d,"v":%q,"n":%d}`, id, v, n)
				}
				switch op {
				case "d":
					return fmt.Sprintf(`{"op":"d","key":{"id":%d},"after":null}`, id)
				case "move":
					return fmt.Sprintf(`{"op":"u","key":{"id":%d},"after":{"id":%d,"v":%q,"n":%d},"before":{"id":%d}}`, id, id, v, n, n)
				}
				return fmt.Sprintf(`{"op":"c","key":{"id":%d},"after":{"id":%d,"v":%q,"n":%d}}`, id, id, v, n)
			}
			// 300 messages on shard 0, offsets 1..300; the pieces are messages 0-74 and 75-299
			build := func(bad int) []*Message {
				var msgs []*Message
				for i := 0; i < 300; i++ {
					id, v, op := i+1, fmt.Sprintf("v%d", i), "c"
					switch {
					case i == 250: // the second piece writes key 5 (first piece) again
						id, v = 5, "again"
					case mode == ModeCDC && i == 100: // the second piece deletes key 10 (first piece)
						id, op = 10, "d"
					case mode == ModeCDC && i == 280: // the second piece moves key 20 (first piece) to 1020
						id, op = 1020, "move"
					}
					p := payload(op, id, v, 20)
					if op != "move" {
						p = payload(op, id, v, i)
					}
					if i == bad {
						p = `{"id":` // does not decode
					}
					msgs = append(msgs, msg("q", 0, int64(i+1), p))
				}
				return msgs
			}
			apply := func(i int, bad int) {
				if i == bad {
					return
				}
				switch {
				case i == 250:
					model["5"] = row{"again", "250"}
				case mode == ModeCDC && i == 100:
					delete(model, "10")
				case mode == ModeCDC && i == 280:
					delete(model, "20")
					model["1020"] = row{fmt.Sprintf("v%d", i), "20"}
				default:
					model[fmt.Sprint(i+1)] = row{fmt.Sprintf("v%d", i), fmt.Sprint(i)}
				}
			}
			check := func(what string) {
				t.Helper()
				got := f.queryStrings(t, `SELECT id || '=' || v || '/' || n AS x FROM `+table+` ORDER BY id`)
				var want []string
				for _, k := range slices.Sorted(maps.Keys(model)) {
					want = append(want, k+"="+model[k].v+"/"+model[k].n)
				}
				slices.Sort(got)
				slices.Sort(want)
				if strings.Join(got, ",") != strings.Join(want, ",") {
					t.Fatalf("%s: table differs from the model:\n got %v\nwant %v", what, got, want)
				}
			}

			// the first 100 messages as a batch of their own: applied (in pieces: 0-32, 32-100)
			first := build(-1)[:100]
			if res := write(t, a, first...); res.Applied != 100 {
				t.Fatalf("first 100: %+v", res)
			}
			for i := 0; i < 100; i++ {
				apply(i, -1)
			}
			check("first 100")
			if got := f.one(t, `SELECT count(*)::text FROM `+table+`_stmts`); got != "2" {
				t.Fatalf("%s INSERT statements for a 100-message batch, want 2 (its two pieces)", got)
			}

			// the whole batch redelivered: the guard refuses in the first piece; applied past 100
			res := write(t, a, build(-1)...)
			if res.Skipped != 100 || res.Applied != 200 {
				t.Fatalf("redelivered batch: %d applied, %d skipped", res.Applied, res.Skipped)
			}
			for i := 100; i < 300; i++ {
				apply(i, -1)
			}
			check("redelivered batch")

			// the same 300 messages on shard 1 into the emptied table: in pieces, one INSERT each
			f.exec(t, `TRUNCATE `+table+`, `+table+`_stmts`)
			model = map[string]row{}
			for i := 0; i < 300; i++ {
				apply(i, -1)
			}
			fresh := build(-1)
			for _, m := range fresh {
				m.Shard, m.Partition = 1, "p1"
			}
			if res := write(t, a, fresh...); res.Applied != 300 {
				t.Fatalf("fresh batch: %+v", res)
			}
			check("fresh batch")
			want := map[Mode]string{ModeUpsert: "2", ModeCDC: "3"}[mode] // cdc: the move ends a round
			if got := f.one(t, `SELECT count(*)::text FROM `+table+`_stmts`); got != want {
				t.Fatalf("%s INSERT statements for a 300-message batch, want %s (one per piece)", got, want)
			}

			// a batch on shard 2 whose message 200 (second piece) does not decode
			f.exec(t, `TRUNCATE `+table)
			model = map[string]row{}
			bad := build(200)
			for _, m := range bad {
				m.Shard, m.Partition = 2, "p2"
			}
			res = write(t, a, bad...)
			if res.Outcomes[200] != Failed || res.Applied != 200 || res.Blocked != 99 {
				t.Fatalf("batch with a bad payload: %d applied, %d failed, %d blocked, message 200 %v", res.Applied, res.Failed, res.Blocked, res.Outcomes[200])
			}
			for i := 0; i < 200; i++ {
				apply(i, 200)
			}
			check("batch with a bad payload")
		})
	}
}

// The pieces of a batch go in one pipeline by statements prepared on the connection. A second
// piece with a column set the first did not have needs a statement the connection has not
// prepared: what was sent is settled, the statement prepared, and the rest goes on in the same
// transaction; the batch after it, of the same shapes, goes by the prepared statements. A message
// of the second piece that PostgreSQL refuses (a CHECK) fails the whole pipelined transaction, the
// COMMIT sent behind it included: nothing of the batch stays but what the regular path then applies
// (the messages before it), and the message fails.
func TestPiecesPrepareAndFailInOnePipeline(t *testing.T) {
	f := startPG(t)
	table := f.name("piped")
	f.exec(t, `CREATE TABLE `+table+` (id int PRIMARY KEY, v text, n int CHECK (n < 1000))`)
	f.exec(t, `CREATE TABLE `+table+`_stmts (n int)`)
	f.exec(t, `CREATE FUNCTION `+table+`_count() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO `+table+`_stmts VALUES (1); RETURN NULL; END $$`)
	f.exec(t, `CREATE TRIGGER count_inserts AFTER INSERT ON `+table+` FOR EACH STATEMENT EXECUTE FUNCTION `+table+`_count()`)
	a := f.applier(t, Config{Table: table, Mode: ModeUpsert})
	// 300 messages of one shard (pieces 0-74 and 75-299); in the second piece every odd message
	// has no n (a second column set); bad: the message whose n breaks the CHECK (-1: none)
	build := func(shard int32, base, bad int) ([]*Message, []string) {
		var msgs []*Message
		var want []string
		for i := 0; i < 300; i++ {
			id := base + i
			p, row := fmt.Sprintf(`{"id":%d,"v":"v%d","n":%d}`, id, i, i), fmt.Sprintf("%d=v%d/%d", id, i, i)
			if i >= 75 && i%2 == 1 {
				p, row = fmt.Sprintf(`{"id":%d,"v":"v%d"}`, id, i), fmt.Sprintf("%d=v%d/<null>", id, i)
			}
			if i == bad {
				p = fmt.Sprintf(`{"id":%d,"v":"v%d","n":5000}`, id, i)
			}
			msgs = append(msgs, msg("q", shard, int64(i+1), p))
			if bad < 0 || i < bad {
				want = append(want, row)
			}
		}
		return msgs, want
	}
	rows := func() []string {
		got := f.queryStrings(t, `SELECT id || '=' || v || '/' || coalesce(n::text, '<null>') FROM `+table)
		slices.Sort(got)
		return got
	}
	for round, shard := range []int32{0, 1} { // the second round: every statement prepared
		f.exec(t, `TRUNCATE `+table+`, `+table+`_stmts`)
		msgs, want := build(shard, 0, -1)
		if res := write(t, a, msgs...); res.Applied != 300 {
			t.Fatalf("round %d: %+v", round, res)
		}
		slices.Sort(want)
		if got := rows(); !slices.Equal(got, want) {
			t.Fatalf("round %d: table differs:\n got %v\nwant %v", round, got, want)
		}
		// one INSERT for the first piece, one per column set for the second
		if got := f.one(t, `SELECT count(*)::text FROM `+table+`_stmts`); got != "3" {
			t.Fatalf("round %d: %s INSERT statements, want 3", round, got)
		}
	}
	f.exec(t, `TRUNCATE `+table)
	msgs, want := build(2, 0, 200)
	res := write(t, a, msgs...)
	if res.Outcomes[200] != Failed || res.Applied != 200 || res.Blocked != 99 {
		t.Fatalf("batch with a refused row: %d applied, %d failed, %d blocked, message 200 %v", res.Applied, res.Failed, res.Blocked, res.Outcomes[200])
	}
	slices.Sort(want)
	if got := rows(); !slices.Equal(got, want) {
		t.Fatalf("batch with a refused row: table differs:\n got %v\nwant %v", got, want)
	}
}

// A batch in pieces whose COMMIT fails (a deferred foreign key checked only then) keeps nothing of
// the pipelined transaction: the regular path then applies the messages before the refused one,
// fails it and blocks its shard's later messages, as for a row refused by a statement.
func TestPiecesCommitFailure(t *testing.T) {
	f := startPG(t)
	table := f.name("piped_commit")
	f.exec(t, `CREATE TABLE `+table+`_parent (id int PRIMARY KEY)`)
	f.exec(t, `INSERT INTO `+table+`_parent SELECT generate_series(0, 299)`)
	f.exec(t, `CREATE TABLE `+table+` (id int PRIMARY KEY, v text,
		n int REFERENCES `+table+`_parent DEFERRABLE INITIALLY DEFERRED)`)
	a := f.applier(t, Config{Table: table, Mode: ModeUpsert})
	var msgs []*Message
	for i := 0; i < 300; i++ {
		n := i
		if i == 200 { // no such parent: refused at COMMIT
			n = 5000
		}
		msgs = append(msgs, msg("q", 0, int64(i+1), fmt.Sprintf(`{"id":%d,"v":"v%d","n":%d}`, i, i, n)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := a.Write(ctx, msgs)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	if res.Outcomes[200] != Failed || res.Applied != 200 || res.Blocked != 99 {
		t.Fatalf("%d applied, %d failed, %d blocked, message 200 %v; want 200, 1, 99, failed", res.Applied, res.Failed, res.Blocked, res.Outcomes[200])
	}
	if got := f.one(t, `SELECT count(*) || ' ' || max(id) FROM `+table); got != "200 199" {
		t.Fatalf("rows (count, max id) %s, want 200 199: the ids before the refused one", got)
	}
}
