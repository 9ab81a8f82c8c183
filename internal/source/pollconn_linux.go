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
)

// The replication connection's socket is read outside Go's network poller. The poller watches
// every socket with edge-triggered epoll, so each segment that arrives wakes an idle scheduler
// thread, even while the reader sleeps its coalescing wait (coalesce.go) and nobody reads. While
// the stream is behind, the walsender sends each message as it decodes it, one segment per change
// or so over TCP without pacing, and those wake-ups were the largest cost pgrelay had per change.
// A pollConn takes the socket out of the poller and waits for it with poll(2) only when a read
// found nothing: what arrives while the reader decodes or sleeps wakes no one.
//
// pollConn is a net.Conn over such a socket: non-blocking reads and writes, each waiting with
// poll(2) for the socket or for a wake-up (its deadline moved, Close), so deadlines (pgconn's
// context cancellation, the reader's status reports) and Close work as on a net.Conn.
type pollConn struct {
	fd     int // the socket (a duplicate of the dialled one, which was closed: out of the poller)
	local  net.Addr
	remote net.Addr

	read, write direction

	mu     sync.Mutex
	users  int // Read and Write calls in progress: the descriptors stay open until they end
	closed bool
}

// direction is the reads' or the writes' deadline and wake-up, apart: a read waits on while a
// write's deadline moves, and the other way round.
type direction struct {
	op       string       // "read" or "write", for errors
	events   int16        // what its poll waits for on the socket
	wakeFd   int          // an eventfd, written to wake a poll waiting in this direction
	deadline atomic.Int64 // unix nanoseconds; 0: none
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
	pc := &pollConn{fd: -1, local: c.LocalAddr(), remote: c.RemoteAddr(),
		read:  direction{op: "read", events: unix.POLLIN, wakeFd: -1},
		write: direction{op: "write", events: unix.POLLOUT, wakeFd: -1}}
	var dupErr error
	err = raw.Control(func(s uintptr) { pc.fd, dupErr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) })
	for _, d := range []*direction{&pc.read, &pc.write} {
		if err == nil && dupErr == nil {
			d.wakeFd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		}
	}
	if err = errors.Join(err, dupErr, c.Close()); err != nil {
		pc.release()
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

// leave ends a call; the last one after Close closes the descriptors.
func (c *pollConn) leave() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.users--
	if c.closed && c.users == 0 {
		c.release()
	}
}

func (c *pollConn) release() {
	for _, fd := range []int{c.fd, c.read.wakeFd, c.write.wakeFd} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// wake makes a poll waiting in direction d return.
func (d *direction) wake() {
	one := [8]byte{1}
	_, _ = unix.Write(d.wakeFd, one[:])
}

// expired reports whether d's deadline has passed: as on a net.Conn, a call past its deadline
// fails even when the socket is ready (the WAL reader's status reports rely on it).
func (d *direction) expired() bool {
	n := d.deadline.Load()
	return n != 0 && time.Now().UnixNano() >= n
}

// wait polls the socket for d's events until d's deadline or a wake-up.
func (c *pollConn) wait(d *direction) error {
	fds := []unix.PollFd{{Fd: int32(c.fd), Events: d.events}, {Fd: int32(d.wakeFd), Events: unix.POLLIN}}
	var ts *unix.Timespec
	if dl := d.deadline.Load(); dl != 0 {
		left := dl - time.Now().UnixNano()
		if left <= 0 {
			return errPollConnTimeout{}
		}
		t := unix.NsecToTimespec(left)
		ts = &t
	}
	if _, err := unix.Ppoll(fds, ts, nil); err != nil && err != unix.EINTR {
		return os.NewSyscallError("ppoll", err)
	}
	if fds[1].Revents != 0 {
		var buf [8]byte
		_, _ = unix.Read(d.wakeFd, buf[:])
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return net.ErrClosed
	}
	return nil
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
		n, err := unix.Read(c.fd, p)
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
		n, err := unix.Write(c.fd, p[written:])
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
	if c.users == 0 {
		c.release()
	} else {
		c.read.wake()
		c.write.wake()
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

// setDeadline stores t as d's deadline and, when it came closer, wakes a poll waiting in
// direction d so that it ends in time.
func (c *pollConn) setDeadline(d *direction, t time.Time) {
	var n int64
	if !t.IsZero() {
		n = max(t.UnixNano(), 1)
	}
	old := d.deadline.Swap(n)
	if n != 0 && (old == 0 || n < old) {
		c.mu.Lock()
		if !c.closed && c.users > 0 {
			d.wake()
		}
		c.mu.Unlock()
	}
}
