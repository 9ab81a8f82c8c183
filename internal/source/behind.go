package source

import "time"

// The stream is behind the writers when a transaction reaches the reader later after its commit
// than the path from PostgreSQL takes: the walsender is still decoding older WAL, or the WAL waits
// in the connection. More WAL is then certainly waiting, so a batch that is not full waits to fill
// (catch-up batching, load_linger) even when the arrival rate alone would not make it wait: a
// walsender starved of CPU delivers a transaction at a time, below load_linger's rate, and a batch
// per transaction (a read, a write, an fsync each) would slow it further on shared cores.
const (
	// BehindLingers: the stream is behind when a transaction's delivery takes more than this
	// many load_linger longer than the quickest recent delivery, so a wait to fill adds at most
	// a quarter of the delay already there, and a caught-up stream's jitter does not count.
	BehindLingers = 4
	// lagWindow: the quickest delivery is the minimum over the last one to two windows, so the
	// baseline follows a change of clock or path within two windows.
	lagWindow = 10 * time.Second
)

// lagMeter measures how far behind its commit each transaction arrives, on the reader's
// goroutine (one clock read per transaction).
//
// The delay is now − commit time, with the commit time (pgoutput Begin) on the server's clock.
// Its baseline is the minimum, over the last one to two lagWindows, of the transit of a message:
// now − the time the walsender sent it (XLogData and keepalives carry it). The transit holds the
// two clocks' skew and the path's own delay, but not the walsender's decoding, so a stream behind
// from the start (a restart with a backlog) is seen as behind at once, and an excess over the
// quickest transit (WAL waiting in the connection) counts too.
type lagMeter struct {
	sent      time.Time     // the send time of the XLogData being decoded
	cur, prev time.Duration // the least transit in the current window and in the one before
	start     time.Time     // when the current window started (zero: no transit yet)
}

// transit records that a message sent (on the server's clock) at sent arrived now.
func (m *lagMeter) transit(now, sent time.Time) {
	d := now.Sub(sent)
	switch age := now.Sub(m.start); {
	case m.start.IsZero() || age >= 2*lagWindow:
		m.prev, m.cur, m.start = d, d, now
	case age >= lagWindow:
		m.prev, m.cur, m.start = m.cur, d, now
	case d < m.cur:
		m.cur = d
	}
}

// excess is how much longer than the quickest recent transit a transaction committed at commit
// took to arrive now; the transit of the message carrying it (m.sent) is recorded first.
func (m *lagMeter) excess(now, commit time.Time) time.Duration {
	m.transit(now, m.sent)
	return now.Sub(commit) - min(m.cur, m.prev)
}

// behind reports whether a transaction arriving with that excess delay finds the stream behind
// the writers, with load_linger wait (never when wait is 0).
func behind(excess, wait time.Duration) bool { return wait > 0 && excess > BehindLingers*wait }
