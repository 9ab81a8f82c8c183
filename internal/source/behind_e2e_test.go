package source_test

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
)

// TestBatchesFillWhileBehind: transactions committed at a pace well below load_linger's rate
// (one per 25 ms, 40/s, where load_linger 100ms waits from 80/s) but reaching pg_cdc 1 s after
// their commit, through a connection that holds what the server sends (the stream behind the
// writers), go several to a batch; the same pace caught up went one to a batch before. Every
// event is read back exactly once, in commit order.
func TestBatchesFillWhileBehind(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY)`)
	proxy := newDelayProxy(t, e.pg.Port)
	rec := fmt.Sprint("lag-", time.Now().UnixNano()) // the recording's name, new in every run
	startStream(t, fmt.Sprintf(`
input:
  pg_cdc:
    name: lag
    dsn: %s
    tls: {mode: disable}
    tables: [{table: s, queue: q}]
    redis: {url: %s}
    lease_ttl: 3s
    load_linger: 100ms
output:
  pgrelay_test_record: {name: %s}
logger: {level: warn}
`, strings.Replace(e.pg.DSN(), fmt.Sprintf(":%d/", e.pg.Port), fmt.Sprintf(":%d/", proxy.port()), 1), e.rd.URL(), rec))
	e.waitPointer("lag", "q")

	c := e.conn()
	commit := func(from, to int) {
		start := time.Now()
		for id := from; id < to; id++ {
			time.Sleep(time.Until(start.Add(time.Duration(id-from) * 25 * time.Millisecond)))
			if _, err := c.Exec(e.ctx, `INSERT INTO s VALUES ($1)`, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	const caughtUp, all = 10, 70
	commit(0, caughtUp) // the meter's baseline: transactions delivered as they commit
	recordedBatches(t, rec, caughtUp)
	proxy.delay.Store(int64(time.Second))
	commit(caughtUp, all)
	batches := recordedBatches(t, rec, all)

	var ids []int64
	var late, lateBatches int
	for _, b := range batches {
		for _, id := range b {
			ids = append(ids, id)
		}
		if b[0] >= caughtUp {
			late, lateBatches = late+len(b), lateBatches+1
		}
	}
	for i, id := range ids {
		if id != int64(i) {
			t.Fatalf("events read back %v, want 0-%d once each, in order", ids, all-1)
		}
	}
	if per := float64(late) / float64(lateBatches); per < 2.5 {
		t.Fatalf("behind the writers: %d events in %d batches (%.1f per batch), want several per batch; batches %v", late, lateBatches, per, batches)
	}
}

// delayProxy forwards TCP connections to a local port, holding what the server sends for delay
// (none at first) before passing it on, in order; what the client sends goes through at once.
type delayProxy struct {
	ln    net.Listener
	delay atomic.Int64 // ns
}

func newDelayProxy(t *testing.T, port int) *delayProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &delayProxy{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c, port)
		}
	}()
	return p
}

func (p *delayProxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *delayProxy) serve(c net.Conn, port int) {
	defer c.Close()
	s, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return
	}
	defer s.Close()
	go func() {
		_, _ = io.Copy(s, c)
		s.Close()
	}()
	type chunk struct {
		at time.Time
		b  []byte
	}
	chunks := make(chan chunk, 4096)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := s.Read(buf)
			if n > 0 {
				chunks <- chunk{time.Now().Add(time.Duration(p.delay.Load())), buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for ch := range chunks {
		time.Sleep(time.Until(ch.at))
		if _, err := c.Write(ch.b); err != nil {
			return
		}
	}
}

// recordedBatches waits until the pgrelay_test_record output named name received n messages and
// returns the row ids of each batch it received.
func recordedBatches(t *testing.T, name string, n int) [][]int64 {
	t.Helper()
	cdctest.Wait(t, 30*time.Second, fmt.Sprintf("%d events recorded", n), func() (bool, string) {
		got := len(recordedOf(name))
		return got >= n, fmt.Sprint(got)
	})
	recorded.Lock()
	defer recorded.Unlock()
	rows := recorded.rows[name]
	var out [][]int64
	for _, size := range recorded.batches[name] {
		b := make([]int64, size)
		for i := range b {
			b[i] = rows[i].id
		}
		out, rows = append(out, b), rows[size:]
	}
	return out
}
