//go:build !linux

package source

import (
	"context"
	"net"
)

// dialOutsidePoller returns dial unchanged: the replication socket stays in Go's network poller
// (pollconn_linux.go takes it out on Linux).
func dialOutsidePoller(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return dial
}
