package redisconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/rawio"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

func TestKey(t *testing.T) {
	cases := []struct {
		prefix, queue string
		parts         []string
		want          string
	}{
		{"pgrelay", "orders", []string{"s", "3"}, "pgrelay:{orders}:s:3"},
		{"x", "q", nil, "x:{q}"},
		{"pgrelay", "q", []string{"src", "main", "lease"}, "pgrelay:{q}:src:main:lease"},
	}
	for _, c := range cases {
		if got := Key(c.prefix, c.queue, c.parts...); got != c.want {
			t.Errorf("Key = %q, want %q", got, c.want)
		}
	}
}

func TestValidateAndRedact(t *testing.T) {
	if err := (Config{URL: "redis://127.0.0.1:6379"}).Validate(); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"http://u:secret@h:1", "redis://u:secret@h:notaport", "redis://u:secret@[::1", "redis://:secret@h:1/x"} {
		err := (Config{URL: u}).Validate()
		if !errcode.Is(err, errcode.RedisConfig) {
			t.Fatalf("%s: %v", redact(u), err)
		}
		if got := err.Error(); strings.Contains(got, "secret") {
			t.Errorf("password leaked into error: %s", got)
		}
		if _, err := (Config{ClusterURLs: []string{u}}).Client(); err == nil || strings.Contains(err.Error(), "secret") {
			t.Errorf("cluster_urls %s: %v", redact(u), err)
		}
	}
}

// TestParse parses the fields through the linter and the spec, as a component does.
func TestParse(t *testing.T) {
	const lintRefuses errcode.Code = "(refused by the linter)"
	cases := []struct {
		name, yaml string
		check      func(Config) bool
		code       errcode.Code // expected error code ("": none; lintRefuses: the linter refuses it)
	}{
		{"defaults", `{}`, func(c Config) bool {
			return c.URL == "redis://127.0.0.1:6379" && c.Sentinel == nil && len(c.ClusterURLs) == 0 && c.Prefix == "pgrelay" && c.TLS == nil && !c.HasFailover()
		}, ""},
		{"cluster", `cluster_urls: [redis://a:1, redis://b:2]`, func(c Config) bool {
			return len(c.ClusterURLs) == 2 && c.HasFailover()
		}, ""},
		{"sentinel", `
password: datapw
sentinel:
  master_name: mymaster
  addresses: [10.0.0.1:26379, "[::1]:26380"]
  password: sentinelpw
`, func(c Config) bool {
			s := c.Sentinel
			return s != nil && s.MasterName == "mymaster" && len(s.Addrs) == 2 && s.Password == "sentinelpw" && s.Username == "" &&
				s.TLS == nil && c.Password == "datapw" && c.HasFailover()
		}, ""},
		{"tls for the master only", `
tls: {enabled: true}
sentinel: {master_name: m, addresses: [h:1]}
`, func(c Config) bool {
			return c.TLS != nil && c.Sentinel.TLS == nil
		}, ""},
		{"tls for the sentinels only", `
sentinel: {master_name: m, addresses: [h:1], tls: {enabled: true}}
`, func(c Config) bool {
			return c.TLS == nil && c.Sentinel.TLS != nil
		}, ""},
		{"sentinel and cluster", `
cluster_urls: [redis://a:1]
sentinel: {master_name: m, addresses: [h:1]}
`, nil, errcode.RedisConfig},
		{"sentinel without master name", `sentinel: {addresses: [h:1]}`, nil, lintRefuses},
		{"sentinel without addresses", `sentinel: {master_name: m}`, nil, errcode.RedisConfig},
		{"sentinel with an empty master name", `sentinel: {master_name: "", addresses: [h:1]}`, nil, errcode.RedisConfig},
		{"sentinel with no addresses", `sentinel: {master_name: m, addresses: []}`, nil, errcode.RedisConfig},
		{"sentinel address without port", `sentinel: {master_name: m, addresses: [h]}`, nil, errcode.RedisConfig},
		{"bad url", `url: http://h:1`, nil, errcode.RedisConfig},
		{"a database", `url: redis://h:1/3`, func(c Config) bool { return c.database() == 3 }, ""},
		{"cluster node with a database", `cluster_urls: [redis://a:1, redis://b:2/3]`, nil, errcode.RedisConfig},
	}
	spec := service.NewConfigSpec().Fields(Fields()...)
	env := service.NewEmptyEnvironment()
	err := env.RegisterInput("redis_test", spec, func(*service.ParsedConfig, *service.Resources) (service.Input, error) {
		return nil, errors.New("not built")
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lint := env.NewStreamBuilder().AddInputYAML("redis_test:\n" + indent(c.yaml))
			if c.code == lintRefuses {
				if lint == nil {
					t.Fatal("the linter accepted it")
				}
				return
			}
			if lint != nil {
				t.Fatal(lint)
			}
			pc, err := spec.ParseYAML(c.yaml, env)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Parse(pc)
			if c.code != "" {
				if !errcode.Is(err, c.code) {
					t.Fatalf("error %v, want code %s", err, c.code)
				}
				return
			}
			if err != nil || !c.check(got) {
				t.Fatalf("%+v %v", got, err)
			}
		})
	}
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.Trim(s, "\n"), "\n") {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

func TestTopologyChanged(t *testing.T) {
	ctx := context.Background()
	done, cancel := context.WithCancel(ctx)
	cancel()
	cases := []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"nil", ctx, nil, false},
		{"nil reply", ctx, redis.Nil, false},
		{"moved", ctx, proto("MOVED 1 127.0.0.1:7001"), true},
		{"ask", ctx, proto("ASK 1 127.0.0.1:7001"), true},
		{"clusterdown", ctx, proto("CLUSTERDOWN The cluster is down"), true},
		{"readonly", ctx, proto("READONLY You can't write against a read only replica."), true},
		{"script error", ctx, proto("ERR Error running script"), false},
		{"connection refused", ctx, &net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{"eof", ctx, io.EOF, true},
		{"closed client", ctx, redis.ErrClosed, false},
		{"context ended", done, io.EOF, false},
	}
	for _, c := range cases {
		if got := topologyChanged(c.ctx, c.err); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// proto makes a Redis error reply as go-redis returns it.
func proto(msg string) error {
	cmd := redis.NewCmd(context.Background())
	cmd.SetErr(replyError(msg))
	return cmd.Err()
}

type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

func TestSentinelDialerPicksTLS(t *testing.T) {
	// A listener that records whether the client opened with a TLS ClientHello (first byte 0x16).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	first := make(chan byte, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b := make([]byte, 1)
			_, _ = io.ReadFull(c, b)
			first <- b[0]
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	tlsConf := &tls.Config{InsecureSkipVerify: true}
	for _, c := range []struct {
		name           string
		sentinels      []string
		sentinel, data *tls.Config
		wantTLS        bool
	}{
		{"a sentinel with sentinel TLS", []string{addr}, tlsConf, nil, true},
		{"a sentinel without TLS", []string{addr}, nil, tlsConf, false},
		{"a data node with data TLS", []string{"127.0.0.1:1"}, nil, tlsConf, true},
		{"a data node without TLS", []string{"127.0.0.1:1"}, tlsConf, nil, false},
	} {
		dial := sentinelDialer(c.sentinels, c.sentinel, c.data)
		conn, err := dial(context.Background(), "tcp", addr)
		if err == nil {
			if !c.wantTLS && !rawio.Wrapped(conn) {
				t.Errorf("%s: a plain connection is a %T, not rawio's", c.name, conn)
			}
			_, _ = conn.Write([]byte("*1\r\n$4\r\nPING\r\n"))
			conn.Close()
		}
		if got := <-first == 0x16; got != c.wantTLS {
			t.Errorf("%s: TLS %v, want %v", c.name, got, c.wantTLS)
		}
	}
}

// TestSentinelUnreachableFailsFast: with no sentinel listening, a command fails within seconds
// (go-redis's default dial retries, nested through the sentinels, took ~40 s), so a start or a
// shutdown is never held that long.
func TestSentinelUnreachableFailsFast(t *testing.T) {
	conn := Config{Sentinel: &Sentinel{MasterName: "m", Addrs: []string{
		fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}}}
	rdb, err := conn.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	start := time.Now()
	err = rdb.Ping(context.Background()).Err()
	if err == nil || !strings.Contains(err.Error(), "sentinels") {
		t.Fatalf("ping: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("failed after %s", d)
	}
}

// go-redis's connections of a plain client, TLS or not, and of a Cluster client read and write
// through rawio (the consumer's reads and acknowledgements): the client works and the socket under
// its connection is rawio's.
func TestClientsDialRawIO(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	plain := testenv.StartRedis(t)
	secure := testenv.StartRedisTLS(t)
	tlsConf, err := secure.TLS.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		conf Config
		addr string
	}{
		{"url", Config{URL: "redis://" + plain.Addr()}, plain.Addr()},
		{"url with TLS", Config{URL: "redis://" + secure.Addr(), TLS: tlsConf}, secure.Addr()},
		{"cluster_urls", Config{ClusterURLs: []string{"redis://" + plain.Addr()}}, plain.Addr()},
	} {
		rdb, err := c.conf.Client()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := rdb.(*redis.ClusterClient); !ok { // a single server is no cluster: only dial
			if err := rdb.Ping(ctx).Err(); err != nil {
				t.Fatalf("%s: PING: %v", c.name, err)
			}
		}
		var dial func(context.Context, string, string) (net.Conn, error)
		switch cl := rdb.(type) {
		case *redis.Client:
			dial = cl.Options().Dialer
		case *redis.ClusterClient:
			dial = cl.Options().Dialer
		}
		conn, err := dial(ctx, "tcp", c.addr)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		under := conn
		if tc, ok := conn.(*tls.Conn); ok {
			under = tc.NetConn()
		} else if c.conf.TLS != nil {
			t.Errorf("%s: a %T, not a TLS connection", c.name, conn)
		}
		if !rawio.Wrapped(under) {
			t.Errorf("%s: the client's socket is a %T, not rawio's", c.name, under)
		}
		conn.Close()
		rdb.Close()
	}
}
