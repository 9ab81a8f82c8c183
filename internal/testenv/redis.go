package testenv

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
	proc procSlot

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
	return startRedisOn(t, func(r *Redis) []string { return append([]string{"--port", fmt.Sprint(r.Port)}, extra...) })
}

// startRedisOn starts a server on a free port with the arguments args gives for it (after the
// common ones). A port taken between FreePort and the server's bind (by another test process, or,
// for a cluster node's bus at port+10000, by an outgoing connection) is replaced by another.
func startRedisOn(t testing.TB, args func(*Redis) []string, setup ...func(*Redis)) *Redis {
	t.Helper()
	for attempt := 1; ; attempt++ {
		r := &Redis{t: t, Port: FreePort(t), Dir: tempDir(t, "redis")}
		for _, f := range setup {
			f(r)
		}
		err := r.run(args(r))
		if err == nil {
			return r
		}
		if attempt == portStarts || !portTaken(err) {
			t.Fatalf("testenv: redis: %v", err)
		}
	}
}

// run starts the server with the common arguments, then args (the listening port, the caller's).
func (r *Redis) run(args []string) error {
	r.t.Helper()
	bin := redisBin(r.t)
	r.args = append([]string{
		"--bind", "127.0.0.1", "--dir", r.Dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "",
		"--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning",
	}, args...)
	if err := r.tryStart(bin); err != nil {
		r.Stop()
		return err
	}
	r.t.Cleanup(r.Stop)
	return nil
}

func (r *Redis) start(bin string) {
	r.t.Helper()
	if err := r.tryStart(bin); err != nil {
		r.t.Fatalf("testenv: redis: %v", err)
	}
}

func (r *Redis) tryStart(bin string) error {
	cmd, err := command(bin, r.args...)
	if err != nil {
		return err
	}
	logPath := filepath.Join(r.Dir, "redis.log")
	var logFrom int64 // the log's size before this start: what follows is this run's
	if fi, err := os.Stat(logPath); err == nil {
		logFrom = fi.Size()
	}
	p, err := startProc(cmd, logPath)
	if err != nil {
		return fmt.Errorf("start redis: %w", err)
	}
	r.proc.set(p)
	if err := waitTCP(p, r.Port, 30*time.Second); err != nil {
		return err
	}
	if err := waitRedisLoaded(r.Addr(), r.tlsConf); err != nil {
		return err
	}
	if err := waitOwnPort(p, r.Addr(), r.tlsConf); err != nil {
		return err
	}
	return r.rewriteTruncatedAOF(logPath, logFrom)
}

// rewriteTruncatedAOF has the server rewrite its append-only file from memory, and waits for the
// rewrite, when the load that just ended truncated the file (a SIGKILL during the server's write
// of its last commands cut them). Redis 7.0 cuts the file after the last whole command even when
// that command is inside a MULTI … EXEC block whose EXEC was lost: the block's MULTI and first
// commands stay in the file, the commands written after the load are appended behind them, and
// the next load runs them as one transaction, the lost one half applied (or, when no EXEC follows,
// reverts it and drops every later write). The rewrite writes the data as loaded, which holds
// none of the cut block, in a new file. Nothing to do on a server that did not truncate its file.
func (r *Redis) rewriteTruncatedAOF(logPath string, logFrom int64) error {
	log, err := os.ReadFile(logPath)
	if err != nil || int64(len(log)) < logFrom || !bytes.Contains(log[logFrom:], []byte("Truncating the AOF")) {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1, TLSConfig: r.tlsConf})
	defer c.Close()
	ctx := context.Background()
	if err := c.BgRewriteAOF(ctx).Err(); err != nil {
		return fmt.Errorf("redis %s: BGREWRITEAOF after a truncated load: %w", r.Addr(), err)
	}
	last, err := WaitRewrite(ctx, c, 30*time.Second)
	if err != nil {
		return fmt.Errorf("redis %s: after a truncated load: %w", r.Addr(), err)
	}
	if last != "ok" {
		return fmt.Errorf("redis %s: the AOF rewrite after a truncated load ended %s", r.Addr(), last)
	}
	return nil
}

// WaitRewrite waits up to timeout until the server behind c has no AOF rewrite running or
// scheduled, and returns how the last one ended (aof_last_bgrewrite_status: "ok" or "err").
func WaitRewrite(ctx context.Context, c *redis.Client, timeout time.Duration) (last string, err error) {
	err = waitFor(timeout, func() error {
		info, err := c.Info(ctx, "persistence").Result()
		if err != nil {
			return err
		}
		p := parseInfo(info)
		if p["aof_rewrite_in_progress"] != "0" || p["aof_rewrite_scheduled"] != "0" {
			return errors.New("the AOF rewrite is still running")
		}
		last = p["aof_last_bgrewrite_status"]
		return nil
	})
	return last, err
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

// waitOwnPort returns once the server answering at addr is p (INFO's process_id): tests of other
// processes start servers too, and one of theirs may hold the port p is about to find taken. Then
// p exits, and its error (the log's "Address already in use") is returned.
func waitOwnPort(p *proc, addr string, tlsConf *tls.Config) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, TLSConfig: tlsConf})
	defer c.Close()
	for i := 0; i < 500; i++ {
		if p.exited() {
			return fmt.Errorf("server exited: %s", tail(p.log))
		}
		info, err := c.Info(context.Background(), "server").Result()
		if err == nil && parseInfo(info)["process_id"] == strconv.Itoa(p.cmd.Process.Pid) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("port of %s answered by another server than pid %d: Address already in use", addr, p.cmd.Process.Pid)
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
func (r *Redis) Kill() { r.proc.signal(syscall.SIGKILL, 10*time.Second) }

// Restart starts the server again on the same directory and port; it reloads its append-only file.
func (r *Redis) Restart() {
	r.t.Helper()
	r.proc.signal(syscall.SIGTERM, 15*time.Second) // when it still runs
	r.start(redisBin(r.t))
}

// Stop shuts the server down.
func (r *Redis) Stop() { r.proc.signal(syscall.SIGTERM, 10*time.Second) }

// Pause stops the server with SIGSTOP: it keeps its connections but answers nothing until Resume.
func (r *Redis) Pause() { r.groupSignal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (r *Redis) Resume() { r.groupSignal(syscall.SIGCONT) }

func (r *Redis) groupSignal(sig syscall.Signal) {
	if p := r.proc.current(); p != nil && !p.exited() {
		syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// Alive reports whether the server process runs (it may be paused).
func (r *Redis) Alive() bool {
	p := r.proc.current()
	return p != nil && !p.exited()
}

// Info returns one section of INFO as a map, from a new connection.
func (r *Redis) Info(section string) (map[string]string, error) {
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer c.Close()
	text, err := c.Info(context.Background(), section).Result()
	if err != nil {
		return nil, err
	}
	return parseInfo(text), nil
}

// parseInfo reads INFO's "key:value" lines.
func parseInfo(text string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			out[k] = v
		}
	}
	return out
}

// waitFor polls cond every 20 ms until it returns nil or timeout passes; it returns cond's last error.
func waitFor(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ACL runs an ACL command line as the default user (e.g. one of docs/operations.md's ACL SETUSER
// lines, words separated by spaces) and fails the test on error.
func (r *Redis) ACL(line string) {
	r.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), TLSConfig: r.tlsConf, MaxRetries: -1})
	defer c.Close()
	var args []any
	for _, w := range strings.Fields(line) {
		args = append(args, w)
	}
	if err := c.Do(context.Background(), args...).Err(); err != nil {
		r.t.Fatalf("testenv: %s: %v", line, err)
	}
}

// UserURL is URL with an ACL user and password in it.
func (r *Redis) UserURL(user, password string) string {
	scheme, addr, _ := strings.Cut(r.URL(), "://")
	return scheme + "://" + user + ":" + password + "@" + addr
}
