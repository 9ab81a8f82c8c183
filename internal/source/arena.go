package source

import "unsafe"

// arenaBlock is the size of an arena's blocks; a value over a quarter of it gets its own.
const arenaBlock = 64 << 10

// arena hands out the bytes of events (payloads, ids, partition names) from shared blocks: one
// allocation per block instead of one or more per event, and nothing for the garbage collector to
// scan. Bytes handed out are never written again, so the payloads, and the strings made over
// them, stay valid; a block is freed once nothing refers to any of its bytes.
type arena struct{ block []byte }

// bytes returns a copy of b.
func (a *arena) bytes(b []byte) []byte {
	n := len(b)
	if n > arenaBlock/4 {
		return append([]byte(nil), b...)
	}
	if cap(a.block)-len(a.block) < n {
		a.block = make([]byte, 0, arenaBlock)
	}
	start := len(a.block)
	a.block = append(a.block, b...)
	return a.block[start : start+n : start+n]
}

// room returns an empty slice of capacity n for the caller to fill by appending (at most n bytes):
// the arena's, or its own when n is over a quarter of a block.
func (a *arena) room(n int) []byte {
	if n > arenaBlock/4 {
		return make([]byte, 0, n)
	}
	if cap(a.block)-len(a.block) < n {
		a.block = make([]byte, 0, arenaBlock)
	}
	start := len(a.block)
	a.block = a.block[:start+n]
	return a.block[start : start : start+n]
}

// string returns b as a string in the arena.
func (a *arena) string(b []byte) string { return arenaString(a.bytes(b)) }

// arenaString is b, bytes an arena handed out, as a string: they are never written again.
func arenaString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// eventSlab hands out the event slices of queued changes from shared arrays, instead of a slice
// per change.
type eventSlab struct{ free []Event }

// take returns n zeroed events.
func (s *eventSlab) take(n int) []Event {
	if cap(s.free)-len(s.free) < n {
		s.free = make([]Event, 0, max(256, n))
	}
	start := len(s.free)
	s.free = s.free[:start+n]
	return s.free[start : start+n : start+n]
}
