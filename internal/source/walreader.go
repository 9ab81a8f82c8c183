package source

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
)

// statusEvery is how often the reader reports its position when nothing changed (at most; a
// quarter of the server's wal_sender_timeout when that is shorter); a new flush position is
// reported within flushReportDelay.
const (
	statusEvery      = 10 * time.Second
	flushReportDelay = time.Second
)

// statusInterval is statusEvery, or a quarter of wal_sender_timeout when that is shorter, so the
// walsender never times out even while the reader is held back by a slow output.
func statusInterval(ctx context.Context, pool *pgxpool.Pool) time.Duration {
	var ms int64
	if err := pool.QueryRow(ctx, `SELECT setting::bigint FROM pg_catalog.pg_settings WHERE name = 'wal_sender_timeout'`).Scan(&ms); err != nil || ms <= 0 {
		return statusEvery
	}
	return max(min(statusEvery, time.Duration(ms)*time.Millisecond/4), 100*time.Millisecond)
}

// read receives the WAL, answers keepalives and reports the flush position; it returns when the
// session ends (after sending the final position).
//
// Per message it reads no clock and watches no context (one clock read per transaction measures
// whether the stream is behind: lagMeter): the time of the next status report is the
// connection's read deadline, which ends a wait for data (and, data or not, the next read from the
// socket once it has passed), and the end of the session moves that deadline to now.
func (ss *session) read(repl *pgconn.PgConn, dec *decoder) error {
	conn := repl.Conn()
	var sentFlush uint64
	lastStatus := time.Time{}
	sendStatus := func() error {
		f := ss.flush.Load()
		lsn := pglogrepl.LSN(f)
		err := pglogrepl.SendStandbyStatusUpdate(context.Background(), repl, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn, ClientTime: time.Now()})
		sentFlush, lastStatus = f, time.Now()
		return err
	}
	nextStatus := func() time.Time {
		if ss.flush.Load() != sentFlush {
			return lastStatus.Add(flushReportDelay)
		}
		return lastStatus.Add(ss.every)
	}
	defer func() { _ = sendStatus() }()
	stop := context.AfterFunc(ss.ctx, func() { _ = conn.SetReadDeadline(time.Now()) })
	defer stop()
	defer func() { _ = conn.SetReadDeadline(time.Time{}) }()
	var lastPos pglogrepl.LSN
	position := func(lsn pglogrepl.LSN) error {
		if dec.inTxn || lsn <= lastPos {
			return nil
		}
		lastPos = lsn
		return ss.push(item{kind: itemPosition, lsn: lsn}, sendStatus, nextStatus)
	}
	emit := func(it item) error {
		if it.kind == itemCommit {
			if it.commit > lastPos {
				lastPos = it.commit
			}
			it.behind = behind(ss.lag.excess(time.Now(), dec.at), ss.src.cfg.LoadLinger)
			ss.coalesce.setBehind(it.behind)
		}
		if it.kind == itemChunk && it.commit-1 > lastPos {
			lastPos = it.commit - 1
		}
		if ss.snap != nil {
			ss.snap.observe(it)
		}
		return ss.push(it, sendStatus, nextStatus)
	}
	var paused int64           // the last readPause slept for
	var deadline time.Time     // the connection's read deadline: the next status report
	deadlineFlush := sentFlush // the flush position deadline was set for
	for {
		if deadline.IsZero() || ss.flush.Load() != deadlineFlush {
			// A report is due (the deadline passed), or a new flush position moved it closer.
			if !time.Now().Before(nextStatus()) {
				if err := sendStatus(); err != nil {
					return fmt.Errorf("send standby status: %w", err)
				}
			}
			deadline, deadlineFlush = nextStatus(), ss.flush.Load()
			if err := conn.SetReadDeadline(deadline); err != nil {
				return fmt.Errorf("receive WAL: %w", err)
			}
			if ss.ctx.Err() != nil { // ended before the deadline was set: the AfterFunc's may be overwritten
				return nil
			}
		}
		if p := ss.readPause.Load(); p != paused {
			paused = p
			ss.pauseReading(p)
		}
		raw, err := repl.ReceiveMessage(context.Background())
		if err != nil {
			if ss.ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				deadline = time.Time{}
				continue
			}
			return fmt.Errorf("receive WAL: %w", err)
		}
		switch m := raw.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyData:
			if err := ss.copyData(m.Data, dec, emit, position, &lastStatus); err != nil {
				if ss.ctx.Err() != nil {
					return nil
				}
				return err
			}
			if ss.snap != nil && !dec.inTxn { // between transactions, a chunk may go ahead of the stream
				if err := ss.snap.early(lastPos, emit); err != nil {
					if ss.ctx.Err() != nil {
						return nil
					}
					return err
				}
			}
			if lastStatus.IsZero() { // a keepalive asked for a reply
				deadline = time.Time{}
			}
		}
	}
}

// pauseReading sleeps until the unix ns until, at most while the session runs. The bundler asks
// for it while it waits to fill a batch: the WAL that arrives meanwhile waits in the socket and is
// then read in a few large reads, where reading it as it came cost a read (and a wake-up) per
// message. The pause ends before the batch goes, and it is at most a share of load_linger, well
// within any status report's or keepalive's time.
func (ss *session) pauseReading(until int64) {
	d := time.Until(time.Unix(0, until))
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-ss.ctx.Done():
		t.Stop()
	}
}

func (ss *session) copyData(data []byte, dec *decoder, emit func(item) error, position func(pglogrepl.LSN) error, lastStatus *time.Time) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		if ka.ReplyRequested {
			*lastStatus = time.Time{}
		}
		ss.lag.transit(time.Now(), ka.ServerTime)
		if ka.ServerWALEnd > 0 {
			// Every record before ServerWALEnd was decoded and sent: commits ≤ end-1 are all here.
			return position(ka.ServerWALEnd - 1)
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parse XLogData: %w", err)
		}
		ss.dataMsgs.Add(1)
		ss.lag.sent = x.ServerTime
		if len(x.WALData) < 2 || x.WALData[0] != 'M' || x.WALData[1] == 1 {
			// all but a non-transactional logical message (flags 0: watermarks, heartbeats),
			// which moves the session's position rather than a transaction
			return dec.decode(ss.ctx, x.WALData, emit)
		}
		msg, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			return fmt.Errorf("decode pgoutput: %w", err)
		}
		if lm, ok := msg.(*pglogrepl.LogicalDecodingMessage); ok && !lm.Transactional {
			if lm.Prefix == WatermarkPrefix && ss.snap != nil {
				if handled, err := ss.watermark(lm, emit); handled || err != nil {
					return err
				}
			}
			if lm.LSN > 0 {
				return position(lm.LSN - 1)
			}
			return nil
		}
		return dec.handle(ss.ctx, msg, emit)
	}
	return nil
}

// push hands an item to the bundler, blocking while the queue is full but still reporting the
// position to PostgreSQL on time, so a slow output never times the walsender out.
func (ss *session) push(it item, sendStatus func() error, nextStatus func() time.Time) error {
	for {
		ok, changed := ss.q.tryPush(it)
		if ok {
			return nil
		}
		t := time.NewTimer(time.Until(nextStatus()))
		select {
		case <-changed:
		case <-t.C:
			if err := sendStatus(); err != nil {
				t.Stop()
				return fmt.Errorf("send standby status: %w", err)
			}
		case <-ss.ctx.Done():
			t.Stop()
			return ss.ctx.Err()
		}
		t.Stop()
	}
}
