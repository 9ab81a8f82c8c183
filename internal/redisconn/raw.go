package redisconn

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgrelay/pgrelay/internal/rawio"
	"github.com/redis/go-redis/v9"
)

// Raw is a small pool of plain RESP2 connections to the masters behind a go-redis client, dialed
// with that client's own options: its dialer (which asks the sentinels for the master on a
// Sentinel client, and speaks TLS when configured), credentials, database and client name. The
// caller encodes its commands into a byte buffer (AppendCommand, AppendBulk, ...) and reads the
// replies one by one. It is for a hot path that sends thousands of commands per round trip, where
// go-redis's per-command objects, boxed arguments and parsed replies cost more than the commands.
// On a Sentinel failover client of Config.Client it drops its connections to a master as soon
// as a sentinel announces another one (switch.go).
// It is safe for concurrent use; a RawConn is used by one goroutine at a time.
type Raw struct {
	rdb      redis.UniversalClient
	sentinel *Sentinel // the sentinels whose +switch-master the pool follows; nil: none
	watch    switchWatch
	gen      atomic.Uint64 // moves on with each new master a sentinel announces

	mu       sync.Mutex
	idle     map[string][]*RawConn // by node address
	master   string                // the master a sentinel last announced
	masterAt time.Time             // when
	closed   bool
}

const (
	rawMaxIdle     = 4                // idle connections kept per node
	rawMaxIdleTime = 30 * time.Second // an idle connection older than this is closed, not reused
)

// ErrRawUnavailable is returned by Raw.Run for a client it cannot dial masters of (only plain,
// Sentinel and Cluster clients are), or once the pool is closed.
var ErrRawUnavailable = errors.New("redisconn: no raw connection (a client other than plain, Sentinel or Cluster, or a closed pool)")

// NewRaw returns a pool over rdb's masters; nothing is dialed before the first Run.
func NewRaw(rdb redis.UniversalClient) *Raw {
	r := &Raw{rdb: rdb, idle: map[string][]*RawConn{}}
	if c, ok := rdb.(*redis.Client); ok {
		r.sentinel = sentinelFor(c)
	}
	return r
}

// Run runs fn on a connection of the master serving key. On Redis Cluster, when fn returns a
// MOVED answer, the slot map is reloaded and fn runs again on the node the answer names, up to
// maxRedirects times; an ASK answer is returned as it is (the slot is being migrated). A
// connection fn left broken (an I/O error, a reply it did not read, or an answer meaning the
// node is no longer the master) is closed; any other goes back to the pool.
func (r *Raw) Run(ctx context.Context, key string, fn func(*RawConn) error) error {
	var node *redis.Client
	cc, cluster := r.rdb.(*redis.ClusterClient)
	switch c := r.rdb.(type) {
	case *redis.ClusterClient:
		var err error
		if node, err = c.MasterForKey(ctx, key); err != nil {
			return fmt.Errorf("find the master of %s: %w", key, err)
		}
	case *redis.Client:
		node = c
	default:
		return ErrRawUnavailable
	}
	for redirects := 0; ; redirects++ {
		err := r.runOn(ctx, node, fn)
		if cluster && topologyChanged(ctx, err) {
			cc.ReloadState(ctx)
		}
		kind, addr := redirectOf(err)
		if !cluster || kind != "MOVED" || redirects == maxRedirects {
			return err
		}
		if node, err = nodeAt(ctx, cc, addr); err != nil {
			return err
		}
	}
}

func (r *Raw) runOn(ctx context.Context, node *redis.Client, fn func(*RawConn) error) error {
	c, err := r.get(ctx, node)
	if err != nil {
		return err
	}
	stop := c.Watch(ctx) // a cancelled context ends any read or write under way at once
	err = fn(c)
	var h Handed
	if errors.As(err, &h) {
		// another goroutine owns c now: it puts it back (Put) or hands it on
		stop()
		return h.Err
	}
	if !stop() {
		c.broken = true
	}
	r.Put(ctx, c, err)
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (r *Raw) get(ctx context.Context, node *redis.Client) (*RawConn, error) {
	opt := node.Options()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrRawUnavailable
	}
	gen := r.gen.Load()
	for list := r.idle[opt.Addr]; len(list) > 0; list = r.idle[opt.Addr] {
		c := list[len(list)-1]
		r.idle[opt.Addr] = list[:len(list)-1]
		if c.gen == gen && time.Since(c.idleAt) < rawMaxIdleTime {
			r.mu.Unlock()
			return c, nil
		}
		c.nc.Close()
	}
	r.mu.Unlock()
	if r.sentinel != nil {
		r.watchSwitches(r.sentinel)
	}
	c, err := dialRaw(ctx, opt)
	if err != nil {
		return nil, err
	}
	c.pool, c.gen = r, gen // a switch announced during the dial fails the first Send
	if r.sentinel != nil {
		if err := r.checkDialed(c); err != nil {
			c.nc.Close()
			return nil, err
		}
	}
	return c, nil
}

// Handed is what a Run function returns, wrapping its own error (nil for none), when it gave its
// connection to another goroutine: Run then neither closes it nor puts it back in the pool, and
// returns Err. The new owner puts it back with Put (or hands it on again).
type Handed struct{ Err error }

func (h Handed) Unwrap() error { return h.Err }

func (h Handed) Error() string {
	if h.Err == nil {
		return "redisconn: connection handed over"
	}
	return h.Err.Error()
}

// Put gives back a connection whose last use ended with err, as the end of Run does (a Run
// function that handed it over leaves that to the new owner): to the pool, or closed when it is
// broken or err says the server is no longer the one to write to (READONLY, MOVED, an I/O error):
// a new connection asks for the master again.
func (r *Raw) Put(ctx context.Context, c *RawConn, err error) {
	if err != nil && !c.broken && topologyChanged(ctx, err) {
		c.broken = true
	}
	r.put(c)
}

func (r *Raw) put(c *RawConn) {
	if !c.broken {
		r.mu.Lock()
		if !r.closed && len(r.idle[c.addr]) < rawMaxIdle {
			c.idleAt = time.Now()
			r.idle[c.addr] = append(r.idle[c.addr], c)
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
	c.nc.Close()
}

// Close closes the idle connections and ends the subscriptions to the sentinels; connections in
// use are closed when their Run ends.
func (r *Raw) Close() error {
	r.mu.Lock()
	r.closed = true
	for addr, list := range r.idle {
		for _, c := range list {
			c.nc.Close()
		}
		delete(r.idle, addr)
	}
	r.mu.Unlock()
	r.stopWatch() // not under mu: a subscription may be dialing a sentinel
	return nil
}

// RawConn is one connection of a Raw pool.
type RawConn struct {
	nc     net.Conn
	br     *bufio.Reader
	addr   string
	opt    *redis.Options
	pool   *Raw
	gen    uint64 // the pool's generation when it was dialed
	broken bool
	idleAt time.Time
	bulk   []byte // the last bulk reply read

	// Buf is the caller's buffer for commands, kept with the connection so its capacity is reused.
	Buf []byte
	// State is the caller's note of what it left open on the connection (a WATCH, a MULTI), kept
	// with it in the pool; nil on a new connection. A connection closed for its age or because it
	// broke takes its state with it.
	State any
}

// Drop marks the connection broken: it is closed instead of going back to the pool (for a caller
// that lost track of the connection's state).
func (c *RawConn) Drop() { c.broken = true }

// dialRaw connects with opt's dialer and authenticates, selects the database and names the client
// as go-redis would (RESP2: no HELLO).
func dialRaw(ctx context.Context, opt *redis.Options) (*RawConn, error) {
	dctx, cancel := context.WithTimeout(ctx, positive(opt.DialTimeout, dialTimeout))
	nc, err := opt.Dialer(dctx, opt.Network, opt.Addr)
	cancel()
	if err != nil {
		return nil, err
	}
	nc = rawio.Wrap(nc)
	c := &RawConn{nc: nc, br: bufio.NewReaderSize(nc, 32<<10), addr: opt.Addr, opt: opt}
	user, pass := opt.Username, opt.Password
	switch {
	case opt.CredentialsProviderContext != nil:
		if user, pass, err = opt.CredentialsProviderContext(ctx); err != nil {
			nc.Close()
			return nil, err
		}
	case opt.CredentialsProvider != nil:
		user, pass = opt.CredentialsProvider()
	}
	var b []byte
	n := 0
	if pass != "" {
		if user != "" {
			b = AppendCommand(b, "AUTH", user, pass)
		} else {
			b = AppendCommand(b, "AUTH", pass)
		}
		n++
	}
	if opt.DB > 0 {
		b = AppendCommand(b, "SELECT", strconv.Itoa(opt.DB))
		n++
	}
	if opt.ClientName != "" {
		b = AppendCommand(b, "CLIENT", "SETNAME", opt.ClientName)
		n++
	}
	if n > 0 {
		err := c.Send(ctx, b, 0)
		for ; n > 0 && err == nil; n-- {
			var rep Reply
			if rep, err = c.Read(); err == nil {
				err = rep.Err()
			}
		}
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("redis %s: connection setup: %w", opt.Addr, err)
		}
	}
	return c, nil
}

func positive(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Send writes b, whole commands, and gives their replies the client's read timeout plus extra
// (e.g. a WAIT's own timeout) to arrive.
// On a pool that follows the sentinels, a connection dialed before the last announced switch of
// master sends nothing: ErrMasterSwitched.
func (c *RawConn) Send(ctx context.Context, b []byte, extra time.Duration) error {
	err := c.nc.SetReadDeadline(c.deadline(ctx, time.Now(), c.opt.ReadTimeout, extra))
	if err == nil {
		err = c.SendBehind(ctx, b)
	}
	if err != nil {
		c.broken = true
	}
	return err
}

// SendBehind writes b, whole commands, on a connection another goroutine is reading the replies
// of: b's replies come after theirs. It touches nothing the reader uses, so an error is only
// returned, for the caller to Drop the connection once it owns it.
func (c *RawConn) SendBehind(ctx context.Context, b []byte) error {
	if c.pool != nil && c.pool.gen.Load() != c.gen {
		return ErrMasterSwitched
	}
	if err := c.nc.SetWriteDeadline(c.deadline(ctx, time.Now(), c.opt.WriteTimeout, 0)); err != nil {
		return err
	}
	_, err := c.nc.Write(b)
	return err
}

// Broken reports whether the connection lost step (an I/O error, or Drop).
func (c *RawConn) Broken() bool { return c.broken }

// Watch makes a cancellation of ctx end any read or write under way on c at once, until the
// returned stop is called: Run watches its function's context so, and the new owner of a
// connection handed over watches its own. stop
// reports false when ctx ended first: the connection is then unusable (Drop it, unless it was
// handed on).
func (c *RawConn) Watch(ctx context.Context) (stop func() bool) {
	return context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
}

// deadline is now + timeout (+ extra), or the context's deadline when sooner; none when the
// client's timeout is off (≤ 0).
func (c *RawConn) deadline(ctx context.Context, now time.Time, timeout, extra time.Duration) time.Time {
	var d time.Time
	if timeout > 0 {
		d = now.Add(timeout + extra)
	}
	if cd, ok := ctx.Deadline(); ok && (d.IsZero() || cd.Before(d)) {
		d = cd
	}
	return d
}

// Reply is one RESP2 reply. Str is valid until the next Read on the connection.
type Reply struct {
	Kind byte   // '+' status, '-' error, ':' integer, '$' bulk string, '*' array
	Str  []byte // the status, error or bulk text; nil for a nil bulk string
	Int  int64  // the integer; the length of a bulk string or array (-1: nil)
}

// Nil reports whether the reply is a nil bulk string or nil array.
func (r Reply) Nil() bool { return (r.Kind == '$' || r.Kind == '*') && r.Int < 0 }

// Err returns an error reply as a ReplyError, nil for any other reply.
func (r Reply) Err() error {
	if r.Kind != '-' {
		return nil
	}
	return ReplyError(r.Str)
}

// ReplyError is an error reply read by a RawConn. It is a redis.Error, so go-redis's
// redis.HasErrorPrefix recognises it like the replies go-redis reads.
type ReplyError string

func (e ReplyError) Error() string { return string(e) }

// RedisError marks ReplyError as a reply of the server (redis.Error).
func (ReplyError) RedisError() {}

// Read reads one reply; for an array, only its length: its elements are the next replies.
func (c *RawConn) Read() (Reply, error) { return c.read(true) }

// read reads one reply; with keep false a bulk string is skipped, not copied (Str is nil).
func (c *RawConn) read(keep bool) (Reply, error) {
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		c.broken = true
		return Reply{}, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		c.broken = true
		return Reply{}, fmt.Errorf("redis %s: malformed reply %q", c.addr, line)
	}
	rep := Reply{Kind: line[0]}
	body := line[1 : len(line)-2]
	switch rep.Kind {
	case '+', '-':
		rep.Str = body
		return rep, nil
	case ':', '$', '*':
		n, ok := ParseInt(body)
		if !ok {
			c.broken = true
			return Reply{}, fmt.Errorf("redis %s: malformed reply %q", c.addr, line)
		}
		rep.Int = n
		if rep.Kind != '$' || n < 0 {
			return rep, nil
		}
		if !keep {
			if _, err := c.br.Discard(int(n) + 2); err != nil {
				c.broken = true
				return Reply{}, err
			}
			return rep, nil
		}
		if cap(c.bulk) < int(n)+2 {
			c.bulk = make([]byte, n+2)
		}
		b := c.bulk[:n+2]
		if _, err := io.ReadFull(c.br, b); err != nil {
			c.broken = true
			return Reply{}, err
		}
		rep.Str = b[:n]
		return rep, nil
	}
	c.broken = true
	return Reply{}, fmt.Errorf("redis %s: unexpected reply %q", c.addr, line)
}

// Skip reads one reply whole (an array with all its elements) and returns the first error reply
// in it as an error.
func (c *RawConn) Skip() error {
	rep, err := c.read(false)
	if err != nil {
		return err
	}
	if rep.Kind == '*' {
		var first error
		for i := int64(0); i < rep.Int; i++ {
			if err := c.Skip(); err != nil {
				if c.broken {
					return err
				}
				if first == nil {
					first = err
				}
			}
		}
		return first
	}
	return rep.Err()
}

// SkipStatus reads the replies that are the status s (such as "QUEUED") from what the connection
// has already received, up to max of them, and returns how many it read. It stops at any other
// reply and never waits for data: read the next reply with Read. A long pipeline answers
// thousands of equal statuses, compared here as bytes instead of parsed one by one.
func (c *RawConn) SkipStatus(s string, max int) int {
	size := len(s) + 3 // +<s>\r\n
	n := min(c.br.Buffered()/size, max)
	if n == 0 {
		return 0
	}
	b, _ := c.br.Peek(n * size) // buffered already: no read
	i := 0
	for ; i < n; i++ {
		r := b[i*size : (i+1)*size]
		if r[0] != '+' || string(r[1:1+len(s)]) != s || r[size-2] != '\r' || r[size-1] != '\n' {
			break
		}
	}
	_, _ = c.br.Discard(i * size)
	return i
}

// ParseInt parses a decimal integer without allocating.
func ParseInt(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, ch := range b {
		if ch < '0' || ch > '9' {
			return 0, false
		}
		n = n*10 + int64(ch-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// AppendArrayLen appends the header of a command (or array) of n elements.
func AppendArrayLen(b []byte, n int) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '\r', '\n')
}

// AppendBulk appends v as a bulk string.
func AppendBulk[T string | []byte](b []byte, v T) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(v)), 10)
	b = append(b, '\r', '\n')
	b = append(b, v...)
	return append(b, '\r', '\n')
}

// AppendBulkHead appends the header of a bulk string of n bytes: the caller appends the bytes and
// "\r\n" (a value gathered from several pieces without copying them twice).
func AppendBulkHead(b []byte, n int) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '\r', '\n')
}

// AppendBulkInt appends the decimal text of v as a bulk string.
func AppendBulkInt(b []byte, v int64) []byte {
	var num [20]byte
	return AppendBulk(b, strconv.AppendInt(num[:0], v, 10))
}

// AppendCommand appends one command of string arguments.
func AppendCommand(b []byte, args ...string) []byte {
	b = AppendArrayLen(b, len(args))
	for _, a := range args {
		b = AppendBulk(b, a)
	}
	return b
}
