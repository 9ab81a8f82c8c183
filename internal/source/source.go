package source

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// Phases a source reports (DESIGN §8).
const (
	PhaseConnecting     = "connecting"
	PhaseStandby        = "standby"
	PhaseWaitingForSlot = "waiting_for_slot"
	PhaseStreaming      = "streaming"
	PhaseError          = "error"
	PhaseStopped        = "stopped"
)

// Logger is what Source logs through (Benthos' *service.Logger satisfies it).
type Logger interface {
	Infof(format string, args ...any)
	Warnf(format string, args ...any)
	Errorf(format string, args ...any)
}

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
}

// Keys are the Redis keys of one source (DESIGN §4), under its first queue's hash tag.
type Keys struct{ Lease, Pointer, Resync, Status string }

// KeysFor derives the keys from the config.
func KeysFor(c *Config) Keys {
	k := func(s string) string { return redisconn.Key(c.Redis.Prefix, c.Tables[0].Queue, "src", c.Name, s) }
	return Keys{Lease: k("lease"), Pointer: k("ptr"), Resync: k("resync"), Status: k("status")}
}

// Batch is one bundle of events with the pointer it moves to.
type Batch struct {
	Events     []Event
	Cover      pointer.Pointer
	CoverJSON  []byte
	LeaseKey   string
	Fence      string
	PointerKey string
	// Out is the consumer's form of the batch (the input's Benthos messages), made by Next's
	// prepare when the batch was built ahead; nil otherwise.
	Out     any
	sess    *session
	txns    int                 // transactions completed by this batch
	receipt *queue.CoverReceipt // marked by redis_queue once the cover is the stored pointer
}

// Receipt is the note the redis_queue output marks once this batch's cover is the stored
// pointer, so Ack need not read the pointer back (docs/batch-contract.md).
func (b *Batch) Receipt() *queue.CoverReceipt {
	if b.receipt == nil {
		b.receipt = queue.NewCoverReceipt(b.Cover.Position())
	}
	return b.receipt
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

	inflight chan struct{} // one unacknowledged batch at a time (held from Next until its Ack)
	unacked  chan struct{} // full while a returned batch awaits its Ack
	nextMu   sync.Mutex    // one Next at a time: only Next builds batches

	mu       sync.Mutex
	phase    string
	lastErr  error
	sess     *session
	sessCh   chan struct{} // closed and replaced when sess changes
	retry    *Batch
	ahead    *Batch // built while the previous batch was in flight; handed out after its ack
	attempts int

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
	return &Source{
		cfg: cfg, log: log, hooks: hooks, keys: keys, owner: owner, rdb: rdb,
		writer:   queue.NewWriter(rdb, queue.WriterConfig{Prefix: cfg.Redis.Prefix}),
		lease:    lease.New(rdb, keys.Lease, cfg.LeaseTTL, owner),
		inflight: make(chan struct{}, 1),
		unacked:  make(chan struct{}, 1),
		phase:    PhaseConnecting,
		sessCh:   make(chan struct{}),
	}, nil
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
}

// Close stops streaming after the batch in flight (Benthos calls it once acks are done), sends
// PostgreSQL the last position, frees the slot and releases the lease at once.
func (s *Source) Close(ctx context.Context) error {
	if s.cancel != nil {
		s.cancel()
		select {
		case <-s.done:
		case <-ctx.Done():
		}
	}
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.lease.Release(rctx)
	s.setPhase(PhaseStopped, nil)
	s.rdb.Close()
	return err
}

// Phase reports the current phase and last error.
func (s *Source) Phase() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase, s.lastErr
}

func (s *Source) setPhase(p string, err error) {
	s.mu.Lock()
	changed := s.phase != p || (err != nil && (s.lastErr == nil || s.lastErr.Error() != err.Error()))
	s.phase, s.lastErr = p, err
	s.mu.Unlock()
	if err != nil && s.hooks.Error != nil {
		s.hooks.Error(errcode.Code(err))
	}
	if changed {
		if s.hooks.Phase != nil {
			s.hooks.Phase(p)
		}
		s.publishStatus(p, err)
	}
}

// publishStatus records this replica's phase for `pgrelay status` (best effort).
func (s *Source) publishStatus(phase string, err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v := fmt.Sprintf(`{"phase":%q,"error":%q,"code":%q,"at":%q}`, phase, msg, errcode.Code(err), time.Now().UTC().Format(time.RFC3339))
	s.rdb.HSet(ctx, s.keys.Status, s.owner, v)
	s.rdb.PExpire(ctx, s.keys.Status, 24*time.Hour)
}

// run is the ownership loop: take the lease (standby meanwhile), stream while holding it, and
// start over from the pointer after a fence or a lost lease.
func (s *Source) run(ctx context.Context) {
	for ctx.Err() == nil {
		ok, err := s.lease.TryAcquire(ctx)
		if err != nil {
			s.setPhase(PhaseConnecting, err)
			sleep(ctx, time.Second)
			continue
		}
		if !ok {
			s.setPhase(PhaseStandby, nil)
			if s.hooks.Owner != nil {
				s.hooks.Owner(false)
			}
			sleep(ctx, jitter(s.cfg.LeaseTTL/2))
			continue
		}
		if s.hooks.Owner != nil {
			s.hooks.Owner(true)
		}
		s.log.Infof("pg_cdc %s: took the lease %s (fence %s)", s.cfg.Name, s.keys.Lease, s.lease.Token())
		s.own(ctx)
		if ctx.Err() == nil {
			s.lease.Drop()
			if s.hooks.Owner != nil {
				s.hooks.Owner(false)
			}
			sleep(ctx, jitter(time.Second))
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
		err := s.session(ownCtx)
		if ownCtx.Err() != nil {
			return
		}
		if errcode.Is(err, "fenced") {
			s.log.Warnf("pg_cdc %s: fenced, starting over from the pointer: %v", s.cfg.Name, err)
			s.setPhase(PhaseConnecting, err)
			return
		}
		if time.Since(started) > time.Minute {
			backoff = time.Second
		}
		phase := PhaseConnecting
		if errcode.Code(err) != "" {
			phase = PhaseError
		}
		s.setPhase(phase, err)
		s.log.Errorf("pg_cdc %s: %v (retrying in %s)", s.cfg.Name, err, backoff)
		s.sleepUnlessResync(ownCtx, jitter(backoff))
		backoff = min(backoff*2, 30*time.Second)
	}
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
			s.log.Warnf("pg_cdc %s: lost the lease %s", s.cfg.Name, s.keys.Lease)
			stop()
			return
		case time.Since(lastOK) > s.cfg.LeaseTTL:
			s.log.Warnf("pg_cdc %s: could not renew the lease for %s: %v", s.cfg.Name, s.cfg.LeaseTTL, err)
			stop()
			return
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func jitter(d time.Duration) time.Duration {
	return d*8/10 + time.Duration(rand.Int64N(int64(d)*4/10+1))
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

// Next blocks until the previous batch is acknowledged and a new one is due, then returns it.
// While the previous batch is in flight, a full bundle already queued is built ahead and given
// to prepare (the input's conversion), so it is ready the moment the ack arrives; it is still
// handed out only after that ack (one unacknowledged batch at a time, DESIGN §5).
func (s *Source) Next(ctx context.Context, prepare func(*Batch)) (*Batch, error) {
	s.nextMu.Lock()
	defer s.nextMu.Unlock()
	if err := s.waitTurn(ctx, prepare); err != nil {
		return nil, err
	}
	b, err := s.next(ctx)
	if err != nil {
		<-s.inflight
		return nil, err
	}
	s.unacked <- struct{}{}
	return b, nil
}

// waitTurn takes the in-flight slot (the previous batch is acknowledged), building the next
// batch ahead while it waits.
func (s *Source) waitTurn(ctx context.Context, prepare func(*Batch)) error {
	for {
		select {
		case s.inflight <- struct{}{}:
			return nil
		default:
		}
		wake := s.buildAhead(ctx, prepare)
		select {
		case s.inflight <- struct{}{}:
			return nil
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// buildAhead builds a full batch while another is in flight, unless one is built already or a
// nacked batch waits for its re-send; it returns what to wait on before trying again.
func (s *Source) buildAhead(ctx context.Context, prepare func(*Batch)) <-chan struct{} {
	s.mu.Lock()
	sess, changed, busy := s.sess, s.sessCh, s.ahead != nil || s.retry != nil
	s.mu.Unlock()
	if sess == nil || busy {
		return changed
	}
	full := sess.q.whenFull()
	select {
	case <-full:
	default:
		return full
	}
	b, _, err := sess.build(ctx, true)
	if err != nil {
		sess.fail(err)
	}
	if b == nil {
		return changed
	}
	if prepare != nil {
		prepare(b)
	}
	s.mu.Lock()
	if s.sess == sess {
		s.ahead = b
	}
	s.mu.Unlock()
	return nil
}

// takeAhead returns the batch built ahead, if it belongs to the current, still running session
// (a failed session's batch would follow a batch that may not be in).
func (s *Source) takeAhead() *Batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.ahead
	s.ahead = nil
	if b != nil && b.sess == s.sess && b.sess.ctx.Err() == nil {
		return b
	}
	return nil
}

func (s *Source) next(ctx context.Context) (*Batch, error) {
	if b := s.takeRetry(ctx); b != nil {
		return b, nil
	}
	if b := s.takeAhead(); b != nil {
		return b, nil
	}
	for {
		sess, changed := s.current()
		if sess == nil {
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		b, wait, err := sess.bundle(ctx)
		if err != nil {
			sess.fail(err)
		}
		if b != nil {
			return b, nil
		}
		t := time.NewTimer(wait.after)
		select {
		case <-wait.ch:
		case <-t.C:
		case <-changed:
		case <-sess.ctx.Done():
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
		t.Stop()
	}
}

// takeRetry returns the nacked batch of the current session, after a backoff.
func (s *Source) takeRetry(ctx context.Context) *Batch {
	s.mu.Lock()
	b, n := s.retry, s.attempts
	s.retry = nil
	ok := b != nil && b.sess == s.sess
	s.mu.Unlock()
	if !ok {
		return nil
	}
	sleep(ctx, min(100*time.Millisecond<<min(n, 8), 10*time.Second))
	return b
}

// Ack handles the output's verdict on b. Success: make sure the pointer reached the cover (write
// it when the output did not), and only then let the reader tell PostgreSQL the new position.
// Fenced: stop and start over from the pointer. Anything else: re-send the same batch.
func (s *Source) Ack(ctx context.Context, b *Batch, err error) error {
	defer func() {
		<-s.unacked
		<-s.inflight
	}()
	if err == nil {
		err = s.ensurePointer(ctx, b)
	}
	cur, _ := s.current()
	if cur != b.sess {
		return nil // a batch of an ended session: the next one re-reads the pointer
	}
	switch {
	case err == nil:
		s.mu.Lock()
		s.attempts = 0
		s.mu.Unlock()
		b.sess.acked(b)
		return nil
	case errcode.Is(err, "fenced"):
		b.sess.fail(err)
		return nil
	default:
		s.mu.Lock()
		s.retry = b
		s.attempts++
		s.mu.Unlock()
		s.log.Warnf("pg_cdc %s: batch up to %s not delivered, re-sending: %v", s.cfg.Name, b.Cover.Position(), err)
		return nil
	}
}

// waitAcked blocks until no returned batch awaits its ack, so a new session reads a pointer that
// no earlier batch can still move.
func (s *Source) waitAcked(ctx context.Context) error {
	for len(s.unacked) > 0 {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		sleep(ctx, 20*time.Millisecond)
	}
	return nil
}

// ensurePointer makes sure the stored pointer is at or past the batch's cover. With redis_queue
// it is (the output moved it in the same script call as the messages and marked the batch's
// receipt); otherwise one fenced compare-and-set writes it (a duplicate when it is already there).
func (s *Source) ensurePointer(ctx context.Context, b *Batch) error {
	if b.receipt.Done() {
		return nil
	}
	_, err := s.writer.Write(ctx, nil, b.cover())
	return err
}

func (b *Batch) cover() *queue.Cover {
	return &queue.Cover{LeaseKey: b.LeaseKey, Fence: b.Fence, PointerKey: b.PointerKey, Pointer: b.CoverJSON, Pos: b.Cover.Position()}
}

// readPointer reads the stored pointer (nil when there is none).
func (s *Source) readPointer(ctx context.Context) (*pointer.Pointer, error) {
	return ReadPointer(ctx, s.rdb, s.keys.Pointer)
}

// ReadPointer reads a stored pointer (nil when there is none).
func ReadPointer(ctx context.Context, rdb redis.Cmdable, key string) (*pointer.Pointer, error) {
	raw, err := rdb.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pointer %s: %w", key, err)
	}
	p, err := pointer.Parse(raw)
	if err != nil {
		return nil, err
	}
	return &p, nil
}
