//go:build linux

package source

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pgrelay/pgrelay/internal/rawio"
)

// The replication connection's socket is read outside Go's network poller. The poller watches
// every socket with edge-triggered epoll, so each segment that arrives wakes an idle scheduler
// thread, even while the reader sleeps its coalescing wait (coalesce.go) and nobody reads. While
// the stream is behind, the walsender sends each message as it decodes it, one segment per change
// or so over TCP without pacing, and those wake-ups were the largest cost pgrelay had per change.
// A pollConn keeps the socket out of the poller and puts it in only while a read (or write) waits
// because the socket had nothing (a duplicate of the descriptor, registered for that wait and
// closed after it): what arrives while the reader decodes or sleeps wakes no one, and a wait parks
// the goroutine in the poller like any network read, holding no thread.
//
// pollConn is a net.Conn over such a socket, with a net.Conn's deadlines (pgconn's context
// cancellation, the reader's status reports) and Close.
type pollConn struct {
	fd     int // the socket (a duplicate of the dialled one, which was closed: out of the poller)
	local  net.Addr
	remote net.Addr

	read, write direction

	mu     sync.Mutex
	users  int // Read and Write calls in progress: the descriptor stays open until they end
	closed bool
}

// direction is the reads' or the writes' deadline and wait.
type direction struct {
	events   int16        // what poll waits for: POLLIN or POLLOUT
	deadline atomic.Int64 // unix nanoseconds; 0: none
	waiting  *os.File     // the socket's registered duplicate a call waits on (pollConn.mu)
}

// errPollConnTimeout is a read or write past its deadline: a net.Error whose Timeout is true and
// that matches os.ErrDeadlineExceeded, as a net.Conn's.
type errPollConnTimeout struct{}

func (errPollConnTimeout) Error() string   { return "i/o timeout" }
func (errPollConnTimeout) Timeout() bool   { return true }
func (errPollConnTimeout) Temporary() bool { return true }
func (errPollConnTimeout) Is(target error) bool {
	return target == os.ErrDeadlineExceeded
}

// dialOutsidePoller wraps dial: the connection it returns is a pollConn over the dialled socket,
// or the dialled connection itself when it is not a socket pgrelay can take over.
func dialOutsidePoller(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newPollConn(c)
	}
}

// newPollConn takes c's socket out of the network poller: it duplicates the descriptor, then
// closes c (which removes the original from the poller; the socket stays open through the
// duplicate, non-blocking as c left it). A c without a descriptor comes back as it is.
func newPollConn(c net.Conn) (net.Conn, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c, nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return c, nil
	}
	pc := &pollConn{fd: -1, local: c.LocalAddr(), remote: c.RemoteAddr(), read: direction{events: unix.POLLIN}, write: direction{events: unix.POLLOUT}}
	var dupErr error
	err = raw.Control(func(s uintptr) { pc.fd, dupErr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) })
	if err = errors.Join(err, dupErr, c.Close()); err != nil {
		if pc.fd >= 0 {
			unix.Close(pc.fd)
		}
		return nil, err
	}
	return pc, nil
}

// enter marks a call in progress, or reports that the connection is closed.
func (c *pollConn) enter() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	c.users++
	return nil
}

// leave ends a call; the last one after Close closes the descriptor.
func (c *pollConn) leave() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.users--
	if c.closed && c.users == 0 {
		unix.Close(c.fd)
	}
}

// expired reports whether d's deadline has passed: as on a net.Conn, a call past its deadline
// fails even when the socket is ready (the WAL reader's status reports rely on it).
func (d *direction) expired() bool {
	n := d.deadline.Load()
	return n != 0 && time.Now().UnixNano() >= n
}

// wait waits in the network poller until the socket is ready for d (or d's deadline, or Close):
// a duplicate of the socket is registered for the wait and closed after it.
func (c *pollConn) wait(d *direction) error {
	dup, err := unix.FcntlInt(uintptr(c.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return os.NewSyscallError("fcntl", err)
	}
	f := os.NewFile(uintptr(dup), "pg_cdc replication socket") // non-blocking: registered in the poller
	defer f.Close()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return net.ErrClosed
	}
	d.waiting = f
	if deadline := d.deadline.Load(); deadline != 0 { // under mu: setDeadline's later value wins
		setFileDeadline(f, d, deadline)
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		d.waiting = nil
		c.mu.Unlock()
	}()
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	// ready looks at the socket itself, each time the poller is asked: the registration may have
	// reported it ready before RawRead resets the poller's state, so a "not yet" without looking
	// could wait for an edge that already came (data the walsender sent before the wait, and no more
	// while it waits for an answer).
	ready := func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: d.events}}
		n, err := unix.Poll(fds, 0)
		return err != nil || n > 0 // an error or a hang-up: the caller's read or write reports it
	}
	if d.events == unix.POLLOUT {
		err = raw.Write(ready)
	} else {
		err = raw.Read(ready)
	}
	if err == nil {
		return nil
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	switch {
	case closed: // Close closed the duplicate under the wait
		return net.ErrClosed
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errPollConnTimeout{}
	}
	return err
}

// setFileDeadline gives the registered duplicate f d's deadline (unix nanoseconds; 0: none).
func setFileDeadline(f *os.File, d *direction, deadline int64) {
	t := time.Time{}
	if deadline != 0 {
		t = time.Unix(0, deadline)
	}
	if d.events == unix.POLLOUT {
		_ = f.SetWriteDeadline(t)
	} else {
		_ = f.SetReadDeadline(t)
	}
}

func (c *pollConn) Read(p []byte) (int, error) {
	if err := c.enter(); err != nil {
		return 0, err
	}
	defer c.leave()
	for {
		if c.read.expired() {
			return 0, c.opError("read", errPollConnTimeout{})
		}
		n, err := rawio.Read(c.fd, p)
		switch {
		case err == nil && n == 0 && len(p) > 0:
			return 0, io.EOF
		case err == nil:
			return n, nil
		case err == unix.EINTR:
			continue
		case err != unix.EAGAIN:
			return 0, c.opError("read", os.NewSyscallError("read", err))
		}
		if err := c.wait(&c.read); err != nil {
			return 0, c.opError("read", err)
		}
	}
}

func (c *pollConn) Write(p []byte) (int, error) {
	if err := c.enter(); err != nil {
		return 0, err
	}
	defer c.leave()
	written := 0
	for written < len(p) {
		if c.write.expired() {
			return written, c.opError("write", errPollConnTimeout{})
		}
		n, err := rawio.Write(c.fd, p[written:])
		switch {
		case err == nil:
			written += n
			continue
		case err == unix.EINTR:
			continue
		case err != unix.EAGAIN:
			return written, c.opError("write", os.NewSyscallError("write", err))
		}
		if err := c.wait(&c.write); err != nil {
			return written, c.opError("write", err)
		}
	}
	return written, nil
}

func (c *pollConn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: c.remote.Network(), Source: c.local, Addr: c.remote, Err: err}
}

// Close closes the connection; calls in progress return net.ErrClosed.
func (c *pollConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	c.closed = true
	for _, d := range []*direction{&c.read, &c.write} {
		if d.waiting != nil {
			_ = d.waiting.Close() // ends the wait
		}
	}
	if c.users == 0 {
		unix.Close(c.fd)
	}
	return nil
}

func (c *pollConn) LocalAddr() net.Addr  { return c.local }
func (c *pollConn) RemoteAddr() net.Addr { return c.remote }

func (c *pollConn) SetDeadline(t time.Time) error {
	c.setDeadline(&c.read, t)
	c.setDeadline(&c.write, t)
	return nil
}

func (c *pollConn) SetReadDeadline(t time.Time) error {
	c.setDeadline(&c.read, t)
	return nil
}

func (c *pollConn) SetWriteDeadline(t time.Time) error {
	c.setDeadline(&c.write, t)
	return nil
}

// setDeadline stores t as d's deadline and gives it to a wait in progress.
func (c *pollConn) setDeadline(d *direction, t time.Time) {
	var n int64
	if !t.IsZero() {
		n = max(t.UnixNano(), 1)
	}
	if d.deadline.Swap(n) == n {
		return
	}
	c.mu.Lock()
	if d.waiting != nil {
		setFileDeadline(d.waiting, d, d.deadline.Load()) // the latest, whichever call stored it
	}
	c.mu.Unlock()
}
