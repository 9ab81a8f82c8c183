package source

import (
	"io"
	"testing"
)

// chunks is a reader that returns its chunks one per Read (as a socket returns what has arrived).
type chunks [][]byte

func (c *chunks) Read(p []byte) (int, error) {
	if len(*c) == 0 {
		return 0, io.EOF
	}
	n := copy(p, (*c)[0])
	if n < len((*c)[0]) {
		(*c)[0] = (*c)[0][n:]
	} else {
		*c = (*c)[1:]
	}
	return n, nil
}

// TestReadCoalescerWaitsOnlyBehindAfterADrainedRead: a read waits before it goes only while the
// stream is behind or under load and the previous read returned less than it asked for (the
// socket was drained); a full read, or a stream that keeps up, never waits.
func TestReadCoalescerWaitsOnlyBehindAfterADrainedRead(t *testing.T) {
	for _, tc := range []struct {
		name           string
		behind, loaded bool
		reads          []int // bytes each Read returns, buffer of 8
		waits          int
	}{
		{"caught up", false, false, []int{3, 3, 3}, 0},
		{"behind, every read drained", true, false, []int{3, 3, 3}, 2},
		{"under load, every read drained", false, true, []int{3, 3, 3}, 2},
		{"behind, full reads", true, false, []int{8, 8, 8}, 0},
		{"behind, full then drained", true, false, []int{8, 2, 8, 1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var src chunks
			for _, n := range tc.reads {
				src = append(src, make([]byte, n))
			}
			c := newReadCoalescer(&src)
			waits := 0
			c.wait = func() { waits++ }
			c.setBehind(tc.behind)
			c.setLoaded(tc.loaded)
			buf := make([]byte, 8)
			for i, want := range tc.reads {
				if n, err := c.Read(buf); n != want || err != nil {
					t.Fatalf("read %d: %d bytes, %v; want %d", i, n, err, want)
				}
			}
			if waits != tc.waits {
				t.Errorf("%d waits, want %d", waits, tc.waits)
			}
		})
	}
}
