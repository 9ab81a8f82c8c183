package queue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// sentinelClient is the failover client pgrelay builds for the setup's sentinels.
func sentinelClient(t *testing.T, rs *testenv.RedisSentinel) redis.UniversalClient {
	t.Helper()
	conn := redisconn.Config{Sentinel: &redisconn.Sentinel{MasterName: testenv.SentinelMaster, Addrs: rs.SentinelAddrs()}}
	rdb, err := conn.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// ids lists the message ids of queue q (one shard), read through rdb.
func ids(t *testing.T, rdb redis.UniversalClient, l Layout, q string) []string {
	t.Helper()
	var out []string
	for i := 0; ; i++ {
		xs, err := rdb.XRange(context.Background(), l.Stream(q, 0), "-", "+").Result()
		if err == nil {
			for _, x := range xs {
				for _, e := range EntriesOf(nil, x) {
					out = append(out, e.MessageID)
				}
			}
			return out
		}
		if i > 250 { // the client may need a moment to reach the new master
			t.Fatalf("read %s: %v", q, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSentinelFailoverDurability shows what each durability promises across a Sentinel failover
// when the replica did not receive a write: the replica is paused (SIGSTOP) and cut off, a batch is
// written, the master is SIGKILLed, the replica resumes and is promoted.
//   - aof: the batch was acknowledged (it was on the master's disk) and is lost.
//   - {replicas: 1}: the batch was refused with replicas_shortfall, so nothing acknowledged is lost;
//     once the old master is back as a replica (and the sentinels settled), writes through the same
//     client are acknowledged again.
//
// The AOF check runs on the failover client, before and after the failover.
func TestSentinelFailoverDurability(t *testing.T) {
	for _, c := range []struct {
		name string
		dur  Durability
	}{
		{"aof", Durability{AOF: true}},
		{"replicas", Durability{Replicas: 1, WaitTimeout: 3 * time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			rs := testenv.StartRedisSentinel(t, 1)
			master, replica := rs.Nodes[0], rs.Nodes[1]
			rdb := sentinelClient(t, rs)
			w := NewWriter(rdb, WriterConfig{Shards: 1, Durability: c.dur, RetryFor: -1})
			if err := w.Connect(ctx); err != nil {
				t.Fatalf("connect: %v", err)
			}
			if _, err := w.Write(ctx, msgs("q", 3, 1), nil); err != nil {
				t.Fatalf("first batch: %v", err)
			}
			rs.WaitReplicated(master, 10*time.Second)
			// The link being up is not enough: wait until the replica holds the first batch.
			deadline := time.Now().Add(10 * time.Second)
			for n := int64(0); n != 3; {
				if time.Now().After(deadline) {
					t.Fatalf("the replica holds %d of the first batch's 3 entries", n)
				}
				n = int64(len(ids(t, replica.Client(), w.Layout(), "q")))
				if n != 3 {
					time.Sleep(10 * time.Millisecond)
				}
			}

			// The replica stops, and the master drops its link (so nothing more reaches the
			// replica's socket): from now on the replica receives nothing.
			replica.Pause()
			if err := master.Client().ClientKillByFilter(ctx, "TYPE", "replica").Err(); err != nil {
				t.Fatal(err)
			}
			second := msgs("q", 5, 1)[3:]
			_, err := w.Write(ctx, second, nil)
			master.Kill()
			replica.Resume()
			promoted := rs.WaitPromoted(master, 30*time.Second)
			if promoted != replica {
				t.Fatalf("promoted %s", promoted.Addr())
			}
			got := ids(t, rdb, w.Layout(), "q")
			if fmt.Sprint(got) != "[m0 m1 m2]" {
				t.Fatalf("after the failover the queue holds %v, want the first batch only", got)
			}
			switch {
			case c.dur.AOF && err != nil:
				t.Fatalf("aof: the second batch was not acknowledged: %v", err)
			case c.dur.AOF:
				t.Logf("aof: the second batch was acknowledged and is lost: the queue holds %v", got)
			case !errcode.Is(err, errcode.ReplicasShortfall):
				t.Fatalf("replicas: the second batch: %v, want replicas_shortfall", err)
			default:
				t.Logf("replicas: the second batch was refused (%v); nothing acknowledged is lost", err)
			}
			if err := CheckAOF(ctx, rdb); err != nil {
				t.Fatalf("AOF check on the new master: %v", err)
			}
			if c.dur.Replicas == 0 {
				return
			}
			rs.Rejoin(master, promoted)
			rs.WaitSettled(30 * time.Second) // whichever node the sentinels settle on, with its replica
			if _, err := w.Write(ctx, second, nil); err != nil {
				t.Fatalf("after the old master came back as a replica: %v", err)
			}
			// The refused batch was on the old master's disk: a refusal promises nothing acknowledged
			// is lost, not that the batch is absent. When the sentinels settle on the old node before it
			// has replaced its data with the new master's, that copy survives before the one written now
			// (a plain producer's write has no cover to make the second a duplicate).
			switch got := fmt.Sprint(ids(t, rdb, w.Layout(), "q")); got {
			case "[m0 m1 m2 m3 m4]":
			case "[m0 m1 m2 m3 m4 m3 m4]":
				t.Logf("the refused batch survived on the old master: queue %s", got)
			default:
				t.Fatalf("queue %s", got)
			}
		})
	}
}

func TestFailoverWarning(t *testing.T) {
	for _, c := range []struct {
		dur      Durability
		failover bool
		want     bool
	}{
		{Durability{AOF: true}, true, true},
		{Durability{AOF: true}, false, false},
		{Durability{Replicas: 1}, true, false},
		{Durability{}, true, false},
	} {
		if got := c.dur.FailoverWarning(c.failover) != ""; got != c.want {
			t.Errorf("%+v failover %v: warning %v", c.dur, c.failover, got)
		}
	}
}
