package source

import (
	"errors"
	"fmt"
	"testing"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// TestFailedPhase: a session's error leaves the source in phase error only when the user must fix
// it; a lost connection or a server that does not answer leaves it connecting.
func TestFailedPhase(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{errors.New("connection reset by peer"), PhaseConnecting},
		{errcode.New(errcode.PGUnreachable, "PostgreSQL does not answer", ""), PhaseConnecting},
		{fmt.Errorf("start: %w", errcode.New(errcode.RedisUnreachable, "Redis does not answer", "")), PhaseConnecting},
		{errcode.New(errcode.PGPassword, "refused", ""), PhaseError},
		{errcode.New(errcode.SlotLost, "gone", ""), PhaseError},
	} {
		if got := failedPhase(c.err); got != c.want {
			t.Errorf("%v: %s, want %s", c.err, got, c.want)
		}
	}
}

// TestReadyPhase: a replica is ready (`/ready` 200, the input connected) while it streams,
// snapshots, stands by for the owner, or waits for the slot an earlier owner's connection still
// holds; not while it connects, has failed or has stopped.
func TestReadyPhase(t *testing.T) {
	for p, want := range map[string]bool{
		PhaseStreaming: true, PhaseSnapshot: true, PhaseStandby: true, PhaseWaitingForSlot: true,
		PhaseConnecting: false, PhaseError: false, PhaseStopped: false, "": false,
	} {
		if got := ReadyPhase(p); got != want {
			t.Errorf("ReadyPhase(%q) = %v, want %v", p, got, want)
		}
	}
}
