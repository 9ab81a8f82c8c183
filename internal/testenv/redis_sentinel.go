package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name the sentinels of StartRedisSentinel monitor their master under.
const SentinelMaster = "pgrelay"

// RedisSentinel is a throwaway Redis Sentinel setup on loopback: one master with appendfsync
// always, its replicas, and three sentinels (quorum 2) that promote a replica when the master has
// been unreachable for a second.
type RedisSentinel struct {
	t         testing.TB
	Nodes     []*Redis // the first master, then its replicas; roles change on failover
	Sentinels []*Sentinel
}

// Sentinel is one redis-sentinel process.
type Sentinel struct {
	Port int
	Dir  string
	proc *proc
}

// Addr is host:port of the sentinel.
func (s *Sentinel) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.Port) }

// StartRedisSentinel starts a master, `replicas` replicas of it and three sentinels, and returns
// once the replicas are in sync and every sentinel knows the replicas and the other sentinels.
func StartRedisSentinel(t testing.TB, replicas int) *RedisSentinel {
	t.Helper()
	bin, err := exec.LookPath("redis-sentinel")
	if err != nil {
		missing(t, "redis-sentinel")
	}
	rs := &RedisSentinel{t: t}
	master := StartRedis(t)
	rs.Nodes = append(rs.Nodes, master)
	for i := 0; i < replicas; i++ {
		rs.Nodes = append(rs.Nodes, StartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port)))
	}
	for i := 0; i < 3; i++ {
		rs.Sentinels = append(rs.Sentinels, startSentinel(t, bin, master.Port))
	}
	err = waitFor(60*time.Second, func() error {
		if err := rs.replicasInSync(master, replicas); err != nil {
			return err
		}
		for _, s := range rs.Sentinels {
			m, err := s.masterState()
			if err != nil {
				return err
			}
			if m["num-slaves"] != strconv.Itoa(replicas) || m["num-other-sentinels"] != "2" {
				return fmt.Errorf("sentinel %s knows %s replicas and %s other sentinels", s.Addr(), m["num-slaves"], m["num-other-sentinels"])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("testenv: sentinel setup: %v", err)
	}
	return rs
}

func startSentinel(t testing.TB, bin string, masterPort int) *Sentinel {
	t.Helper()
	s := &Sentinel{Port: FreePort(t), Dir: tempDir(t, "sentinel")}
	conf := filepath.Join(s.Dir, "sentinel.conf")
	text := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
daemonize no
dir %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %s 1000
sentinel failover-timeout %s 10000
sentinel parallel-syncs %s 1
`, s.Port, s.Dir, SentinelMaster, masterPort, SentinelMaster, SentinelMaster, SentinelMaster)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if cred, _, _ := serviceUser(); cred != nil {
		if err := os.Chown(conf, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatalf("testenv: chown %s: %v", conf, err)
		}
	}
	cmd, err := command(bin, conf)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if s.proc, err = startProc(cmd, filepath.Join(s.Dir, "sentinel.log")); err != nil {
		t.Fatalf("testenv: start sentinel: %v", err)
	}
	t.Cleanup(func() { s.proc.signal(syscall.SIGTERM, 10*time.Second) })
	if err := waitTCP(s.proc, s.Port, 30*time.Second); err != nil {
		t.Fatalf("testenv: sentinel: %v", err)
	}
	if err := waitOwnPort(s.proc, s.Addr(), nil); err != nil {
		t.Fatalf("testenv: sentinel: %v", err)
	}
	return s
}

// masterState is SENTINEL MASTER <name> as a map.
func (s *Sentinel) masterState() (map[string]string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	return c.Master(context.Background(), SentinelMaster).Result()
}

// masterAddr is the master's address as this sentinel reports it.
func (s *Sentinel) masterAddr() (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	hp, err := c.GetMasterAddrByName(context.Background(), SentinelMaster).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// SentinelAddrs lists host:port of every sentinel.
func (rs *RedisSentinel) SentinelAddrs() []string {
	var out []string
	for _, s := range rs.Sentinels {
		out = append(out, s.Addr())
	}
	return out
}

// Client returns a go-redis failover client of the master, closed when the test ends.
func (rs *RedisSentinel) Client() *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: rs.SentinelAddrs()})
	rs.t.Cleanup(func() { c.Close() })
	return c
}

// node returns the node listening on addr (nil if none).
func (rs *RedisSentinel) node(addr string) *Redis {
	for _, n := range rs.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// Master returns the node the first sentinel names as master.
func (rs *RedisSentinel) Master() *Redis {
	rs.t.Helper()
	addr, err := rs.Sentinels[0].masterAddr()
	if err != nil {
		rs.t.Fatalf("testenv: sentinel master: %v", err)
	}
	return rs.node(addr)
}

// WaitPromoted waits until every sentinel names a master other than old and that node runs as
// master; it returns the new master.
func (rs *RedisSentinel) WaitPromoted(old *Redis, timeout time.Duration) *Redis {
	rs.t.Helper()
	var promoted *Redis
	err := waitFor(timeout, func() (err error) {
		promoted, err = rs.agreedMaster(old)
		return err
	})
	if err != nil {
		rs.t.Fatalf("testenv: no promotion: %v", err)
	}
	return promoted
}

// WaitSettled waits until every sentinel names the same node as master, that node runs as master,
// and every other live node is its replica, in sync; it returns that master. After a failover the
// sentinels may still change their mind on a loaded machine (a new master they could not reach in
// time is failed over again), so a test that only needs a settled pair asks for this instead of a
// particular node.
func (rs *RedisSentinel) WaitSettled(timeout time.Duration) *Redis {
	rs.t.Helper()
	var master *Redis
	err := waitFor(timeout, func() (err error) {
		if master, err = rs.agreedMaster(nil); err != nil {
			return err
		}
		live := 0
		for _, n := range rs.Nodes {
			if n != master && n.Alive() {
				live++
			}
		}
		return rs.replicasInSync(master, live)
	})
	if err != nil {
		rs.t.Fatalf("testenv: not settled: %v", err)
	}
	return master
}

// agreedMaster is the node every sentinel names as master, if it is not old and runs as master.
func (rs *RedisSentinel) agreedMaster(old *Redis) (*Redis, error) {
	var master *Redis
	for _, s := range rs.Sentinels {
		addr, err := s.masterAddr()
		if err != nil {
			return nil, err
		}
		n := rs.node(addr)
		if n == nil || n == old || (master != nil && n != master) {
			return nil, fmt.Errorf("sentinel %s names %s as master", s.Addr(), addr)
		}
		master = n
	}
	repl, err := master.Info("replication")
	if err != nil {
		return nil, err
	}
	if repl["role"] != "master" {
		return nil, fmt.Errorf("%s runs as %s", master.Addr(), repl["role"])
	}
	return master, nil
}

// Rejoin restarts node old (a master that was failed over) as a replica of master, as the
// sentinels would reconfigure it, only without waiting for their next look at it (up to 10 s).
func (rs *RedisSentinel) Rejoin(old, master *Redis) {
	rs.t.Helper()
	old.args = append(old.args, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	old.Restart()
}

// WaitReplicated waits until every live node other than master is its replica, in sync.
func (rs *RedisSentinel) WaitReplicated(master *Redis, timeout time.Duration) {
	rs.t.Helper()
	live := 0
	for _, n := range rs.Nodes {
		if n != master && n.Alive() {
			live++
		}
	}
	if err := waitFor(timeout, func() error { return rs.replicasInSync(master, live) }); err != nil {
		rs.t.Fatalf("testenv: replicas not in sync: %v", err)
	}
}

// replicasInSync checks that master runs as master with n replicas online, each of them with an
// up link and no sync in progress.
func (rs *RedisSentinel) replicasInSync(master *Redis, n int) error {
	repl, err := master.Info("replication")
	if err != nil {
		return err
	}
	if repl["role"] != "master" || repl["connected_slaves"] != strconv.Itoa(n) {
		return fmt.Errorf("master %s: role %s with %s replicas, want %d", master.Addr(), repl["role"], repl["connected_slaves"], n)
	}
	for _, r := range rs.Nodes {
		if r == master || !r.Alive() {
			continue
		}
		ri, err := r.Info("replication")
		if err != nil {
			return err
		}
		if ri["role"] != "slave" || ri["master_port"] != strconv.Itoa(master.Port) ||
			ri["master_link_status"] != "up" || ri["master_sync_in_progress"] != "0" {
			return fmt.Errorf("replica %s: role %s of port %s, link %s", r.Addr(), ri["role"], ri["master_port"], ri["master_link_status"])
		}
	}
	return nil
}
