package testenv

import (
	"context"
	"crypto/tls"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a throwaway redis-server with appendonly yes and appendfsync always, so an acknowledged
// write survives a SIGKILL of the server.
type Redis struct {
	t    testing.TB
	Port int
	Dir  string
	TLS  *RedisTLSFiles // set by StartRedisTLS: the server speaks only TLS
	args []string
	mu   sync.Mutex
	proc *proc

	tlsConf *tls.Config // the test's own connections to a TLS server
}

func redisBin(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		missing(t, "redis-server")
	}
	return bin
}

// StartRedis starts a plain redis-server on a free loopback port; extra arguments are appended
// (for example "--appendfsync", "everysec").
func StartRedis(t testing.TB, extra ...string) *Redis {
	t.Helper()
	r := &Redis{t: t, Port: FreePort(t), Dir: tempDir(t, "redis")}
	r.run(append([]string{"--port", fmt.Sprint(r.Port)}, extra...))
	return r
}

// run starts the server with the common arguments, then args (the listening port, the caller's).
func (r *Redis) run(args []string) {
	r.t.Helper()
	bin := redisBin(r.t)
	r.args = append([]string{
		"--bind", "127.0.0.1", "--dir", r.Dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "",
		"--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning",
	}, args...)
	r.start(bin)
	r.t.Cleanup(r.Stop)
}

func (r *Redis) start(bin string) {
	r.t.Helper()
	cmd, err := command(bin, r.args...)
	if err != nil {
		r.t.Fatalf("testenv: %v", err)
	}
	p, err := startProc(cmd, filepath.Join(r.Dir, "redis.log"))
	if err != nil {
		r.t.Fatalf("testenv: start redis: %v", err)
	}
	r.mu.Lock()
	r.proc = p
	r.mu.Unlock()
	if err := waitTCP(p, r.Port, 30*time.Second); err != nil {
		r.t.Fatalf("testenv: redis: %v", err)
	}
	if err := waitRedisLoaded(r.Addr(), r.tlsConf); err != nil {
		r.t.Fatalf("testenv: redis: %v", err)
	}
}

// waitRedisLoaded waits until the server has loaded its data (PING answers without LOADING).
func waitRedisLoaded(addr string, tlsConf *tls.Config) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, TLSConfig: tlsConf})
	defer c.Close()
	var err error
	for i := 0; i < 300; i++ {
		if err = c.Ping(context.Background()).Err(); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// Addr is host:port of the server.
func (r *Redis) Addr() string { return fmt.Sprintf("127.0.0.1:%d", r.Port) }

// URL is the redis:// URL of the server (rediss:// for a TLS server).
func (r *Redis) URL() string {
	if r.TLS != nil {
		return "rediss://" + r.Addr()
	}
	return "redis://" + r.Addr()
}

// Client returns a new client of the server, closed when the test ends.
func (r *Redis) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), TLSConfig: r.tlsConf})
	r.t.Cleanup(func() { c.Close() })
	return c
}

// Kill stops the server with SIGKILL, as a crash would.
func (r *Redis) Kill() {
	r.mu.Lock()
	p := r.proc
	r.mu.Unlock()
	p.signal(syscall.SIGKILL, 10*time.Second)
}

// Restart starts the server again on the same directory and port; it reloads its append-only file.
func (r *Redis) Restart() {
	r.t.Helper()
	r.mu.Lock()
	p := r.proc
	r.mu.Unlock()
	if p != nil && !p.exited() {
		p.signal(syscall.SIGTERM, 15*time.Second)
	}
	r.start(redisBin(r.t))
}

// Stop shuts the server down.
func (r *Redis) Stop() {
	r.mu.Lock()
	p := r.proc
	r.mu.Unlock()
	p.signal(syscall.SIGTERM, 10*time.Second)
}

// RedisCluster is a throwaway 3-master Redis Cluster on loopback (no replicas).
type RedisCluster struct {
	Nodes []*Redis
}

// StartRedisCluster starts three cluster-enabled redis-servers and joins them with
// `redis-cli --cluster create`; it returns once every node reports cluster_state:ok.
func StartRedisCluster(t testing.TB) *RedisCluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		missing(t, "redis-cli")
	}
	rc := &RedisCluster{}
	var addrs []string
	for i := 0; i < 3; i++ {
		n := StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000")
		rc.Nodes = append(rc.Nodes, n)
		addrs = append(addrs, n.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range rc.Nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr()})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("testenv: cluster not ok: %v %s", err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
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
