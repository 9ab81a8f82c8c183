package redisconn

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// rawSetGet runs SET key v and GET key on a raw connection of the master serving key and returns
// GET's reply (or the first error reply).
func rawSetGet(ctx context.Context, r *Raw, key, v string) (string, error) {
	var got string
	err := r.Run(ctx, key, func(c *RawConn) error {
		b := AppendCommand(c.Buf[:0], "SET", key, v)
		b = AppendCommand(b, "GET", key)
		c.Buf = b
		if err := c.Send(ctx, b, 0); err != nil {
			return err
		}
		if err := c.Skip(); err != nil {
			return err
		}
		rep, err := c.Read()
		if err != nil {
			return err
		}
		got = string(rep.Str)
		return rep.Err()
	})
	return got, err
}

// TestRawConnectsLikeItsClient: a Raw pool reaches the server the way its go-redis client does:
// password and database, an ACL user, TLS with a client certificate, the master named by the
// sentinels; its connections are reused, and the pool refuses work once closed.
func TestRawConnectsLikeItsClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		name  string
		start func(t *testing.T) (raw, check redis.UniversalClient)
	}{
		{"password and database", func(t *testing.T) (redis.UniversalClient, redis.UniversalClient) {
			r := testenv.StartRedis(t)
			if err := r.Client().ConfigSet(ctx, "requirepass", "s3cret").Err(); err != nil {
				t.Fatal(err)
			}
			return redis.NewClient(&redis.Options{Addr: r.Addr(), Password: "s3cret", DB: 3}),
				redis.NewClient(&redis.Options{Addr: r.Addr(), Password: "s3cret", DB: 3})
		}},
		{"ACL user and client name", func(t *testing.T) (redis.UniversalClient, redis.UniversalClient) {
			r := testenv.StartRedis(t)
			if err := r.Client().Do(ctx, "acl", "setuser", "relay", "on", ">pw", "~*", "&*", "+@all").Err(); err != nil {
				t.Fatal(err)
			}
			return redis.NewClient(&redis.Options{Addr: r.Addr(), Username: "relay", Password: "pw", ClientName: "pgrelay-raw"}), r.Client()
		}},
		{"TLS with a client certificate", func(t *testing.T) (redis.UniversalClient, redis.UniversalClient) {
			r := testenv.StartRedisTLS(t)
			conf, err := r.TLS.ClientConfig()
			if err != nil {
				t.Fatal(err)
			}
			return redis.NewClient(&redis.Options{Addr: r.Addr(), TLSConfig: conf}), r.Client()
		}},
		{"Sentinel", func(t *testing.T) (redis.UniversalClient, redis.UniversalClient) {
			rs := testenv.StartRedisSentinel(t, 0)
			return rs.Client(), rs.Nodes[0].Client()
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rdb, check := c.start(t)
			defer rdb.Close()
			r := NewRaw(rdb)
			for i, v := range []string{"one", "two"} {
				if got, err := rawSetGet(ctx, r, "k", v); err != nil || got != v {
					t.Fatalf("run %d: %q %v", i, got, err)
				}
			}
			if got := check.Get(ctx, "k").Val(); got != "two" {
				t.Fatalf("the client reads %q", got)
			}
			if n := len(r.idle); n != 1 || len(r.idle[rdb.(*redis.Client).Options().Addr]) != 1 {
				t.Fatalf("idle connections: %v", r.idle)
			}
			if c.name == "ACL user and client name" {
				if list := check.ClientList(ctx).Val(); !strings.Contains(list, "name=pgrelay-raw") || !strings.Contains(list, "user=relay") {
					t.Fatalf("client list: %s", list)
				}
			}
			r.Close()
			if _, err := rawSetGet(ctx, r, "k", "three"); !errors.Is(err, ErrRawUnavailable) {
				t.Fatalf("after Close: %v", err)
			}
		})
	}
}

// TestRawFollowsMoved moves a key's (empty) slot to another master behind the client's back:
// Raw.Run follows the MOVED answer (reloading the slot map) and runs again on the new owner. A
// slot being migrated answers ASK, which Run returns as it is.
func TestRawFollowsMoved(t *testing.T) {
	t.Parallel()
	rc := testenv.StartRedisCluster(t)
	ctx := context.Background()
	cc := NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs()})
	defer cc.Close()
	r := NewRaw(cc)
	defer r.Close()
	key := "pgrelay:{rawmoved}:k"
	_, others := slotOwners(rc, key)
	if got, err := rawSetGet(ctx, r, key, "a"); err != nil || got != "a" {
		t.Fatalf("first: %q %v", got, err)
	}
	cc.Del(ctx, key)
	moveSlot(t, rc, key, others[0])
	if got, err := rawSetGet(ctx, r, key, "b"); err != nil || got != "b" {
		t.Fatalf("after MOVED: %q %v", got, err)
	}
	if v := others[0].Client().Get(ctx, key).Val(); v != "b" {
		t.Fatalf("after MOVED: %s holds %q", others[0].Addr(), v)
	}

	cc.Del(ctx, key)
	migrateSlot(t, key, others[0], others[1])
	if _, err := rawSetGet(ctx, r, key, "c"); !redis.HasErrorPrefix(err, "ASK") {
		t.Fatalf("migrating slot: %v, want an ASK answer", err)
	}
}
