//go:build linux

package source_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/source"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestReplicationSocketIsOutsideTheNetworkPoller: while pg_cdc streams, the socket of its
// replication connection (found by the client port PostgreSQL shows for the walsender) has a
// descriptor in none of the process's epoll sets: the one it reads, which only a duplicate made for
// a wait joins the poller with, so what the walsender sends meanwhile wakes no idle thread. A
// query connection's socket, read through Go's poller, is in one.
func TestReplicationSocketIsOutsideTheNetworkPoller(t *testing.T) {
	e := &env{t: t, pg: testenv.StartPostgres(t), rd: testenv.StartRedis(t), ctx: context.Background()}
	e.pg.Exec(`CREATE TABLE polled (id bigint PRIMARY KEY)`)
	stop := startStream(t, fmt.Sprintf(`
input:
  pg_cdc:
    name: po
    dsn: %s
    tls: {mode: disable}
    tables: [{table: polled, queue: po}]
    redis: {url: %s}
output:
  drop: {}
logger: {level: warn}
`, e.pg.DSN(), e.rd.URL()))
	defer stop()
	e.waitPointer("po", "po")

	var port int
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT client_port FROM pg_stat_replication`).Scan(&port); err != nil {
		t.Fatal(err)
	}
	polled := source.Polled(t)
	outside := 0
	fds := socketFds(t, port, e.pg.Port)
	for _, fd := range fds {
		if !polled[fd] {
			outside++
		}
	}
	if outside == 0 {
		t.Fatalf("every descriptor of the replication connection's socket (%v, local port %d) is in an epoll set", fds, port)
	}
	// The same check finds a socket that is: the source's query connections to PostgreSQL.
	var pooled int
	for _, s := range tcpSockets(t) {
		if s.remote != e.pg.Port || s.local == port {
			continue
		}
		for _, fd := range socketFds(t, s.local, e.pg.Port) {
			if polled[fd] {
				pooled++
			}
		}
	}
	if pooled == 0 {
		t.Fatal("setup: none of the source's query connections is in an epoll set; the check sees nothing")
	}
}

// TestStreamOverTheUnixSocket: pg_cdc reaches PostgreSQL over its Unix socket (the replication
// connection a pollConn over a Unix stream socket): transactions written while it streams, large
// enough to fill the socket, and a restart replay exactly to the table.
func TestStreamOverTheUnixSocket(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE sock (id bigint PRIMARY KEY, v text)`)
	run := func() func() {
		return startStream(t, cdctest.Pipeline{Name: "us", DSN: e.pg.SocketDSN(), Tables: `[{table: sock, queue: us}]`, Redis: e.rd.URL()}.YAML())
	}
	stop := run()
	e.waitPointer("us", "us")
	for i := 0; i < 20; i++ {
		e.pg.Exec(`INSERT INTO sock SELECT g, repeat('v', 200) || g FROM generate_series($1::bigint, $1::bigint + 999) g`, i*1000)
		if i == 10 {
			stop()
			stop = run()
		}
	}
	e.pg.Exec(`UPDATE sock SET v = 'updated' WHERE id % 7 = 0`)
	e.pg.Exec(`DELETE FROM sock WHERE id % 11 = 0`)
	defer stop()
	end := cdctest.CurrentLSN(t, e.pg.Pool())
	cdctest.WaitCovered(t, 60*time.Second, 20*time.Millisecond, end, func() *pointer.Pointer {
		return cdctest.ReadPointer(t, e.rd.Client(), "us", "us")
	})
	e.checkOracle("us", "public.sock", "id")
}

// tcpSocket is a loopback TCP socket of the network namespace (/proc/net/tcp).
type tcpSocket struct {
	local, remote int // ports
	inode         uint64
}

// tcpSockets lists the namespace's TCP sockets (any process's; socketFd finds this one's).
func tcpSockets(t *testing.T) []tcpSocket {
	t.Helper()
	var out []tcpSocket
	for _, name := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || !strings.Contains(fields[1], ":") {
				continue
			}
			local, err1 := strconv.ParseUint(fields[1][strings.LastIndex(fields[1], ":")+1:], 16, 32)
			remote, err2 := strconv.ParseUint(fields[2][strings.LastIndex(fields[2], ":")+1:], 16, 32)
			inode, err3 := strconv.ParseUint(fields[9], 10, 64)
			if err1 == nil && err2 == nil && err3 == nil && inode != 0 {
				out = append(out, tcpSocket{int(local), int(remote), inode})
			}
		}
		f.Close()
	}
	return out
}

// socketFds are the descriptors of this process's socket from local port to remote port.
func socketFds(t *testing.T, local, remote int) []int {
	t.Helper()
	var fds []int
	files := source.OpenFiles(t)
	for _, s := range tcpSockets(t) {
		if s.local != local || s.remote != remote {
			continue
		}
		want := fmt.Sprintf("socket:[%d]", s.inode)
		for fd, target := range files {
			if target == want {
				fds = append(fds, fd)
			}
		}
	}
	if len(fds) == 0 {
		t.Fatalf("no socket of this process goes from port %d to port %d", local, remote)
	}
	return fds
}
