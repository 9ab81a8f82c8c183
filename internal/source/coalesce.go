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
	r        io.Reader
	behind   atomic.Bool
	loaded   atomic.Bool
	drained  bool   // the last read returned less than it asked for: the socket had no more
	lastRead int64  // unix ns: when the last read began (kept once turn is set)
	wait     func() // sleeps coalesceWait
	// turn, set by the session once it streams, is the wait under load: until the reader's next
	// turn (session.readTurn), given when the last read began.
	turn func(lastRead int64)
}

func newReadCoalescer(r io.Reader) *readCoalescer {
	return &readCoalescer{r: r, wait: func() { time.Sleep(coalesceWait) }}
}

// Read waits first when the stream is behind or under load and the previous read drained the
// socket: coalesceWait while behind, the reader's next turn under load.
func (c *readCoalescer) Read(p []byte) (int, error) {
	if c.drained {
		switch behind, loaded := c.behind.Load(), c.loaded.Load(); {
		case loaded && !behind && c.turn != nil:
			c.turn(c.lastRead)
		case behind || loaded:
			c.wait()
		}
	}
	if c.turn != nil {
		c.lastRead = time.Now().UnixNano()
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

// Under load, a batch waits to fill until load_linger after the previous ack (bundler.go), and
// the WAL that arrives meanwhile is read in turns: the bundler gives the reader one turn shortly
// before the batch goes (session.readPause), the reader reads and queues what arrived and tells
// the bundler (readServed), and the batch goes at once. Between turns a reader that drained the
// socket waits for the next turn, or for the bundler asking for data (wantData: it has nothing
// to send), at most turnWaitMax. So pgrelay wakes about twice per batch (the ack, the turn)
// instead of at every read, timer and hand-over in between: each wake of an idle Go process
// costs its scheduler threads and the runtime's monitor several context switches, which on
// small transactions cost more than the changes themselves.

// turns reports whether the reader reads in turns: a replication reader that takes them (under
// load: the bundler's waits to fill give them), not behind, with no snapshot
// running (its chunks go into the queue once the stream passed their high watermarks, and a full
// batch of them is built while another is in flight: the reader reads on as before), and with no
// linger (it counts from the first change seen, which turns would put off).
func (ss *session) turns() bool {
	c := ss.coalesce
	return c != nil && c.turn != nil && !c.behind.Load() && (ss.snap == nil || ss.snap.over.Load()) && ss.src.cfg.Linger == 0
}

// turnWaitMax bounds a reader's wait for its next turn: the reader still answers keepalives and
// reports its position while batches stall (the wait is a ticker's, not a timer per wait: a
// stopped timer still wakes the runtime at its time).
const turnWaitMax = 100 * time.Millisecond

// poke sends on a channel of capacity 1 without blocking: a wake-up already pending is enough.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// readTurn is the reader's wait under load between a read that drained the socket and the next
// (everything read so far is decoded and queued by now, but for a message only partly received);
// lastRead is when that read began. A turn
// nothing was read in yet is waited for (or, once it has come, read at once); a turn read in is
// served (the bundler is told), and the reader waits for the next turn or for the bundler asking
// for data.
func (ss *session) readTurn(lastRead int64) {
	if !ss.turns() { // a snapshot runs: its chunks wait for the stream to pass their watermarks
		ss.coalesce.wait()
		return
	}
	for {
		turn := ss.readPause.Load()
		if turn != 0 && lastRead < turn {
			ss.pauseReading(turn) // (at once when it has come)
			return
		}
		if turn != 0 && ss.readServed.Load() != turn {
			ss.readServed.Store(turn)
			poke(ss.readDone)
		}
		if ss.wantData.Load() {
			return
		}
		select {
		case <-ss.readWake:
		case <-ss.readTick.C:
			return
		case <-ss.ctx.Done():
			return
		}
	}
}
