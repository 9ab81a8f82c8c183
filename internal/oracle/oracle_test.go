package oracle

import (
	"fmt"
	"strings"
	"testing"
)

// ev builds an entry: shard 0, the given offset, partition = key text.
func ev(off int64, id, payload string) Entry {
	p := "p"
	if i := strings.Index(payload, `"key":{"id":`); i >= 0 {
		p = payload[i+12 : i+13]
	}
	return Entry{Shard: 0, Off: off, Partition: p, ID: id, Payload: []byte(payload)}
}

func payload(op, key, after, unchanged, lsn string) string {
	u := ""
	if unchanged != "" {
		u = `,"unchanged":[` + unchanged + `]`
	}
	return fmt.Sprintf(`{"op":"%s","table":"public.t","key":{"id":%s},"after":%s,"before":null%s,"lsn":"%s","xid":1,"ts":"x","seq":0}`,
		op, key, after, u, lsn)
}

// good is a correct queue: row 1 inserted, updated with an unchanged column, row 2 inserted and deleted.
func good() []Entry {
	return []Entry{
		ev(1, "a", payload("c", "1", `{"id":1,"v":"x","big":"B"}`, "", "0/10")),
		ev(2, "b", payload("u", "1", `{"id":1,"v":"y"}`, `"big"`, "0/20")),
		ev(3, "c", payload("c", "2", `{"id":2,"v":"z","big":null}`, "", "0/20")),
		ev(4, "d", payload("d", "2", `null`, "", "0/30")),
	}
}

func table() map[string]Row {
	return map[string]Row{`id=1;`: {"id": "1", "v": `"y"`, "big": `"B"`}}
}

func check(entries []Entry) []string {
	r := Replay(entries)
	return append(r.Problems, Compare(r.Tables["public.t"], table())...)
}

func TestOracleAcceptsACorrectQueue(t *testing.T) {
	if p := check(good()); len(p) != 0 {
		t.Fatal(p)
	}
}

func TestOracleRefusesDamage(t *testing.T) {
	for name, damage := range map[string]func([]Entry) []Entry{
		"duplicate id": func(e []Entry) []Entry { e[2].ID = "a"; return e },
		"lsn going back": func(e []Entry) []Entry {
			e[1].Payload = []byte(strings.Replace(string(e[1].Payload), "0/20", "0/5", 1))
			return e
		},
		"lost insert": func(e []Entry) []Entry { return append(e[1:2], e[2:]...) },
		"lost delete": func(e []Entry) []Entry { return e[:3] },
		"wrong value": func(e []Entry) []Entry {
			e[1].Payload = []byte(strings.Replace(string(e[1].Payload), `"y"`, `"q"`, 1))
			return e
		},
		"offset gap":            func(e []Entry) []Entry { e[3].Off = 9; return e },
		"key in two partitions": func(e []Entry) []Entry { e[1].Partition = "other"; return e },
		"unchanged with no earlier value": func(e []Entry) []Entry {
			e[0].Payload = []byte(payload("c", "1", `{"id":1,"v":"x"}`, `"big"`, "0/10"))
			return e
		},
	} {
		if p := check(damage(good())); len(p) == 0 {
			t.Errorf("%s: not detected", name)
		}
	}
}

// A table without a key (append-only, `key` null) replays as a multiset of rows: two equal rows
// are two rows, so a lost or a repeated insert shows.
func TestOracleComparesKeylessRowsAsAMultiset(t *testing.T) {
	ins := func(off int64, id, after string) Entry {
		return Entry{Off: off, Partition: "all", ID: id,
			Payload: []byte(`{"op":"c","table":"public.log","key":null,"after":` + after + `,"before":null,"lsn":"0/10","xid":1,"ts":"x","seq":0}`)}
	}
	queue := []Entry{ins(1, "a", `{"m":"x","n":1}`), ins(2, "b", `{"m":"x","n":1}`), ins(3, "c", `{"m":"y","n":null}`)}
	rows := map[string]Row{}
	for _, r := range []Row{{"m": `"x"`, "n": "1"}, {"m": `"y"`, "n": "null"}, {"m": `"x"`, "n": "1"}} {
		rows[multisetKey(rows, r)] = r
	}
	for name, c := range map[string]struct {
		queue []Entry
		diffs int
	}{
		"equal":           {queue, 0},
		"an insert lost":  {queue[1:], 1},
		"an insert twice": {append(append([]Entry(nil), queue...), ins(4, "d", `{"m":"y","n":null}`)), 1},
		"another value":   {[]Entry{queue[0], queue[1], ins(3, "c", `{"m":"z","n":null}`)}, 2},
	} {
		r := Replay(c.queue)
		if d := Compare(r.Tables["public.log"], rows); len(d) != c.diffs || len(r.Problems) != 0 {
			t.Errorf("%s: %d differences (%v), %d problems (%v), want %d differences", name, len(d), d, len(r.Problems), r.Problems, c.diffs)
		}
	}
}

// The good queue's events in envelopes: one per transaction (lsn), the second in two parts.
func enveloped() []Entry {
	inner := func(i int) string { return string(good()[i].Payload) }
	env := func(off int64, id, lsn string, part int, last bool, events ...string) Entry {
		return Entry{Off: off, Partition: "all", ID: fmt.Sprintf("%s:t%d", id, part),
			Payload: []byte(fmt.Sprintf(`{"op":"x","id":"%s","lsn":"%s","xid":1,"ts":"x","part":%d,"last":%v,"events":[%s]}`,
				id, lsn, part, last, strings.Join(events, ",")))}
	}
	return []Entry{
		env(1, "pg:e:10", "0/10", 1, true, inner(0)),
		env(2, "pg:e:20", "0/20", 1, false, inner(1)),
		env(3, "pg:e:20", "0/20", 2, true, inner(2)),
		env(4, "pg:e:30", "0/30", 1, true, inner(3)),
	}
}

func TestOracleReplaysEnvelopes(t *testing.T) {
	if p := check(enveloped()); len(p) != 0 {
		t.Fatal(p)
	}
	if r := Replay(enveloped()); r.Events != 4 || r.Envelopes != 4 || len(r.Complete) != 3 {
		t.Errorf("%d events, %d envelopes, %d transactions complete", r.Events, r.Envelopes, len(r.Complete))
	}
	for name, damage := range map[string]func([]Entry) []Entry{
		"a part lost":             func(e []Entry) []Entry { return append(e[:1], e[2:]...) },
		"the last part lost":      func(e []Entry) []Entry { return append(e[:2], e[3:]...) },
		"a part twice (other id)": func(e []Entry) []Entry { d := e[2]; d.ID += "x"; d.Off = 5; return append(e, d) },
		"parts out of order":      func(e []Entry) []Entry { e[1].Off, e[2].Off = 3, 2; e[1], e[2] = e[2], e[1]; return e },
		"an event of another transaction": func(e []Entry) []Entry {
			e[0].Payload = []byte(strings.Replace(string(e[0].Payload), `"lsn":"0/10","xid":1,"ts":"x","seq"`, `"lsn":"0/11","xid":1,"ts":"x","seq"`, 1))
			return e
		},
	} {
		if p := check(damage(enveloped())); len(p) == 0 {
			t.Errorf("%s: not detected", name)
		}
	}
}
