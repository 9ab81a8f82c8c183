//go:build linux

package source

// Polled and OpenFiles are polled and openFiles for the external tests: the descriptors in this
// process's epoll sets, and what each of its descriptors refers to.
var (
	Polled    = polled
	OpenFiles = openFiles
)
