package source

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/retry"
)

// Phases a source reports (DESIGN §8).
const (
	PhaseConnecting     = "connecting"
	PhaseStandby        = "standby"
	PhaseWaitingForSlot = "waiting_for_slot"
	PhaseStreaming      = "streaming"
	PhaseSnapshot       = "snapshot" // streaming while the snapshot runs
	PhaseError          = "error"
	PhaseStopped        = "stopped"
)

// ReadyPhase reports whether a replica in phase p works as it should: streaming, snapshotting,
// standing by for the replica that owns the source, or waiting for the slot an earlier owner's
// connection still holds. Connecting (its last attempt failed or none finished) and error are not.
func ReadyPhase(p string) bool {
	switch p {
	case PhaseStreaming, PhaseSnapshot, PhaseStandby, PhaseWaitingForSlot:
		return true
	}
	return false
}

// WaitReady blocks until the source reaches a ready phase (ReadyPhase: nil), ctx ends (its error),
// or max passes: then the phase's last error, or an error naming the phase when it has none.
func (s *Source) WaitReady(ctx context.Context, max time.Duration) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	deadline := time.Now().Add(max)
	for {
		phase, err := s.Phase()
		switch {
		case ReadyPhase(phase):
			return nil
		case time.Now().After(deadline) && err != nil:
			return err
		case time.Now().After(deadline):
			return fmt.Errorf("pg_cdc %s: not streaming yet (phase %s)", s.cfg.Name, phase)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Logger is what Source logs through (Benthos' *service.Logger satisfies it).
type Logger interface {
	Infof(format string, args ...any)
	Warnf(format string, args ...any)
	Errorf(format string, args ...any)
}

// namedLogger prefixes every line with the source's name ("pg_cdc <name>: "), so a process running
// several sources tells them apart; the Source's messages are written without it.
type namedLogger struct {
	Logger
	prefix string
}

func newNamedLogger(log Logger, name string) namedLogger {
	return namedLogger{Logger: log, prefix: "pg_cdc " + strings.ReplaceAll(name, "%", "%%") + ": "}
}

func (l namedLogger) Infof(format string, args ...any)  { l.Logger.Infof(l.prefix+format, args...) }
func (l namedLogger) Warnf(format string, args ...any)  { l.Logger.Warnf(l.prefix+format, args...) }
func (l namedLogger) Errorf(format string, args ...any) { l.Logger.Errorf(l.prefix+format, args...) }

// Hooks receive counts for metrics; nil hooks are skipped.
type Hooks struct {
	Transactions func(n int64)
	Messages     func(n int64)
	Bundles      func(n int64)
	PointerLSN   func(lsn uint64)
	SlotLag      func(bytes int64)
	Owner        func(owner bool)
	Error        func(code string)
	// Phase reports each change of phase (PhaseConnecting, PhaseStreaming, ...).
	Phase func(phase string)
	// SnapshotRows counts snapshot rows read (after the chunk is in the queue); SnapshotTables
	// counts tables whose snapshot finished.
	SnapshotRows   func(n int64)
	SnapshotTables func(n int64)
	// Refused reports a table the start checks refused (refused true, with its code), and
	// false once a later start accepts it.
	Refused func(table, code string, refused bool)
}

// Keys are the Redis keys of one source (DESIGN §4), under its first queue's hash tag.
type Keys struct{ Lease, Pointer, Resync, Status, Rejoin, Reread string }

// KeysFor derives the keys from the config.
func KeysFor(c *Config) Keys {
	k := func(s string) string { return redisconn.Key(c.Redis.Prefix, c.Tables[0].Queue, "src", c.Name, s) }
	return Keys{Lease: k("lease"), Pointer: k("ptr"), Resync: k("resync"), Status: k("status"), Rejoin: k("rejoin"), Reread: k("reread")}
}

// Source owns the lease, runs streaming sessions, and hands out one batch at a time.
type Source struct {
	cfg    Config
	log    Logger
	hooks  Hooks
	keys   Keys
	owner  string
	rdb    redis.UniversalClient
	writer *queue.Writer
	lease  *lease.Lease
	covers *coverWriter // writes the pointer for outputs that do not, in the background

	stopCovers context.CancelFunc // ends the cover writer's retries (Close, after the last write)

	chain  *queue.Chain // the batches in flight, as the output sees them (at most its window)
	nextMu sync.Mutex   // one Next at a time: only Next builds batches

	mu       sync.Mutex
	phase    string
	lastErr  error
	sess     *session
	sessCh   chan struct{} // closed and replaced when sess changes
	streamed []string      // the tables the replication session streams ("schema.name"), set at its start
	matched  []string      // the tables the session's start found named (patterns expanded), refused ones too
	// unpublished are the tables a pattern matched that the start refused for not being in an
	// unmanaged publication: the heartbeat restarts the session once one is.
	unpublished []TableInfo
	refused     []Refusal         // the tables its start checks refused (skipped with on_refused_table: skip)
	snapProg    *SnapshotProgress // the running snapshot's last progress report
	out         []*Batch          // handed out and awaiting their verdict (Ack), in the order handed out
	outCh       chan struct{}     // closed and replaced whenever out shrinks
	retry       []*Batch          // nacked, to send again in order
	settling    bool              // an Ack is settling the batches at the head of out (they stay in out until settled)
	ahead       *Batch            // built while a batch was in flight; handed out after its ack, or behind it
	attempts    int

	cancel context.CancelFunc
	done   chan struct{}
}

// New prepares a source; Start connects.
func New(cfg Config, log Logger, hooks Hooks) (*Source, error) {
	rdb, err := cfg.Redis.Client()
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	owner := fmt.Sprintf("%s:%d:%08x", host, os.Getpid(), rand.Uint32())
	keys := KeysFor(&cfg)
	s := &Source{
		cfg: cfg, log: newNamedLogger(log, cfg.Name), hooks: hooks, keys: keys, owner: owner, rdb: rdb,
		writer: queue.NewWriter(rdb, queue.WriterConfig{Prefix: cfg.Redis.Prefix}),
		lease:  lease.New(rdb, keys.Lease, cfg.LeaseTTL, owner),
		chain:  queue.NewChain(),
		outCh:  make(chan struct{}),
		phase:  PhaseConnecting,
		sessCh: make(chan struct{}),
	}
	ctx, stop := context.WithCancel(context.Background())
	s.covers, s.stopCovers = newCoverWriter(s, ctx), stop
	return s, nil
}

// Start runs the ownership loop in the background until Close.
func (s *Source) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		s.run(ctx)
	}()
	go s.refreshStatus(ctx)
}

// statusRefresh is how often a replica writes its status entry again although nothing changed, so
// a replica that stays in one phase (streaming for weeks) keeps its entry, and the hash, from
// expiring; statusKeep is how long an entry not written again stays (a stopped or vanished
// replica's), and the hash after its last write.
var statusRefresh atomic.Int64

const statusKeep = 24 * time.Hour

func init() { statusRefresh.Store(int64(time.Hour)) }

// refreshStatus writes this replica's status entry every statusRefresh and drops the entries of
// replicas that wrote none for statusKeep, until ctx ends.
func (s *Source) refreshStatus(ctx context.Context) {
	t := time.NewTicker(time.Duration(statusRefresh.Load()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		phase, err := s.Phase()
		s.publishStatus(phase, err)
		s.pruneStatus(ctx, time.Now().Add(-statusKeep))
	}
}

// pruneStatus deletes the status entries of other replicas last written before cutoff (or that
// cannot be read).
func (s *Source) pruneStatus(ctx context.Context, cutoff time.Time) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	all, err := s.rdb.HGetAll(ctx, s.keys.Status).Result()
	if err != nil {
		return
	}
	var old []string
	for owner, raw := range all {
		if owner == s.owner {
			continue
		}
		var st ReplicaStatus
		if json.Unmarshal([]byte(raw), &st) == nil {
			if at, err := time.Parse(time.RFC3339, st.At); err == nil && !at.Before(cutoff) {
				continue // written since cutoff
			}
		}
		old = append(old, owner)
	}
	if len(old) > 0 {
		s.rdb.HDel(ctx, s.keys.Status, old...)
	}
}

// Close stops streaming after the batch in flight (Benthos calls it once acks are done), writes
// the last acknowledged cover, sends PostgreSQL the last position, frees the slot and releases
// the lease at once.
func (s *Source) Close(ctx context.Context) error {
	wctx, wcancel := context.WithTimeout(ctx, closeWriteWithin)
	defer wcancel()
	_ = s.covers.drain(wctx) // while the session runs, so PostgreSQL learns the last position too
	if s.cancel != nil {
		s.cancel()
		select {
		case <-s.done:
		case <-ctx.Done():
		}
	}
	_ = s.covers.drain(wctx) // an ack that came after the first drain
	s.stopCovers()
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.lease.Release(rctx)
	s.setPhase(PhaseStopped, nil)
	s.writer.Close()
	s.rdb.Close()
	return err
}

// closeWriteWithin bounds how long Close waits for the last cover's write: past it the pointer
// stays behind and the next start repeats what is past it.
const closeWriteWithin = 5 * time.Second

// Phase reports the current phase and last error.
func (s *Source) Phase() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase, s.lastErr
}

// countError counts err by its code in the Error hook (pgrelay_source_errors): a session's error,
// or a batch the output did not deliver (Redis at its memory limit, a write refused), which the
// source sends again without ending the session.
func (s *Source) countError(err error) {
	if s.hooks.Error == nil {
		return
	}
	code := errcode.Of(err)
	if code.Transient() {
		code = "" // counted as a lost connection is
	}
	s.hooks.Error(string(code))
}

func (s *Source) setPhase(p string, err error) {
	s.mu.Lock()
	changed := s.phase != p || (err != nil && (s.lastErr == nil || s.lastErr.Error() != err.Error()))
	s.phase, s.lastErr = p, err
	s.mu.Unlock()
	if err != nil {
		s.countError(err)
	}
	if changed {
		if s.hooks.Phase != nil {
			s.hooks.Phase(p)
		}
		s.publishStatus(p, err)
	}
}

// ReplicaStatus is what a replica records in the source's status hash (field: its owner id) for
// `pgrelay status`.
type ReplicaStatus struct {
	Phase    string            `json:"phase"`
	Error    string            `json:"error"`
	Code     errcode.Code      `json:"code"`
	At       string            `json:"at"`
	Refused  []RefusedTable    `json:"refused,omitempty"`  // tables its last start refused and skipped
	Snapshot *SnapshotProgress `json:"snapshot,omitempty"` // the running snapshot's last progress line
}

// RefusedTable is a table the start checks refused, with its coded error.
type RefusedTable struct {
	Table string       `json:"table"`
	Code  errcode.Code `json:"code"`
	Error string       `json:"error"`
}

// setSnapshotProgress records the snapshot's progress (nil: none runs) in the status hash.
func (s *Source) setSnapshotProgress(p *SnapshotProgress) {
	s.mu.Lock()
	s.snapProg = p
	phase, err := s.phase, s.lastErr
	s.mu.Unlock()
	s.publishStatus(phase, err)
}

// publishStatus records this replica's phase for `pgrelay status` (best effort).
func (s *Source) publishStatus(phase string, err error) {
	st := ReplicaStatus{Phase: phase, Code: errcode.Of(err), At: time.Now().UTC().Format(time.RFC3339)}
	if err != nil {
		st.Error = err.Error()
	}
	s.mu.Lock()
	for _, r := range s.refused {
		st.Refused = append(st.Refused, RefusedTable{Table: r.Table, Code: errcode.Of(r.Err), Error: r.Err.Error()})
	}
	st.Snapshot = s.snapProg
	s.mu.Unlock()
	v, _ := json.Marshal(st)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.rdb.HSet(ctx, s.keys.Status, s.owner, v)
	s.rdb.PExpire(ctx, s.keys.Status, statusKeep)
}

// run is the ownership loop: take the lease (standby meanwhile), stream while holding it, and
// start over from the pointer after a fence or a lost lease.
func (s *Source) run(ctx context.Context) {
	aclChecked := false
	for ctx.Err() == nil {
		if !aclChecked {
			err := s.checkACL(ctx)
			if errcode.Lasting(err) {
				s.setPhase(PhaseError, err)
				s.log.Errorf("%v", err)
				retry.Sleep(ctx, retry.Jitter(5*time.Second))
				continue
			}
			aclChecked = err == nil // else Redis is unreachable: the lease attempt says so, and the check runs again
		}
		ok, err := s.lease.TryAcquire(ctx)
		if err != nil {
			s.setPhase(PhaseConnecting, s.cfg.Redis.Explain(err))
			retry.Sleep(ctx, time.Second)
			continue
		}
		if !ok {
			s.setPhase(PhaseStandby, nil)
			if s.hooks.Owner != nil {
				s.hooks.Owner(false)
			}
			retry.Sleep(ctx, retry.Jitter(s.cfg.LeaseTTL/2))
			continue
		}
		if s.hooks.Owner != nil {
			s.hooks.Owner(true)
		}
		s.log.Infof("took the lease %s (fence %s)", s.keys.Lease, s.lease.Token())
		s.own(ctx)
		if ctx.Err() == nil {
			s.lease.Drop()
			if s.hooks.Owner != nil {
				s.hooks.Owner(false)
			}
			retry.Sleep(ctx, retry.Jitter(time.Second))
		}
	}
}

// own streams while the lease holds, renewing it every TTL/3 and restarting sessions with backoff.
func (s *Source) own(ctx context.Context) {
	ownCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go s.renew(ownCtx, cancel)
	backoff := time.Second
	for ownCtx.Err() == nil {
		started := time.Now()
		err := s.cfg.Redis.Explain(s.session(ownCtx))
		if ownCtx.Err() != nil {
			return
		}
		if errcode.Is(err, errcode.Fenced) {
			s.log.Warnf("fenced, starting over from the pointer: %v", err)
			s.setPhase(PhaseConnecting, err)
			return
		}
		if errors.Is(err, errRereadRequested) || errors.Is(err, errNewTables) {
			s.log.Infof("%v: starting the session again to read them", err)
			continue
		}
		if time.Since(started) > time.Minute {
			backoff = time.Second
		}
		s.setPhase(failedPhase(err), err)
		s.log.Errorf("%v (retrying in %s)", err, backoff)
		s.sleepUnlessResync(ownCtx, retry.Jitter(backoff))
		backoff = min(backoff*2, 30*time.Second)
	}
}

// failedPhase is the phase of a source whose session ended with err: error for a coded error the
// user must fix, connecting for the rest (a lost connection, a server that does not answer), which
// the next attempt may get past by itself.
func failedPhase(err error) string {
	if errcode.Lasting(err) {
		return PhaseError
	}
	return PhaseConnecting
}

// renew extends the lease every TTL/3; losing it (or not reaching Redis for a TTL) stops owning.
func (s *Source) renew(ctx context.Context, stop context.CancelFunc) {
	t := time.NewTicker(s.cfg.LeaseTTL / 3)
	defer t.Stop()
	lastOK := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ok, err := s.lease.Renew(ctx)
		switch {
		case err == nil && ok:
			lastOK = time.Now()
		case err == nil && !ok:
			s.log.Warnf("lost the lease %s", s.keys.Lease)
			stop()
			return
		case time.Since(lastOK) > s.cfg.LeaseTTL:
			s.log.Warnf("could not renew the lease for %s: %v", s.cfg.LeaseTTL, s.cfg.Redis.Explain(err))
			stop()
			return
		}
	}
}

// setSession publishes the streaming session to the bundler (nil when none).
func (s *Source) setSession(sess *session) {
	s.mu.Lock()
	s.sess = sess
	s.retry, s.ahead = nil, nil
	close(s.sessCh)
	s.sessCh = make(chan struct{})
	s.mu.Unlock()
}

func (s *Source) current() (*session, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sess, s.sessCh
}
