//go:build linux

package source

// Polled is polled for the external tests: the descriptors in this process's epoll sets.
var Polled = polled
