// Package lease implements fenced leases in Redis: one holder at a time per key, renewed before its
// TTL runs out, released at once on a clean stop. Each new holder gets a token with a larger
// sequence number; writers pass the token to scripts that refuse to write unless the lease key
// still holds it (the fence), so a paused ex-holder can never write after losing the lease.
//
// The scripts are resources/lease_*.lua.
package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/resources"
)

var (
	acquireScript = redis.NewScript(resources.MustRead("lease_acquire.lua"))
	renewScript   = redis.NewScript(resources.MustRead("lease_renew.lua"))
	releaseScript = redis.NewScript(resources.MustRead("lease_release.lua"))
)

// Lease is one process's claim on one lease key. It is safe for concurrent use.
type Lease struct {
	rdb   redis.Scripter
	key   string
	ttl   time.Duration
	owner string

	mu    sync.Mutex
	token string
}

// New prepares a lease on key for owner (unique per process life, e.g. host:pid:random); nothing is
// sent to Redis until TryAcquire.
func New(rdb redis.Scripter, key string, ttl time.Duration, owner string) *Lease {
	return &Lease{rdb: rdb, key: key, ttl: ttl, owner: owner}
}

// Key is the lease key.
func (l *Lease) Key() string { return l.key }

// TTL is the lease's time to live.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Token is the fence of the current holding, or "" when not held.
func (l *Lease) Token() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.token
}

// TryAcquire takes the lease if it is free (or already ours) and reports whether we hold it.
func (l *Lease) TryAcquire(ctx context.Context) (bool, error) {
	res, err := acquireScript.Run(ctx, l.rdb, []string{l.key, l.key + ":seq"}, l.owner, l.ttl.Milliseconds()).Result()
	if errors.Is(err, redis.Nil) {
		l.setToken("")
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("lease %s: acquire: %w", l.key, err)
	}
	tok, _ := res.(string)
	l.setToken(tok)
	return tok != "", nil
}

// Renew extends the lease; false means it was lost (expired and maybe taken by another owner).
func (l *Lease) Renew(ctx context.Context) (bool, error) {
	tok := l.Token()
	if tok == "" {
		return false, nil
	}
	n, err := renewScript.Run(ctx, l.rdb, []string{l.key}, tok, l.ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("lease %s: renew: %w", l.key, err)
	}
	if n != 1 {
		l.setToken("")
		return false, nil
	}
	return true, nil
}

// Release gives the lease up at once so another owner can take it without waiting for the TTL.
func (l *Lease) Release(ctx context.Context) error {
	tok := l.Token()
	if tok == "" {
		return nil
	}
	l.setToken("")
	if err := releaseScript.Run(ctx, l.rdb, []string{l.key}, tok).Err(); err != nil {
		return fmt.Errorf("lease %s: release: %w", l.key, err)
	}
	return nil
}

// Drop forgets the holding locally without telling Redis (after a fence error: someone else
// holds the key now, or will once the TTL runs out).
func (l *Lease) Drop() { l.setToken("") }

func (l *Lease) setToken(t string) {
	l.mu.Lock()
	l.token = t
	l.mu.Unlock()
}

// Holder reads who holds key and for how much longer ("" and 0 when free).
func Holder(ctx context.Context, rdb redis.Cmdable, key string) (string, time.Duration, error) {
	v, err := rdb.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, err
	}
	ttl, err := rdb.PTTL(ctx, key).Result()
	return v, ttl, err
}
