// Package testenv starts real, throwaway PostgreSQL and Redis servers for tests.
//
// Every server listens on a free loopback port, keeps its files in a temporary directory, and dies
// with the test: it is stopped by t.Cleanup (which also runs when the test fails or panics) and, as a
// last resort, by the kernel (Pdeathsig) when the test binary itself dies. When CI=true a missing server
// binary fails the test instead of skipping it, so CI can never pass by testing nothing.
package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// InCI reports whether the tests run in CI (CI=true), where missing servers are failures.
func InCI() bool { return os.Getenv("CI") == "true" }

// missing skips the test, or fails it in CI, because a server binary is not installed.
func missing(t testing.TB, what string) {
	t.Helper()
	msg := fmt.Sprintf("testenv: %s not found; run scripts/setup", what)
	if InCI() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// RepoRoot returns the module root (the directory holding go.mod), found upwards from the working
// directory, so tests in any package can find the cache that scripts/setup fills.
func RepoRoot() string {
	dir, _ := os.Getwd()
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for i := 0; i < 50; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("testenv: free port: %v", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		// Redis Cluster also needs port+10000 for its bus.
		if p+10000 > 65535 || usedPorts[p] {
			continue
		}
		usedPorts[p] = true
		return p
	}
	t.Fatal("testenv: no free port")
	return 0
}

var (
	portMu    sync.Mutex
	usedPorts = map[int]bool{}
)

// portStarts is how many ports a new server tries: one taken between FreePort and the server's
// bind (by another test process: the packages' tests run several at once) is replaced by another.
const portStarts = 5

// portTaken reports whether a server failed to start because its port was in use.
func portTaken(err error) bool { return strings.Contains(err.Error(), "Address already in use") }

// serviceUser is the unprivileged account servers run as when the test runs as root
// (PostgreSQL refuses to run as root). nil means "run as the current user".
func serviceUser() (*syscall.Credential, string, error) {
	if os.Geteuid() != 0 {
		return nil, "", nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, name, nil
	}
	return nil, "", fmt.Errorf("running as root and neither a postgres nor a nobody user exists")
}

// tempDir makes a fresh directory that the service user can use, removed when the test ends.
func tempDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgrelay-"+prefix+"-")
	if err != nil {
		t.Fatalf("testenv: temp dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if cred, _, _ := serviceUser(); cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatalf("testenv: chown %s: %v", dir, err)
		}
	}
	return dir
}

// command builds a server command that runs as the service user, in its own process group, and is
// killed by the kernel if the test binary dies.
func command(bin string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command(bin, args...)
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cred, _, err := serviceUser()
	if err != nil {
		return nil, err
	}
	if cred != nil {
		attr.Credential = cred
	}
	cmd.SysProcAttr = attr
	return cmd, nil
}

// proc is one running server process with its output captured to a log file.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// procSlot holds a server's current process, which a restart replaces while the test's other
// goroutines may signal it.
type procSlot struct {
	mu sync.Mutex
	p  *proc
}

func (s *procSlot) current() *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p
}

func (s *procSlot) set(p *proc) {
	s.mu.Lock()
	s.p = p
	s.mu.Unlock()
}

// signal signals the current process as proc.signal does (nothing when there is none or it ended).
func (s *procSlot) signal(sig syscall.Signal, wait time.Duration) { s.current().signal(sig, wait) }

func startProc(cmd *exec.Cmd, logPath string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the whole process group (PostgreSQL's backends are in it too) and, for
// SIGKILL, waits until the leader is gone.
func (p *proc) signal(sig syscall.Signal, wait time.Duration) {
	if p == nil || p.exited() {
		return
	}
	if sig == syscall.SIGKILL {
		p.killTree()
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, sig)
	select {
	case <-p.done:
	case <-time.After(wait):
		p.killTree()
	}
}

// killTree SIGKILLs the server and every process it started, and waits until none is left. A
// process group is not enough: PostgreSQL's backends call setsid, and a backend that outlives its
// postmaster keeps the shared memory attached, so a restart on the same data directory would fail.
func (p *proc) killTree() {
	pid := p.cmd.Process.Pid
	pids := append(Descendants(pid), pid)
	for _, q := range pids {
		syscall.Kill(q, syscall.SIGKILL)
	}
	syscall.Kill(-pid, syscall.SIGKILL)
	<-p.done
	for i := 0; i < 250; i++ {
		alive := groupAlive(pid)
		for _, q := range pids {
			alive = alive || processAlive(q)
		}
		if !alive {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procStat returns a process's state letter, parent pid and process group from /proc/<pid>/stat.
func procStat(pid string) (state string, ppid, pgrp int, ok bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return "", 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 3 {
		return "", 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	pgrp, _ = strconv.Atoi(f[2])
	return f[0], ppid, pgrp, true
}

// Descendants lists every live process below pid (zombies left out).
func Descendants(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if state, ppid, _, ok := procStat(e.Name()); ok && state != "Z" {
			child, _ := strconv.Atoi(e.Name())
			children[ppid] = append(children[ppid], child)
		}
	}
	var out []int
	var walk func(int)
	walk = func(p int) {
		for _, c := range children[p] {
			out = append(out, c)
			walk(c)
		}
	}
	walk(pid)
	return out
}

// processAlive reports whether pid is a live (non-zombie) process.
func processAlive(pid int) bool {
	state, _, _, ok := procStat(strconv.Itoa(pid))
	return ok && state != "Z"
}

// tail returns the end of the process log, for error messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// waitTCP waits until something accepts connections on 127.0.0.1:port, or the process exits.
func waitTCP(p *proc, port int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("server exited: %s", tail(p.log))
		}
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("server not listening on %d after %s: %s", port, timeout, tail(p.log))
}

// groupAlive reports whether a live (non-zombie) process of process group pgid remains.
func groupAlive(pgid int) bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if state, _, pgrp, ok := procStat(e.Name()); ok && state != "Z" && pgrp == pgid {
			return true
		}
	}
	return false
}
