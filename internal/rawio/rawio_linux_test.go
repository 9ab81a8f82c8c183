//go:build linux

package rawio_test

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/rawio"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// pair connects a wrapped client to a plain server end over network ("tcp" or "unix").
func pair(t *testing.T, network string) (client, server net.Conn) {
	t.Helper()
	c, s := testenv.SocketPair(t, network, rawio.Dialer((&net.Dialer{}).DialContext))
	if !rawio.Wrapped(c) {
		t.Fatalf("Wrap left a %T as is", c)
	}
	return c, s
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// Data crosses both ways whole and in order, small and large writes alike (a write larger than
// the socket's buffers waits for the reader, in the poller or through the net package).
func TestWrapCarriesData(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		for _, size := range []int{1, 4 << 10, rawio.MaxRawWrite, rawio.MaxRawWrite + 1, 8 << 20} {
			t.Run(fmt.Sprintf("%s/%d", network, size), func(t *testing.T) {
				c, s := pair(t, network)
				want := pattern(size)
				for _, dir := range []struct {
					name string
					w, r net.Conn
				}{{"out", c, s}, {"in", s, c}} {
					got := make(chan []byte, 1)
					go func() {
						b := make([]byte, len(want))
						_, err := io.ReadFull(dir.r, b)
						if err != nil {
							t.Errorf("%s: read: %v", dir.name, err)
						}
						got <- b
					}()
					n, err := dir.w.Write(want)
					if err != nil || n != len(want) {
						t.Fatalf("%s: write: %d of %d, %v", dir.name, n, len(want), err)
					}
					if b := <-got; !bytes.Equal(b, want) {
						t.Fatalf("%s: the bytes read differ from the bytes written", dir.name)
					}
				}
			})
		}
	}
}

// A small write into a full socket waits for room in the poller (the EAGAIN path) and then goes
// out whole, after what filled it. (A Unix socket: its buffers do not grow the way TCP's
// autotuning grows them after a write timed out.)
func TestWrapWaitsForRoom(t *testing.T) {
	c, s := pair(t, "unix")
	chunk := pattern(rawio.MaxRawWrite)
	var sent bytes.Buffer
	for { // fill the socket's buffers: a write that cannot finish before its deadline
		c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
		n, err := c.Write(chunk)
		sent.Write(chunk[:n])
		if err != nil {
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("write into a full socket: %v, want a timeout", err)
			}
			break
		}
	}
	c.SetWriteDeadline(time.Time{})
	last := pattern(100)
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(last)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a write into a full socket returned before anyone read: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	sent.Write(last)
	got := make([]byte, sent.Len())
	if _, err := io.ReadFull(s, got); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, sent.Bytes()) {
		t.Fatal("the bytes read differ from the bytes written")
	}
}

// Deadlines, Close and the peer's close read as on the net package's connections.
func TestWrapErrorsReadLikeNet(t *testing.T) {
	t.Run("read deadline", func(t *testing.T) {
		c, _ := pair(t, "tcp")
		c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		_, err := c.Read(make([]byte, 10))
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read past its deadline: %v, want a timeout", err)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "read" {
			t.Fatalf("read past its deadline: %#v, want a *net.OpError of op read", err)
		}
	})
	t.Run("close during a read", func(t *testing.T) {
		c, _ := pair(t, "tcp")
		done := make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 10))
			done <- err
		}()
		time.Sleep(20 * time.Millisecond)
		c.Close()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read closed under it: %v, want net.ErrClosed", err)
		}
	})
	t.Run("peer closed", func(t *testing.T) {
		c, s := pair(t, "unix")
		s.Write([]byte("ab"))
		s.Close()
		b, err := io.ReadAll(c)
		if err != nil || string(b) != "ab" {
			t.Fatalf("read to the peer's close: %q, %v; want \"ab\" then io.EOF", b, err)
		}
		if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("read after the peer's close: %d, %v; want io.EOF", n, err)
		}
	})
}

// Connections that are not TCP or Unix sockets pass through as they are, and a wrapped one still
// hands out its descriptor.
func TestWrapLeavesOtherConnections(t *testing.T) {
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	tc := tls.Client(p1, &tls.Config{})
	for _, c := range []net.Conn{p1, tc} {
		if w := rawio.Wrap(c); w != c || rawio.Wrapped(w) {
			t.Fatalf("Wrap(%T) = %T, want it as is", c, w)
		}
	}
	c, _ := pair(t, "tcp")
	sc, ok := c.(syscall.Conn)
	if !ok {
		t.Fatal("a wrapped connection is not a syscall.Conn")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd uintptr
	if err := rc.Control(func(d uintptr) { fd = d }); err != nil || fd == 0 {
		t.Fatalf("the wrapped connection's descriptor: %d, %v", fd, err)
	}
}
