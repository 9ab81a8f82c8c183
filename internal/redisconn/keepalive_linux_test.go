package redisconn

import (
	"context"
	"net"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sys/unix"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// The connections redisconn dials keep go-redis's own TCP keep-alive (a master gone without a
// reset is noticed within 45 s), plain, Cluster and Sentinel alike.
func TestDialersKeepGoRedisKeepAlive(t *testing.T) {
	for _, c := range []struct {
		name string
		dial func(t *testing.T) func(context.Context, string, string) (net.Conn, error)
	}{
		{"url", func(t *testing.T) func(context.Context, string, string) (net.Conn, error) {
			rdb, err := Config{URL: "redis://127.0.0.1:1"}.Client()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rdb.Close() })
			return rdb.(*redis.Client).Options().Dialer
		}},
		{"cluster_urls", func(t *testing.T) func(context.Context, string, string) (net.Conn, error) {
			rdb, err := Config{ClusterURLs: []string{"redis://127.0.0.1:1"}}.Client()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rdb.Close() })
			return rdb.(*redis.ClusterClient).Options().Dialer
		}},
		{"sentinel", func(t *testing.T) func(context.Context, string, string) (net.Conn, error) {
			return sentinelDialer([]string{"127.0.0.1:1"}, nil, nil)
		}},
	} {
		conn, _ := testenv.SocketPair(t, "tcp", c.dial(t))
		if got := keepAliveOf(t, conn); got != [4]int{1, 30, 5, 3} {
			t.Errorf("%s: keep-alive (on, idle s, interval s, probes) %v, want go-redis's [1 30 5 3]", c.name, got)
		}
	}
}

// keepAliveOf reads c's TCP keep-alive: whether it is on, the idle seconds before the first probe,
// the seconds between probes and the probes before the peer is declared dead.
func keepAliveOf(t *testing.T, c net.Conn) (got [4]int) {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	opts := [4][2]int{{unix.SOL_SOCKET, unix.SO_KEEPALIVE}, {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE},
		{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL}, {unix.IPPROTO_TCP, unix.TCP_KEEPCNT}}
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		for i, o := range opts {
			if got[i], gerr = unix.GetsockoptInt(int(fd), o[0], o[1]); gerr != nil {
				return
			}
		}
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	return got
}
