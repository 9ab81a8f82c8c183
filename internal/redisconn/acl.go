package redisconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// A Use is one thing a pgrelay component does in Redis. Each needs the commands aclCommands lists
// for it; a component checks its uses at start (CheckACL), and an ACL user holding the commands of
// its uses (ACLLine) on the keys under the prefix needs nothing more.
type Use int

// The uses, by component.
const (
	// UseServer: PING, and INFO memory for the eviction check (every long-running component).
	UseServer Use = iota
	// UseCluster: a Redis Cluster client: the slot map, the command table go-redis routes by, and
	// ASKING before a command sent on after an ASK redirection (added by CheckACL on a cluster; add
	// it to every line there).
	UseCluster
	// UseLease: a lease (pg_cdc's source lease, the redis_queue input's shard leases), held by the
	// lease_*.lua scripts.
	UseLease
	// UseSource: pg_cdc's pointer, status hash and resync request.
	UseSource
	// UseWrite: a queue write (the redis_queue output; pg_cdc's first pointer): the optimistic
	// transaction (WATCH, the reads, MULTI … EXEC, or DISCARD and UNWATCH), queue_write.lua when
	// it keeps conflicting, and the queue's meta.
	UseWrite
	// UseAOF: the `durability: aof` check (CONFIG GET appendonly, appendfsync).
	UseAOF
	// UseReplicas: `durability: {replicas: N}` (WAIT).
	UseReplicas
	// UseRetention: the output's trims (max_age, max_length), which spare what a group still needs.
	UseRetention
	// UseConsume: the redis_queue input: its groups, fenced reads, acks, attempts, dead letters and
	// membership.
	UseConsume
	// UseInspect: a queue's shards, groups and lag (pgrelay queue info, the sinks of pgrelay status,
	// the input's lag gauges).
	UseInspect
	// UseStatus: a source's lease, pointer and status hash (pgrelay status).
	UseStatus
	// UsePosition: where each shard ends, read in one MULTI/EXEC (pgrelay queue position).
	UsePosition
	// UseDeadLetters: listing dead letters (pgrelay queue dlq).
	UseDeadLetters
	// UseReplay: pgrelay queue dlq --replay (queue_replay.lua).
	UseReplay
	// UseDrop: pgrelay queue dlq --drop.
	UseDrop
	// UseResync: pgrelay resync (the request key).
	UseResync
	// UseTeardown: pgrelay teardown (deletes the pointer, status and request keys).
	UseTeardown
	// UseReread: pgrelay snapshot (reads the pointer's presence and the request key, writes it).
	UseReread
)

// aclCommands are the commands of each use, as an ACL rule names them. A command a script runs
// counts like one sent directly: Redis checks the user's ACL inside scripts too.
var aclCommands = map[Use][]string{
	UseServer:    {"ping", "info"},
	UseCluster:   {"cluster|slots", "command", "asking"},
	UseLease:     {"evalsha", "eval", "get", "set", "incr", "pexpire", "del"},
	UseSource:    {"get", "exists", "del", "hset", "pexpire"},
	UseWrite:     {"evalsha", "eval", "get", "set", "hget", "hmget", "hset", "xadd", "watch", "unwatch", "type", "multi", "exec", "discard"},
	UseAOF:       {"config|get"},
	UseReplicas:  {"wait"},
	UseRetention: {"hget", "xrevrange", "xtrim", "xinfo|groups", "xpending"},
	UseConsume: {"evalsha", "eval", "exists", "get", "del", "hget", "hmget", "hset", "hdel", "hincrby", "xgroup|create", "xinfo|groups", "xinfo|stream",
		"xreadgroup", "xread", "xrevrange", "xrange", "xack", "xadd", "zadd", "zrem", "zremrangebyscore", "zcard"},
	UseInspect:     {"hgetall", "xlen", "xrange", "xinfo|groups", "xinfo|stream", "time", "zcount", "get", "pttl"},
	UseStatus:      {"get", "pttl", "hgetall"},
	UsePosition:    {"multi", "exec", "hget", "xinfo|stream"},
	UseDeadLetters: {"xrange"},
	UseReplay:      {"evalsha", "eval", "hget", "xinfo|groups", "xrange", "hincrby", "xadd", "xdel"},
	UseDrop:        {"xdel"},
	UseResync:      {"set"},
	UseTeardown:    {"get", "pttl", "del"},
	UseReread:      {"exists", "get", "set"},
}

// checkCommands are what CheckACL itself runs: it queues the others inside MULTI and DISCARDs them.
var checkCommands = []string{"multi", "discard"}

// aloneCommands are checked each on its own before MULTI: inside it EXEC would run the queue and
// DISCARD end it, and WATCH is refused there. EXEC or DISCARD alone, when allowed, only answers
// that no MULTI is open; WATCH alone watches the placeholder key, which the DISCARD after the
// probes unwatches.
var aloneCommands = []string{"discard", "exec", "watch"}

// The ACL users of docs/operations.md (Least privilege), one per role, with the uses of each.
var (
	// SourceUses is pg_cdc with its redis_queue output.
	SourceUses = []Use{UseServer, UseLease, UseSource, UseWrite, UseAOF, UseReplicas, UseRetention}
	// ConsumerUses is the redis_queue input (a sink's pipeline).
	ConsumerUses = []Use{UseServer, UseLease, UseConsume, UseInspect}
	// CLIReadUses is pgrelay status, queue info, queue position and queue dlq (listing).
	CLIReadUses = []Use{UseStatus, UseInspect, UsePosition, UseDeadLetters}
	// CLIWriteUses is the read-only CLI's plus pgrelay resync, teardown and queue dlq --replay/--drop.
	CLIWriteUses = []Use{UseStatus, UseInspect, UsePosition, UseDeadLetters, UseResync, UseTeardown, UseReplay, UseDrop, UseReread}
)

// ACLCommands lists the commands of uses and of the start check, sorted, each once.
func ACLCommands(uses ...Use) []string {
	set := map[string]bool{}
	for _, c := range checkCommands {
		set[c] = true
	}
	for _, u := range uses {
		for _, c := range aclCommands[u] {
			set[c] = true
		}
	}
	out := make([]string, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// ACLLine is the ACL SETUSER command giving user exactly the commands of uses on the keys under
// prefix, and nothing else (no other keys, no channels).
func ACLLine(user, password, prefix string, uses ...Use) string {
	rules := []string{"ACL SETUSER", user, "reset", "on", ">" + password, "~" + prefix + ":*", "resetchannels", "-@all"}
	for _, c := range ACLCommands(uses...) {
		rules = append(rules, "+"+c)
	}
	return strings.Join(rules, " ")
}

// probeArgs are a harmless invocation of each command, K standing for a key: CheckACL only queues
// it inside MULTI, where Redis checks the ACL (command and keys) and runs nothing.
var probeArgs = map[string][]string{
	"ping": {}, "info": {"memory"}, "cluster|slots": {}, "command": {}, "asking": {}, "time": {}, "config|get": {"appendonly"}, "wait": {"0", "0"},
	"evalsha": {"0000000000000000000000000000000000000000", "1", "K"}, "eval": {"return 0", "1", "K"},
	"get": {"K"}, "set": {"K", "v"}, "incr": {"K"}, "pexpire": {"K", "1"}, "del": {"K"}, "exists": {"K"}, "pttl": {"K"},
	"watch": {"K"}, "unwatch": {}, "type": {"K"},
	"hget": {"K", "f"}, "hmget": {"K", "f"}, "hset": {"K", "f", "v"}, "hgetall": {"K"}, "hdel": {"K", "f"}, "hincrby": {"K", "f", "1"},
	"xadd": {"K", "*", "f", "v"}, "xrange": {"K", "-", "+"}, "xrevrange": {"K", "+", "-"}, "xlen": {"K"}, "xdel": {"K", "0-1"},
	"xtrim": {"K", "MINID", "0"}, "xack": {"K", "g", "0-1"}, "xpending": {"K", "g"},
	"xread": {"COUNT", "1", "STREAMS", "K", "0"}, "xreadgroup": {"GROUP", "g", "c", "COUNT", "1", "STREAMS", "K", ">"},
	"xgroup|create": {"K", "g", "$", "MKSTREAM"}, "xinfo|groups": {"K"}, "xinfo|stream": {"K"},
	"zadd": {"K", "1", "m"}, "zrem": {"K", "m"}, "zremrangebyscore": {"K", "-inf", "0"}, "zcard": {"K"}, "zcount": {"K", "-inf", "+inf"},
}

// CheckACL checks, without running any of them, that the Redis user may run every command of uses
// on queue's keys: it queues each inside MULTI, where Redis checks a command's ACL (the command and
// its keys) before queueing it, and DISCARDs the lot. With queue "" (a component whose queues come
// from its messages) the commands are checked and the keys not: Redis checks a command before its
// keys, so a key refusal of the placeholder key says nothing and is ignored. A refusal is a
// redis_acl error naming the rules to add. Other errors (a connection that failed) come back as
// they are.
func (c Config) CheckACL(ctx context.Context, rdb redis.UniversalClient, queue string, uses ...Use) error {
	if _, ok := rdb.(*redis.ClusterClient); ok {
		uses = append(uses, UseCluster)
	}
	key := c.Key(queue, "acl")
	conn, err := connFor(ctx, rdb, key)
	if err != nil {
		return c.Explain(err)
	}
	defer conn.Close()
	// DISCARD (and EXEC) first, then MULTI, each alone: with MULTI refused the probes would run for
	// real, and with DISCARD refused the transaction would stay open.
	names := ACLCommands(uses...)
	for _, cmd := range aloneCommands {
		if cmd != "discard" && !slices.Contains(names, cmd) {
			continue
		}
		err := conn.Do(ctx, probe(cmd, key)...).Err()
		switch {
		case isKeyDenial(err) && queue != "":
			return c.aclError(err, nil, true)
		case isNoPerm(err) && !isKeyDenial(err):
			return c.aclError(err, []string{cmd}, false)
		case isAuth(err):
			return c.Explain(err)
		}
		// Any reply (DISCARD without MULTI) passes; no reply at all (Redis unreachable) ends the check.
		var reply redis.Error
		if err != nil && !errors.As(err, &reply) {
			return c.Explain(fmt.Errorf("redis: %w", err))
		}
	}
	if err := conn.Do(ctx, "multi").Err(); err != nil {
		if isNoPerm(err) {
			return c.aclError(err, []string{"multi"}, false)
		}
		return c.Explain(fmt.Errorf("redis: MULTI: %w", err))
	}
	cmds, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, name := range names {
			if slices.Contains(checkCommands, name) || slices.Contains(aloneCommands, name) {
				continue
			}
			p.Do(ctx, probe(name, key)...)
		}
		p.Do(ctx, "discard")
		return nil
	})
	var denied []string
	keys := false
	var first error
	for _, cmd := range cmds {
		if err := cmd.Err(); isNoPerm(err) {
			if isKeyDenial(err) && queue == "" {
				continue
			}
			if first == nil {
				first = err
			}
			if isKeyDenial(err) {
				keys = true
			} else {
				denied = append(denied, strings.ToLower(strings.Join(argStrings(cmd.Args(), cmd.Name()), "|")))
			}
		}
	}
	if first != nil {
		return c.aclError(first, denied, keys)
	}
	if err != nil && !isNoPerm(err) && !errors.Is(err, redis.Nil) {
		// A refusal other than NOPERM (MOVED on a cluster node, a server error) says nothing about
		// the ACL; only a connection that failed is an error.
		var rerr redis.Error
		if !errors.As(err, &rerr) {
			return fmt.Errorf("redis: ACL check: %w", err)
		}
	}
	return nil
}

// probe is the command name (split at |) with its probe arguments, key in place of K.
func probe(name, key string) []any {
	args := []any{}
	for _, part := range strings.Split(name, "|") {
		args = append(args, part)
	}
	for _, a := range probeArgs[name] {
		if a == "K" {
			args = append(args, key)
		} else {
			args = append(args, a)
		}
	}
	return args
}

// argStrings is the command's name and, for a command with subcommands (config get, xgroup
// create, xinfo groups), the subcommand, as an ACL rule names them.
func argStrings(args []any, name string) []string {
	out := []string{name}
	if len(args) > 1 && slices.Contains([]string{"config", "xgroup", "xinfo", "cluster"}, strings.ToLower(name)) {
		out = append(out, fmt.Sprint(args[1]))
	}
	return out
}

// connFor is one connection to the server holding key: the master of its slot on a cluster.
func connFor(ctx context.Context, rdb redis.UniversalClient, key string) (*redis.Conn, error) {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Conn(), nil
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("redis: find the master of %s: %w", key, err)
		}
		return node.Conn(), nil
	}
	return nil, fmt.Errorf("unsupported redis client type %T", rdb)
}

// User is the ACL user the connection logs in as: username, else the URL's, else "default".
func (c Config) User() string {
	if c.Username != "" {
		return c.Username
	}
	u := c.URL
	if len(c.ClusterURLs) > 0 {
		u = c.ClusterURLs[0]
	}
	if o, err := redis.ParseURL(u); err == nil && o.Username != "" && c.Sentinel == nil {
		return o.Username
	}
	return "default"
}

// Explain gives a connection error the user can fix its code and fix sentence (docs/errors.md):
// redis_tls for a TLS handshake or certificate that failed, redis_unreachable for a server that
// does not answer (refused, no such host, timed out, every Sentinel unreachable), redis_auth for a
// user name and password refused (WRONGPASS) or a password missing (NOAUTH), redis_oom for a write
// refused at the memory limit, and redis_acl, with
// the rule that fixes it, for a refusal for want of an ACL permission (NOPERM, or the same refusal
// of a command inside a script). Any other error, and one already coded, comes back unchanged; the
// cause stays wrapped.
func (c Config) Explain(err error) error {
	if err == nil || errcode.Of(err) != "" {
		return err
	}
	err = tidy(err)
	if what, fix, ok := tlsProblem(err); ok {
		return errcode.Wrap(errcode.RedisTLS, err, what, fix)
	}
	switch {
	case Unreachable(err) && c.Sentinel != nil && strings.Contains(err.Error(), allSentinelsDown):
		return errcode.Wrap(errcode.RedisUnreachable, err, "no Redis Sentinel answers (of "+strings.Join(c.Sentinel.Addrs, ", ")+")",
			"check "+FieldSentinel+"."+FieldSentinelAddresses+", that redis-sentinel runs and listens there (port in sentinel.conf) and that no firewall drops the connection; pgrelay keeps retrying")
	case Unreachable(err):
		return errcode.Wrap(errcode.RedisUnreachable, err, "Redis does not answer"+dialedAt(err),
			"check the host and port of url (or the Sentinel or Cluster addresses), that redis-server runs and listens there (bind and port in redis.conf) and that no firewall drops the connection; pgrelay keeps retrying")
	case strings.Contains(err.Error(), "ERR DB index is out of range"):
		return errcode.Wrap(errcode.RedisConfig, err, fmt.Sprintf("Redis has no database %d (url's path)", c.database()),
			"use a database number below the server's databases setting (16 by default) in url, e.g. redis://host:6379/0, or raise databases in redis.conf")
	case strings.Contains(err.Error(), "ERR SELECT is not allowed in cluster mode"):
		return errcode.Wrap(errcode.RedisConfig, err, fmt.Sprintf("url names database %d of a Redis Cluster node; a cluster has database 0 only", c.database()),
			"list the cluster's nodes in cluster_urls without a database (redis://host:6379)")
	case redis.HasErrorPrefix(err, "WRONGPASS"):
		return errcode.Wrap(errcode.RedisAuth, err, "Redis refused the user name and password of user "+c.User(),
			"set the password (and user) in url, e.g. redis://<user>:${REDIS_PASSWORD}@host:6379, to those of a user that is on (ACL SETUSER <user> on >password)")
	case redis.HasErrorPrefix(err, "OOM"):
		return errcode.Wrap(errcode.RedisOOM, err, "Redis is at its memory limit (maxmemory) and refuses writes; nothing was written",
			"raise maxmemory, or keep less in Redis: let the consumers catch up and trim what every group has read (max_age or max_length on the redis_queue output)")
	case redis.HasErrorPrefix(err, "NOAUTH"):
		return errcode.Wrap(errcode.RedisAuth, err, "Redis wants a password and got none",
			"set the password in url, e.g. redis://:${REDIS_PASSWORD}@host:6379 (with a user: redis://<user>:${REDIS_PASSWORD}@host:6379)")
	case isKeyDenial(err):
		return c.aclError(err, nil, true)
	case isNoPerm(err):
		var cmds []string
		if m := deniedCommand.FindStringSubmatch(err.Error()); m != nil {
			cmds = []string{m[1]}
		}
		return c.aclError(err, cmds, false)
	}
	return err
}

// database is the database number url names (0 when none, or when url does not parse).
func (c Config) database() int {
	if o, err := redis.ParseURL(c.URL); err == nil {
		return o.DB
	}
	return 0
}

// allSentinelsDown is go-redis's error text when no Sentinel of a failover client answers.
const allSentinelsDown = "all sentinels specified in configuration are unreachable"

// Unreachable reports a connection that reached no server: a dial refused, without a route or timed
// out, a host name that does not resolve, or every Sentinel unreachable. An error of a connection
// already open (a reset, a read timeout) is not.
func Unreachable(err error) bool {
	if errors.Is(err, context.Canceled) { // pgrelay is stopping
		return false
	}
	var op *net.OpError
	var dns *net.DNSError
	return errors.As(err, &dns) || errors.As(err, &op) && op.Op == "dial" ||
		strings.Contains(err.Error(), allSentinelsDown)
}

// tlsProblem says what failed in a TLS handshake with Redis and how to fix it (ok false: err is no
// TLS failure): the server's certificate (unknown CA, another host, expired), a server without
// TLS (a handshake without answer), or the server's refusal of the client's certificate.
func tlsProblem(err error) (what, fix string, ok bool) {
	var verify *tls.CertificateVerificationError
	var header tls.RecordHeaderError
	var remote *net.OpError
	var handshake *handshakeError
	var unknownCA x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &unknownCA):
		return "Redis's certificate is not signed by the CA in tls.root_cas_file",
			"set tls.root_cas_file (or tls.root_cas) to the CA that signed the server's certificate (its tls-cert-file)", true
	case errors.As(err, &host):
		return "Redis's certificate does not name the host connected to (" + host.Host + ")",
			"connect to a host name or IP address the certificate lists, or issue the server a certificate naming this one", true
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return "Redis's certificate has expired or is not valid yet", "renew the server's certificate (or check this machine's clock)", true
	case errors.As(err, &verify):
		return "Redis's certificate could not be verified", "check that tls.root_cas_file holds the CA that signed the server's certificate", true
	case errors.As(err, &header):
		return "Redis does not speak TLS on this port",
			"connect without TLS (redis:// and tls.enabled: false), or enable TLS on the server (tls-port in redis.conf)", true
	case errors.As(err, &remote) && remote.Op == "remote error" && strings.HasPrefix(remote.Err.Error(), "tls: "):
		return "Redis refused the TLS handshake (" + remote.Err.Error() + "): it wants a client certificate it trusts",
			"set tls.client_certs to a certificate and key signed by a CA in the server's tls-ca-cert-file", true
	case errors.As(err, &handshake) && !errors.Is(err, context.Canceled):
		return "the TLS handshake with Redis at " + handshake.addr + " did not complete",
			"check that the server speaks TLS on that port (tls-port in redis.conf), or connect without TLS (redis:// and tls.enabled: false)", true
	}
	return "", "", false
}

// isAuth reports a login refused (WRONGPASS) or missing (NOAUTH).
func isAuth(err error) bool {
	return redis.HasErrorPrefix(err, "WRONGPASS") || redis.HasErrorPrefix(err, "NOAUTH")
}

// dialedAt names the address of a dial that failed (" at host:port"), or nothing when unknown.
func dialedAt(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" && op.Addr != nil {
		return " at " + op.Addr.String()
	}
	var dns *net.DNSError
	if errors.As(err, &dns) && dns.Name != "" {
		return " at " + dns.Name + " (no such host)"
	}
	return ""
}

// deniedCommand finds the command a NOPERM reply names: "... no permissions to run the 'xadd' command".
var deniedCommand = regexp.MustCompile(`no permissions to run the '([^']+)' command`)

// isNoPerm reports an ACL refusal: a NOPERM reply (after "EXECABORT ... because of:" for EXEC), or a
// script's command refused by the ACL ("The user executing the script can't ..." up to Redis 7.0,
// "ACL failure in script: ..." from 7.2).
func isNoPerm(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "because of: NOPERM") ||
		strings.Contains(msg, "The user executing the script can't") || strings.Contains(msg, "ACL failure in script")
}

// deniedKey finds a key refusal in an ACL refusal, as Redis 7.0 and 7.2+ word it, directly and in a
// script.
var deniedKey = regexp.MustCompile(`access (one of the keys|at least one of the keys|a key|the '[^']*' key)`)

// isKeyDenial reports an ACL refusal of a key (rather than of a command).
func isKeyDenial(err error) bool {
	return isNoPerm(err) && deniedKey.MatchString(err.Error())
}

func (c Config) aclError(err error, cmds []string, keys bool) error {
	user := c.User()
	var rules []string
	if keys {
		rules = append(rules, "~"+c.Prefix+":*")
	}
	for _, cmd := range cmds {
		rules = append(rules, "+"+cmd)
	}
	what := "the commands and keys pgrelay needs"
	switch {
	case len(cmds) > 0 && keys:
		what = strings.Join(cmds, ", ") + " and the keys " + c.Prefix + ":*"
	case len(cmds) > 0:
		what = strings.Join(cmds, ", ")
	case keys:
		what = "the keys " + c.Prefix + ":*"
	}
	fix := "ACL SETUSER " + user + " " + strings.Join(rules, " ")
	if len(rules) == 0 {
		fix = "give the user the ACL line of its component in docs/operations.md (Least privilege)"
	}
	return errcode.Wrap(errcode.RedisACL, err, "the Redis user "+user+" may not run "+what, fix)
}

// tidy wraps err so that its text drops what go-redis adds around a failed connection's cause
// ("redis: Conn is in a bad state: ", and "redis: " twice over); errors.As and errors.Is see
// through the wrapper. An error without them comes back as it is.
func tidy(err error) error {
	text := err.Error()
	clean := strings.ReplaceAll(text, "Conn is in a bad state: ", "")
	for strings.Contains(clean, "redis: redis: ") {
		clean = strings.ReplaceAll(clean, "redis: redis: ", "redis: ")
	}
	if clean == text {
		return err
	}
	return errcode.Retold(err, clean)
}
