package queue

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// CheckEviction returns a coded error (redis_eviction) when a master of rdb may evict keys: it has
// a memory limit (maxmemory > 0) and a maxmemory-policy other than noeviction. Without a limit
// Redis never evicts, whatever the policy.
//
// The volatile-* policies are refused too. They evict only keys with a TTL, so they never remove
// a stream, the meta hash, a pointer or the dead letters (none has a TTL), but pgrelay's leases
// have one, and volatile-ttl evicts the keys closest to expiry first: under memory pressure the
// leases would vanish early, ending a source's session or moving a shard to another replica while
// a batch is in flight. Under noeviction a full Redis refuses writes instead; pgrelay retries them
// and loses nothing.
//
// The settings are read with INFO memory, which managed services allow where CONFIG GET is
// disabled.
func CheckEviction(ctx context.Context, rdb redis.UniversalClient) error {
	return eachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil && strings.HasPrefix(err.Error(), "NOPERM") {
			return errcode.Wrap(errcode.RedisEviction, err,
				fmt.Sprintf("cannot read maxmemory and maxmemory-policy of redis %s with INFO memory", c.Options().Addr),
				"allow the Redis user INFO (ACL +info), so pgrelay can check that Redis never evicts its keys")
		}
		if err != nil {
			return fmt.Errorf("redis %s: INFO memory: %w", c.Options().Addr, err)
		}
		limit, policy := memorySettings(info)
		if evicts(limit, policy) {
			return errcode.New(errcode.RedisEviction,
				fmt.Sprintf("redis %s has maxmemory %d bytes with maxmemory-policy %s, so it may evict the queue's keys (streams, pointers, leases)",
					c.Options().Addr, limit, policy),
				"run CONFIG SET maxmemory-policy noeviction and set it in redis.conf (or the service's parameter group), or remove the limit with maxmemory 0")
		}
		return nil
	})
}

// evicts reports whether a server with this maxmemory (bytes) and maxmemory-policy may evict keys.
func evicts(maxmemory int64, policy string) bool {
	return maxmemory > 0 && policy != "noeviction"
}

// memorySettings reads maxmemory and maxmemory_policy from an INFO memory reply.
func memorySettings(info string) (maxmemory int64, policy string) {
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "maxmemory":
			maxmemory, _ = strconv.ParseInt(v, 10, 64)
		case "maxmemory_policy":
			policy = v
		}
	}
	return maxmemory, policy
}

// eachMaster runs check on every master of rdb: each node of a cluster, or the one server.
func eachMaster(ctx context.Context, rdb redis.UniversalClient, check func(context.Context, *redis.Client) error) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, check)
	case *redis.Client:
		return check(ctx, c)
	default:
		return fmt.Errorf("unsupported redis client type %T", rdb)
	}
}
