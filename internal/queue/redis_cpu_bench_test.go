package queue

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/benchenv"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// redisCPUBatch is the batch size of BenchmarkRedisCPU: one 1,000-row transaction of the bench
// table is one batch of pg_cdc's (max_bundle_messages 1000).
const redisCPUBatch = 1000

// eventPayload is a change event of the size pg_cdc writes for the bench table (~230 bytes).
func eventPayload(n int) []byte {
	return fmt.Appendf(nil, `{"op":"c","table":"public.bench","lsn":"0/%08X","tx":"pg:00000001:0/%08X","ts":"2026-01-01T00:00:00.000000Z","key":{"id":%d},"data":{"id":%d,"v":"value %d","n":%d.5,"ts":"2026-01-01T00:00:00.000000Z"}}`,
		n, n, n, n, n, n)
}

// redisCPUSmall is the batch size of the small-batch variants: pg_cdc under many small
// transactions (a few events per batch, each batch its own write).
const redisCPUSmall = 5

func redisCPUMsgs(q string, from, size int) []Message {
	out := make([]Message, size)
	for i := range out {
		n := from + i
		out[i] = Message{Queue: q, Partition: `{"id":` + strconv.Itoa(n) + `}`, ID: "pg:00000001:" + strconv.Itoa(n),
			Tx: "pg:00000001:0/" + strconv.Itoa(from), CreatedMs: 1700000000000, Payload: eventPayload(n)}
	}
	return out
}

// minimal Lua loops over the same entries: no fence, no pointer, no checks.
var (
	lua7 = redis.NewScript(`for i = 1, #KEYS do
  local b = (i - 1) * 7
  redis.call('XADD', KEYS[i], '*', 'off', ARGV[b+1], 'p', ARGV[b+2], 'id', ARGV[b+3], 'tx', ARGV[b+4], 'ts', ARGV[b+5], 'h', ARGV[b+6], 'd', ARGV[b+7])
end
return 'ok'`)
	lua2 = redis.NewScript(`for i = 1, #KEYS do
  redis.call('XADD', KEYS[i], '*', 'm', ARGV[2*i-1], 'd', ARGV[2*i])
end
return 'ok'`)
)

// redisVariant writes one batch of entries (msgs) its own way; queue names the keys it uses.
type redisVariant struct {
	name, about string
	batches     int // batches per call of write
	size        int // entries per batch: redisCPUBatch when 0
	fsync       string
	write       func(ctx context.Context, rdb *redis.Client, w *benchWriters, msgs [][]Message, seq int) error
}

// benchWriters are the writers of BenchmarkRedisCPU: tx as pgrelay runs it, another one for a
// second source on the same queue, and one that writes every piece with the script.
type benchWriters struct {
	tx, second, script *Writer
	txV2, scriptV2     *Writer // writers of queues in layout version 2 (an entry per message)
	layout             Layout
}

func seven(i int, m *Message) []any {
	return []any{"off", i, "p", m.Partition, "id", m.ID, "tx", m.Tx, "ts", m.CreatedMs, "h", "", "d", m.Payload}
}

func packed(i int, m *Message) []any {
	return []any{"m", strconv.Itoa(i) + "|" + m.Partition + "|" + m.ID + "|" + m.Tx + "|" + strconv.FormatInt(m.CreatedMs, 10) + "|", "d", m.Payload}
}

func xaddAll(ctx context.Context, p redis.Pipeliner, l Layout, q string, msgs []Message, fields func(int, *Message) []any) {
	for i := range msgs {
		p.XAdd(ctx, &redis.XAddArgs{Stream: l.Stream(q, Shard(msgs[i].Partition, 16)), Values: fields(i, &msgs[i])})
	}
}

func luaAll(ctx context.Context, c redis.Scripter, s *redis.Script, l Layout, q string, msgs []Message, fields func(int, *Message) []any) error {
	keys := make([]string, len(msgs))
	var args []any
	for i := range msgs {
		keys[i] = l.Stream(q, Shard(msgs[i].Partition, 16))
		f := fields(i, &msgs[i])
		for k := 1; k < len(f); k += 2 {
			args = append(args, f[k])
		}
	}
	return s.Run(ctx, c, keys, args...).Err()
}

// benchCover is the pointer-moving cover of call seq of source s (positions strictly increase).
func benchCover(q string, seq int) *Cover { return benchCoverOf(q, "s", seq) }

func benchCoverOf(q, src string, seq int) *Cover {
	pos := fmt.Sprintf("%016x", seq)
	return &Cover{LeaseKey: "pgrelay:{" + q + "}:src:" + src + ":lease", Fence: "me|1", PointerKey: "pgrelay:{" + q + "}:src:" + src + ":ptr",
		Pointer: []byte(`{"v":1,"pos":"` + pos + `","lsn":"0/0","in_txn":null,"snapshot":null}`), Pos: pos}
}

var redisVariants = []redisVariant{
	{name: "tx", about: "Writer.Write as pgrelay runs it: fenced, pointer compare-and-set, one optimistic transaction (WATCH, reads, MULTI/EXEC) per batch", batches: 1,
		write: func(ctx context.Context, _ *redis.Client, w *benchWriters, msgs [][]Message, seq int) error {
			_, err := w.tx.Write(ctx, msgs[0], benchCover(msgs[0][0].Queue, seq))
			return err
		}},
	{name: "tx_v2", about: "tx into a queue of layout version 2 (an entry per message; tx packs up to PackMessages of a shard's messages an entry)", batches: 1,
		write: func(ctx context.Context, _ *redis.Client, w *benchWriters, msgs [][]Message, seq int) error {
			_, err := w.txV2.Write(ctx, msgs[0], benchCover(msgs[0][0].Queue, seq))
			return err
		}},
	{name: "script_v2", about: "script into a queue of layout version 2", batches: 1,
		write: func(ctx context.Context, _ *redis.Client, w *benchWriters, msgs [][]Message, seq int) error {
			_, err := w.scriptV2.Write(ctx, msgs[0], benchCover(msgs[0][0].Queue, seq))
			return err
		}},
	{name: "tx_chain", about: "tx with two batches of one source in flight (a chain, window 2): each batch queued behind the EXEC of the one before it", batches: 4,
		write: func(ctx context.Context, _ *redis.Client, w *benchWriters, msgs [][]Message, seq int) error {
			ch := NewChain()
			ch.Offer(2)
			for i := range msgs {
				ch.Expect(benchCover(msgs[i][0].Queue, seq+i).Pos)
			}
			errs := make([]chan error, len(msgs))
			for i, batch := range msgs {
				if i >= 2 {
					if err := <-errs[i-2]; err != nil {
						return err
					}
				}
				c := benchCover(batch[0].Queue, seq+i)
				c.Chain = ch
				if i > 0 {
					c.Prev = benchCover(batch[0].Queue, seq+i-1).Pos
				}
				errs[i] = make(chan error, 1)
				go func() { _, err := w.tx.Write(ctx, batch, c); errs[i] <- err }()
			}
			return errors.Join(<-errs[len(msgs)-2], <-errs[len(msgs)-1])
		}},
	{name: "tx2", about: "two sources writing one queue at the same time, each batch a transaction (their EXECs abort each other's)", batches: 2,
		write: func(ctx context.Context, _ *redis.Client, w *benchWriters, msgs [][]Message, seq int) error {
			errs := make(chan error, 2)
			go func() { _, err := w.tx.Write(ctx, msgs[0], benchCoverOf(msgs[0][0].Queue, "s", seq)); errs <- err }()
			go func() { _, err := w.second.Write(ctx, msgs[1], benchCoverOf(msgs[1][0].Queue, "t", seq)); errs <- err }()
			return errors.Join(<-errs, <-errs)
		}},
	{name: "tx_small", about: "tx with batches of redisCPUSmall entries (what a write costs per batch)", batches: 1, size: redisCPUSmall,
		write: func(ctx context.Context, _ *redis.Client, w *benchWriters, msgs [][]Message, seq int) error {
			_, err := w.tx.Write(ctx, msgs[0], benchCover(msgs[0][0].Queue, seq))
			return err
		}},
	{name: "script_small", about: "script with batches of redisCPUSmall entries", batches: 1, size: redisCPUSmall,
		write: func(ctx context.Context, _ *redis.Client, w *benchWriters, msgs [][]Message, seq int) error {
			_, err := w.script.Write(ctx, msgs[0], benchCover(msgs[0][0].Queue, seq))
			return err
		}},
	{name: "tx_small_nofsync", about: "tx_small with appendfsync no (what a small batch costs besides the fsync)", batches: 1, size: redisCPUSmall, fsync: "no",
		write: func(ctx context.Context, _ *redis.Client, w *benchWriters, msgs [][]Message, seq int) error {
			_, err := w.tx.Write(ctx, msgs[0], benchCover(msgs[0][0].Queue, seq))
			return err
		}},
	{name: "script_small_nofsync", about: "script_small with appendfsync no", batches: 1, size: redisCPUSmall, fsync: "no",
		write: func(ctx context.Context, _ *redis.Client, w *benchWriters, msgs [][]Message, seq int) error {
			_, err := w.script.Write(ctx, msgs[0], benchCover(msgs[0][0].Queue, seq))
			return err
		}},
	{name: "script", about: "the write script (Writer.Write with every piece through resources/queue_write.lua), one call per batch", batches: 1,
		write: func(ctx context.Context, _ *redis.Client, w *benchWriters, msgs [][]Message, seq int) error {
			_, err := w.script.Write(ctx, msgs[0], benchCover(msgs[0][0].Queue, seq))
			return err
		}},
	{name: "script4", about: "the write script, 4 batches' calls pipelined in one round trip (one AOF write and fsync for 4 batches)", batches: 4,
		write: func(ctx context.Context, rdb *redis.Client, w *benchWriters, msgs [][]Message, seq int) error {
			cmds := make([]*redis.Cmd, len(msgs))
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, batch := range msgs {
					keys, args, err := w.script.build(ctx, batch, benchCover(batch[0].Queue, seq+i), true)
					if err != nil {
						return err
					}
					cmds[i] = writeScript.EvalSha(ctx, p, keys, args...)
				}
				return nil
			})
			return err
		}},
	{name: "script_nofsync", about: "the write script with appendfsync no (what the fsync costs)", batches: 1, fsync: "no",
		write: func(ctx context.Context, _ *redis.Client, w *benchWriters, msgs [][]Message, seq int) error {
			_, err := w.script.Write(ctx, msgs[0], benchCover(msgs[0][0].Queue, seq))
			return err
		}},
	{name: "lua7", about: "a bare Lua loop of XADDs with the seven fields (no checks, fence or pointer)", batches: 1,
		write: func(ctx context.Context, rdb *redis.Client, w *benchWriters, msgs [][]Message, _ int) error {
			return luaAll(ctx, rdb, lua7, w.layout, "lua7", msgs[0], seven)
		}},
	{name: "lua2", about: "a bare Lua loop of XADDs with two fields (metadata packed into one)", batches: 1,
		write: func(ctx context.Context, rdb *redis.Client, w *benchWriters, msgs [][]Message, _ int) error {
			return luaAll(ctx, rdb, lua2, w.layout, "lua2", msgs[0], packed)
		}},
	{name: "multi7", about: "plain XADDs with the seven fields in MULTI/EXEC (one AOF write and fsync per batch)", batches: 1,
		write: func(ctx context.Context, rdb *redis.Client, w *benchWriters, msgs [][]Message, _ int) error {
			_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error { xaddAll(ctx, p, w.layout, "multi7", msgs[0], seven); return nil })
			return err
		}},
	{name: "multi2", about: "plain XADDs with two fields in MULTI/EXEC", batches: 1,
		write: func(ctx context.Context, rdb *redis.Client, w *benchWriters, msgs [][]Message, _ int) error {
			_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error { xaddAll(ctx, p, w.layout, "multi2", msgs[0], packed); return nil })
			return err
		}},
	{name: "xadd7", about: "plain XADDs with the seven fields in a pipeline (Redis fsyncs once per read of the socket, ~16 KiB)", batches: 1,
		write: func(ctx context.Context, rdb *redis.Client, w *benchWriters, msgs [][]Message, _ int) error {
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error { xaddAll(ctx, p, w.layout, "xadd7", msgs[0], seven); return nil })
			return err
		}},
}

// BenchmarkRedisCPU measures what one queue entry costs the redis-server process (CPU time per
// entry from /proc) with appendonly yes and appendfsync always, written in several ways that
// alternate round by round: the writer as pgrelay runs it (optimistic transactions), the write
// script, both with small batches too (per batch: the fixed cost of a write), several of its calls pipelined
// per fsync, bare Lua loops with seven and with two fields, plain XADDs in MULTI/EXEC and in a
// pipeline, and the script without fsync. PGRELAY_BENCH_REDIS_ENTRIES entries per variant and
// round (100,000; 10,000 in quick mode; a tenth of that with small batches), PGRELAY_BENCH_RUNS
// rounds, medians reported. PGRELAY_BENCH_REDIS_VARIANTS names a subset of the variants
// (comma-separated). With PGRELAY_BENCH_PERF set to a directory, perf records redis-server in the first round
// (perf record -e cpu-clock) into <dir>/redis_<variant>.data.
func BenchmarkRedisCPU(b *testing.B) {
	r := testenv.StartRedis(b, append([]string{"--auto-aof-rewrite-percentage", "0"}, strings.Fields(os.Getenv("PGRELAY_BENCH_REDIS_ARGS"))...)...)
	rdb := r.Client()
	ctx := context.Background()
	pid, err := benchenv.RedisPid(ctx, rdb)
	if err != nil {
		b.Fatal(err)
	}
	entries := benchenv.Size("PGRELAY_BENCH_REDIS_ENTRIES", 100000, 10000)
	w := &benchWriters{tx: NewWriter(rdb, WriterConfig{Shards: 16}), second: NewWriter(rdb, WriterConfig{Shards: 16}),
		script: NewWriter(rdb, WriterConfig{Shards: 16}), layout: NewLayout("")}
	w.txV2, w.scriptV2 = NewWriter(rdb, WriterConfig{Shards: 16, CreateVersion: LayoutV2}), NewWriter(rdb, WriterConfig{Shards: 16, CreateVersion: LayoutV2})
	w.script.scriptOnly, w.scriptV2.scriptOnly = true, true
	for _, v := range redisVariants {
		rdb.Set(ctx, "pgrelay:{"+v.name+"}:src:s:lease", "me|1", 0)
		rdb.Set(ctx, "pgrelay:{"+v.name+"}:src:t:lease", "me|1", 0)
	}
	seq := map[string]int{}
	only := map[string]bool{} // PGRELAY_BENCH_REDIS_VARIANTS: a comma-separated subset of the variants
	for _, name := range strings.Split(os.Getenv("PGRELAY_BENCH_REDIS_VARIANTS"), ",") {
		if name != "" {
			only[name] = true
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var m benchenv.Metrics
		for round := 0; round < benchenv.Runs(); round++ {
			for _, v := range redisVariants {
				if !only[v.name] && len(only) > 0 {
					continue
				}
				// the batches, built before the window (the client's work is not what is measured)
				size, total := v.size, entries
				if size == 0 {
					size = redisCPUBatch
				} else {
					total = max(entries/10, size) // small batches: a tenth of the entries, as many writes as 100 big ones
				}
				var calls [][][]Message
				for n := 0; n < total; n += size * v.batches {
					var call [][]Message
					for k := 0; k < v.batches; k++ {
						call = append(call, redisCPUMsgs(v.name, n+k*size, size))
					}
					calls = append(calls, call)
				}
				if v.fsync != "" {
					rdb.ConfigSet(ctx, "appendfsync", v.fsync)
				}
				stopPerf := perfRecord(b, pid, v.name, round)
				r0, c0, t0, a0 := cpu(b, pid), benchenv.SelfCPU(), time.Now(), w.tx.conflicts.Load()+w.second.conflicts.Load()
				for _, call := range calls {
					seq[v.name] += v.batches
					if err := v.write(ctx, rdb, w, call, seq[v.name]); err != nil {
						b.Fatalf("%s: %v", v.name, err)
					}
				}
				elapsed, rd, cl := time.Since(t0), cpu(b, pid)-r0, benchenv.SelfCPU()-c0
				stopPerf()
				if v.fsync != "" {
					rdb.ConfigSet(ctx, "appendfsync", "always")
				}
				n := len(calls) * v.batches * size
				m.Add(v.name+"_entries/s", float64(n)/elapsed.Seconds())
				m.Add(v.name+"_cpu_redis_us/entry", benchenv.PerChange(rd, n))
				m.Add(v.name+"_cpu_client_us/entry", benchenv.PerChange(cl, n))
				if size < redisCPUBatch {
					m.Add(v.name+"_cpu_redis_us/batch", benchenv.PerChange(rd, len(calls)*v.batches))
				}
				if v.name == "tx2" {
					m.Add(v.name+"_aborted_exec/batch", float64(w.tx.conflicts.Load()+w.second.conflicts.Load()-a0)/float64(len(calls)*v.batches))
				}
				for s := 0; s < 16; s++ {
					rdb.Del(ctx, w.layout.Stream(v.name, s))
				}
			}
			// keep the append-only file small between rounds (outside the windows)
			rdb.BgRewriteAOF(ctx)
			if _, err := testenv.WaitRewrite(ctx, rdb, 5*time.Minute); err != nil {
				b.Fatal(err)
			}
		}
		m.Report(b)
	}
}

func cpu(b *testing.B, pid int) time.Duration {
	d, err := benchenv.CPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// perfRecord starts perf record on pid in the first round when PGRELAY_BENCH_PERF is set.
func perfRecord(b *testing.B, pid int, variant string, round int) func() {
	dir := os.Getenv("PGRELAY_BENCH_PERF")
	if dir == "" || round > 0 {
		return func() {}
	}
	os.MkdirAll(dir, 0o755)
	cmd := exec.Command("perf", "record", "-q", "-e", "cpu-clock", "-F", "2999", "-g", "-p", strconv.Itoa(pid),
		"-o", filepath.Join(dir, "redis_"+variant+".data"))
	if err := cmd.Start(); err != nil {
		b.Logf("perf: %v", err)
		return func() {}
	}
	time.Sleep(300 * time.Millisecond) // perf attaches
	return func() {
		cmd.Process.Signal(syscall.SIGINT)
		cmd.Wait()
	}
}
