//go:build linux

package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// pollPair is a pollConn dialled to a loopback listener, and the listener's end.
func pollPair(t *testing.T) (*pollConn, net.Conn) {
	t.Helper()
	var d net.Dialer
	c, peer := testenv.SocketPair(t, "tcp", dialOutsidePoller(d.DialContext))
	pc, ok := c.(*pollConn)
	if !ok {
		t.Fatalf("dialOutsidePoller gave a %T, want a *pollConn", c)
	}
	return pc, peer
}

// isTimeout is what pgconn.Timeout and the WAL reader check: a net.Error that timed out and
// matches os.ErrDeadlineExceeded.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && errors.Is(err, os.ErrDeadlineExceeded)
}

// TestPollConnBehavesAsANetConn: reads, writes, deadlines and Close of a pollConn as pgconn and
// the WAL reader use them on a net.Conn.
func TestPollConnBehavesAsANetConn(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, c *pollConn, peer net.Conn)
	}{
		{"a read waits for data that arrives later", func(t *testing.T, c *pollConn, peer net.Conn) {
			go func() { time.Sleep(20 * time.Millisecond); peer.Write([]byte("hello")) }()
			buf := make([]byte, 16)
			n, err := c.Read(buf)
			if err != nil || string(buf[:n]) != "hello" {
				t.Fatalf("Read = %q, %v; want hello", buf[:n], err)
			}
		}},
		{"a wait for data already in the socket returns at once, every time", func(t *testing.T, c *pollConn, peer net.Conn) {
			buf := make([]byte, 1)
			for i := 0; i < 300; i++ {
				peer.Write([]byte{byte(i)})
				for {
					n, err := unix.Read(c.fd, buf) // as Read does, then wait on EAGAIN
					if err == nil && n == 1 {
						break
					}
					c.SetReadDeadline(time.Now().Add(2 * time.Second))
					if err := c.wait(&c.read); err != nil {
						t.Fatalf("wait %d for a byte sent before it: %v", i, err)
					}
				}
				peer.Write([]byte{byte(i)}) // in the socket before the wait
				time.Sleep(time.Millisecond)
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				if err := c.wait(&c.read); err != nil {
					t.Fatalf("wait %d for a byte already in the socket: %v", i, err)
				}
				if n, err := unix.Read(c.fd, buf); err != nil || n != 1 {
					t.Fatalf("read %d after the wait: %d, %v", i, n, err)
				}
			}
			c.SetReadDeadline(time.Time{})
		}},
		{"a read past its deadline fails even with data waiting", func(t *testing.T, c *pollConn, peer net.Conn) {
			peer.Write([]byte("waiting"))
			time.Sleep(10 * time.Millisecond)
			c.SetReadDeadline(time.Now().Add(-time.Second))
			if _, err := c.Read(make([]byte, 16)); !isTimeout(err) {
				t.Fatalf("Read past the deadline = %v, want a timeout", err)
			}
			c.SetReadDeadline(time.Time{})
			buf := make([]byte, 16)
			if n, err := c.Read(buf); err != nil || string(buf[:n]) != "waiting" {
				t.Fatalf("Read after clearing the deadline = %q, %v; want the data, kept", buf[:n], err)
			}
		}},
		{"a deadline ends a wait for data that does not come", func(t *testing.T, c *pollConn, peer net.Conn) {
			c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
			start := time.Now()
			_, err := c.Read(make([]byte, 16))
			if !isTimeout(err) {
				t.Fatalf("Read = %v, want a timeout", err)
			}
			if took := time.Since(start); took < 25*time.Millisecond || took > 5*time.Second {
				t.Fatalf("the read waited %v for a 30 ms deadline", took)
			}
		}},
		{"a deadline moved to now ends a waiting read (context cancellation)", func(t *testing.T, c *pollConn, peer net.Conn) {
			done := make(chan error, 1)
			go func() { _, err := c.Read(make([]byte, 16)); done <- err }()
			time.Sleep(20 * time.Millisecond)
			c.SetDeadline(time.Now())
			select {
			case err := <-done:
				if !isTimeout(err) {
					t.Fatalf("Read = %v, want a timeout", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the waiting read did not end when its deadline moved to now")
			}
		}},
		{"a deadline moved later keeps a read waiting for its data", func(t *testing.T, c *pollConn, peer net.Conn) {
			c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			done := make(chan error, 1)
			buf := make([]byte, 16)
			go func() { _, err := c.Read(buf); done <- err }()
			time.Sleep(10 * time.Millisecond)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			time.Sleep(100 * time.Millisecond)
			peer.Write([]byte("late"))
			if err := <-done; err != nil || string(bytes.TrimRight(buf, "\x00")) != "late" {
				t.Fatalf("Read = %q, %v; want late", buf, err)
			}
		}},
		{"Close ends a waiting read", func(t *testing.T, c *pollConn, peer net.Conn) {
			done := make(chan error, 1)
			go func() { _, err := c.Read(make([]byte, 16)); done <- err }()
			time.Sleep(20 * time.Millisecond)
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if !errors.Is(err, net.ErrClosed) {
					t.Fatalf("Read = %v, want net.ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the waiting read did not end at Close")
			}
			if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Write after Close = %v, want net.ErrClosed", err)
			}
			if err := c.Close(); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("second Close = %v, want net.ErrClosed", err)
			}
		}},
		{"the peer's close is io.EOF", func(t *testing.T, c *pollConn, peer net.Conn) {
			peer.Write([]byte("bye"))
			peer.Close()
			got, err := io.ReadAll(c)
			if err != nil || string(got) != "bye" {
				t.Fatalf("ReadAll = %q, %v; want bye", got, err)
			}
		}},
		{"a write larger than the socket's buffers waits for room and arrives whole", func(t *testing.T, c *pollConn, peer net.Conn) {
			data := bytes.Repeat([]byte("0123456789abcdef"), 1<<20) // 16 MiB
			got := make(chan []byte, 1)
			go func() {
				time.Sleep(50 * time.Millisecond) // the writer finds the buffers full
				b, _ := io.ReadAll(peer)
				got <- b
			}()
			n, err := c.Write(data)
			if err != nil || n != len(data) {
				t.Fatalf("Write = %d, %v; want %d", n, err, len(data))
			}
			c.Close()
			if !bytes.Equal(<-got, data) {
				t.Fatal("the peer did not read the bytes written")
			}
		}},
		{"a write deadline ends a write the peer never reads", func(t *testing.T, c *pollConn, peer net.Conn) {
			c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
			n, err := c.Write(make([]byte, 64<<20))
			if !isTimeout(err) || n >= 64<<20 {
				t.Fatalf("Write = %d, %v; want a timeout after part of it", n, err)
			}
		}},
		{"a write's deadline ends a waiting write and leaves a waiting read waiting", func(t *testing.T, c *pollConn, peer net.Conn) {
			read := make(chan string, 1)
			go func() {
				buf := make([]byte, 16)
				n, err := c.Read(buf)
				read <- fmt.Sprintf("%s %v", buf[:n], err)
			}()
			wrote := make(chan error, 1)
			go func() { _, err := c.Write(make([]byte, 64<<20)); wrote <- err }() // the peer does not read
			time.Sleep(50 * time.Millisecond)
			c.SetWriteDeadline(time.Now())
			select {
			case err := <-wrote:
				if !isTimeout(err) {
					t.Fatalf("Write = %v, want a timeout", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the waiting write did not end when its deadline moved to now")
			}
			select {
			case got := <-read:
				t.Fatalf("the waiting read ended with %q when the write's deadline moved", got)
			case <-time.After(50 * time.Millisecond):
			}
			peer.Write([]byte("x"))
			if got := <-read; got != "x <nil>" {
				t.Fatalf("Read = %q, want x", got)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, peer := pollPair(t)
			tt.run(t, c, peer)
		})
	}
}

// TestPollConnIsOutsideTheNetworkPoller: the dialled socket is registered in none of the
// process's epoll sets (a socket in Go's poller is: its arrivals wake an idle thread).
func TestPollConnIsOutsideTheNetworkPoller(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			io.Copy(io.Discard, c)
		}
	}()
	plain, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	plainFd := connFd(t, plain)
	if !polled(t)[plainFd] {
		t.Fatalf("setup: a net.Conn's socket (fd %d) is not in an epoll set; the check reads nothing", plainFd)
	}
	var d net.Dialer
	c, err := dialOutsidePoller(d.DialContext)(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc := c.(*pollConn)
	if polled(t)[pc.fd] {
		t.Fatalf("the pollConn's socket (fd %d) is in an epoll set", pc.fd)
	}
	// A wait leaves no duplicate behind: between waits the socket has one descriptor.
	if err := pc.wait(&pc.write); err != nil { // writable at once
		t.Fatal(err)
	}
	files := openFiles(t)
	self := files[pc.fd]
	for fd, target := range files {
		if target == self && fd != pc.fd {
			t.Fatalf("after a wait the socket still has descriptor %d beside %d", fd, pc.fd)
		}
	}
}

func connFd(t *testing.T, c net.Conn) int {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	raw.Control(func(s uintptr) { fd = int(s) })
	return fd
}

// openFiles maps this process's descriptors to what they refer to (/proc/self/fd's links:
// "socket:[inode]", "anon_inode:[eventpoll]", a path).
func openFiles(t *testing.T) map[int]string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	files := map[int]string{}
	for _, e := range fds {
		n, err := strconv.Atoi(e.Name())
		if target, lerr := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && lerr == nil {
			files[n] = target
		}
	}
	return files
}

// polled is the set of descriptors registered in any of this process's epoll sets, from the
// "tfd:" lines of /proc/self/fdinfo.
func polled(t *testing.T) map[int]bool {
	t.Helper()
	in := map[int]bool{}
	for fd, target := range openFiles(t) {
		if target != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", strconv.Itoa(fd)))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "tfd:" {
				if n, err := strconv.Atoi(f[1]); err == nil {
					in[n] = true
				}
			}
		}
	}
	return in
}
