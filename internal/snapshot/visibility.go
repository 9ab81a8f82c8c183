package snapshot

import (
	"fmt"
	"strconv"
	"strings"
)

// Snapshot is pg_current_snapshot() of the transaction that read a chunk: full 64-bit xids.
type Snapshot struct {
	Xmin, Xmax uint64
	Xip        []uint64 // in progress when the snapshot was taken
}

// ParseSnapshot parses the text form "xmin:xmax:xip1,xip2,...".
func ParseSnapshot(s string) (Snapshot, error) {
	parts := strings.Split(strings.TrimSpace(s), ":")
	if len(parts) != 3 {
		return Snapshot{}, fmt.Errorf("snapshot %q: want xmin:xmax:xip", s)
	}
	var snap Snapshot
	var err error
	if snap.Xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %q: xmin: %w", s, err)
	}
	if snap.Xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %q: xmax: %w", s, err)
	}
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return Snapshot{}, fmt.Errorf("snapshot %q: xip: %w", s, err)
			}
			snap.Xip = append(snap.Xip, v)
		}
	}
	return snap, nil
}

// Widen turns a 32-bit xid (as pgoutput sends it) into the full xid nearest to Xmax: the one
// less than 2^31 away from it, below or above, across an epoch boundary either way. A transaction
// the stream or a consumer asks about was running or committed close to the snapshot (PostgreSQL
// keeps every live xid within 2^31 of the next one), so this is its xid. An xid that would fall
// before the first epoch is taken from the one after.
func (s Snapshot) Widen(xid uint32) uint64 {
	full := int64(s.Xmax) + int64(int32(xid-uint32(s.Xmax)))
	if full < 0 {
		full += 1 << 32
	}
	return uint64(full)
}

// Sees reports whether a transaction with the given 32-bit xid had committed (and so was visible)
// when the snapshot was taken. The caller only asks about transactions that did commit.
func (s Snapshot) Sees(xid uint32) bool {
	full := s.Widen(xid)
	if full >= s.Xmax {
		return false
	}
	for _, x := range s.Xip {
		if x == full {
			return false
		}
	}
	return true
}
