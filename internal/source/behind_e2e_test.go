package source_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

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
	rec := newBatchRecorder(t)
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
  batch_recorder: {name: %s}
logger: {level: warn}
`, strings.Replace(e.pg.DSN(), fmt.Sprintf(":%d/", e.pg.Port), fmt.Sprintf(":%d/", proxy.port()), 1), e.rd.URL(), rec.name))
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
	rec.wait(t, caughtUp)
	proxy.delay.Store(int64(time.Second))
	commit(caughtUp, all)
	batches := rec.wait(t, all)

	var ids []int
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
		if id != i {
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

// batchRecorder is a Benthos output that records the ids (after.id) of each batch it receives.
type batchRecorder struct {
	name    string
	mu      sync.Mutex
	batches [][]int
}

var recorders sync.Map // name → *batchRecorder

func init() {
	service.MustRegisterBatchOutput("batch_recorder", service.NewConfigSpec().Field(service.NewStringField("name")),
		func(conf *service.ParsedConfig, _ *service.Resources) (service.BatchOutput, service.BatchPolicy, int, error) {
			name, err := conf.FieldString("name")
			if err != nil {
				return nil, service.BatchPolicy{}, 0, err
			}
			r, ok := recorders.Load(name)
			if !ok {
				return nil, service.BatchPolicy{}, 0, fmt.Errorf("no batch recorder %q", name)
			}
			return r.(*batchRecorder), service.BatchPolicy{}, 1, nil
		})
}

func newBatchRecorder(t *testing.T) *batchRecorder {
	r := &batchRecorder{name: t.Name()}
	recorders.Store(r.name, r)
	t.Cleanup(func() { recorders.Delete(r.name) })
	return r
}

func (r *batchRecorder) Connect(context.Context) error { return nil }
func (r *batchRecorder) Close(context.Context) error   { return nil }

func (r *batchRecorder) WriteBatch(_ context.Context, b service.MessageBatch) error {
	ids := make([]int, 0, len(b))
	for _, m := range b {
		p, err := m.AsBytes()
		if err != nil {
			return err
		}
		var ev struct {
			After struct {
				ID int `json:"id"`
			} `json:"after"`
		}
		if err := json.Unmarshal(p, &ev); err != nil {
			return err
		}
		ids = append(ids, ev.After.ID)
	}
	r.mu.Lock()
	r.batches = append(r.batches, ids)
	r.mu.Unlock()
	return nil
}

// wait waits until n events were recorded and returns the batches.
func (r *batchRecorder) wait(t *testing.T, n int) [][]int {
	t.Helper()
	var out [][]int
	cdctest.Wait(t, 30*time.Second, fmt.Sprintf("%d events recorded", n), func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		out = append(out[:0], r.batches...)
		got := 0
		for _, b := range out {
			got += len(b)
		}
		return got >= n, fmt.Sprint(got)
	})
	return out
}
