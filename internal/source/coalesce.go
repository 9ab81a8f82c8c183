package source

import (
	"bufio"
	"io"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// While the stream is behind the writers (a backlog, a catch-up after a restart), the walsender
// sends each message as it decodes it, one small send each, and a reader that reads as soon as
// data arrives takes a few messages per read (about four changes in BenchmarkSourceTx1000): a read
// system call, the kernel's receive work for what arrived, and a wake-up of the reading goroutine
// every few messages, which cost pgrelay more than decoding them (the socket is outside Go's
// network poller, pollconn_linux.go, so what arrives during the wait wakes no one). Under sustained load of small transactions it is the same, a
// read every few messages. The replication connection's reads go through a readCoalescer: while
// the stream is behind (the lag meter's verdict at each commit) or under load (batches wait to fill,
// load_linger), a read that found the socket drained waits coalesceWait before the next one, so
// what the walsender sends meanwhile is taken in a few large reads (a few hundred changes per read
// in a catch-up). Both need load_linger above 0. A stream that keeps up at a moderate rate is
// neither: its reads go at once, with no latency added.
//
// Every connection of the source reads its socket through a bufio.Reader (readLarge): pgproto3
// reads into what is left of its 8 KiB buffer, often a few hundred bytes, so a backlog waiting in
// the replication socket, or a snapshot chunk's rows, took one system call per few KiB. The
// coalescer sits under the replication connection's, so each of its reads asks for up to
// replReadBuf bytes and a short one means the socket was drained.
const (
	coalesceWait = time.Millisecond
	replReadBuf  = 256 << 10 // the replication connection's reads
	queryReadBuf = 128 << 10 // a query connection's (snapshot chunks, watermarks, read-back)
)

// readLarge builds a connection's frontend (pgconn.Config.BuildFrontend) over a reader of size
// bytes.
func readLarge(r io.Reader, w io.Writer, size int) *pgproto3.Frontend {
	return pgproto3.NewFrontend(bufio.NewReaderSize(r, size), w)
}

// queryFrontend is the query connections' BuildFrontend.
func queryFrontend(r io.Reader, w io.Writer) *pgproto3.Frontend {
	return readLarge(r, w, queryReadBuf)
}

// replicationFrontend is the replication connection's BuildFrontend: its reads go through a
// readCoalescer, which it hands to set (the session flags it).
func replicationFrontend(set func(*readCoalescer)) func(io.Reader, io.Writer) *pgproto3.Frontend {
	return func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		c := newReadCoalescer(r)
		set(c)
		return readLarge(c, w, replReadBuf)
	}
}

// readCoalescer is the replication connection's reader (under readLarge's buffer): the reader
// goroutine alone calls Read; the session sets behind at each commit, the bundler loaded as it
// decides whether a batch waits to fill.
type readCoalescer struct {
	r       io.Reader
	behind  atomic.Bool
	loaded  atomic.Bool
	drained bool   // the last read returned less than it asked for: the socket had no more
	wait    func() // sleeps coalesceWait
}

func newReadCoalescer(r io.Reader) *readCoalescer {
	return &readCoalescer{r: r, wait: func() { time.Sleep(coalesceWait) }}
}

// Read waits coalesceWait first when the stream is behind or under load and the previous read
// drained the socket.
func (c *readCoalescer) Read(p []byte) (int, error) {
	if c.drained && (c.behind.Load() || c.loaded.Load()) {
		c.wait()
	}
	n, err := c.r.Read(p)
	c.drained = n < len(p)
	return n, err
}

// setBehind records whether the stream is behind (nil-safe: a connection without a coalescer).
func (c *readCoalescer) setBehind(behind bool) {
	if c != nil {
		setFlag(&c.behind, behind)
	}
}

// setLoaded records whether batches wait to fill (nil-safe).
func (c *readCoalescer) setLoaded(loaded bool) {
	if c != nil {
		setFlag(&c.loaded, loaded)
	}
}

// setFlag stores v in flag when it differs (a load is cheaper than a store to a shared line).
func setFlag(flag *atomic.Bool, v bool) {
	if flag.Load() != v {
		flag.Store(v)
	}
}
