//go:build linux

package rawio

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// Read reads from the non-blocking descriptor fd into p without the runtime's system call
// bookkeeping. It returns the system call's result as is: (0, nil) at end of file, EAGAIN when
// nothing is there, EINTR never (it retries).
func Read(fd int, p []byte) (int, error) { return call(syscall.SYS_READ, fd, p) }

// Write writes p to the non-blocking descriptor fd without the runtime's system call bookkeeping:
// what the socket took (maybe less than p), or EAGAIN when it took nothing.
func Write(fd int, p []byte) (int, error) { return call(syscall.SYS_WRITE, fd, p) }

// call makes the read or write system call trap on fd and p, again while it is interrupted.
func call(trap uintptr, fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, _, e := syscall.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch e {
		case 0:
			return int(n), nil
		case syscall.EINTR:
			continue
		}
		return 0, e
	}
}

// MaxRawWrite is the largest write Wrap's connections make without the runtime's bookkeeping. A
// larger one goes through the net package: on loopback TCP the sender's call also runs the
// receiver's side (hundreds of µs for a snapshot's batch), long enough that the runtime's handing
// the processor to another thread meanwhile pays for the monitor's wake-up.
const MaxRawWrite = 32 << 10

// Wrap returns c with Read and Write through this package's calls, waiting in the network poller
// when the socket is not ready (deadlines and Close work as on c). A connection that is not a
// TCP or Unix socket (TLS, a pipe) is returned as is.
func Wrap(c net.Conn) net.Conn {
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return c
	}
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return c
	}
	return &conn{Conn: c, rc: rc}
}

// conn is a net.Conn whose Read and Write go through RawRead/RawWrite of its socket.
type conn struct {
	net.Conn
	rc syscall.RawConn
}

func (c *conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var (
		n    int
		rerr error
	)
	err := c.rc.Read(func(fd uintptr) bool {
		n, rerr = Read(int(fd), p)
		return rerr != syscall.EAGAIN
	})
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case rerr != nil:
		return 0, c.opError("read", os.NewSyscallError("read", rerr))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (c *conn) Write(p []byte) (int, error) {
	if len(p) > MaxRawWrite {
		return c.Conn.Write(p)
	}
	written := 0
	var werr error
	err := c.rc.Write(func(fd uintptr) bool {
		for written < len(p) {
			n, e := Write(int(fd), p[written:])
			if e == syscall.EAGAIN {
				return false
			}
			if e != nil {
				werr = e
				return true
			}
			written += n
		}
		return true
	})
	switch {
	case err != nil:
		return written, c.opError("write", err)
	case werr != nil:
		return written, c.opError("write", os.NewSyscallError("write", werr))
	}
	return written, nil
}

// opError is err as the net package reports it: a *net.OpError naming the connection, whose
// Timeout is true past a deadline and which unwraps to net.ErrClosed after Close.
func (c *conn) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok { // RawConn's own ("raw-read"): unwrap to name the operation
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// SyscallConn is the socket's, so a caller can take the descriptor (the replication connection's
// reader does).
func (c *conn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }

// Wrapped reports whether c reads and writes through this package (Wrap took it).
func Wrapped(c net.Conn) bool {
	_, ok := c.(*conn)
	return ok
}
