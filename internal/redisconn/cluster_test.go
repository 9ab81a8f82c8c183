package redisconn

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestMasterPipelineFollowsRedirects moves a key's (empty) slot to another master behind the
// client's back, and then marks it as migrating to a third one: MasterPipeline follows the MOVED
// answer (the stale slot map is reloaded) and then the ASK answer, and each time the commands run
// on the node that serves the key, on one connection (WAIT sees the write).
func TestMasterPipelineFollowsRedirects(t *testing.T) {
	t.Parallel()
	rc := testenv.StartRedisCluster(t)
	ctx := context.Background()
	cc := NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs()})
	defer cc.Close()
	key := "pgrelay:{redirect}:k"
	owner, others := slotOwners(rc, key)
	write := func(v string) []redis.Cmder {
		cmds, err := MasterPipeline(ctx, cc, key, func(p redis.Pipeliner) {
			p.Set(ctx, key, v, 0)
			p.Do(ctx, "wait", 0, 0)
		})
		if err != nil {
			t.Fatalf("MasterPipeline: %v", err)
		}
		return cmds
	}
	if cmds := write("a"); len(cmds) != 2 {
		t.Fatalf("%d commands returned", len(cmds))
	}

	// MOVED: the slot (emptied first) now belongs to others[0]; the client's map still says owner.
	cc.Del(ctx, key)
	moveSlot(t, rc, key, others[0])
	if m, err := cc.MasterForKey(ctx, key); err != nil || m.Options().Addr != owner.Addr() {
		t.Fatalf("the client's map changed by itself: %v %v", m, err)
	}
	write("b")
	if v := others[0].Client().Get(ctx, key).Val(); v != "b" {
		t.Fatalf("after MOVED: %s holds %q", others[0].Addr(), v)
	}
	if m, _ := cc.MasterForKey(ctx, key); m.Options().Addr != others[0].Addr() {
		t.Fatalf("slot map not reloaded: master %s", m.Options().Addr)
	}

	// ASK: others[0] migrates the slot to others[1]; a key it does not hold is answered with ASK.
	cc.Del(ctx, key)
	migrateSlot(t, key, others[0], others[1])
	cmds := write("c")
	if wait, err := cmds[1].(*redis.Cmd).Int64(); err != nil || wait != 0 {
		t.Fatalf("WAIT after ASK: %d %v", wait, err)
	}
	asking := redis.NewClient(&redis.Options{Addr: others[1].Addr()})
	defer asking.Close()
	var get *redis.StringCmd
	if _, err := asking.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "asking")
		get = p.Get(ctx, key)
		return nil
	}); err != nil || get.Val() != "c" {
		t.Fatalf("after ASK: %s holds %q (%v)", others[1].Addr(), get.Val(), err)
	}
}

// slotOwners returns the master serving key and the other masters.
func slotOwners(rc *testenv.RedisCluster, key string) (owner *testenv.Redis, others []*testenv.Redis) {
	owner, _ = rc.MasterOf(key)
	for _, n := range rc.Nodes {
		if n != owner {
			others = append(others, n)
		}
	}
	return owner, others
}

// moveSlot gives key's (empty) slot to node on every node, behind the clients' back.
func moveSlot(t *testing.T, rc *testenv.RedisCluster, key string, node *testenv.Redis) {
	ctx := context.Background()
	id := node.Client().ClusterMyID(ctx).Val()
	s := node.Client().ClusterKeySlot(ctx, key).Val()
	for _, n := range rc.Nodes {
		if err := n.Client().Do(ctx, "cluster", "setslot", s, "node", id).Err(); err != nil {
			t.Fatalf("setslot on %s: %v", n.Addr(), err)
		}
	}
}

// migrateSlot marks key's slot as migrating from one master to another.
func migrateSlot(t *testing.T, key string, from, to *testenv.Redis) {
	ctx := context.Background()
	s := from.Client().ClusterKeySlot(ctx, key).Val()
	if err := to.Client().Do(ctx, "cluster", "setslot", s, "importing", from.Client().ClusterMyID(ctx).Val()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := from.Client().Do(ctx, "cluster", "setslot", s, "migrating", to.Client().ClusterMyID(ctx).Val()).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestClusterClientReloadsOnDeadMaster SIGKILLs a master of a cluster with replicas: once the
// replica is promoted, a client built by NewClusterClient reaches the key again within seconds
// (its failing dials made it reload the slot map), where go-redis alone would keep dialing the
// dead master until its 60 s reload.
func TestClusterClientReloadsOnDeadMaster(t *testing.T) {
	t.Parallel()
	rc := testenv.StartRedisCluster(t, testenv.WithClusterReplicas(1), testenv.WithNodeTimeout(time.Second))
	ctx := context.Background()
	cc := NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs()})
	defer cc.Close()
	key := "pgrelay:{dead}:k"
	if err := cc.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	master, replicas := rc.MasterOf(key)
	if len(replicas) != 1 {
		t.Fatalf("replicas %v", replicas)
	}
	waitReplicated(t, replicas[0], key)
	master.Kill()
	killed := time.Now()
	var promoted time.Time
	for promoted.IsZero() {
		if m, _ := rc.MasterOf(key); m == replicas[0] {
			promoted = time.Now()
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatal("no promotion")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		c, cancel := context.WithTimeout(ctx, time.Second)
		v, err := cc.Get(c, key).Result()
		cancel()
		if err == nil && v == "v" {
			break
		}
		if time.Since(promoted) > 15*time.Second {
			t.Fatalf("key unreachable %s after the promotion: %v", time.Since(promoted), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("promoted %.1fs after the kill; the key read again %.1fs after that", promoted.Sub(killed).Seconds(), time.Since(promoted).Seconds())
}

// waitReplicated waits until replica r (READONLY) holds key.
func waitReplicated(t *testing.T, r *testenv.Redis, key string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), OnConnect: func(ctx context.Context, cn *redis.Conn) error {
		return cn.ReadOnly(ctx).Err()
	}})
	defer c.Close()
	for i := 0; ; i++ {
		n, err := c.Exists(context.Background(), key).Result()
		if err == nil && n == 1 {
			return
		}
		if i > 500 {
			t.Fatalf("replica %s never got %s: %v", r.Addr(), key, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
