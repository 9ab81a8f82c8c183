package tests

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/sink"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// peakRSS is a process's peak resident set (VmHWM) in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// TestSinkHostileInput feeds the real redis_queue input → pg_sink (cdc mode) pipeline change events
// that are malformed JSON, not UTF-8, wrongly typed (an op that is a number, a key that is an array,
// a column value PostgreSQL refuses), over the 64 MiB payload limit, of an unknown op, without a
// key, or an envelope with one such event (none of its events written), each placed first, in the
// middle or last of a partition among good events. Each is
// dead-lettered after max_attempts with its coded error, every partition carries on past it, and
// the table holds exactly the last good write of every row. The sink refuses the 64 MiB payload
// before parsing it: its peak RSS stays within a few copies of the message.
func TestSinkHostileInput(t *testing.T) {
	pg := testenv.StartPostgres(t)
	r := testenv.StartRedis(t)
	ctx := context.Background()
	pg.Exec(`CREATE TABLE items (id int PRIMARY KEY, v text, n int)`)

	huge := make([]byte, 0, sink.MaxPayloadBytes+200)
	huge = append(huge, `{"op":"c","key":{"id":301},"after":{"id":301,"n":1,"v":"`...)
	for len(huge) < sink.MaxPayloadBytes+100 {
		huge = append(huge, "0123456789abcdef"...)
	}
	huge = append(huge, `"}}`...)
	poisons := []struct {
		id, partition string
		pos           string // first, middle or last of its partition
		payload       string
		code          string // how the dead letter's error starts
	}{
		{"malformed", "p1", "first", `{"op":"c","key":{"id":101},"after":{"id":101,`, "bad_payload: payload is not valid JSON"},
		{"not-utf8", "p1", "last", "{\"op\":\"c\",\"key\":{\"id\":102},\"after\":{\"id\":102,\"v\":\"\xff\xfe\"}}", "bad_payload: payload is not valid JSON (invalid UTF-8"},
		{"op-number", "p2", "middle", `{"op":5,"key":{"id":201},"after":{"id":201,"v":"x"}}`, "bad_payload: change event op is not a string"},
		{"key-array", "p2", "last", `{"op":"d","key":[201]}`, "bad_payload: change event key is not an object"},
		{"value-type", "p3", "middle", `{"op":"u","key":{"id":301},"after":{"id":301,"n":"not a number"}}`, "22P02: invalid input syntax for type integer"},
		{"huge", "p3", "first", string(huge), "payload_too_large: payload is"},
		{"unknown-op", "p4", "middle", `{"op":"z","key":{"id":401},"after":{"id":401}}`, `bad_payload: unknown change event op "z"`},
		{"no-key", "p5", "first", `{"op":"c","key":null,"after":{"v":"no key"}}`, "bad_payload: c event has no non-null value for key column(s) [id]"},
		{"not-object", "p5", "middle", `[1,2,3]`, "bad_payload: payload is JSON but not an object"},
		{"envelope", "p6", "last", `{"op":"x","id":"pg:1","events":[{"op":"u","key":{"id":601},"after":{"id":601,"v":"never","n":0}},{"op":"d","key":[601]}]}`,
			"bad_payload: envelope event 1: change event key is not an object"},
	}
	// good events: each partition pK writes rows K01..K03, several times; the last write wins
	perPartition := map[string][]sinkMessage{}
	want := map[int]string{}
	seq := 0
	for k := 1; k <= 6; k++ {
		p := fmt.Sprintf("p%d", k)
		for round := 1; round <= 4; round++ {
			for j := 1; j <= 3; j++ {
				id := k*100 + j
				seq++
				v := fmt.Sprintf("v%d-%d", id, round)
				perPartition[p] = append(perPartition[p], sinkMessage{partition: p, id: fmt.Sprintf("good-%d", seq),
					payload: fmt.Sprintf(`{"op":"c","table":"public.items","key":{"id":%d},"after":{"id":%d,"v":%q,"n":%d},"before":null}`, id, id, v, seq)})
				want[id] = fmt.Sprintf("%s/%d", v, seq)
			}
		}
	}
	for _, p := range poisons {
		perPartition[p.partition] = insertAt(perPartition[p.partition], sinkMessage{partition: p.partition, id: p.id, payload: p.payload}, p.pos)
	}
	var lists [][]sinkMessage
	for k := 1; k <= 6; k++ {
		lists = append(lists, perPartition[fmt.Sprintf("p%d", k)])
	}
	queueMessages(t, r.URL(), "items", 4, interleave(lists), 20)
	p := startSinkPipeline(t, itemsCopy(r.URL(), pg.DSN(), "cdc", 16, 2))
	waitDrained(t, r, "items", len(poisons), p)
	rss := peakRSS(t, p.Pid())
	p.Kill()
	t.Logf("sink peak RSS %d MiB with a %d MiB message", rss>>20, len(huge)>>20)
	if limit := int64(8 * len(huge)); rss > limit {
		t.Errorf("sink peak RSS %d MiB, over %d MiB (8 × the largest message)", rss>>20, limit>>20)
	}

	dls, err := queue.ListDeadLetters(ctx, r.Client(), queue.NewLayout("pgrelay"), "items", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	payloads := map[string]string{}
	for _, d := range dls {
		got[d.MessageID] = d.Error
		payloads[d.MessageID] = d.Payload
		if d.Attempts != 2 {
			t.Errorf("dead letter %s after %d attempts, want 2", d.MessageID, d.Attempts)
		}
	}
	for _, ps := range poisons {
		e, ok := got[ps.id]
		if !ok {
			t.Errorf("%s not dead-lettered (dead letters: %v)", ps.id, sinkSorted(keysOf(got)))
			continue
		}
		if !strings.HasPrefix(e, ps.code) {
			t.Errorf("%s dead-lettered with %q, want %q...", ps.id, e, ps.code)
		}
		if payloads[ps.id] != ps.payload {
			t.Errorf("%s: the dead letter's payload (%d bytes) is not the message's (%d bytes)", ps.id, len(payloads[ps.id]), len(ps.payload))
		}
		delete(got, ps.id)
	}
	if len(got) > 0 {
		t.Errorf("good messages dead-lettered: %v", got)
	}
	rows, err := pg.Pool().Query(ctx, `SELECT id, v || '/' || n FROM items`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id int
		var vn string
		if err := rows.Scan(&id, &vn); err != nil {
			t.Fatal(err)
		}
		if vn != want[id] {
			t.Errorf("row %d = %s, want %s", id, vn, want[id])
		}
		n++
	}
	if n != len(want) {
		t.Errorf("%d rows, want %d", n, len(want))
	}
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
