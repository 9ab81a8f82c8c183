package queue

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestChainMultiPieceWaitsForPrev: a chained batch that cannot follow on the connection
// (it is written in several pieces) must still wait for the write of the batch before it instead
// of racing it: written at once, it reads the pointer below Prev and is refused (ErrBehind) though
// nothing failed, so the source nacks and re-sends every second batch.
func TestChainMultiPieceWaitsForPrev(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	q := "multipiece"
	_, _, cover := leasedSource(t, rdb, q)
	w := NewWriter(rdb, WriterConfig{Shards: 4, MaxScriptMessages: 4})
	defer w.Close()
	b0, b1, b2 := batchOf(q, "zero", 3, 3), batchOf(q, "one", 3, 3), batchOf(q, "two", 6, 3)
	if res, err := w.Write(ctx, b0, cover("0001")); err != nil || res != ResultOK {
		t.Fatalf("first batch: %v %v", res, err)
	}
	ch := NewChain()
	ch.Expect("0002")
	ch.Expect("0003")
	held, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	w.beforeExec = func() {
		if calls.Add(1) == 1 {
			close(held)
			<-release // the first write is slow to reach its EXEC
		}
	}
	one := writeAsync(ctx, w, b1, chainedCover(cover, ch, "0002", ""))
	<-held
	two := writeAsync(ctx, w, b2, chainedCover(cover, ch, "0003", "0002"))
	time.Sleep(200 * time.Millisecond)
	close(release)
	for i, c := range []<-chan writeResult{one, two} {
		if r := <-c; r.err != nil || r.res != ResultOK {
			t.Errorf("batch %d: %v %v", i+1, r.res, r.err)
		}
	}
}

// TestStalePrimedReadsAreNotBehind: a write with Prev that takes a connection primed before
// the batch at Prev went in (on another connection) must not be refused as behind on those old
// reads: the pointer only moves forward, so what they showed below Prev may no longer hold. (A
// priming's reads are checked by its WATCH only when EXEC runs; a refusal sends no EXEC.)
func TestStalePrimedReadsAreNotBehind(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	q := "stale"
	leaseKey, _, cover := leasedSource(t, rdb, q)
	w := NewWriter(rdb, WriterConfig{Shards: 4})
	defer w.Close()
	b0, b1, b2 := batchOf(q, "zero", 6, 3), batchOf(q, "one", 6, 3), batchOf(q, "two", 6, 3)
	if res, err := w.Write(ctx, b0, cover("0001")); err != nil || res != ResultOK {
		t.Fatalf("batch 0: %v %v", res, err)
	}
	// the connection primed by batch 0 stays out of the pool while batch 1 goes on another one
	err := w.raw.Run(ctx, leaseKey, func(*redisconn.RawConn) error {
		c := cover("0002")
		c.Prev = "0001"
		if res, err := w.Write(ctx, b1, c); err != nil || res != ResultOK {
			t.Errorf("batch 1: %v %v", res, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c := cover("0003")
	c.Prev = "0002"
	if res, err := w.Write(ctx, b2, c); err != nil || res != ResultOK {
		t.Fatalf("batch 2 (its batch before is in): %v %v", res, err)
	}
	checkQueue(t, rdb, w.Layout(), q, b0, b1, b2)
}

// TestChainRetryReopensWhileFollowerReads: the second write joins the first write's opening
// and waits for it to read its replies (link.read) and looks at link.applied. The first write's
// EXEC aborts (a lease renewal): it retries on another primed connection, which opens the same
// link again (opened replaces read, closeLink writes applied), while the follower still reads
// those fields without the chain's lock: a data race (go test -race).
func TestChainRetryReopensWhileFollowerReads(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	px := testenv.StartHoldProxy(t, r.Addr())
	prdb := redis.NewClient(&redis.Options{Addr: px.Addr()})
	defer prdb.Close()
	q := "reopen"
	leaseKey, ptrKey, cover := leasedSource(t, rdb, q)
	w := NewWriter(prdb, WriterConfig{Shards: 4})
	defer w.Close()
	b0, b1, b2, bx := batchOf(q, "zero", 6, 3), batchOf(q, "one", 6, 3), batchOf(q, "two", 6, 3), batchOf(q, "x", 6, 3)
	if res, err := w.Write(ctx, b0, cover("0001")); err != nil || res != ResultOK {
		t.Fatalf("batch 0: %v %v", res, err)
	}
	// two connections primed with the same reads: A (batch 0's) goes stale while batch x goes
	// on B, then an attempt on A that aborts primes it afresh
	err := w.raw.Run(ctx, leaseKey, func(*redisconn.RawConn) error { // holds A
		if res, err := w.Write(ctx, bx, cover("0002")); err != nil || res != ResultOK { // on B
			t.Errorf("batch x: %v %v", res, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = w.raw.Run(ctx, leaseKey, func(*redisconn.RawConn) error { // holds A (the pool's last)
		return w.raw.Run(ctx, leaseKey, func(conn *redisconn.RawConn) error { // B
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	// now the pool is [B, A] or [A, B]: prime the stale one afresh with an attempt that aborts
	for range 2 {
		_ = w.raw.Run(ctx, leaseKey, func(conn *redisconn.RawConn) error {
			pr, _ := conn.State.(*primed)
			if pr == nil || pr.st.stored == `{"pos":"0002"}` {
				return nil // not the stale one: look at the next
			}
			p, err := w.plan(ctx, b1)
			if err != nil {
				return err
			}
			var aborted *ownView
			_, err = w.txAttempt(ctx, conn, p, b1, cover("0003"), true, &aborted)
			if !errors.Is(err, errTxConflict) {
				t.Errorf("priming attempt: %v, want a conflict", err)
			}
			return nil
		})
	}
	ch := NewChain()
	ch.Expect("0003")
	ch.Expect("0004")
	var calls atomic.Int32
	w.beforeExec = func() {
		if calls.Add(1) == 1 { // a renewal of the lease: the first EXEC aborts, the reads stay the same
			tok := rdb.Get(ctx, leaseKey).Val()
			rdb.Set(ctx, leaseKey, tok, redis.KeepTTL)
		}
	}
	px.Hold()
	two := writeAsync(ctx, w, b2, chainedCover(cover, ch, "0004", "0003"))
	one := writeAsync(ctx, w, b1, chainedCover(cover, ch, "0003", ""))
	if !px.WaitSent(`two-5`, 5*time.Second) {
		px.Release()
		t.Fatal("the second batch was not queued behind the first")
	}
	px.Release()
	for i, c := range []<-chan writeResult{one, two} {
		if r := <-c; r.err != nil || r.res != ResultOK {
			t.Errorf("batch %d: %v %v", i+1, r.res, r.err)
		}
	}
	checkQueue(t, rdb, w.Layout(), q, b0, bx, b1, b2)
	if got := rdb.Get(ctx, ptrKey).Val(); got != `{"pos":"0004"}` {
		t.Fatalf("pointer %s", got)
	}
}
