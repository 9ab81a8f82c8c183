package redisconn

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"log/slog"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestGoRedisLinesGoToTheComponentLogger: what go-redis logs reaches the Benthos logger given to
// LogTo with library=go-redis, a failed dial (a real one: a client of a port nothing listens on)
// at debug level and any other line at info; before LogTo, a failed dial is dropped and another
// line goes to stderr's logger.
func TestGoRedisLinesGoToTheComponentLogger(t *testing.T) {
	var std bytes.Buffer
	fresh := &goRedisLogger{std: log.New(&std, "redis: ", 0)} // as goRedisLog before any LogTo
	fresh.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v", 5, "refused")
	fresh.Printf(context.Background(), "sentinel: new master=%q addr=%q", "m", "127.0.0.1:1")
	if got := std.String(); strings.Contains(got, "failed to dial") || !strings.Contains(got, `sentinel: new master="m"`) {
		t.Errorf("before LogTo, stderr got %q", got)
	}

	var out bytes.Buffer
	t.Cleanup(func() { goRedisLog.to.Store(nil) })
	LogTo(service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), MaxRetries: -1})
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err == nil {
		t.Fatal("a ping to a closed port succeeded")
	}
	goRedisLog.Printf(context.Background(), "sentinel: new master=%q addr=%q", "m", "127.0.0.1:1")
	// a Sentinel that does not answer (go-redis's text, with a real dial's error)
	sentinel := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}, MaxRetries: -1})
	defer sentinel.Close()
	if err := sentinel.Ping(context.Background()).Err(); err == nil {
		t.Fatal("a ping through a Sentinel on a closed port succeeded")
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var dial, sentinelDial, other bool
	for _, l := range lines {
		if !strings.Contains(l, "library=go-redis") {
			t.Errorf("without library=go-redis: %s", l)
		}
		dial = dial || strings.Contains(l, "level=DEBUG") && strings.Contains(l, "failed to dial")
		sentinelDial = sentinelDial || strings.Contains(l, "level=DEBUG") && strings.Contains(l, "GetMasterAddrByName")
		other = other || strings.Contains(l, "level=INFO") && strings.Contains(l, `sentinel: new master=\"m\"`)
	}
	if !dial || !sentinelDial || !other {
		t.Errorf("want the failed dials (a pool's, a Sentinel's) at debug and the sentinel line at info, got:\n%s", out.String())
	}
}
