package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster is a throwaway Redis Cluster on loopback: three masters, each with the same number
// of replicas (none by default).
type RedisCluster struct {
	t     testing.TB
	Nodes []*Redis // every node, masters first as created; roles change on failover
}

// ClusterOption changes how StartRedisCluster builds the cluster.
type ClusterOption func(*clusterConfig)

type clusterConfig struct {
	replicas    int
	nodeTimeout time.Duration
}

// WithClusterReplicas gives every master n replicas (redis-cli --cluster-replicas n).
func WithClusterReplicas(n int) ClusterOption { return func(c *clusterConfig) { c.replicas = n } }

// WithNodeTimeout sets cluster-node-timeout: how long a master may be unreachable before its
// replica is promoted (default 5 s).
func WithNodeTimeout(d time.Duration) ClusterOption {
	return func(c *clusterConfig) { c.nodeTimeout = d }
}

// StartRedisCluster starts 3 × (1 + replicas) cluster-enabled redis-servers (appendfsync always)
// and joins them with `redis-cli --cluster create`; it returns once every node reports
// cluster_state:ok and every replica is in sync with its master.
func StartRedisCluster(t testing.TB, opts ...ClusterOption) *RedisCluster {
	t.Helper()
	conf := clusterConfig{nodeTimeout: 5 * time.Second}
	for _, o := range opts {
		o(&conf)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		missing(t, "redis-cli")
	}
	rc := &RedisCluster{t: t}
	var addrs []string
	for i := 0; i < 3*(1+conf.replicas); i++ {
		n := StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", fmt.Sprint(conf.nodeTimeout.Milliseconds()))
		rc.Nodes = append(rc.Nodes, n)
		addrs = append(addrs, n.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", fmt.Sprint(conf.replicas), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := rc.waitWhole(60 * time.Second); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return rc
}

// Addrs lists host:port of every node.
func (rc *RedisCluster) Addrs() []string {
	var out []string
	for _, n := range rc.Nodes {
		out = append(out, n.Addr())
	}
	return out
}

// Client returns a cluster client, closed when the test ends.
func (rc *RedisCluster) Client(t testing.TB) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs()})
	t.Cleanup(func() { c.Close() })
	return c
}

// Node returns the node listening on addr (nil if none).
func (rc *RedisCluster) Node(addr string) *Redis {
	for _, n := range rc.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// MasterOf returns the node that a live node's CLUSTER NODES names as master of key's slot, and
// the connected replicas of that master; nil when no live node can say.
func (rc *RedisCluster) MasterOf(key string) (master *Redis, replicas []*Redis) {
	for _, n := range rc.Nodes {
		if !n.Alive() {
			continue
		}
		m, rs, err := rc.slotOwners(n, key)
		if err == nil && m != nil {
			return m, rs
		}
	}
	return nil, nil
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr, master string
	flags            []string
	connected        bool
	slots            [][2]int64
}

func (n clusterNode) has(flag string) bool { return slices.Contains(n.flags, flag) }

// failed reports whether the line's node is flagged fail or fail? (suspected).
func (n clusterNode) failed() bool { return n.has("fail") || n.has("fail?") }

// clusterNodes reads CLUSTER NODES from node n.
func clusterNodes(n *Redis) ([]clusterNode, error) {
	c := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
	defer c.Close()
	text, err := c.ClusterNodes(context.Background()).Result()
	if err != nil {
		return nil, err
	}
	var out []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		cn := clusterNode{id: f[0], addr: addr, flags: strings.Split(f[2], ","), master: f[3], connected: f[7] == "connected"}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") { // a slot being migrated
				continue
			}
			lo, hi, found := strings.Cut(r, "-")
			a, _ := strconv.ParseInt(lo, 10, 64)
			b := a
			if found {
				b, _ = strconv.ParseInt(hi, 10, 64)
			}
			cn.slots = append(cn.slots, [2]int64{a, b})
		}
		out = append(out, cn)
	}
	return out, nil
}

// slotOwners asks node n which node is master of key's slot, and which replicas of it are connected.
func (rc *RedisCluster) slotOwners(n *Redis, key string) (*Redis, []*Redis, error) {
	c := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
	slot, err := c.ClusterKeySlot(context.Background(), key).Result()
	c.Close()
	if err != nil {
		return nil, nil, err
	}
	nodes, err := clusterNodes(n)
	if err != nil {
		return nil, nil, err
	}
	for _, m := range nodes {
		if !m.has("master") || m.failed() {
			continue
		}
		for _, r := range m.slots {
			if r[0] > slot || slot > r[1] {
				continue
			}
			var replicas []*Redis
			for _, s := range nodes {
				if s.master == m.id && s.connected && !s.failed() {
					if r := rc.Node(s.addr); r != nil {
						replicas = append(replicas, r)
					}
				}
			}
			return rc.Node(m.addr), replicas, nil
		}
	}
	return nil, nil, fmt.Errorf("slot %d not served", slot)
}

// WaitWhole waits until the cluster is whole again: every live node reports cluster_state:ok and
// lists no node as failed, and every live replica is in sync with its master.
func (rc *RedisCluster) WaitWhole(timeout time.Duration) {
	rc.t.Helper()
	if err := rc.waitWhole(timeout); err != nil {
		rc.t.Fatalf("testenv: %v", err)
	}
}

func (rc *RedisCluster) waitWhole(timeout time.Duration) error {
	return waitFor(timeout, func() error {
		for _, n := range rc.Nodes {
			if !n.Alive() {
				continue
			}
			if err := nodeWhole(n); err != nil {
				return fmt.Errorf("cluster not whole: node %s: %w", n.Addr(), err)
			}
		}
		return nil
	})
}

// nodeWhole checks one node: cluster_state ok, no failed node in its view, and as a replica a
// master link that is up with no sync in progress.
func nodeWhole(n *Redis) error {
	c := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "cluster_state:ok") {
		return fmt.Errorf("state not ok")
	}
	nodes, err := clusterNodes(n)
	if err != nil {
		return err
	}
	for _, cn := range nodes {
		if cn.failed() || !cn.connected {
			return fmt.Errorf("sees %s as %v (connected %v)", cn.addr, cn.flags, cn.connected)
		}
	}
	repl, err := n.Info("replication")
	if err != nil {
		return err
	}
	if repl["role"] == "slave" && (repl["master_link_status"] != "up" || repl["master_sync_in_progress"] != "0") {
		return fmt.Errorf("replica link %s, sync in progress %s", repl["master_link_status"], repl["master_sync_in_progress"])
	}
	return nil
}
