// Command pprofgroup sums a CPU profile of pgrelay by cause: each sample goes to the category of
// the frame nearest its leaf that names one (pgoutput parse, value conversion, JSON encoding,
// Benthos messages, go-redis, GC, syscalls, ...), so an allocation counts for the code that
// made it and a write(2) counts as a syscall. Given the measured CPU per change, it prints each
// cause in µs per change too.
//
//	go run ./internal/benchenv/pprofgroup -us 8.5 bin/bench/pprof/stream_queue.pprof
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

type category struct {
	name string
	re   *regexp.Regexp
}

// categories, tried on each frame from the leaf up; the first frame that matches one decides.
var categories = []category{
	{"GC: assists by allocating goroutines", regexp.MustCompile(`^runtime\.gcAssistAlloc`)},
	{"GC: background mark, sweep, scavenge", regexp.MustCompile(`^runtime\.(gcBgMarkWorker|bgsweep|bgscavenge|gcStart|gcMarkDone|gcMarkTermination)`)},
	{"syscalls (read, write, futex, epoll)", regexp.MustCompile(`^(syscall\.|internal/runtime/syscall|runtime\.(futex|epollwait|netpoll|usleep|nanosleep|madvise|write1|read))`)},
	{"Go scheduler and timers", regexp.MustCompile(`^runtime\.(schedule|findRunnable|park_m|goschedImpl|gosched_m|wakep|startm|stopm|notesleep|notewakeup|sysmon|mPark|timers|checkTimers|goready|ready|casgstatus|execute|runqgrab|stealWork|mcall)`)},
	{"benchmark harness", regexp.MustCompile(`pgrelay/internal/(benchenv|source_test|sink_test)|^testing\.`)},
	{"go-redis: commands, argument encoding, replies", regexp.MustCompile(`github\.com/redis/go-redis`)},
	{"queue.Writer: script arguments", regexp.MustCompile(`pgrelay/internal/queue\.`)},
	{"redis_queue output: messages, metadata, interpolation", regexp.MustCompile(`pgrelay/output\.`)},
	{"pg_cdc input: Benthos messages and metadata", regexp.MustCompile(`pgrelay/input\.`)},
	{benthos, regexp.MustCompile(`redpanda-data/benthos`)},
	{"value conversion (internal/convert)", regexp.MustCompile(`pgrelay/internal/convert\.`)},
	{"partition names and hashing", regexp.MustCompile(`pgrelay/internal/partition\.`)},
	{"pgoutput parse (pglogrepl)", regexp.MustCompile(`jackc/pglogrepl`)},
	{"JSON event encoding (decoder.event)", regexp.MustCompile(`source\.\(\*decoder\)\.(event|appendObject|insert|update|delete|published)`)},
	{"snapshot chunks (internal/snapshot)", regexp.MustCompile(`pgrelay/internal/snapshot\.`)},
	{"source: decoder, bundler, item queue, pointer", regexp.MustCompile(`pgrelay/internal/(source|pointer)\.`)},
	{"pgx: WAL and query messages", regexp.MustCompile(`jackc/pgx|jackc/pgproto3|jackc/pgio`)},
	{"JSON (encoding/json)", regexp.MustCompile(`^encoding/json\.`)},
}

const (
	other   = "other runtime and libraries"
	benthos = "Benthos: messages, metadata maps, transactions, acks"
)

// benthosCaller splits Benthos' share by the pgrelay code that called it: pg_cdc building
// messages and their metadata, redis_queue reading them, or the pipeline itself (transactions,
// acks, batch copies).
func benthosCaller(frames []string) string {
	for _, fr := range frames {
		switch {
		case strings.Contains(fr, "pgrelay/input."):
			return "Benthos messages and metadata maps built by pg_cdc"
		case strings.Contains(fr, "pgrelay/output."):
			return "Benthos messages and metadata read by redis_queue"
		}
	}
	return "Benthos pipeline: transactions, acks, batch plumbing"
}

var valueRe = regexp.MustCompile(`^\s*([0-9.]+)(ns|us|µs|ms|s)\s+(.*)$`)

func parseDuration(v, unit string) time.Duration {
	f, _ := strconv.ParseFloat(v, 64)
	switch unit {
	case "ns":
		return time.Duration(f)
	case "us", "µs":
		return time.Duration(f * 1e3)
	case "ms":
		return time.Duration(f * 1e6)
	default:
		return time.Duration(f * 1e9)
	}
}

func main() {
	perChange := flag.Float64("us", 0, "the measured CPU µs per change of the profiled window (0: shares only)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: pprofgroup [-us N] profile.pprof ...")
		os.Exit(2)
	}
	totals := map[string]time.Duration{}
	var all, alloc time.Duration
	for _, f := range flag.Args() {
		out, err := exec.Command("go", "tool", "pprof", "-traces", f).Output()
		if err != nil {
			fmt.Fprintln(os.Stderr, "pprofgroup:", err)
			os.Exit(1)
		}
		var value time.Duration
		var frames []string
		flush := func() {
			if value == 0 {
				return
			}
			cat := other
		find:
			for i, fr := range frames {
				for _, c := range categories {
					if c.re.MatchString(fr) {
						cat = c.name
						if c.name == benthos {
							cat = benthosCaller(frames[i:])
						}
						break find
					}
				}
			}
			for _, fr := range frames {
				if strings.HasPrefix(fr, "runtime.mallocgc") || strings.HasPrefix(fr, "runtime.growslice") {
					alloc += value
					break
				}
			}
			totals[cat] += value
			all += value
			value, frames = 0, nil
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "-----") {
				flush()
				continue
			}
			if m := valueRe.FindStringSubmatch(line); m != nil {
				value = parseDuration(m[1], m[2])
				frames = append(frames, strings.TrimSuffix(strings.TrimSpace(m[3]), " (inline)"))
				continue
			}
			if value != 0 {
				frames = append(frames, strings.TrimSuffix(strings.TrimSpace(line), " (inline)"))
			}
		}
		flush()
	}
	type row struct {
		name string
		d    time.Duration
	}
	var rows []row
	for k, v := range totals {
		rows = append(rows, row{k, v})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].d > rows[j].d })
	fmt.Printf("| cause | share | µs per change |\n|---|---|---|\n")
	for _, r := range rows {
		share := float64(r.d) / float64(all)
		us := ""
		if *perChange > 0 {
			us = fmt.Sprintf("%.2f", share**perChange)
		}
		fmt.Printf("| %s | %.0f %% | %s |\n", r.name, 100*share, us)
	}
	fmt.Printf("\nsamples: %s; under mallocgc/growslice (any cause): %.0f %%\n", all, 100*float64(alloc)/float64(all))
}
