package redisconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestCheckACL gives a Redis user exactly the ACL line of each role and proves CheckACL passes;
// then, for every command of the line, takes that command away and proves CheckACL returns
// redis_acl whose fix is the rule that gives it back (and passes once that rule ran); a user
// without the key pattern gets the pattern. The check runs nothing: the server holds no key after.
func TestCheckACL(t *testing.T) {
	r := testenv.StartRedis(t)
	ctx := context.Background()
	roles := map[string][]Use{"source": SourceUses, "consumer": ConsumerUses, "cli": CLIReadUses, "operator": CLIWriteUses}
	for role, uses := range roles {
		t.Run(role, func(t *testing.T) {
			user := "u_" + role
			conf := Config{URL: r.UserURL(user, "pw"), Prefix: "pgrelay"}
			rdb, err := conf.Client()
			if err != nil {
				t.Fatal(err)
			}
			defer rdb.Close()
			line := ACLLine(user, "pw", "pgrelay", uses...)
			r.ACL(line)
			if err := conf.CheckACL(ctx, rdb, "q", uses...); err != nil {
				t.Fatalf("the role's own line: %v", err)
			}
			for _, cmd := range ACLCommands(uses...) {
				r.ACL("ACL SETUSER " + user + " -" + cmd)
				err := conf.CheckACL(ctx, rdb, "q", uses...)
				fix := "ACL SETUSER " + user + " +" + cmd
				if !errcode.Is(err, errcode.RedisACL) || !strings.HasSuffix(err.Error(), "Fix: "+fix) {
					t.Errorf("without %s: %v, want redis_acl with the fix %q", cmd, err, fix)
				}
				r.ACL(fix)
				if err := conf.CheckACL(ctx, rdb, "q", uses...); err != nil {
					t.Fatalf("after %s: %v", fix, err)
				}
			}
			r.ACL("ACL SETUSER " + user + " resetkeys ~other:*")
			fix := "ACL SETUSER " + user + " ~pgrelay:*"
			if err := conf.CheckACL(ctx, rdb, "q", uses...); !errcode.Is(err, errcode.RedisACL) || !strings.HasSuffix(err.Error(), "Fix: "+fix) {
				t.Errorf("without the key pattern: %v, want redis_acl with the fix %q", err, fix)
			}
			// Without a queue (the output's queues come from its messages) the commands are
			// checked, keyed ones too, and the keys not.
			if err := conf.CheckACL(ctx, rdb, "", uses...); err != nil {
				t.Errorf("no queue, other keys: %v", err)
			}
			keyed := ""
			for _, c := range ACLCommands(uses...) {
				if slices.Contains(probeArgs[c], "K") {
					keyed = c
				}
			}
			r.ACL("ACL SETUSER " + user + " -" + keyed)
			fix = "ACL SETUSER " + user + " +" + keyed
			if err := conf.CheckACL(ctx, rdb, "", uses...); !errcode.Is(err, errcode.RedisACL) || !strings.HasSuffix(err.Error(), "Fix: "+fix) {
				t.Errorf("no queue, without %s: %v, want redis_acl with the fix %q", keyed, err, fix)
			}
		})
	}
	if n := r.Client().DBSize(ctx).Val(); n != 0 {
		t.Errorf("the checks left %d keys: they ran commands", n)
	}
}

// TestExplainNOPERM maps the refusals Redis gives a command, a key and a script's command to
// redis_acl naming the rule, and leaves other errors alone.
func TestExplainNOPERM(t *testing.T) {
	r := testenv.StartRedis(t)
	ctx := context.Background()
	r.ACL("ACL SETUSER e reset on >pw ~pgrelay:* -@all +get +evalsha +eval")
	conf := Config{URL: r.UserURL("e", "pw"), Prefix: "pgrelay"}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), Username: "e", Password: "pw"})
	defer rdb.Close()
	for _, c := range []struct {
		name string
		err  error
		fix  string
	}{
		{"command", rdb.Set(ctx, "pgrelay:x", "1", 0).Err(), "Fix: ACL SETUSER e +set"},
		{"key", rdb.Get(ctx, "other").Err(), "Fix: ACL SETUSER e ~pgrelay:*"},
		{"script key", rdb.Eval(ctx, "return redis.call('GET', 'other')", []string{"pgrelay:x"}).Err(), "Fix: ACL SETUSER e ~pgrelay:*"},
		{"script command", rdb.Eval(ctx, "return redis.call('SET', KEYS[1], 'x')", []string{"pgrelay:x"}).Err(), "docs/operations.md"},
	} {
		if err := conf.Explain(c.err); !errcode.Is(err, errcode.RedisACL) || !strings.Contains(err.Error(), c.fix) {
			t.Errorf("%s: %v, want redis_acl with %q", c.name, err, c.fix)
		}
	}
	if err := conf.Explain(redis.Nil); err != redis.Nil {
		t.Errorf("redis.Nil became %v", err)
	}
}

// TestExplainACLReplies maps the wording of ACL refusals of Redis 7.0 and 7.2+ (direct, inside
// MULTI, inside a script) to redis_acl with the rule.
func TestExplainACLReplies(t *testing.T) {
	conf := Config{URL: "redis://u:pw@127.0.0.1:1", Prefix: "pgrelay"}
	for _, c := range []struct{ reply, fix string }{
		{"NOPERM this user has no permissions to run the 'xadd' command", "ACL SETUSER u +xadd"},
		{"NOPERM User u has no permissions to run the 'xadd' command", "ACL SETUSER u +xadd"},
		{"EXECABORT Transaction discarded because of: NOPERM User u has no permissions to run the 'xdel' command", "ACL SETUSER u +xdel"},
		{"NOPERM this user has no permissions to access one of the keys used as arguments", "ACL SETUSER u ~pgrelay:*"},
		{"NOPERM No permissions to access a key", "ACL SETUSER u ~pgrelay:*"},
		{"ERR Error running script (call to f_1): @user_script:1: The user executing the script can't access at least one of the keys mentioned in the command", "ACL SETUSER u ~pgrelay:*"},
		{"ERR ACL failure in script: User u has no permissions to run the 'hset' command script: f_1, on @user_script:1.", "ACL SETUSER u +hset"},
		{"ERR ACL failure in script: User u has no permissions to access the 'other' key script: f_1, on @user_script:1.", "ACL SETUSER u ~pgrelay:*"},
		{"ERR Error running script (call to f_1): @user_script:1: The user executing the script can't run this command or subcommand", "docs/operations.md"},
	} {
		if err := conf.Explain(replyError(c.reply)); !errcode.Is(err, errcode.RedisACL) || !strings.Contains(err.Error(), c.fix) {
			t.Errorf("%q: %v, want redis_acl with %q", c.reply, err, c.fix)
		}
	}
	for _, reply := range []string{"ERR unknown command", "NOSCRIPT No matching script", "LOADING Redis is loading the dataset in memory"} {
		if err := conf.Explain(replyError(reply)); errcode.Of(err) != "" {
			t.Errorf("%q became %v", reply, err)
		}
	}
}

// TestACLCoversScripts reads every Lua script of resources/ and requires each command it runs to be
// in the commands of the use that runs the script: Redis checks the ACL inside scripts too, so a
// command added to a script without adding it here would be refused under a least-privilege user. A
// new script must be given its use here.
func TestACLCoversScripts(t *testing.T) {
	scriptUse := map[string]Use{
		"lease_acquire.lua": UseLease, "lease_renew.lua": UseLease, "lease_release.lua": UseLease,
		"queue_write.lua": UseWrite, "queue_read.lua": UseConsume, "queue_fail.lua": UseConsume,
		"queue_group_start.lua": UseConsume, "queue_replay.lua": UseReplay,
	}
	files, err := filepath.Glob("../../resources/*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	call := regexp.MustCompile(`redis\.p?call\(\s*'([A-Za-z]+)'(?:\s*,\s*'([A-Za-z]+)')?`)
	for _, f := range files {
		use, ok := scriptUse[filepath.Base(f)]
		if !ok {
			t.Errorf("%s: not assigned to a use: add it to scriptUse and its commands to aclCommands", filepath.Base(f))
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		cmds := ACLCommands(use)
		for _, m := range call.FindAllStringSubmatch(string(b), -1) {
			cmd := strings.ToLower(m[1])
			if cmd == "xinfo" || cmd == "xgroup" || cmd == "config" {
				cmd += "|" + strings.ToLower(m[2])
			}
			if !slices.Contains(cmds, cmd) {
				t.Errorf("%s runs %s, which the commands of its use lack", filepath.Base(f), cmd)
			}
		}
		for _, entry := range []string{"evalsha", "eval"} { // redis.Script.Run: EVALSHA, EVAL on NOSCRIPT
			if !slices.Contains(cmds, entry) {
				t.Errorf("%s: its use lacks %s", filepath.Base(f), entry)
			}
		}
	}
}

// TestACLProbesEveryCommand: every command of every use has a probe.
func TestACLProbesEveryCommand(t *testing.T) {
	for u, cmds := range aclCommands {
		for _, c := range cmds {
			if _, ok := probeArgs[c]; !ok && !slices.Contains(checkCommands, c) && !slices.Contains(aloneCommands, c) {
				t.Errorf("use %d: %s has no probe", u, c)
			}
		}
	}
}

// TestCheckACLOnCluster: on Redis Cluster the source's line with UseCluster's commands (the slot
// map, the command table, ASKING) passes the check on the queue's master and a queue write goes
// through without a refusal on any node; without CLUSTER SLOTS the check names that rule.
func TestCheckACLOnCluster(t *testing.T) {
	rc := testenv.StartRedisCluster(t)
	ctx := context.Background()
	uses := append([]Use{UseCluster}, SourceUses...)
	var urls []string
	for _, a := range rc.Addrs() {
		rc.Node(a).ACL(ACLLine("src", "pw", "pgrelay", uses...))
		urls = append(urls, "redis://src:pw@"+a)
	}
	conf := Config{ClusterURLs: urls, Prefix: "pgrelay"}
	rdb, err := conf.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if err := conf.CheckACL(ctx, rdb, "q", SourceUses...); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, "pgrelay:{q}:meta", "shards", "1").Err(); err != nil {
		t.Fatal(err)
	}
	for _, a := range rc.Addrs() {
		if log := rc.Node(a).Client().Do(ctx, "ACL", "LOG").Val(); len(log.([]any)) > 0 {
			t.Errorf("%s refused: %v", a, log)
		}
		rc.Node(a).ACL("ACL SETUSER src -cluster|slots")
	}
	fresh, _ := conf.Client() // a client that has no slot map yet
	defer fresh.Close()
	if err := conf.CheckACL(ctx, fresh, "q", SourceUses...); !errcode.Is(err, errcode.RedisACL) || !strings.HasSuffix(err.Error(), "Fix: ACL SETUSER src +cluster|slots") {
		t.Errorf("without CLUSTER SLOTS: %v", err)
	}
}

// TestACLLinesDocumented: docs/operations.md prints each role's line exactly as ACLLine makes it,
// so the lines users copy are the ones the tests run.
func TestACLLinesDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct {
		user, password string
		uses           []Use
	}{
		{"pgrelay-source", "SOURCE_PASSWORD", SourceUses},
		{"pgrelay-consumer", "CONSUMER_PASSWORD", ConsumerUses},
		{"pgrelay-cli", "CLI_PASSWORD", CLIReadUses},
		{"pgrelay-operator", "OPERATOR_PASSWORD", CLIWriteUses},
	} {
		line := ACLLine(l.user, l.password, "pgrelay", l.uses...)
		if !strings.Contains(string(doc), "\n"+line+"\n") {
			t.Errorf("docs/operations.md lacks the line of %s:\n%s", l.user, line)
		}
	}
	if !strings.Contains(string(doc), "`+"+strings.Join(aclCommands[UseCluster], " +")+"`") {
		t.Errorf("docs/operations.md lacks the Redis Cluster rules +%s", strings.Join(aclCommands[UseCluster], " +"))
	}
}

// connectCheck runs what a component runs on connecting: a client of conf, then CheckACL.
func connectCheck(t *testing.T, conf Config) error {
	t.Helper()
	rdb, err := conf.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	return conf.CheckACL(context.Background(), rdb, "q", ConsumerUses...)
}

// TestExplainConnectionFailures proves the connection errors a user causes get their codes through
// CheckACL, the check every component runs on connecting, with the address and never the
// password: a port nothing listens on (redis_unreachable, transient: retried), a user's wrong
// password (redis_auth); the right password passes; and a server that wants a password and got
// none (its NOAUTH reply) is redis_auth too.
func TestExplainConnectionFailures(t *testing.T) {
	r := testenv.StartRedis(t)
	r.ACL("ACL SETUSER app reset on >right-one ~pgrelay:* +@all")
	closed := testenv.FreePort(t)
	for _, c := range []struct {
		name string
		url  string
		code errcode.Code // "" when the check must pass
		want string
	}{
		{"right", r.UserURL("app", "right-one"), "", ""},
		{"nothing listens", fmt.Sprintf("redis://127.0.0.1:%d", closed), errcode.RedisUnreachable, fmt.Sprintf("Redis does not answer at 127.0.0.1:%d", closed)},
		{"wrong password", r.UserURL("app", "wrong-one"), errcode.RedisAuth, "user app"},
		{"unknown user", r.UserURL("nobody", "wrong-one"), errcode.RedisAuth, "user nobody"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := connectCheck(t, Config{URL: c.url, Prefix: "pgrelay"})
			switch {
			case c.code == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.code == "":
			case errcode.Of(err) != c.code || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "Fix: "):
				t.Errorf("got %v, want code %s and %q", err, c.code, c.want)
			case strings.Contains(err.Error(), "-one"):
				t.Errorf("the password is in %v", err)
			default:
				t.Logf("%v", err)
			}
		})
	}
	// every Sentinel of a failover client unreachable: go-redis says so without a dial error
	gone := []string{fmt.Sprintf("127.0.0.1:%d", closed), fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}
	if err := connectCheck(t, Config{Sentinel: &Sentinel{MasterName: "main", Addrs: gone}, Prefix: "pgrelay"}); errcode.Of(err) != errcode.RedisUnreachable ||
		!strings.Contains(err.Error(), "no Redis Sentinel answers (of "+strings.Join(gone, ", ")+")") || !strings.Contains(err.Error(), "Fix: check sentinel.addresses") {
		t.Errorf("every Sentinel unreachable: %v", err)
	} else {
		t.Logf("%v", err)
	}
	// a database the server does not have, and a database of a cluster node
	if err := connectCheck(t, Config{URL: r.URL() + "/99", Prefix: "pgrelay"}); errcode.Of(err) != errcode.RedisConfig ||
		!strings.Contains(err.Error(), "Redis has no database 99") || !strings.Contains(err.Error(), "Fix: use a database number below") ||
		strings.Contains(err.Error(), "bad state") {
		t.Errorf("database 99: %v", err)
	}
	node := testenv.StartRedis(t, "--cluster-enabled", "yes")
	if err := connectCheck(t, Config{URL: node.URL() + "/2", Prefix: "pgrelay"}); errcode.Of(err) != errcode.RedisConfig ||
		!strings.Contains(err.Error(), "a cluster has database 0 only") || !strings.Contains(err.Error(), "Fix: list the cluster's nodes in cluster_urls") {
		t.Errorf("database 2 of a cluster node: %v", err)
	}
	conf := Config{URL: "redis://127.0.0.1:1", Prefix: "pgrelay"}
	if err := conf.Explain(replyError("NOAUTH Authentication required.")); errcode.Of(err) != errcode.RedisAuth ||
		!strings.Contains(err.Error(), "wants a password and got none") {
		t.Errorf("NOAUTH: %v", err)
	}
}

// TestExplainTLSFailures connects with each TLS setting a user can get wrong to a Redis that
// speaks only TLS and wants client certificates (and with TLS to one that speaks none), through
// CheckACL as every component does, and proves each failure is redis_tls with the fix naming the
// field to change; the right settings pass.
func TestExplainTLSFailures(t *testing.T) {
	secure := testenv.StartRedisTLS(t)
	plain := testenv.StartRedis(t)
	good, err := secure.TLS.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := os.ReadFile(secure.TLS.OtherCAFile)
	if err != nil {
		t.Fatal(err)
	}
	with := func(change func(*tls.Config)) *tls.Config {
		c := good.Clone()
		change(c)
		return c
	}
	ctx := context.Background()
	for _, c := range []struct {
		name string
		addr string
		tls  *tls.Config
		want string // in the fix; "" when the check must pass
	}{
		{"right", secure.Addr(), good, ""},
		{"another CA", secure.Addr(), with(func(c *tls.Config) {
			c.RootCAs = x509.NewCertPool()
			c.RootCAs.AppendCertsFromPEM(otherCA)
		}), "set tls.root_cas_file"},
		{"another host name", secure.Addr(), with(func(c *tls.Config) { c.ServerName = "db.example" }), "connect to a host name or IP address the certificate lists"},
		{"no client certificate", secure.Addr(), with(func(c *tls.Config) { c.Certificates = nil }), "set tls.client_certs"},
		// the server's certificate seen from a clock 50 years ahead: expired
		{"expired", secure.Addr(), with(func(c *tls.Config) { c.Time = func() time.Time { return time.Now().AddDate(50, 0, 0) } }), "renew the server's certificate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := connectCheck(t, Config{URL: "redis://" + c.addr, TLS: c.tls, Prefix: "pgrelay"})
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want == "":
			case errcode.Of(err) != errcode.RedisTLS || !strings.Contains(err.Error(), "Fix: "+c.want):
				t.Errorf("got %v, want redis_tls with the fix %q", err, c.want)
			case strings.Contains(err.Error(), "bad state") || strings.Contains(err.Error(), "redis: redis:"):
				t.Errorf("go-redis's wrapping in %v", err)
			default:
				t.Logf("%v", err)
			}
		})
	}
	// TLS to a port without it: Redis reads the handshake as a command and answers nothing, so the
	// handshake runs into the dial's timeout (one dial here; a client tries several).
	_, err = dial(ctx, "tcp", plain.Addr(), good, time.Second)
	if err = (Config{}).Explain(err); errcode.Of(err) != errcode.RedisTLS || !strings.Contains(err.Error(), "Fix: check that the server speaks TLS") ||
		!strings.Contains(err.Error(), plain.Addr()) {
		t.Errorf("TLS to a plain port: %v", err)
	}
}

// TestExplainOOM fills a Redis with a small memory limit and no eviction, as pgrelay requires,
// until it refuses a write, and proves the refusal is redis_oom naming the fix.
func TestExplainOOM(t *testing.T) {
	r := testenv.StartRedis(t, "--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
	ctx := context.Background()
	rdb := r.Client()
	big := strings.Repeat("x", 64<<10)
	var err error
	for i := 0; i < 1000 && err == nil; i++ {
		err = rdb.Set(ctx, fmt.Sprintf("pgrelay:k%d", i), big, 0).Err()
	}
	if err = (Config{}).Explain(err); errcode.Of(err) != errcode.RedisOOM || !strings.Contains(err.Error(), "Fix: raise maxmemory") {
		t.Errorf("a write at the memory limit: %v", err)
	}
	// inside MULTI, as the queue writer writes: the write is refused as it is queued, and the
	// writer returns that reply
	conn := rdb.Conn()
	defer conn.Close()
	if err := conn.Do(ctx, "multi").Err(); err != nil {
		t.Fatal(err)
	}
	err = conn.Do(ctx, "xadd", "pgrelay:{q}:s:0", "*", "d", big).Err()
	conn.Do(ctx, "discard")
	if err = (Config{}).Explain(err); errcode.Of(err) != errcode.RedisOOM {
		t.Errorf("a write queued at the memory limit: %v", err)
	}
}
