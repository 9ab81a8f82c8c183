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
// (and of an idle scheduler thread that spins looking for work) every few messages, which cost
// pgrelay more than decoding them. Under sustained load of small transactions it is the same, a
// read every few messages. The replication connection's reads go through a readCoalescer: while
// the stream is behind (the lag meter's verdict at each commit) or under load (batches wait to fill,
// load_linger), a read that found the socket drained waits coalesceWait before the next one, so
// what the walsender sends meanwhile is taken in a few large reads (about sixty changes per read
// in a catch-up). Both need load_linger above 0. A stream that keeps up at a moderate rate is
// neither: its reads go at once, with no latency added.
//
// The coalescer also reads the socket in pieces of up to coalesceBuf bytes and hands them to
// pgproto3 from memory: pgproto3 reads into what is left of its 8 KiB buffer, often a few hundred
// bytes, so a backlog waiting in the socket took one system call per few KiB.
const (
	coalesceWait = time.Millisecond
	coalesceBuf  = 256 << 10
)

// queryReadBuf is how much a query connection of the source reads from its socket at once.
const queryReadBuf = 128 << 10

// readLarge builds the frontend of the source's query connections (pgconn.Config.BuildFrontend)
// over a reader of queryReadBuf: a snapshot chunk arrives as a stream of rows, which pgproto3
// alone reads a few KiB per system call.
func readLarge(r io.Reader, w io.Writer) *pgproto3.Frontend {
	return pgproto3.NewFrontend(bufio.NewReaderSize(r, queryReadBuf), w)
}

// readCoalescer is the replication connection's reader (pgconn.Config.BuildFrontend): the
// reader goroutine alone calls Read; the session sets behind at each commit, the bundler loaded
// as it decides whether a batch waits to fill.
type readCoalescer struct {
	r       io.Reader
	behind  atomic.Bool
	loaded  atomic.Bool
	buf     []byte // read from the socket, not yet handed out: buf[rp:wp]
	rp, wp  int
	err     error  // the socket read's error, returned once, when buf[rp:wp] is handed out
	drained bool   // the last socket read returned less than it asked for: the socket had no more
	wait    func() // sleeps coalesceWait
}

// newReadCoalescer reads r in pieces of up to size bytes.
func newReadCoalescer(r io.Reader, size int) *readCoalescer {
	return &readCoalescer{r: r, buf: make([]byte, size), wait: func() { time.Sleep(coalesceWait) }}
}

// Read hands out what an earlier socket read left; else it reads the socket, first waiting
// coalesceWait when the stream is behind or under load and the previous socket read drained it.
func (c *readCoalescer) Read(p []byte) (int, error) {
	if c.rp < c.wp {
		n := copy(p, c.buf[c.rp:c.wp])
		c.rp += n
		if c.rp == c.wp {
			err := c.err
			c.err = nil
			return n, err
		}
		return n, nil
	}
	if c.drained && (c.behind.Load() || c.loaded.Load()) {
		c.wait()
	}
	if len(p) >= len(c.buf) { // a large message: straight into its buffer
		n, err := c.r.Read(p)
		c.drained = n < len(p)
		return n, err
	}
	n, err := c.r.Read(c.buf)
	c.drained = n < len(c.buf)
	c.wp = n
	c.rp = copy(p, c.buf[:n])
	if c.rp == c.wp {
		return c.rp, err
	}
	c.err = err // once, after the bytes read with it: a read deadline's timeout does not end the connection
	return c.rp, nil
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
