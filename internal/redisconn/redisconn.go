// Package redisconn holds the Redis connection settings shared by every pgrelay component that talks
// to Redis (redis_queue output and input, pg_cdc's lease and pointer, the CLI): the config fields,
// their parsing into a plain struct, and the go-redis client built from it: a plain client, a Cluster
// client that reloads its slot map as soon as the cluster changes, or a Sentinel failover client.
package redisconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/confread"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/rawio"
)

// The connection's field names.
const (
	FieldURL         = "url"
	FieldClusterURLs = "cluster_urls"
	FieldSentinel    = "sentinel"
	FieldUsername    = "username"
	FieldPassword    = "password"
	FieldTLS         = "tls"
	FieldPrefix      = "prefix"

	// Under FieldSentinel.
	FieldSentinelMaster    = "master_name"
	FieldSentinelAddresses = "addresses"
)

// Config is a parsed Redis connection.
type Config struct {
	URL         string    // redis:// or rediss:// URL (may carry user and password)
	ClusterURLs []string  // when set, a Redis Cluster client seeded with these nodes
	Sentinel    *Sentinel // when set, the master that these sentinels name (a failover client)
	Username    string    // ACL user, overrides the URL's
	Password    string    // secret, overrides the URL's
	TLS         *tls.Config
	Prefix      string // key prefix, "pgrelay" by default
	// PoolSize is the most connections per server (0: go-redis's default, 10 per CPU). Not a config
	// field: a component that blocks one connection per shard sizes it.
	PoolSize int
}

// Sentinel is a master found through Redis Sentinel.
type Sentinel struct {
	MasterName string      // the name the sentinels monitor the master under
	Addrs      []string    // host:port of the sentinels
	Username   string      // ACL user of the sentinels ("" when they need none)
	Password   string      // secret: the sentinels' password
	TLS        *tls.Config // TLS of the sentinel connections; nil: plain TCP
}

// Fields returns the connection fields, to embed at the top level of a component's spec.
func Fields() []*service.ConfigField {
	return []*service.ConfigField{
		service.NewStringField(FieldURL).
			Description("Redis URL: `redis://[user[:password]@]host:port[/db]`, or `rediss://` for TLS. Put passwords in `${ENV}` variables.").
			Example("redis://127.0.0.1:6379").Example("rediss://pgrelay:${REDIS_PASSWORD}@redis.internal:6380").
			Default("redis://127.0.0.1:6379").Secret(),
		service.NewStringListField(FieldClusterURLs).
			Description("Seed nodes of a Redis Cluster (`redis://host:port`). When set, `url` is ignored and a cluster client is used.").
			Default([]any{}).Advanced(),
		service.NewObjectField(FieldSentinel,
			service.NewStringField(FieldSentinelMaster).
				Description("The name the sentinels monitor the master under (`sentinel monitor <name> ...`).").Example("mymaster"),
			service.NewStringListField(FieldSentinelAddresses).
				Description("The sentinels, `host:port` each; list all of them.").Example([]any{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"}),
			service.NewStringField(FieldUsername).Description("ACL user of the sentinels.").Default(""),
			service.NewStringField(FieldPassword).Description("Password of the sentinels (`requirepass` in sentinel.conf). Use `${ENV}`.").Default("").Secret(),
			service.NewTLSToggledField(FieldTLS).Description("TLS of the sentinel connections (the `tls` field above is the master's and replicas')."),
		).Description("Reach the master through Redis Sentinel: pgrelay asks the sentinels for the current master and follows a failover. When set, `url` is ignored; `username`, `password` and `tls` apply to the master and its replicas. Cannot be combined with `cluster_urls`.").
			Optional().Advanced(),
		service.NewStringField(FieldUsername).Description("ACL user name; overrides the URL's.").Default("").Advanced(),
		service.NewStringField(FieldPassword).Description("Password; overrides the URL's. Use `${ENV}`.").Default("").Secret().Advanced(),
		service.NewTLSToggledField(FieldTLS),
		service.NewStringField(FieldPrefix).Description("Prefix of every key pgrelay uses in Redis.").Default("pgrelay").
			LintRule(`root = if !this.re_match("^[A-Za-z0-9_.-]+$") { ["prefix must be letters, digits, '_', '.' or '-'"] }`),
	}
}

// Parse reads the fields added by Fields from conf.
func Parse(conf *service.ParsedConfig) (Config, error) {
	var c Config
	var err error
	if c.URL, err = conf.FieldString(FieldURL); err != nil {
		return c, err
	}
	if c.ClusterURLs, err = conf.FieldStringList(FieldClusterURLs); err != nil {
		return c, err
	}
	if conf.Contains(FieldSentinel) {
		if c.Sentinel, err = parseSentinel(conf.Namespace(FieldSentinel)); err != nil {
			return c, err
		}
	}
	if c.Username, err = conf.FieldString(FieldUsername); err != nil {
		return c, err
	}
	if c.Password, err = conf.FieldString(FieldPassword); err != nil {
		return c, err
	}
	if c.TLS, err = toggledTLS(conf); err != nil {
		return c, err
	}
	if c.Prefix, err = conf.FieldString(FieldPrefix); err != nil {
		return c, err
	}
	return c, c.Validate()
}

func parseSentinel(conf *service.ParsedConfig) (*Sentinel, error) {
	r := confread.New(conf)
	s := &Sentinel{
		MasterName: r.String(FieldSentinelMaster),
		Addrs:      r.StringList(FieldSentinelAddresses),
		Username:   r.String(FieldUsername),
		Password:   r.String(FieldPassword),
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	var err error
	if s.TLS, err = toggledTLS(conf); err != nil {
		return nil, err
	}
	return s, nil
}

// toggledTLS reads a TLS toggled field: nil when disabled.
func toggledTLS(conf *service.ParsedConfig) (*tls.Config, error) {
	t, enabled, err := conf.FieldTLSToggled(FieldTLS)
	if err != nil || !enabled {
		return nil, err
	}
	return t, nil
}

// Validate checks the URLs parse and the sentinel settings are complete; errors (code redis_config)
// name the field and the fix, never a password.
func (c Config) Validate() error {
	if c.Sentinel != nil {
		return c.Sentinel.validate(len(c.ClusterURLs) > 0)
	}
	urls := c.ClusterURLs
	if len(urls) == 0 {
		urls = []string{c.URL}
	}
	for _, u := range urls {
		o, err := redis.ParseURL(u)
		if err == nil && len(c.ClusterURLs) > 0 && o.DB != 0 {
			return configError(fmt.Sprintf("cluster_urls entry %q names database %d; a Redis Cluster has database 0 only", redact(u), o.DB),
				"list the nodes without a database path (redis://host:6379)")
		}
		if err != nil {
			return configError(fmt.Sprintf("redis url %q: %v", redact(u), redactErr(err, u)), "use redis://host:port or rediss://host:port, with a database number as the path if not 0 (redis://host:6379/2) and a password in ${ENV} (redis://user:${REDIS_PASSWORD}@host:6379)")
		}
	}
	return nil
}

func (s *Sentinel) validate(cluster bool) error {
	switch {
	case cluster:
		return configError("both sentinel and cluster_urls are set", "use sentinel for a master with replicas watched by Redis Sentinel, or cluster_urls for Redis Cluster, not both")
	case s.MasterName == "":
		return configError("sentinel.master_name is empty", "set it to the name of the `sentinel monitor <name> ...` line of sentinel.conf")
	case len(s.Addrs) == 0:
		return configError("sentinel.addresses is empty", "list every sentinel as host:port, e.g. [10.0.0.1:26379, 10.0.0.2:26379, 10.0.0.3:26379]")
	}
	for _, a := range s.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return configError(fmt.Sprintf("sentinel address %q: %v", a, err), "write each sentinel as host:port, e.g. 10.0.0.1:26379")
		}
	}
	return nil
}

func configError(msg, fix string) error { return errcode.New(errcode.RedisConfig, msg, fix) }

// redact removes the password from a URL for messages. It works on the text, so a URL that does not
// parse is redacted too: the userinfo runs from "://" to the last '@'.
func redact(u string) string {
	scheme, rest, ok := strings.Cut(u, "://")
	at := strings.LastIndexByte(rest, '@')
	if !ok || at < 0 {
		return u
	}
	user, _, hasPass := strings.Cut(rest[:at], ":")
	if !hasPass {
		return u
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}

// redactErr is err (whose text may quote u, as url.Parse's errors do) with u's password hidden.
func redactErr(err error, u string) error {
	r := redact(u)
	if r == u {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), u, r))
}

// HasFailover reports whether the connection follows a failover on its own: Sentinel or Cluster,
// where a replica may be promoted in place of a master that died.
func (c Config) HasFailover() bool { return c.Sentinel != nil || len(c.ClusterURLs) > 0 }

// Client builds the client: a Sentinel failover client when sentinel is set, a ClusterClient
// (see NewClusterClient) when cluster_urls is, else a plain Client. None sends CLIENT SETINFO at
// connect (go-redis' library name), which a least-privilege ACL user would be refused (ACL LOG).
func (c Config) Client() (redis.UniversalClient, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	switch {
	case c.Sentinel != nil:
		return c.failoverClient(), nil
	case len(c.ClusterURLs) > 0:
		var addrs []string
		var base *redis.Options
		for _, u := range c.ClusterURLs {
			o, err := redis.ParseURL(u)
			if err != nil {
				return nil, fmt.Errorf("cluster_urls: %q: %v", redact(u), redactErr(err, u))
			}
			if base == nil {
				base = o
			}
			addrs = append(addrs, o.Addr)
		}
		co := &redis.ClusterOptions{Addrs: addrs, Username: base.Username, Password: base.Password, TLSConfig: base.TLSConfig, PoolSize: c.PoolSize,
			DisableIdentity: true}
		c.apply(&co.Username, &co.Password, &co.TLSConfig)
		co.Dialer = dialer(co.TLSConfig, dialTimeout)
		return NewClusterClient(co), nil
	}
	o, err := redis.ParseURL(c.URL)
	if err != nil {
		return nil, fmt.Errorf("url %q: %v", redact(c.URL), redactErr(err, c.URL))
	}
	c.apply(&o.Username, &o.Password, &o.TLSConfig)
	if c.PoolSize > 0 {
		o.PoolSize = c.PoolSize
	}
	o.DisableIdentity = true
	o.Dialer = dialer(o.TLSConfig, positive(o.DialTimeout, dialTimeout))
	return redis.NewClient(o), nil
}

// failoverClient is go-redis's failover client: every new connection goes to the master the
// sentinels name, and on +switch-master the connections to the old master are dropped.
func (c Config) failoverClient() *redis.Client {
	s := c.Sentinel
	o := &redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.Addrs,
		SentinelUsername: s.Username, SentinelPassword: s.Password,
		Username: c.Username, Password: c.Password, TLSConfig: c.TLS, PoolSize: c.PoolSize, DisableIdentity: true,
		// One dial per attempt: every dial of the master asks the sentinels again, each with its own
		// dial retries, so go-redis's 5 would make a start with no sentinel up take ~40 s to fail
		// (0.6 s with 1); the callers retry with their own backoff.
		DialerRetries: 1}
	o.Dialer = sentinelDialer(s.Addrs, s.TLS, c.TLS)
	rdb := redis.NewFailoverClient(o)
	registerSentinel(rdb, s)
	return rdb
}

// dialTimeout bounds a connection attempt, as go-redis's own dialer does.
const dialTimeout = 5 * time.Second

// sentinelDialer dials the listed sentinels with sentinelTLS and every other address (the master
// and replicas the sentinels name) with dataTLS; nil means plain TCP. (go-redis dials both through
// one Dialer; a sentinel it discovers that is not listed is dialed like the master.)
func sentinelDialer(sentinels []string, sentinelTLS, dataTLS *tls.Config) func(context.Context, string, string) (net.Conn, error) {
	isSentinel := map[string]bool{}
	for _, a := range sentinels {
		isSentinel[a] = true
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		t := dataTLS
		if isSentinel[addr] {
			t = sentinelTLS
		}
		return dial(ctx, network, addr, t, dialTimeout)
	}
}

// keepAlive is go-redis's own TCP keep-alive for its connections: probing after 30 s idle, the
// peer declared dead after 3 unanswered probes 5 s apart (a master gone without a reset is noticed
// within 45 s).
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3}

// dialer dials every address with dial under t's TLS (nil: plain) within timeout.
func dialer(t *tls.Config, timeout time.Duration) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dial(ctx, network, addr, t, timeout)
	}
}

// dial connects to addr (TCP or a Unix socket) with reads and writes through rawio, under t's TLS
// when t is set, within timeout (the handshake included). It replaces go-redis's own dialer, which
// leaves the socket to the net package; like crypto/tls's dialers it checks the certificate against
// the host dialed when t names no server.
func dial(ctx context.Context, network, addr string, t *tls.Config, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	nd := &net.Dialer{KeepAliveConfig: keepAlive}
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c = rawio.Wrap(c)
	if t == nil {
		return c, nil
	}
	if t.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		t = t.Clone()
		t.ServerName = host
	}
	tc := tls.Client(c, t)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, &handshakeError{addr: addr, err: err}
	}
	return tc, nil
}

// handshakeError is a TLS handshake with addr that failed: Explain tells a server that does not
// speak TLS (no answer to the handshake) from a refused certificate (its cause).
type handshakeError struct {
	addr string
	err  error
}

func (e *handshakeError) Error() string { return "TLS handshake with " + e.addr + ": " + e.err.Error() }
func (e *handshakeError) Unwrap() error { return e.err }

func (c Config) apply(user, pass *string, t **tls.Config) {
	if c.Username != "" {
		*user = c.Username
	}
	if c.Password != "" {
		*pass = c.Password
	}
	if c.TLS != nil {
		*t = c.TLS
	}
}

// Key joins the prefix, the hash-tagged queue and the rest: Key("q", "s", "3") = "pgrelay:{q}:s:3".
func (c Config) Key(queue string, parts ...string) string {
	return Key(c.Prefix, queue, parts...)
}

// Key is Config.Key for a given prefix.
func Key(prefix, queue string, parts ...string) string {
	var b strings.Builder
	b.WriteString(prefix)
	b.WriteString(":{")
	b.WriteString(queue)
	b.WriteString("}")
	for _, p := range parts {
		b.WriteByte(':')
		b.WriteString(p)
	}
	return b.String()
}
