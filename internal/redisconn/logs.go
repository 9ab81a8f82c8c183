package redisconn

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"github.com/redpanda-data/benthos/v4/public/service"
)

// go-redis writes what it notices (a pool that could not dial, a Sentinel that named another master,
// Cluster slots that moved) through one logger per process, by default to stderr in a format of
// its own: lines a log pipeline that reads Benthos' logfmt or JSON cannot parse. pgrelay sends them
// to the Benthos logger of the last pgrelay component made (LogTo), with the field
// library=go-redis. A dial that failed (a pool's, or a Sentinel asked for the master) is logged at
// debug level: the component reports its own connection errors, coded (redis_unreachable), at each
// retry. Everything else is logged at info
// level. Before any component is made, failed dials are dropped and other lines go to stderr as
// go-redis writes them (pgrelay's own subcommands drop them all: internal/cli).
var goRedisLog = &goRedisLogger{std: log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile)}

func init() { redis.SetLogger(goRedisLog) }

// LogTo sends go-redis's log lines to l (see goRedisLog).
func LogTo(l *service.Logger) {
	if l != nil {
		goRedisLog.to.Store(l.With("library", "go-redis"))
	}
}

// goRedisLogger is go-redis's logger (its internal.Logging interface).
type goRedisLogger struct {
	to  atomic.Pointer[service.Logger]
	std *log.Logger
}

func (g *goRedisLogger) Printf(_ context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	dial := strings.Contains(msg, "failed to dial") || strings.Contains(msg, ": dial ") // a pool's, a Sentinel's
	l := g.to.Load()
	switch {
	case l == nil && dial:
	case l == nil:
		_ = g.std.Output(2, msg)
	case dial:
		l.Debug(msg)
	default:
		l.Info(msg)
	}
}
