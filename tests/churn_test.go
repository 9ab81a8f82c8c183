package tests

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/internal/queue"
)

// TestThreeReplicasUnderChurn runs three pgrelay replicas, each `pgrelay streams` with the source
// pipeline (pg_cdc, snapshot: initial, of pgbench's three keyed tables → redis_queue, a queue per
// table) and a sink pipeline per queue (redis_queue → pg_sink cdc into database copy), under
// pgbench's TPC-B-like load (-c 4 -j 2). Every PGRELAY_CHURN_KILL_EVERY one replica is SIGKILLed
// or SIGTERMed and started again; the victims and signals come from a seed that is printed
// (PGRELAY_CHURN_SEED replays a run). When the load stops: each queue replays exactly to its table
// (queue oracle), every copied table equals its source md5 per row with each sink's progress at its
// queue's end and no dead letters (sink oracle), and again after a lease TTL. The takeover times
// are logged: source = from the kill of the owner to the first queue entry the new owner wrote;
// sink = from the kill to the first batch a new owner applied on a shard the victim held.
//
// CI runs the short default (35 s of load, a kill every 8–12 s, lease_ttl 3s); `make soak-churn`
// runs 10 minutes with a kill every 20–60 s at the default lease_ttl (scripts/soak).
func TestThreeReplicasUnderChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	seed := uint64(time.Now().UnixNano() % 1e9)
	if s := os.Getenv("PGRELAY_CHURN_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("PGRELAY_CHURN_SEED=%q: %v", s, err)
		}
		seed = n
	}
	dur := envDuration(t, "PGRELAY_CHURN_DURATION", 35*time.Second)
	gapMin, gapMax := envRange(t, "PGRELAY_CHURN_KILL_EVERY", 8*time.Second, 12*time.Second)
	ttl := envDuration(t, "PGRELAY_CHURN_LEASE_TTL", 3*time.Second)
	rate := envInt(t, "PGRELAY_CHURN_RATE", 0)
	t.Logf("seed %d (replay with PGRELAY_CHURN_SEED=%d); load %s, a kill every %s–%s, lease_ttl %s, pgbench rate %d (0: unthrottled); load average %s",
		seed, seed, dur, gapMin, gapMax, ttl, rate, loadAverage())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d: replay with PGRELAY_CHURN_SEED=%d", seed, seed)
		}
	})

	e := newPgbenchEnv(t, pgbenchOptions{leaseTTL: ttl.String()})
	var replicas []*replica
	for n := 0; n < 3; n++ {
		replicas = append(replicas, e.newReplica(n))
	}
	e.waitPointer()
	mon := startProgressMonitor(e)
	plan := churnPlan(seed, dur, gapMin, gapMax)
	load := e.startLoad(dur, rate)
	start := time.Now()
	var kills []*churnKill
	for _, k := range plan {
		time.Sleep(time.Until(start.Add(k.at)))
		kills = append(kills, e.kill(replicas, k, start))
	}
	if err := load.Wait(dur + 5*time.Minute); err != nil {
		t.Fatalf("pgbench: %v\n%s", err, load.Output())
	}
	t.Logf("pgbench: %s tps over %s, %d kills; load average %s", pgbenchTPS(load.Output()), time.Since(start).Round(time.Second), len(kills), loadAverage())
	e.waitCaughtUp(3*time.Minute + dur/2)
	t.Logf("copy equal to the source %s after the load stopped", time.Since(start.Add(dur)).Round(100*time.Millisecond))
	samples := mon.stop()

	entries := e.checkQueues()
	for _, r := range replicas {
		if r.p.Exited() {
			t.Errorf("replica %d ended by itself: %s", r.n, sinkLastLines(r.p.Output(), 10))
		}
	}
	// A dead replica's leases have expired by now: nothing was applied twice or late.
	// The WAL written since (autovacuum after pgbench, checkpoints) is covered once the source's
	// idle advance comes round, so the pointer may take a heartbeat to reach it.
	time.Sleep(ttl + time.Second)
	lsn := e.currentLSN()
	cdctest.Wait(t, 30*time.Second, "everything still caught up after a lease TTL", func() (bool, string) {
		return e.caughtUp(lsn)
	})

	tk := e.takeovers(kills, samples)
	t.Logf("queues: %d entries, each replays to its table; copy = source (md5 per row); load average %s", entries, loadAverage())
	t.Logf("takeover, source (kill of the owner → first entry of the new owner): %s", tk.summary(func(x takeover) (time.Duration, bool) { return x.src, x.hasSrc }))
	t.Logf("takeover, sink (kill → first batch a new owner applied on one of the victim's shards): %s", tk.summary(func(x takeover) (time.Duration, bool) { return x.sinkFirst, x.hasSink }))
	t.Logf("takeover, sink (kill → every shard of the victim moving again): %s", tk.summary(func(x takeover) (time.Duration, bool) { return x.sinkAll, x.hasSink }))
	if !slices.ContainsFunc(tk, func(x takeover) bool { return x.hasSrc }) {
		t.Error("no kill of the source's owner was measured")
	}
	if !slices.ContainsFunc(tk, func(x takeover) bool { return x.hasSink }) {
		t.Error("no sink takeover was measured")
	}
}

// envRange reads "<min>-<max>" durations (e.g. 20s-60s) from the environment, else the defaults.
func envRange(t *testing.T, name string, lo, hi time.Duration) (time.Duration, time.Duration) {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return lo, hi
	}
	a, b, ok := strings.Cut(v, "-")
	x, err1 := time.ParseDuration(a)
	y, err2 := time.ParseDuration(b)
	if !ok || err1 != nil || err2 != nil || x <= 0 || y < x {
		t.Fatalf("%s=%q: want <min>-<max>, e.g. 20s-60s", name, v)
	}
	return x, y
}

// churnStep is one planned kill: at (since the load started), whom (the source's owner, else the
// standby numbered pick among the others) and the signal.
type churnStep struct {
	at     time.Duration
	owner  bool
	pick   int
	signal syscall.Signal
}

// churnPlan draws the kills from seed: gaps uniform in [gapMin, gapMax], the last at least gapMin
// before the load ends; the victim is the source's owner with probability 1/3 (i.e. a uniformly
// random replica of three), the signal SIGKILL or SIGTERM with probability 1/2. A plan with no kill
// of the owner gets one (its first step), and one with a single signal kind gets the other (its
// last step), so every run covers both.
func churnPlan(seed uint64, dur, gapMin, gapMax time.Duration) []churnStep {
	rng := rand.New(rand.NewPCG(seed, 0x636875726e))
	var plan []churnStep
	at := time.Duration(0)
	for {
		at += gapMin + time.Duration(rng.Int64N(int64(gapMax-gapMin)+1))
		if at > dur-gapMin {
			break
		}
		s := churnStep{at: at, owner: rng.IntN(3) == 0, pick: rng.IntN(2), signal: syscall.SIGKILL}
		if rng.IntN(2) == 0 {
			s.signal = syscall.SIGTERM
		}
		plan = append(plan, s)
	}
	if len(plan) == 0 {
		return plan
	}
	if !slices.ContainsFunc(plan, func(s churnStep) bool { return s.owner }) {
		plan[0].owner = true
	}
	if len(plan) > 1 && !slices.ContainsFunc(plan, func(s churnStep) bool { return s.signal != plan[0].signal }) {
		last := &plan[len(plan)-1]
		last.signal = map[syscall.Signal]syscall.Signal{syscall.SIGKILL: syscall.SIGTERM, syscall.SIGTERM: syscall.SIGKILL}[last.signal]
	}
	return plan
}

// churnKill is what happened at one step.
type churnKill struct {
	churnStep
	replica    int
	pid        int
	wasOwner   bool
	shards     []shardKey // the sink shards the victim held
	leaseEnd   time.Time  // when the victim's source lease would expire unless renewed
	sent, gone time.Time  // signal sent; process reaped
}

// shardKey is one sink shard: a queue and a shard number.
type shardKey struct {
	queue string
	shard int
}

// kill carries out one step on the replicas and starts the victim again.
func (e *pgbenchEnv) kill(replicas []*replica, s churnStep, start time.Time) *churnKill {
	e.t.Helper()
	k := &churnKill{churnStep: s}
	ownerPid, leaseEnd := e.sourceOwner()
	if s.owner && ownerPid == 0 { // a takeover is under way: wait for the next owner
		deadline := time.Now().Add(60 * time.Second)
		for ownerPid == 0 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			ownerPid, leaseEnd = e.sourceOwner()
		}
	}
	var victim *replica
	var others []*replica
	for _, r := range replicas {
		if r.p.Pid() == ownerPid {
			victim = r
		} else {
			others = append(others, r)
		}
	}
	if !s.owner || victim == nil {
		victim = others[s.pick%len(others)]
	}
	k.replica, k.pid, k.wasOwner, k.leaseEnd = victim.n, victim.p.Pid(), victim.p.Pid() == ownerPid, leaseEnd
	k.shards = e.shardsHeldBy(k.pid)
	k.sent = time.Now()
	if s.signal == syscall.SIGKILL {
		victim.p.Kill()
	} else {
		victim.p.Signal(syscall.SIGTERM)
		if err := victim.p.Wait(60 * time.Second); err != nil && !strings.Contains(err.Error(), "exit status") {
			e.t.Errorf("replica %d did not stop within 60 s of SIGTERM: %v", victim.n, err)
			victim.p.Kill()
		}
	}
	k.gone = time.Now()
	role := "standby"
	if k.wasOwner {
		role = "source owner"
	}
	if p := e.pointer(); p != nil && len(p.Snapshot) > 0 && string(p.Snapshot) != "null" {
		role += ", snapshot running"
	}
	e.t.Logf("+%s: %s replica %d (pid %d, %s, %d sink shards); gone after %s; load average %s",
		k.sent.Sub(start).Round(100*time.Millisecond), signalName(s.signal), victim.n, k.pid, role, len(k.shards),
		k.gone.Sub(k.sent).Round(time.Millisecond), loadAverage())
	e.start(victim)
	return k
}

func signalName(s syscall.Signal) string {
	if s == syscall.SIGKILL {
		return "SIGKILL"
	}
	return "SIGTERM"
}

// sourceOwner is the pid holding the source's lease (0 when none) and when that lease expires
// unless renewed.
func (e *pgbenchEnv) sourceOwner() (int, time.Time) {
	now := time.Now()
	o, ttl, err := lease.Holder(e.ctx, e.rd.Client(), e.leaseKey())
	if err != nil || o == "" {
		return 0, time.Time{}
	}
	return ownerPid(o), now.Add(ttl)
}

// ownerPid reads the pid of an owner id or lease token (host:pid:random[|fence]).
func ownerPid(owner string) int {
	parts := strings.Split(owner, ":")
	if len(parts) < 3 {
		return 0
	}
	pid, _ := strconv.Atoi(parts[1])
	return pid
}

// shardsHeldBy lists the sink shards whose lease pid holds.
func (e *pgbenchEnv) shardsHeldBy(pid int) []shardKey {
	l := queue.NewLayout("pgrelay")
	var keys []string
	var sks []shardKey
	for _, pt := range pgbenchTables {
		n, err := queue.ShardCount(e.ctx, e.rd.Client(), l, pt.queue)
		if err != nil {
			e.t.Fatal(err)
		}
		for s := 0; s < n; s++ {
			keys = append(keys, l.GroupLease(pt.queue, pgbenchGroup, s))
			sks = append(sks, shardKey{pt.queue, s})
		}
	}
	if len(keys) == 0 {
		return nil
	}
	vals, err := e.rd.Client().MGet(e.ctx, keys...).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	var held []shardKey
	for i, v := range vals {
		if s, ok := v.(string); ok && ownerPid(s) == pid {
			held = append(held, sks[i])
		}
	}
	return held
}

// progressMonitor samples the copy's progress rows every 100 ms and keeps, per sink shard, each
// distinct updated_at seen (the start of the transaction that last moved the shard's offset).
type progressMonitor struct {
	e    *pgbenchEnv
	done chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	seen map[shardKey][]time.Time
}

func startProgressMonitor(e *pgbenchEnv) *progressMonitor {
	m := &progressMonitor{e: e, done: make(chan struct{}), seen: map[shardKey][]time.Time{}}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for {
			select {
			case <-m.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			m.sample()
		}
	}()
	return m
}

func (m *progressMonitor) sample() {
	rows, err := m.e.copy.Query(m.e.ctx, `SELECT queue, shard, updated_at FROM pgrelay.sink_progress WHERE sink LIKE 'copy\_%'`)
	if err != nil {
		return // not created yet
	}
	defer rows.Close()
	m.mu.Lock()
	defer m.mu.Unlock()
	for rows.Next() {
		var sk shardKey
		var at time.Time
		if rows.Scan(&sk.queue, &sk.shard, &at) != nil {
			return
		}
		if s := m.seen[sk]; len(s) == 0 || !s[len(s)-1].Equal(at) {
			m.seen[sk] = append(s, at)
		}
	}
}

func (m *progressMonitor) stop() map[shardKey][]time.Time {
	close(m.done)
	m.wg.Wait()
	return m.seen
}

// takeover is what one kill cost: the source's takeover (when the victim owned it) and the sink's,
// to the first and to the last of the victim's shards that moved again.
type takeover struct {
	signal                  syscall.Signal
	src, sinkFirst, sinkAll time.Duration
	hasSrc, hasSink         bool
}

type takeovers []takeover

// summary is "SIGTERM p50 …; SIGKILL p50 …; all p50 …" of the figure get picks.
func (tk takeovers) summary(get func(takeover) (time.Duration, bool)) string {
	var parts []string
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL, 0} {
		var d []time.Duration
		for _, x := range tk {
			if v, ok := get(x); ok && (sig == 0 || x.signal == sig) {
				d = append(d, v)
			}
		}
		name := "all"
		if sig != 0 {
			name = signalName(sig)
		}
		parts = append(parts, name+" "+summarize(d))
	}
	return strings.Join(parts, "; ")
}

// takeovers measures each kill. Source (when the victim owned it): the first entry of any stream
// of the source's queues whose Redis id time is after the victim could write no more — its exit
// after SIGTERM (it releases the lease on the way out), the expiry of its lease after SIGKILL (a
// script it sent just before dying may still run) — minus the kill. Sink, per shard the victim
// held: the first applied batch whose transaction began after the victim could apply no more (the
// kill for SIGKILL, its exit for SIGTERM), minus the kill; "first" is the earliest shard of the
// kill, "all" the last. A shard that received nothing new has no figure.
func (e *pgbenchEnv) takeovers(kills []*churnKill, seen map[shardKey][]time.Time) takeovers {
	e.t.Helper()
	l := queue.NewLayout("pgrelay")
	var out takeovers
	for i, k := range kills {
		x := takeover{signal: k.signal}
		if k.wasOwner {
			after := k.gone
			if k.signal == syscall.SIGKILL && k.leaseEnd.After(after) {
				after = k.leaseEnd
			}
			var first time.Time
			for _, pt := range pgbenchTables {
				n, _ := queue.ShardCount(e.ctx, e.rd.Client(), l, pt.queue)
				for s := 0; s < n; s++ {
					msgs, err := e.rd.Client().XRangeN(e.ctx, l.Stream(pt.queue, s), strconv.FormatInt(after.UnixMilli()+1, 10), "+", 1).Result()
					if err != nil && err != redis.Nil {
						e.t.Fatal(err)
					}
					if len(msgs) > 0 {
						ms, _ := strconv.ParseInt(strings.Split(msgs[0].ID, "-")[0], 10, 64)
						if at := time.UnixMilli(ms); first.IsZero() || at.Before(first) {
							first = at
						}
					}
				}
			}
			if first.IsZero() {
				e.t.Errorf("kill %d: no entry was written after the source's owner died", i+1)
			} else {
				x.src, x.hasSrc = first.Sub(k.sent), true
				e.t.Logf("kill %d (%s of the source's owner): source takeover %s", i+1, signalName(k.signal), x.src.Round(time.Millisecond))
			}
		}
		after := k.sent
		if k.signal == syscall.SIGTERM {
			after = k.gone
		}
		var per []time.Duration
		for _, sk := range k.shards {
			for _, at := range seen[sk] {
				if at.After(after) {
					per = append(per, at.Sub(k.sent))
					break
				}
			}
		}
		if len(per) > 0 {
			slices.Sort(per)
			x.sinkFirst, x.sinkAll, x.hasSink = per[0], per[len(per)-1], true
			e.t.Logf("kill %d (%s): sink takeover on %d of the victim's %d shards: first %s, last %s", i+1, signalName(k.signal),
				len(per), len(k.shards), per[0].Round(time.Millisecond), per[len(per)-1].Round(time.Millisecond))
		}
		out = append(out, x)
	}
	return out
}

// summarize is "p50 X, max Y (n)".
func summarize(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	s := slices.Clone(d)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return fmt.Sprintf("p50 %s, max %s (%d)", s[(len(s)-1)/2].Round(10*time.Millisecond), s[len(s)-1].Round(10*time.Millisecond), len(s))
}

func TestChurnPlan(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		for _, c := range []struct{ dur, lo, hi time.Duration }{
			{50 * time.Second, 8 * time.Second, 12 * time.Second},
			{10 * time.Minute, 20 * time.Second, 60 * time.Second},
		} {
			plan := churnPlan(seed, c.dur, c.lo, c.hi)
			if again := churnPlan(seed, c.dur, c.lo, c.hi); !slices.Equal(plan, again) {
				t.Fatalf("seed %d: two plans differ", seed)
			}
			if len(plan) < 2 {
				t.Fatalf("seed %d, %s: %d kills", seed, c.dur, len(plan))
			}
			owner, kinds, prev := false, map[syscall.Signal]bool{}, time.Duration(0)
			for _, s := range plan {
				if gap := s.at - prev; gap < c.lo || gap > c.hi {
					t.Errorf("seed %d: gap %s outside %s–%s", seed, gap, c.lo, c.hi)
				}
				if s.at > c.dur-c.lo {
					t.Errorf("seed %d: a kill at %s, less than %s before the end", seed, s.at, c.lo)
				}
				prev, owner, kinds[s.signal] = s.at, owner || s.owner, true
			}
			if !owner || len(kinds) != 2 {
				t.Errorf("seed %d: plan %+v lacks a kill of the owner or a signal", seed, plan)
			}
		}
	}
}
