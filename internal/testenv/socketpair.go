package testenv

import (
	"context"
	"net"
	"path/filepath"
	"testing"
)

// SocketPair connects a client made by dial to a listener of network
// ("tcp" on 127.0.0.1 or "unix" in a temporary directory) and returns the client and the accepted
// end; both are closed when the test ends.
func SocketPair(t testing.TB, network string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) (client, server net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "s")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := dial(context.Background(), network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		c.Close()
		t.Fatal("testenv: SocketPair: accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}
