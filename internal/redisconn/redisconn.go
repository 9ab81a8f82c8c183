// Package redisconn holds the Redis connection settings shared by every pgrelay component that talks
// to Redis (redis_queue output and input, pg_cdc's lease and pointer): the config fields, their
// parsing into a plain struct, and the go-redis client built from it (plain or Cluster).
package redisconn

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/redpanda-data/benthos/v4/public/service"
)

// Config is a parsed Redis connection.
type Config struct {
	URL         string   // redis:// or rediss:// URL (may carry user and password)
	ClusterURLs []string // when set, a Redis Cluster client seeded with these nodes
	Username    string   // ACL user, overrides the URL's
	Password    string   // secret, overrides the URL's
	TLS         *tls.Config
	Prefix      string // key prefix, "pgrelay" by default
}

// Field names of the connection fields.
const (
	FieldURL         = "url"
	FieldClusterURLs = "cluster_urls"
	FieldUsername    = "username"
	FieldPassword    = "password"
	FieldTLS         = "tls"
	FieldPrefix      = "prefix"
)

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
	if c.Username, err = conf.FieldString(FieldUsername); err != nil {
		return c, err
	}
	if c.Password, err = conf.FieldString(FieldPassword); err != nil {
		return c, err
	}
	tlsConf, enabled, err := conf.FieldTLSToggled(FieldTLS)
	if err != nil {
		return c, err
	}
	if enabled {
		c.TLS = tlsConf
	}
	if c.Prefix, err = conf.FieldString(FieldPrefix); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// Validate checks the URLs parse; errors name the field and the fix.
func (c Config) Validate() error {
	urls := c.ClusterURLs
	if len(urls) == 0 {
		urls = []string{c.URL}
	}
	for _, u := range urls {
		if _, err := redis.ParseURL(u); err != nil {
			return fmt.Errorf("redis url %q: %v (use redis://host:port or rediss://host:port)", redact(u), redactErr(err, u))
		}
	}
	return nil
}

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

// Client builds the client: a ClusterClient when cluster_urls is set, else a plain Client.
func (c Config) Client() (redis.UniversalClient, error) {
	if len(c.ClusterURLs) > 0 {
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
		co := &redis.ClusterOptions{Addrs: addrs, Username: base.Username, Password: base.Password, TLSConfig: base.TLSConfig}
		c.apply(&co.Username, &co.Password, &co.TLSConfig)
		return redis.NewClusterClient(co), nil
	}
	o, err := redis.ParseURL(c.URL)
	if err != nil {
		return nil, fmt.Errorf("url %q: %v", redact(c.URL), redactErr(err, c.URL))
	}
	c.apply(&o.Username, &o.Password, &o.TLSConfig)
	return redis.NewClient(o), nil
}

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
