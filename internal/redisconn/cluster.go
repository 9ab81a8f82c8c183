package redisconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// NewClusterClient returns a Redis Cluster client that reloads its slot map at once whenever a
// node answers with a sign that the cluster changed (MOVED, ASK, CLUSTERDOWN, READONLY, ...) or
// cannot be reached. By itself go-redis reloads only on a MOVED answering one of its own routed
// commands, or every 60 s: a master that died without answering, or a command sent to a node
// client (MasterPipeline), would keep going to the old master until then.
func NewClusterClient(o *redis.ClusterOptions) *redis.ClusterClient {
	cc := redis.NewClusterClient(o)
	h := reloadHook{cc: cc}
	cc.OnNewNode(func(n *redis.Client) { n.AddHook(h) })
	return cc
}

// reloadHook is installed on every node client of a cluster client.
type reloadHook struct{ cc *redis.ClusterClient }

func (h reloadHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil && ctx.Err() == nil {
			h.cc.ReloadState(ctx)
		}
		return conn, err
	}
}

func (h reloadHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if topologyChanged(ctx, err) {
			h.cc.ReloadState(ctx)
		}
		return err
	}
}

func (h reloadHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		reload := topologyChanged(ctx, err)
		for _, c := range cmds {
			reload = reload || topologyChanged(ctx, c.Err())
		}
		if reload {
			h.cc.ReloadState(ctx) // asynchronous, and merged with any reload under way
		}
		return err
	}
}

// topologyPrefixes are the errors a node answers when the slot map may have changed.
var topologyPrefixes = []string{"MOVED", "ASK", "CLUSTERDOWN", "READONLY", "MASTERDOWN", "TRYAGAIN", "LOADING"}

// InStep is implemented by errors of a caller's own that leave its connection in step with the
// server, every reply read (an EXEC that a changed watched key aborted, say): like a reply error,
// such an error neither closes the connection (Raw.Put) nor reloads the cluster's slot map.
type InStep interface {
	error
	InStep() bool
}

// topologyChanged reports whether err may mean the cluster changed: one of topologyPrefixes, or a
// connection failure (anything that is not a Redis reply nor InStep). Context ends and a closed
// client are not.
func topologyChanged(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil || errors.Is(err, redis.Nil) || errors.Is(err, redis.ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var in InStep
	if errors.As(err, &in) && in.InStep() {
		return false
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		for _, p := range topologyPrefixes {
			if redis.HasErrorPrefix(err, p) {
				return true
			}
		}
		return false
	}
	return true
}

// maxRedirects bounds how many MOVED/ASK answers MasterPipeline follows for one call.
const maxRedirects = 5

// MasterPipeline runs the commands fn queues, in order, on one connection of the master serving
// key, so that a command like WAIT counts the replicas that have the earlier commands' writes. On
// a plain or Sentinel client that is the one master. On Redis Cluster it follows a MOVED answer
// (reloading the slot map at once, then going to the node the answer names) and an ASK answer
// (ASKING, then the commands, on the named node), up to maxRedirects times. fn is called again for
// each attempt; the commands of the last attempt are returned.
func MasterPipeline(ctx context.Context, rdb redis.UniversalClient, key string, fn func(redis.Pipeliner)) ([]redis.Cmder, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return rdb.Pipelined(ctx, func(p redis.Pipeliner) error { fn(p); return nil })
	}
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("find the master of %s: %w", key, err)
	}
	asking := false
	for redirects := 0; ; redirects++ {
		cmds, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			if asking {
				p.Do(ctx, "asking")
			}
			fn(p)
			return nil
		})
		if asking && len(cmds) > 0 {
			cmds = cmds[1:]
		}
		kind, addr := redirect(cmds)
		if kind == "" || redirects == maxRedirects {
			return cmds, err
		}
		if node, err = nodeAt(ctx, cc, addr); err != nil {
			return cmds, err
		}
		asking = kind == "ASK"
	}
}

// redirect returns "MOVED" or "ASK" and the address named by the first command that was
// redirected, or "" when none was.
func redirect(cmds []redis.Cmder) (kind, addr string) {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return redirectOf(err)
		}
	}
	return "", ""
}

// redirectOf returns "MOVED" or "ASK" and the address err names when it is such an answer.
func redirectOf(err error) (kind, addr string) {
	var reply redis.Error
	if err == nil || !errors.As(err, &reply) {
		return "", ""
	}
	f := strings.Fields(reply.Error())
	if len(f) == 3 && (f[0] == "MOVED" || f[0] == "ASK") {
		return f[0], f[2]
	}
	return "", ""
}

// nodeAt reloads the slot map now and returns the client of the node at addr.
func nodeAt(ctx context.Context, cc *redis.ClusterClient, addr string) (*redis.Client, error) {
	var mu sync.Mutex
	var found *redis.Client
	err := cc.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error { // reloads first
		if c.Options().Addr == addr {
			mu.Lock()
			found = c
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reload the cluster's slot map: %w", err)
	}
	if found == nil {
		return nil, fmt.Errorf("redirected to %s, which the cluster's slot map does not list yet", addr)
	}
	return found, nil
}
