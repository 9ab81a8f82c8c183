package queue

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

func TestEvicts(t *testing.T) {
	cases := []struct {
		maxmemory int64
		policy    string
		want      bool
	}{
		{0, "noeviction", false},
		{0, "allkeys-lru", false}, // no limit: Redis never evicts
		{100 << 20, "noeviction", false},
		{100 << 20, "allkeys-lru", true},
		{100 << 20, "allkeys-lfu", true},
		{100 << 20, "allkeys-random", true},
		{100 << 20, "volatile-lru", true}, // the leases have TTLs
		{100 << 20, "volatile-lfu", true},
		{100 << 20, "volatile-random", true},
		{100 << 20, "volatile-ttl", true},
	}
	for _, c := range cases {
		if got := evicts(c.maxmemory, c.policy); got != c.want {
			t.Errorf("maxmemory %d %s: evicts = %v, want %v", c.maxmemory, c.policy, got, c.want)
		}
	}
	limit, policy := memorySettings("# Memory\r\nused_memory:1024\r\nmaxmemory:104857600\r\nmaxmemory_human:100.00M\r\nmaxmemory_policy:volatile-ttl\r\n")
	if limit != 104857600 || policy != "volatile-ttl" {
		t.Fatalf("memorySettings: %d %q", limit, policy)
	}
}

// TestCheckEviction runs the check against real servers: allkeys-lru and volatile-ttl under a
// limit are refused with the fix in the error, noeviction under a limit and allkeys-lru without
// one are accepted, and the refused server is accepted once CONFIG SET fixes it.
func TestCheckEviction(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{
		{"--maxmemory", "100mb", "--maxmemory-policy", "noeviction"},
		{"--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"},
	} {
		if err := CheckEviction(ctx, testenv.StartRedis(t, args...).Client()); err != nil {
			t.Errorf("%v refused: %v", args, err)
		}
	}
	for _, policy := range []string{"allkeys-lru", "volatile-ttl"} {
		r := testenv.StartRedis(t, "--maxmemory", "100mb", "--maxmemory-policy", policy)
		err := CheckEviction(ctx, r.Client())
		if !errcode.Is(err, errcode.RedisEviction) || errcode.Of(err) != errcode.RedisEviction {
			t.Fatalf("%s accepted or uncoded: %v", policy, err)
		}
		for _, want := range []string{"maxmemory 104857600 bytes", "maxmemory-policy " + policy, "Fix: run CONFIG SET maxmemory-policy noeviction"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error lacks %q: %v", policy, want, err)
			}
		}
		if err := r.Client().ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
			t.Fatal(err)
		}
		if err := CheckEviction(ctx, r.Client()); err != nil {
			t.Errorf("%s changed to noeviction, still refused: %v", policy, err)
		}
	}
}

// TestCheckEvictionWithoutInfo: a Redis user denied INFO cannot be checked, and is told to allow it.
func TestCheckEvictionWithoutInfo(t *testing.T) {
	ctx := context.Background()
	r := testenv.StartRedis(t)
	if err := r.Client().Do(ctx, "ACL", "SETUSER", "relay", "on", ">pw", "~*", "+@all", "-info").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), Username: "relay", Password: "pw"})
	defer c.Close()
	err := CheckEviction(ctx, c)
	if errcode.Of(err) != errcode.RedisEviction || !strings.Contains(err.Error(), "ACL +info") {
		t.Fatalf("INFO denied: %v", err)
	}
}
