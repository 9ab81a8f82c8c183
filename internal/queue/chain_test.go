package queue

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// chainedCover is cover(pos) on chain ch, following prev ("" for the first of the chain).
func chainedCover(cover func(string) *Cover, ch *Chain, pos, prev string) *Cover {
	c := cover(pos)
	c.Chain, c.Prev = ch, prev
	return c
}

type writeResult struct {
	res Result
	err error
}

// writeAsync runs w.Write in the background.
func writeAsync(ctx context.Context, w *Writer, msgs []Message, c *Cover) <-chan writeResult {
	out := make(chan writeResult, 1)
	go func() {
		res, err := w.Write(ctx, msgs, c)
		out <- writeResult{res, err}
	}()
	return out
}

// TestChainQueuesBehindTheWriteInFlight: the second of two chained batches sends its entries
// while the first write's replies have not reached the writer (the proxy holds them), and both
// land exactly once, the pointer at the second's cover. Written one after the other, the second
// batch would send nothing before the first write's reply.
func TestChainQueuesBehindTheWriteInFlight(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	p := testenv.StartHoldProxy(t, r.Addr())
	prdb := redis.NewClient(&redis.Options{Addr: p.Addr()})
	defer prdb.Close()
	q := "chained"
	_, ptrKey, cover := leasedSource(t, rdb, q)
	w := NewWriter(prdb, WriterConfig{Shards: 4})
	defer w.Close()
	b0, b1, b2 := batchOf(q, "zero", 20, 6), batchOf(q, "one", 30, 6), batchOf(q, "two", 40, 6)
	if res, err := w.Write(ctx, b0, cover("0001")); err != nil || res != ResultOK {
		t.Fatalf("first batch: %v %v", res, err)
	}
	ch := NewChain()
	ch.Expect("0002")
	ch.Expect("0003")
	p.Hold()
	one := writeAsync(ctx, w, b1, chainedCover(cover, ch, "0002", ""))
	if !p.WaitSent(`one-29`, 5*time.Second) {
		t.Fatal("the first chained batch was not sent")
	}
	two := writeAsync(ctx, w, b2, chainedCover(cover, ch, "0003", "0002"))
	if !p.WaitSent(`two-39`, 5*time.Second) || p.Pipelined() == 0 {
		p.Release()
		t.Fatal("the second batch sent nothing while the first write's reply was held")
	}
	p.Release()
	for i, c := range []<-chan writeResult{one, two} {
		if r := <-c; r.err != nil || r.res != ResultOK {
			t.Fatalf("batch %d: %v %v", i+1, r.res, r.err)
		}
	}
	checkQueue(t, rdb, w.Layout(), q, b0, b1, b2)
	if got := rdb.Get(ctx, ptrKey).Val(); got != `{"pos":"0003"}` {
		t.Fatalf("pointer %s", got)
	}

	// a run of chained batches, each handed out while the one before is written
	ch2 := NewChain()
	prev := "0003"
	var runs []<-chan writeResult
	all := [][]Message{b0, b1, b2}
	for i := 4; i < 24; i++ {
		pos := "00" + strconv.Itoa(i/10) + strconv.Itoa(i%10)
		ch2.Expect(pos)
		b := batchOf(q, "run"+pos, 25, 5)
		all = append(all, b)
		runs = append(runs, writeAsync(ctx, w, b, chainedCover(cover, ch2, pos, prev)))
		if len(runs) >= 2 {
			if r := <-runs[len(runs)-2]; r.err != nil || r.res != ResultOK {
				t.Fatalf("run batch: %v %v", r.res, r.err)
			}
		}
		prev = pos
	}
	if r := <-runs[len(runs)-1]; r.err != nil || r.res != ResultOK {
		t.Fatalf("last run batch: %v %v", r.res, r.err)
	}
	checkQueue(t, rdb, w.Layout(), q, all...)
	if got := rdb.Get(ctx, ptrKey).Val(); got != `{"pos":"0023"}` {
		t.Fatalf("pointer %s", got)
	}
}

// TestChainChangesInTheWindow makes each change of keyChanges while two chained batches are in
// flight: after the first write's EXEC and the second's entries queued behind it, before the
// second's EXEC (the proxy holds the replies meanwhile). The second write's EXEC aborts, and it
// is written the usual way: fenced, duplicate or exactly once, as the queue and pointer read
// back show. Then the first write's EXEC is made to abort (the change lands before it): the
// second batch, queued behind it, is discarded and written only once the first is in.
func TestChainChangesInTheWindow(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	for i, c := range keyChanges(t, rdb) {
		for _, before := range []bool{false, true} {
			name := c.name + ", after the first EXEC"
			if before {
				name = c.name + ", before the first EXEC"
			}
			t.Run(name, func(t *testing.T) {
				q := "window" + strconv.Itoa(i)
				if before {
					q += "b"
				}
				leaseKey, ptrKey, cover := leasedSource(t, rdb, q)
				p := testenv.StartHoldProxy(t, r.Addr())
				prdb := redis.NewClient(&redis.Options{Addr: p.Addr()})
				defer prdb.Close()
				w := NewWriter(prdb, WriterConfig{Shards: 4})
				defer w.Close()
				zero, first, second := batchOf(q, "zero", 10, 6), batchOf(q, "first", 20, 6), batchOf(q, "second", 30, 6)
				if res, err := w.Write(ctx, zero, cover("0000")); err != nil || res != ResultOK {
					t.Fatalf("batch 0: %v %v", res, err)
				}
				ch := NewChain()
				ch.Expect("0001")
				ch.Expect("0003")
				if before {
					c.change(q, leaseKey, ptrKey) // after the priming reads the first write checks
				}
				p.Hold()
				one := writeAsync(ctx, w, first, chainedCover(cover, ch, "0001", ""))
				two := writeAsync(ctx, w, second, chainedCover(cover, ch, "0003", "0001"))
				if !p.WaitSent(`second-29`, 5*time.Second) {
					p.Release()
					t.Fatal("the second batch was not queued behind the first")
				}
				if !before {
					c.change(q, leaseKey, ptrKey)
				}
				p.Release()
				r1, r2 := <-one, <-two
				checkWindow(t, rdb, w, q, ptrKey, c, before, zero, first, second, r1, r2)
			})
		}
	}
}

// checkWindow checks the outcome of TestChainChangesInTheWindow's two writes (the first at cover
// 0001, the second at 0003 following it) and reads the queue and the pointer back.
func checkWindow(t *testing.T, rdb *redis.Client, w *Writer, q, ptrKey string, c keyChange, before bool,
	zero, first, second []Message, r1, r2 writeResult) {
	t.Helper()
	ctx := context.Background()
	firstIn, want1 := true, writeResult{res: ResultOK}
	switch {
	case c.code != "" && before: // fenced before the first EXEC: neither goes in
		firstIn = false
	case c.moved != "" && before: // the pointer moved past the first cover before it went in
		firstIn, want1 = false, writeResult{res: ResultDuplicate}
	case c.shards != 4 && !before: // the queue was made again after the first batch went in
		firstIn = false
	}
	if c.code != "" && before {
		if !errcode.Is(r1.err, c.code) {
			t.Fatalf("first: %v, want code %s", r1, c.code)
		}
	} else if r1 != want1 {
		t.Fatalf("first: %v, want %v", r1, want1)
	}
	switch {
	case c.code != "":
		if !errcode.Is(r2.err, c.code) {
			t.Fatalf("second: %v, want code %s", r2, c.code)
		}
	case r2.err != nil || r2.res != c.want:
		t.Fatalf("second: %v, want %v", r2, c.want)
	}
	var batches [][]Message
	if c.shards == 4 {
		batches = append(batches, zero)
	}
	if firstIn {
		batches = append(batches, first)
	}
	if c.second {
		batches = append(batches, second)
	}
	if c.other {
		batches = append(batches, batchOf(q, "other", 7, 7))
	}
	checkQueue(t, rdb, w.Layout(), q, batches...)
	ptr := c.ptr
	if c.code != "" {
		ptr = map[bool]string{false: "0001", true: "0000"}[before]
	}
	if got := rdb.Get(ctx, ptrKey).Val(); got != `{"pos":"`+ptr+`"}` {
		t.Fatalf("pointer %s, want pos %s", got, ptr)
	}
}

// TestChainNeverSkipsABatch: a batch whose predecessor is not in the stored pointer is refused
// with ErrBehind and writes nothing, as a transaction and as the script.
func TestChainNeverSkipsABatch(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	for _, script := range []bool{false, true} {
		name := map[bool]string{false: "transaction", true: "script"}[script]
		t.Run(name, func(t *testing.T) {
			q := "skip" + name
			_, ptrKey, cover := leasedSource(t, rdb, q)
			w := NewWriter(rdb, WriterConfig{Shards: 4})
			w.scriptOnly = script
			defer w.Close()
			zero, second := batchOf(q, "zero", 10, 6), batchOf(q, "second", 30, 6)
			if res, err := w.Write(ctx, zero, cover("0001")); err != nil || res != ResultOK {
				t.Fatalf("batch 0: %v %v", res, err)
			}
			for _, c := range []*Cover{
				{Prev: "0002"},                    // no chain: the usual way
				{Prev: "0002", Chain: NewChain()}, // a chain that does not know 0002
			} {
				cv := cover("0003")
				cv.Prev, cv.Chain = c.Prev, c.Chain
				res, err := w.Write(ctx, second, cv)
				if !errors.Is(err, ErrBehind) {
					t.Fatalf("%v %v, want ErrBehind", res, err)
				}
			}
			checkQueue(t, rdb, w.Layout(), q, zero)
			if got := rdb.Get(ctx, ptrKey).Val(); got != `{"pos":"0001"}` {
				t.Fatalf("pointer %s", got)
			}
			// once the batch before is in, the same write goes
			cv := cover("0003")
			cv.Prev = "0001"
			if res, err := w.Write(ctx, second, cv); err != nil || res != ResultOK {
				t.Fatalf("%v %v", res, err)
			}
			checkQueue(t, rdb, w.Layout(), q, zero, second)
		})
	}
}
