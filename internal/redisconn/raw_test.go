package redisconn

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/rawio"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// rawSetGet runs SET key v and GET key on a raw connection of the master serving key and returns
// GET's reply (or the first error reply).
func rawSetGet(ctx context.Context, r *Raw, key, v string) (string, error) {
	var got string
	err := r.Run(ctx, key, func(c *RawConn) error {
		b := AppendCommand(c.Buf[:0], "SET", key, v)
		b = AppendCommand(b, "GET", key)
		c.Buf = b
		if err := c.Send(ctx, b, 0); err != nil {
			return err
		}
		if err := c.Skip(); err != nil {
			return err
		}
		rep, err := c.Read()
		if err != nil {
			return err
		}
		got = string(rep.Str)
		return rep.Err()
	})
	return got, err
}

// TestRawConnectsLikeItsClient: a Raw pool reaches the server the way its go-redis client does:
// password and database, an ACL user, TLS with a client certificate, the master named by the
// sentinels; its connections are reused, and the pool refuses work once closed.
func TestRawConnectsLikeItsClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		name  string
		start func(t *testing.T) (raw, check redis.UniversalClient)
	}{
		{"password and database", func(t *testing.T) (redis.UniversalClient, redis.UniversalClient) {
			r := testenv.StartRedis(t)
			if err := r.Client().ConfigSet(ctx, "requirepass", "s3cret").Err(); err != nil {
				t.Fatal(err)
			}
			return redis.NewClient(&redis.Options{Addr: r.Addr(), Password: "s3cret", DB: 3}),
				redis.NewClient(&redis.Options{Addr: r.Addr(), Password: "s3cret", DB: 3})
		}},
		{"ACL user and client name", func(t *testing.T) (redis.UniversalClient, redis.UniversalClient) {
			r := testenv.StartRedis(t)
			if err := r.Client().Do(ctx, "acl", "setuser", "relay", "on", ">pw", "~*", "&*", "+@all").Err(); err != nil {
				t.Fatal(err)
			}
			return redis.NewClient(&redis.Options{Addr: r.Addr(), Username: "relay", Password: "pw", ClientName: "pgrelay-raw"}), r.Client()
		}},
		{"TLS with a client certificate", func(t *testing.T) (redis.UniversalClient, redis.UniversalClient) {
			r := testenv.StartRedisTLS(t)
			conf, err := r.TLS.ClientConfig()
			if err != nil {
				t.Fatal(err)
			}
			return redis.NewClient(&redis.Options{Addr: r.Addr(), TLSConfig: conf}), r.Client()
		}},
		{"Sentinel", func(t *testing.T) (redis.UniversalClient, redis.UniversalClient) {
			rs := testenv.StartRedisSentinel(t, 0)
			return rs.Client(), rs.Nodes[0].Client()
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rdb, check := c.start(t)
			defer rdb.Close()
			r := NewRaw(rdb)
			for i, v := range []string{"one", "two"} {
				if got, err := rawSetGet(ctx, r, "k", v); err != nil || got != v {
					t.Fatalf("run %d: %q %v", i, got, err)
				}
			}
			if got := check.Get(ctx, "k").Val(); got != "two" {
				t.Fatalf("the client reads %q", got)
			}
			if n := len(r.idle); n != 1 || len(r.idle[rdb.(*redis.Client).Options().Addr]) != 1 {
				t.Fatalf("idle connections: %v", r.idle)
			}
			if c.name == "ACL user and client name" {
				if list := check.ClientList(ctx).Val(); !strings.Contains(list, "name=pgrelay-raw") || !strings.Contains(list, "user=relay") {
					t.Fatalf("client list: %s", list)
				}
			}
			r.Close()
			if _, err := rawSetGet(ctx, r, "k", "three"); !errors.Is(err, ErrRawUnavailable) {
				t.Fatalf("after Close: %v", err)
			}
		})
	}
}

// TestRawFollowsMoved moves a key's (empty) slot to another master behind the client's back:
// Raw.Run follows the MOVED answer (reloading the slot map) and runs again on the new owner. A
// slot being migrated answers ASK, which Run returns as it is.
func TestRawFollowsMoved(t *testing.T) {
	t.Parallel()
	rc := testenv.StartRedisCluster(t)
	ctx := context.Background()
	cc := NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs()})
	defer cc.Close()
	r := NewRaw(cc)
	defer r.Close()
	key := "pgrelay:{rawmoved}:k"
	_, others := slotOwners(rc, key)
	if got, err := rawSetGet(ctx, r, key, "a"); err != nil || got != "a" {
		t.Fatalf("first: %q %v", got, err)
	}
	cc.Del(ctx, key)
	moveSlot(t, rc, key, others[0])
	if got, err := rawSetGet(ctx, r, key, "b"); err != nil || got != "b" {
		t.Fatalf("after MOVED: %q %v", got, err)
	}
	if v := others[0].Client().Get(ctx, key).Val(); v != "b" {
		t.Fatalf("after MOVED: %s holds %q", others[0].Addr(), v)
	}

	cc.Del(ctx, key)
	migrateSlot(t, key, others[0], others[1])
	if _, err := rawSetGet(ctx, r, key, "c"); !redis.HasErrorPrefix(err, "ASK") {
		t.Fatalf("migrating slot: %v, want an ASK answer", err)
	}
}

// TestSkipStatus: SkipStatus reads the buffered run of one status, and stops at another reply,
// at another status, at a reply not received whole, and at max.
func TestSkipStatus(t *testing.T) {
	q := "+QUEUED\r\n"
	cases := []struct {
		in   string
		max  int
		want int
		next string // what Read returns after
	}{
		{strings.Repeat(q, 5) + "+OK\r\n", 10, 5, "OK"},
		{strings.Repeat(q, 5) + "+OK\r\n", 3, 3, "QUEUED"},
		{q + "-ERR wrong number of arguments\r\n" + q, 10, 1, "ERR wrong number of arguments"},
		{"+QUEUEDX\r\n" + q, 10, 0, "QUEUEDX"},
		{"+OK\r\n" + q, 10, 0, "OK"},
		{q + q + "+QUE", 10, 2, ""}, // the third is not whole yet: left to Read
	}
	for _, c := range cases {
		conn := &RawConn{br: bufio.NewReader(strings.NewReader(c.in)), addr: "test"}
		if _, err := conn.br.Peek(1); err != nil { // receive the bytes, as a first Read would
			t.Fatal(err)
		}
		if got := conn.SkipStatus("QUEUED", c.max); got != c.want {
			t.Errorf("%q max %d: read %d, want %d", c.in, c.max, got, c.want)
		}
		rep, err := conn.Read()
		if c.next == "" {
			if err == nil {
				t.Errorf("%q: read %q after, want the end of the input", c.in, rep.Str)
			}
			continue
		}
		if err != nil || string(rep.Str) != c.next {
			t.Errorf("%q: read %q %v after, want %q", c.in, rep.Str, err, c.next)
		}
	}
}

// TestRawReadsLongPipelines reads the replies of long pipelines the way the queue's transaction
// does: runs of +QUEUED compared in bulk (SkipStatus) with any other reply read in between, bulk
// strings skipped whole (Skip), and the connection still in step afterwards. Redis sends the
// replies in pieces, so SkipStatus sees any split of them; the count must come out exact.
func TestRawReadsLongPipelines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testenv.StartRedis(t)
	raw := NewRaw(r.Client())
	defer raw.Close()
	big := strings.Repeat("v", 70<<10) // a bulk reply longer than the connection's buffer
	if err := r.Client().Set(ctx, "big", big, 0).Err(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		n      int   // SETs queued in MULTI
		badAt  []int // positions of a command refused at queue time (wrong arity)
		gets   int   // GETs of the big value pipelined after EXEC, skipped
		errors int   // error replies expected among the queued
	}{
		{"all queued", 5000, nil, 0, 0},
		{"refusals in the run", 3000, []int{0, 1, 1500, 2999}, 0, 4},
		{"big bulk replies skipped", 10, nil, 3, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := raw.Run(ctx, "k", func(conn *RawConn) error {
				b := AppendCommand(conn.Buf[:0], "MULTI")
				bad := map[int]bool{}
				for _, i := range c.badAt {
					bad[i] = true
				}
				for i := range c.n {
					if bad[i] {
						b = AppendCommand(b, "SET", "k")
					} else {
						b = AppendCommand(b, "SET", "k"+strconv.Itoa(i), "v")
					}
				}
				b = AppendCommand(b, "DISCARD")
				for range c.gets {
					b = AppendCommand(b, "GET", "big")
				}
				b = AppendCommand(b, "PING")
				conn.Buf = b
				if err := conn.Send(ctx, b, 0); err != nil {
					return err
				}
				if rep, err := conn.Read(); err != nil || string(rep.Str) != "OK" {
					return fmt.Errorf("MULTI: %q %v", rep.Str, err)
				}
				queued, errs := 0, 0
				for left := c.n; left > 0; left-- {
					k := conn.SkipStatus("QUEUED", left)
					queued += k
					if left -= k; left == 0 {
						break
					}
					rep, err := conn.Read() // an error, or a +QUEUED not yet received whole
					switch {
					case err != nil:
						return err
					case rep.Err() != nil:
						errs++
					case rep.Kind == '+' && string(rep.Str) == "QUEUED":
						queued++
					default:
						return fmt.Errorf("unexpected reply %c%s", rep.Kind, rep.Str)
					}
				}
				if queued != c.n-c.errors || errs != c.errors {
					return fmt.Errorf("%d queued and %d errors, want %d and %d", queued, errs, c.n-c.errors, c.errors)
				}
				if rep, err := conn.Read(); err != nil || string(rep.Str) != "OK" { // DISCARD
					return fmt.Errorf("DISCARD: %q %v", rep.Str, err)
				}
				for range c.gets {
					if err := conn.Skip(); err != nil {
						return err
					}
				}
				if n := conn.SkipStatus("QUEUED", 1); n != 0 {
					return fmt.Errorf("SkipStatus read %d replies of another status", n)
				}
				if rep, err := conn.Read(); err != nil || string(rep.Str) != "PONG" {
					return fmt.Errorf("PING: %c%q %v", rep.Kind, rep.Str, err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRawDropsConnectionsOnSwitch: when a sentinel announces another master, the pool closes
// its idle connections, a connection in use sends nothing more (ErrMasterSwitched, closed when
// its Run ends), and the next Run works on a new connection; the same announcement again
// changes nothing.
func TestRawDropsConnectionsOnSwitch(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	rdb := srv.Client()
	ctx := context.Background()
	r := NewRaw(rdb)
	defer r.Close()
	clientID := func() (id int64) {
		t.Helper()
		if err := r.Run(ctx, "k", func(c *RawConn) error {
			c.Buf = AppendCommand(c.Buf[:0], "CLIENT", "ID")
			if err := c.Send(ctx, c.Buf, 0); err != nil {
				return err
			}
			rep, err := c.Read()
			id = rep.Int
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	alive := func(id int64) bool {
		list := rdb.ClientList(ctx).Val()
		return strings.Contains(list, "id="+strconv.FormatInt(id, 10)+" ")
	}
	// closed: the server lists a connection the pool closed until it has read the close, so
	// this waits for that (a connection left open stays listed and fails the test)
	closed := func(id int64) bool {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if !alive(id) {
				return true
			}
		}
		return false
	}
	idle := clientID()
	if clientID() != idle || !alive(idle) {
		t.Fatal("the idle connection was not reused")
	}
	r.switched("127.0.0.1:1")
	if !closed(idle) {
		t.Fatal("the idle connection survived the switch")
	}
	var inUse int64
	err := r.Run(ctx, "k", func(c *RawConn) error {
		c.Buf = AppendCommand(c.Buf[:0], "CLIENT", "ID")
		if err := c.Send(ctx, c.Buf, 0); err != nil {
			return err
		}
		rep, err := c.Read()
		if err != nil {
			return err
		}
		inUse = rep.Int
		r.switched("127.0.0.1:2")
		return c.Send(ctx, AppendCommand(nil, "SET", "k", "v"), 0)
	})
	if !errors.Is(err, ErrMasterSwitched) {
		t.Fatalf("Send after a switch: %v, want ErrMasterSwitched", err)
	}
	if !closed(inUse) || rdb.Exists(ctx, "k").Val() != 0 {
		t.Fatal("the connection in use went on after the switch")
	}
	next := clientID()
	r.switched("127.0.0.1:2") // announced by another sentinel: the same switch
	if clientID() != next {
		t.Fatal("the same announcement again dropped the connection")
	}
}

// TestCheckDialed: a connection dialed soon after a sentinel announced a switch must reach the
// announced master; an old announcement, a host name or none is not checked.
func TestCheckDialed(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	nc, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := &RawConn{nc: nc}
	for _, tc := range []struct {
		master string
		age    time.Duration
		want   error
	}{
		{"", 0, nil},
		{srv.Addr(), 0, nil},
		{"127.0.0.1:1", 0, ErrMasterSwitched},
		{"127.0.0.1:1", switchSettle + time.Second, nil},
		{"redis-b.internal:6379", 0, nil},
	} {
		r := &Raw{master: tc.master, masterAt: time.Now().Add(-tc.age)}
		if err := r.checkDialed(c); !errors.Is(err, tc.want) {
			t.Errorf("announced %q %v ago: %v, want %v", tc.master, tc.age, err, tc.want)
		}
	}
}

// TestPutClosesAfterATopologyError: a connection given back after a use that ended with READONLY
// (the server is a replica now) or an I/O error is closed, not pooled, as at the end of Run; after
// a plain error reply or none it is pooled again.
func TestPutClosesAfterATopologyError(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.StartRedis(t).Client()
	r := NewRaw(rdb)
	defer r.Close()
	addr := rdb.Options().Addr
	for _, c := range []struct {
		name   string
		err    error
		pooled bool
	}{
		{"no error", nil, true},
		{"an error reply", ReplyError("ERR wrong number of arguments"), true},
		{"READONLY", ReplyError("READONLY You can't write against a read only replica."), false},
		{"an I/O error", io.ErrUnexpectedEOF, false},
		{"the caller's own error, connection in step", inStep{}, true},
		{"the caller's own error, wrapped", fmt.Errorf("write: %w", inStep{}), true},
		{"the caller's own error, not in step", errors.New("a check failed"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var handed *RawConn
			err := r.Run(ctx, "k", func(conn *RawConn) error {
				handed = conn
				return Handed{}
			})
			if err != nil || handed == nil {
				t.Fatalf("run: %v", err)
			}
			before := len(r.idle[addr])
			r.Put(ctx, handed, c.err)
			if got := len(r.idle[addr]) == before+1; got != c.pooled {
				t.Fatalf("pooled %v, want %v (idle %d → %d)", got, c.pooled, before, len(r.idle[addr]))
			}
		})
	}
}

// inStep is an error of the caller's own after which the connection is in step (InStep).
type inStep struct{}

func (inStep) Error() string { return "aborted" }
func (inStep) InStep() bool  { return true }

// The pool's connections read and write without the runtime's system call bookkeeping (rawio):
// the queue writer's commands and replies are pgrelay's hottest socket.
func TestRawConnsUseRawIO(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	raw := NewRaw(redis.NewClient(&redis.Options{Addr: r.Addr()}))
	defer raw.Close()
	err := raw.Run(context.Background(), "k", func(c *RawConn) error {
		if !rawio.Wrapped(c.nc) {
			t.Errorf("the raw connection is a %T, not rawio's", c.nc)
		}
		if err := c.Send(context.Background(), AppendCommand(nil, "PING"), 0); err != nil {
			return err
		}
		rep, err := c.Read()
		if err == nil && string(rep.Str) != "PONG" {
			err = fmt.Errorf("PING: %q", rep.Str)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
