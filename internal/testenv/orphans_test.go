package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServersDieWithPanickingTest runs a child test that starts PostgreSQL and Redis and then panics
// (or is SIGKILLed), and checks that no server process outlives it.
func TestServersDieWithPanickingTest(t *testing.T) {
	for _, mode := range []string{"panic", "sigkill"} {
		t.Run(mode, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "pids")
			cmd := exec.Command(os.Args[0], "-test.run", "^TestHelperStartsServersThenDies$", "-test.count=1")
			cmd.Env = append(os.Environ(), "PGRELAY_TESTENV_HELPER="+mode, "PGRELAY_TESTENV_PIDS="+pidFile)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			if mode == "sigkill" {
				waitFile(t, pidFile)
				cmd.Process.Kill()
			}
			select {
			case <-done:
			case <-time.After(90 * time.Second):
				cmd.Process.Kill()
				t.Fatal("helper test did not end")
			}
			pids := readPids(t, pidFile)
			if len(pids) != 2 {
				t.Fatalf("helper recorded %v", pids)
			}
			deadline := time.Now().Add(10 * time.Second)
			for _, pid := range pids {
				for groupAlive(pid) {
					if time.Now().After(deadline) {
						syscall.Kill(-pid, syscall.SIGKILL)
						t.Fatalf("server group %d outlived its test (%s)", pid, mode)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
}

// TestHelperStartsServersThenDies is the child of TestServersDieWithPanickingTest; it does nothing
// in a normal run.
func TestHelperStartsServersThenDies(t *testing.T) {
	mode := os.Getenv("PGRELAY_TESTENV_HELPER")
	if mode == "" {
		return
	}
	pg := StartPostgres(t)
	r := StartRedis(t)
	f := os.Getenv("PGRELAY_TESTENV_PIDS")
	os.WriteFile(f+".tmp", []byte(fmt.Sprintf("%d\n%d\n", pg.proc.current().cmd.Process.Pid, r.proc.current().cmd.Process.Pid)), 0o644)
	os.Rename(f+".tmp", f)
	if mode == "panic" {
		panic("helper panics with servers running")
	}
	time.Sleep(time.Minute) // waits to be SIGKILLed
}

func waitFile(t *testing.T, path string) {
	for i := 0; i < 600; i++ {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("helper never wrote its pids")
}

func readPids(t *testing.T, path string) []int {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, s := range strings.Fields(string(b)) {
		n, _ := strconv.Atoi(s)
		out = append(out, n)
	}
	return out
}
