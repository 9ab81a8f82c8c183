package rawio

import (
	"context"
	"net"
)

// DialFunc is a dialer's signature (pgconn's DialFunc, go-redis' Dialer).
type DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// Dialer wraps dial: the connections it makes read and write through Wrap.
func Dialer(dial DialFunc) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return Wrap(c), nil
	}
}
