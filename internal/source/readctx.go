package source

import (
	"context"
	"time"
)

// deadlineCtx hands out one context per deadline: the WAL reader waits for each message with
// the time of its next status report as the deadline, which changes only a few times a second,
// so making a context (and its timer) per message would be wasted work.
type deadlineCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
	at     time.Time
}

// until returns a context of parent that ends at at, reusing the last one while it still fits.
func (d *deadlineCtx) until(parent context.Context, at time.Time) context.Context {
	if d.ctx == nil || !at.Equal(d.at) || d.ctx.Err() != nil {
		d.stop()
		d.ctx, d.cancel = context.WithDeadline(parent, at)
		d.at = at
	}
	return d.ctx
}

// stop releases the current context.
func (d *deadlineCtx) stop() {
	if d.cancel != nil {
		d.cancel()
	}
}
