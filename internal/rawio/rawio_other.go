//go:build !linux

package rawio

import "net"

// Wrap returns c as is: the raw calls are Linux's.
func Wrap(c net.Conn) net.Conn { return c }

// Wrapped reports false: nothing is wrapped off Linux.
func Wrapped(c net.Conn) bool { return false }
