package testenv

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// HoldProxy forwards TCP connections to a Redis server and watches them. While held (Hold), what
// the server sends waits in the proxy instead of reaching the client; what the client sends
// always goes through, so a test sees what a client sends before it has read a reply. It notes
// each connection that sent an XADD after an EXEC with no byte of a reply delivered to it in
// between: a client that queued a write behind a transaction whose outcome it did not know yet
// (Pipelined).
type HoldProxy struct {
	ln        net.Listener
	hold      atomic.Bool
	pipelined atomic.Int64 // XADDs sent behind an unanswered EXEC

	mu    sync.Mutex
	sent  []byte // everything the clients sent, in arrival order across connections
	wake  chan struct{}
	conns []net.Conn
}

// StartHoldProxy listens on a loopback port and forwards to target (host:port) until the test ends.
func StartHoldProxy(t testing.TB, target string) *HoldProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &HoldProxy{ln: ln, wake: make(chan struct{})}
	t.Cleanup(func() {
		ln.Close()
		p.Release()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	go p.accept(target)
	return p
}

// Addr is the proxy's address.
func (p *HoldProxy) Addr() string { return p.ln.Addr().String() }

// URL is the proxy as a redis:// URL.
func (p *HoldProxy) URL() string { return "redis://" + p.Addr() }

// Hold keeps what the server sends from the clients until Release.
func (p *HoldProxy) Hold() { p.hold.Store(true) }

// Release passes on what was held, and all that follows.
func (p *HoldProxy) Release() {
	p.hold.Store(false)
	p.mu.Lock()
	close(p.wake)
	p.wake = make(chan struct{})
	p.mu.Unlock()
}

// Pipelined is how many times a client sent an XADD behind an EXEC it had no reply to.
func (p *HoldProxy) Pipelined() int64 { return p.pipelined.Load() }

// WaitSent waits up to d for the clients to have sent s; it reports whether they did.
func (p *HoldProxy) WaitSent(s string, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		p.mu.Lock()
		ok := bytes.Contains(p.sent, []byte(s))
		p.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

var (
	execMarker = []byte("*1\r\n$4\r\nEXEC\r\n")
	xaddMarker = []byte("$4\r\nXADD\r\n")
)

func (p *HoldProxy) accept(target string) {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", target)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		var unanswered atomic.Bool // an EXEC went, and no reply byte came back since
		go p.clientSide(client, server, &unanswered)
		go p.serverSide(server, client, &unanswered)
	}
}

// clientSide passes what the client sends to the server, noting it.
func (p *HoldProxy) clientSide(client, server net.Conn, unanswered *atomic.Bool) {
	buf := make([]byte, 64<<10)
	var tail []byte // the end of the previous read, for a marker split between reads
	for {
		n, err := client.Read(buf)
		if n > 0 {
			joined := append(tail, buf[:n]...)
			for i := 0; i < len(joined); {
				x, e := bytes.Index(joined[i:], xaddMarker), bytes.Index(joined[i:], execMarker)
				switch {
				case x < 0 && e < 0:
					i = len(joined)
				case e >= 0 && (x < 0 || e < x):
					if i+e+len(execMarker) > len(tail) { // not one seen in the previous read
						unanswered.Store(true)
					}
					i += e + len(execMarker)
				default:
					if i+x+len(xaddMarker) > len(tail) && unanswered.Load() {
						p.pipelined.Add(1)
					}
					i += x + len(xaddMarker)
				}
			}
			tail = append(tail[:0], joined[max(0, len(joined)-len(execMarker)):]...)
			p.mu.Lock()
			p.sent = append(p.sent, buf[:n]...)
			p.mu.Unlock()
			if _, err := server.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			server.Close()
			return
		}
	}
}

// serverSide passes what the server sends to the client, holding it while the proxy is held.
func (p *HoldProxy) serverSide(server, client net.Conn, unanswered *atomic.Bool) {
	buf := make([]byte, 64<<10)
	for {
		n, err := server.Read(buf)
		for n > 0 && p.hold.Load() {
			p.mu.Lock()
			wake := p.wake
			p.mu.Unlock()
			select {
			case <-wake:
			case <-time.After(10 * time.Millisecond):
			}
		}
		if n > 0 {
			unanswered.Store(false)
			if _, err := client.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			client.Close()
			return
		}
	}
}
