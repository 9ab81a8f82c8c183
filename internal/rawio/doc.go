// Package rawio reads and writes non-blocking sockets with system calls the Go runtime does not
// account for.
//
// A read or write through the net package enters the runtime's system call bookkeeping, and the
// first such call after the process was idle wakes the runtime's monitor thread (sysmon), which
// then polls every 20 µs until the process is idle again. pgrelay's hot path is a burst of socket
// reads and writes per transaction or batch (the WAL, Redis' commands and replies) with idle time
// between bursts, so that monitor woke about once per burst: with small transactions it was a
// fifth to a third of pgrelay's CPU (docs/dev/benchmark-notes.md). On a non-blocking socket a read
// or write never blocks, so the bookkeeping buys nothing: Read and Write here make the call
// directly and wait, when the socket is not ready, in the network poller like the net package.
package rawio
