// Command perfgroup sums perf recordings of redis-server (BenchmarkRedisCPU with
// PGRELAY_BENCH_PERF, or scripts/bench --profile) by cause: the self time of each symbol from
// `perf report --no-children`, grouped into the Lua VM, objects and memory, the kernel, AOF
// formatting, the stream type, and command dispatch. Lua's internal functions have no dynamic
// symbols: an unnamed address counts as Lua when the nearest symbol below it is one of Lua's.
// Given a variant's measured CPU µs per entry (variant=µs), it prints µs per entry too.
//
//	go run ./internal/benchenv/perfgroup bin/bench/perf script=6.6 multi7=4.0
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

type category struct {
	name  string
	match func(dso, sym string) bool
}

func re(s string) *regexp.Regexp { return regexp.MustCompile(s) }

var (
	luaRe      = re(`^(lua|luaV_|luaH_|luaS_|luaD_|luaC_|luaL_|luaRedis|luaPush|luaReply|luaCreate|luaArgs|luaSet|luaMaskCountHook|scriptCall|evalGeneric|evalSha|redisProtocolToLua|luaRaise|ldb|scriptRun|freeLuaRedisArgv|__GI_____strtod|__strtod|strtod)`)
	streamRe   = re(`^(stream|lp|rax|xadd|xsetid)`)
	aofRe      = re(`^(catAppendOnly|feedAppendOnly|flushAppendOnly|aofWrite|sdscatlen|sdscatfmt|sdscatprintf|_?sdsMakeRoomFor|_?sdsnewlen|ll2string|sdsll2str)`)
	propRe     = re(`^(propagate|alsoPropagate|redisOpArray|execCommandPropagate|postExecutionUnitOperations|afterCommand)`)
	memRe      = re(`^(decrRefCount|incrRefCount|createEmbeddedStringObject|createStringObject|createRawStringObject|createObject|getDecodedObject|tryObjectEncoding|zmalloc|zfree|zrealloc|ztrymalloc|ztryrealloc|malloc|free|je_|__memmove|__memcpy|memcpy|__memset|__memcmp|__strchr|__strlen|dupStringObject|sdsfree|sdsdup|string2ll|string2l)`)
	dispatchRe = re(`^(call|processCommand|lookupCommand|readQueryFromClient|processMultibulk|processInputBuffer|addReply|_addReply|writeToClient|handleClientsWithPendingWrites|prepareClient|dict|lookupKey|dbAdd|getKeysFromCommand|commandCheck|getCommandFlags|resetClient|freeClientArgv|notifyKeyspaceEvent|signalModifiedKey|touchWatchedKey|ustime|mstime|monotonic|__vdso|_dict|siphash|ACLCheck)`)
)

var categories = []category{
	{"kernel (write, fsync, epoll, page faults)", func(d, s string) bool { return strings.HasPrefix(d, "[kernel") }},
	{"Lua VM and Lua↔Redis conversion", func(d, s string) bool { return luaRe.MatchString(s) }},
	{"XADD: stream, listpack, rax", func(d, s string) bool { return streamRe.MatchString(s) }},
	{"AOF: formatting commands into the buffer", func(d, s string) bool { return aofRe.MatchString(s) }},
	{"propagation of script effects", func(d, s string) bool { return propRe.MatchString(s) }},
	{"objects, allocation, copies", func(d, s string) bool {
		return memRe.MatchString(s) || strings.Contains(d, "jemalloc") || strings.HasPrefix(d, "libc")
	}},
	{"dispatch, protocol parsing, replies", func(d, s string) bool {
		return dispatchRe.MatchString(s) || strings.HasPrefix(d, "[vdso")
	}},
}

const other = "other"

type symbol struct {
	addr uint64
	name string
}

// dynamicSymbols lists the redis-server binary's exported symbols, sorted by address.
func dynamicSymbols() []symbol {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil
	}
	if real, err := filepath.EvalSymlinks(bin); err == nil {
		bin = real
	}
	out, _ := exec.Command("nm", "-nD", bin).Output()
	var syms []symbol
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		if a, err := strconv.ParseUint(f[0], 16, 64); err == nil {
			syms = append(syms, symbol{a, f[2]})
		}
	}
	sort.Slice(syms, func(i, j int) bool { return syms[i].addr < syms[j].addr })
	return syms
}

// resolve names an unnamed address after Lua when the nearest symbol below it is Lua's.
func resolve(syms []symbol, s string) string {
	if !strings.HasPrefix(s, "0x") {
		return s
	}
	a, err := strconv.ParseUint(s[2:], 16, 64)
	if err != nil {
		return s
	}
	i := sort.Search(len(syms), func(i int) bool { return syms[i].addr > a }) - 1
	if i >= 0 && strings.HasPrefix(syms[i].name, "lua") {
		return "lua_internal"
	}
	return "static_function"
}

var lineRe = regexp.MustCompile(`^\s*([0-9.]+)%\s+(\S+)\s+\[.\]\s+(\S+)`)

func group(path string, syms []symbol) (map[string]float64, error) {
	out, err := exec.Command("perf", "report", "-i", path, "--no-children", "--sort", "dso,symbol", "-g", "none", "--percent-limit", "0").Output()
	if err != nil {
		return nil, fmt.Errorf("perf report %s: %w", path, err)
	}
	totals := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		m := lineRe.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		pct, _ := strconv.ParseFloat(m[1], 64)
		dso, sym := m[2], resolve(syms, m[3])
		cat := other
		for _, c := range categories {
			if c.match(dso, sym) {
				cat = c.name
				break
			}
		}
		totals[cat] += pct
	}
	return totals, sc.Err()
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: perfgroup DIR [variant=µs ...]")
		os.Exit(2)
	}
	us := map[string]float64{}
	for _, a := range os.Args[2:] {
		k, v, _ := strings.Cut(a, "=")
		us[k], _ = strconv.ParseFloat(v, 64)
	}
	files, _ := filepath.Glob(filepath.Join(os.Args[1], "redis_*.data"))
	sort.Strings(files)
	syms := dynamicSymbols()
	var variants []string
	res := map[string]map[string]float64{}
	for _, f := range files {
		v := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "redis_"), ".data")
		t, err := group(f, syms)
		if err != nil {
			fmt.Fprintln(os.Stderr, "perfgroup:", err)
			os.Exit(1)
		}
		variants = append(variants, v)
		res[v] = t
	}
	fmt.Printf("| cause | %s |\n|---|%s\n", strings.Join(variants, " | "), strings.Repeat("---|", len(variants)))
	names := []string{}
	for _, c := range categories {
		names = append(names, c.name)
	}
	for _, n := range append(names, other) {
		var cells []string
		for _, v := range variants {
			p := res[v][n]
			if u, ok := us[v]; ok {
				cells = append(cells, fmt.Sprintf("%.1f (%.0f %%)", p/100*u, p))
			} else {
				cells = append(cells, fmt.Sprintf("%.0f %%", p))
			}
		}
		fmt.Printf("| %s | %s |\n", n, strings.Join(cells, " | "))
	}
}
