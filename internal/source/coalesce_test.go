package source

import (
	"bufio"
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
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

// TestReadCoalescerHandsOutLargeReads: through the buffer over the coalescer (readLarge), a
// socket read fills as much of the buffer as has arrived and the smaller reads after it are
// served from memory, in order, with no socket read or wait between them; a read as large as the
// buffer goes straight to the socket; the socket's error comes after the bytes read before it.
func TestReadCoalescerHandsOutLargeReads(t *testing.T) {
	data := make([]byte, 60)
	for i := range data {
		data[i] = byte(i)
	}
	sock := &countingReader{r: &chunks{data[:16], data[16:20], data[20:40], data[40:]}}
	c := newReadCoalescer(sock)
	br := bufio.NewReaderSize(c, 16)
	waits := 0
	c.wait = func() { waits++ }
	c.setBehind(true)
	var got, sizes []int
	for len(got) < 40 {
		p := make([]byte, 5)
		n, err := br.Read(p)
		if err != nil {
			t.Fatalf("read %d: %v", len(sizes), err)
		}
		for _, b := range p[:n] {
			got = append(got, int(b))
		}
		sizes = append(sizes, n)
	}
	for i, b := range got {
		if b != i {
			t.Fatalf("byte %d is %d: out of order (%v)", i, b, got)
		}
	}
	// 16 (one socket read, the buffer full) as 5+5+5+1; 4 (drained) at once; after a wait 16
	// of the next 20 (full) as 5+5+5+1; their last 4 (drained) at once
	if want := []int{5, 5, 5, 1, 4, 5, 5, 5, 1, 4}; !slices.Equal(sizes, want) {
		t.Errorf("reads of %v bytes, want %v", sizes, want)
	}
	if sock.reads != 4 || waits != 1 {
		t.Errorf("%d socket reads and %d waits, want 4 and 1", sock.reads, waits)
	}
	big := make([]byte, 32) // the buffer's size or more: straight to the socket
	if n, err := br.Read(big); n != 20 || err != nil || big[0] != 40 {
		t.Errorf("large read: %d bytes from %d, %v; want 20 from 40", n, big[0], err)
	}
	if n, err := br.Read(big); n != 0 || err != io.EOF {
		t.Errorf("after the end: %d, %v; want 0, EOF", n, err)
	}
}

type countingReader struct {
	r     io.Reader
	reads int
}

func (c *countingReader) Read(p []byte) (int, error) {
	c.reads++
	return c.r.Read(p)
}

// errOnce returns err on its first Read, then reads r: a read deadline that fired once.
type errOnce struct {
	err error
	r   io.Reader
}

func (e *errOnce) Read(p []byte) (int, error) {
	if err := e.err; err != nil {
		e.err = nil
		return 0, err
	}
	return e.r.Read(p)
}

// TestReadCoalescerErrorIsNotSticky: an error of the socket (a read deadline's timeout, after
// which pgconn goes on using the connection) is returned once, and the reads after it read the
// socket again.
func TestReadCoalescerErrorIsNotSticky(t *testing.T) {
	timeout := errors.New("i/o timeout")
	br := bufio.NewReaderSize(newReadCoalescer(&errOnce{err: timeout, r: &chunks{[]byte("abc")}}), 16)
	p := make([]byte, 8)
	if n, err := br.Read(p); n != 0 || err != timeout {
		t.Fatalf("first read: %d, %v; want the timeout", n, err)
	}
	if n, err := br.Read(p); n != 3 || err != nil || string(p[:3]) != "abc" {
		t.Fatalf("read after the timeout: %d %q, %v; want abc", n, p[:n], err)
	}
}

// askedReader records how many bytes each Read asked for.
type askedReader struct {
	r     io.Reader
	asked []int
}

func (a *askedReader) Read(p []byte) (int, error) {
	a.asked = append(a.asked, len(p))
	return a.r.Read(p)
}

// TestConnectionsAskForLargeReads: the frontends the source builds its connections with ask the
// socket for large reads (pgproto3 alone asks for what is left of its 8 KiB buffer, often a few
// hundred bytes) and hand out the messages in them in order; the replication connection's goes
// through the coalescer it gives the session.
func TestConnectionsAskForLargeReads(t *testing.T) {
	var reads *readCoalescer
	for _, tc := range []struct {
		name  string
		build func(io.Reader, io.Writer) *pgproto3.Frontend
		want  int
	}{
		{"replication", replicationFrontend(func(c *readCoalescer) { reads = c }), replReadBuf},
		{"query", queryFrontend, queryReadBuf},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ready := func(status byte) []byte { return []byte{'Z', 0, 0, 0, 5, status} }
			sock := &askedReader{r: &chunks{ready('I'), ready('T')}}
			fe := tc.build(sock, io.Discard)
			for _, want := range []byte{'I', 'T'} {
				msg, err := fe.Receive()
				if r, ok := msg.(*pgproto3.ReadyForQuery); err != nil || !ok || r.TxStatus != want {
					t.Fatalf("received %#v, %v; want ReadyForQuery %c", msg, err, want)
				}
			}
			if len(sock.asked) == 0 || sock.asked[0] < tc.want || tc.want < 64<<10 {
				t.Errorf("the socket was asked for %v bytes; want reads of %d (at least 64 KiB)", sock.asked, tc.want)
			}
		})
	}
	if reads == nil {
		t.Error("the replication frontend gave the session no coalescer")
	}
}
