package input

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/queue"
)

// groupStatsEvery is how often the input reads its group's lag and pending entries.
const groupStatsEvery = 10 * time.Second

// groupGauges are the gauges the input keeps about its group and queue (docs/metrics.md). Every
// replica of a group reports the whole group's figures, so aggregate them with max, not sum.
type groupGauges struct {
	lag, pending, deadLetters *service.MetricGauge
}

func newGroupGauges(m *service.Metrics) groupGauges {
	return groupGauges{
		lag:         m.NewGauge("redis_queue_group_lag", "queue", "group"),
		pending:     m.NewGauge("redis_queue_group_pending", "queue", "group"),
		deadLetters: m.NewGauge("redis_queue_dead_letter_entries", "queue"),
	}
}

// reportGroupStats sets the gauges from queue.Inspect (the figures of `pgrelay queue info`) now and
// every groupStatsEvery until ctx ends; done is closed when it returns.
func reportGroupStats(ctx context.Context, rdb redis.UniversalClient, conf queue.ConsumerConfig, g groupGauges, log *service.Logger, done chan struct{}) {
	defer close(done)
	layout := queue.NewLayout(conf.Prefix)
	t := time.NewTicker(groupStatsEvery)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, groupStatsEvery)
		info, err := queue.Inspect(rctx, rdb, layout, conf.Queue)
		cancel()
		switch {
		case err == nil:
			for _, gi := range info.Groups {
				if gi.Name == conf.Group {
					g.lag.Set(gi.Lag, conf.Queue, conf.Group)
					g.pending.Set(gi.Pending, conf.Queue, conf.Group)
				}
			}
			g.deadLetters.Set(info.DeadLetters, conf.Queue)
		case errcode.Is(err, errcode.NoQueue), ctx.Err() != nil: // not created yet, or closing
		default:
			log.Debugf("redis_queue %s: reading the group's lag: %v", conf.Queue, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
