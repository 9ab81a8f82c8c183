package sink

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// UnknownKeys is what the sink does with a payload key (cdc: a key of `after`) that names no
// column of the target: a column added to the source that the copy lacks, a producer's typo.
type UnknownKeys string

// The unknown_keys policies.
const (
	// UnknownKeysIgnore leaves such keys out, silently.
	UnknownKeysIgnore UnknownKeys = "ignore"
	// UnknownKeysWarn leaves them out, and the first time a key is met a coded warning
	// (target_column_missing) is told to Config.OnUnknownKey (the plugin logs it).
	UnknownKeysWarn UnknownKeys = "warn"
	// UnknownKeysPause pauses the sink (target_column_missing) until the table has the column:
	// nothing of the message is written without it and nothing is dead-lettered; the sink re-reads
	// the table's shape and retries.
	UnknownKeysPause UnknownKeys = "pause"
)

// unknownKeys watches one sink's payload keys that name no column. It outlives the writers of the
// table's successive shapes, so a key is told once per process, not once per shape.
type unknownKeys struct {
	policy UnknownKeys
	table  string
	tell   func(warning error)

	mu   sync.Mutex
	told atomic.Pointer[map[string]bool] // keys already told; replaced, never changed, under mu
}

// newUnknownKeys returns the watch for cfg's target table, or nil when keys are ignored (or the
// mode maps none).
func newUnknownKeys(cfg *Config, table string) *unknownKeys {
	if cfg.Mode == ModeSQL || cfg.UnknownKeys == UnknownKeysIgnore {
		return nil
	}
	tell := cfg.OnUnknownKey
	if tell == nil {
		tell = func(error) {}
	}
	return &unknownKeys{policy: cfg.UnknownKeys, table: table, tell: tell}
}

// meet records a key with no column. It returns true with pause: the caller collects the message's
// keys and ends it with pauseError; else the key is left out. key is the member's name as bytes; the
// common case, a key told before, allocates nothing.
func (u *unknownKeys) meet(key []byte) (pause bool) {
	if u == nil {
		return false
	}
	if u.policy == UnknownKeysPause {
		return true
	}
	if told := u.told.Load(); told != nil && (*told)[string(key)] {
		return false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	old := u.told.Load()
	if old != nil && (*old)[string(key)] {
		return false
	}
	next := make(map[string]bool, 1)
	if old != nil {
		for k := range *old {
			next[k] = true
		}
	}
	next[string(key)] = true
	u.told.Store(&next)
	u.tell(u.warning(string(key)))
	return false
}

func (u *unknownKeys) warning(key string) error {
	return errcode.New(errcode.TargetColumnMissing,
		fmt.Sprintf("payload key %q names no column of %s: its values are left out (unknown_keys: warn; told once per key)", key, u.table),
		fmt.Sprintf("add the column (ALTER TABLE %s ADD COLUMN %s ...) to write them from the next message on, or set unknown_keys: ignore to leave such keys out silently, or pause to have the sink wait for the column", u.table, sqlName(key)))
}

// pauseError is the error that pauses the sink on a message whose keys name no column.
func (u *unknownKeys) pauseError(keys []string) error {
	quoted, adds := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		quoted[i], adds[i] = strconv.Quote(k), "ADD COLUMN "+sqlName(k)+" ..."
	}
	what, cols := "payload key "+quoted[0]+" has", "the column"
	if len(keys) > 1 {
		what, cols = "payload keys "+strings.Join(quoted, ", ")+" have", "the columns"
	}
	return errcode.New(errcode.TargetColumnMissing,
		fmt.Sprintf("%s no column in %s (unknown_keys: pause)", what, u.table),
		fmt.Sprintf("add %s (ALTER TABLE %s %s); the sink re-reads the table and writes the batch, nothing is dead-lettered. Or set unknown_keys: warn to leave such keys out", cols, u.table, strings.Join(adds, ", ")))
}

// isUnknownKeyPause reports whether err is the pause of unknown_keys: pause, which belongs to the
// batch (the table lacks a column), not to the message that met it.
func isUnknownKeyPause(err error) bool {
	return errcode.Of(err) == errcode.TargetColumnMissing
}
