package redisconn

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"
)

// A Raw pool over a Sentinel failover client follows a failover as go-redis's own pool does:
// it subscribes to +switch-master on every listed sentinel, and when one announces a new master
// the pool's generation moves on. Idle connections of an older generation are closed instead of
// reused, and a connection in use refuses its next Send, so no write goes to a master the
// sentinels no longer name, even while that node still runs as a master (a SENTINEL FAILOVER
// with the old master up, until the sentinels make it a replica). The check is one atomic load
// per Send: no round trip.

// ErrMasterSwitched is returned by RawConn.Send (and the dial of a new raw connection) when the
// sentinels announced another master since the connection was dialed: nothing was sent, and the
// connection is closed. Running the commands again dials the new master.
var ErrMasterSwitched = errors.New("redisconn: the sentinels switched the master; the connection to the old one is closed")

// sentinelOf holds the Sentinel settings of each failover client Config.Client built, so a Raw
// pool over that client can follow the sentinels; an entry goes with its client.
var sentinelOf sync.Map // weak.Pointer[redis.Client] → *Sentinel

func registerSentinel(c *redis.Client, s *Sentinel) {
	k := weak.Make(c)
	sentinelOf.Store(k, s)
	runtime.AddCleanup(c, func(k weak.Pointer[redis.Client]) { sentinelOf.Delete(k) }, k)
}

// sentinelFor is the Sentinel settings c was built with, nil for a client that is not a failover
// client of Config.Client.
func sentinelFor(c *redis.Client) *Sentinel {
	if v, ok := sentinelOf.Load(weak.Make(c)); ok {
		return v.(*Sentinel)
	}
	return nil
}

// switchWatch is the +switch-master subscriptions of a Raw pool.
type switchWatch struct {
	once    sync.Once
	clients []*redis.SentinelClient
	subs    []*redis.PubSub
}

// watchSwitches subscribes to +switch-master on every sentinel of s, once per pool. The
// subscribing runs in the background (a sentinel that is down would hold up the first write for
// its dial timeout); go-redis's PubSub subscribes again whenever it reconnects.
func (r *Raw) watchSwitches(s *Sentinel) {
	r.watch.once.Do(func() {
		for _, addr := range s.Addrs {
			sc := redis.NewSentinelClient(&redis.Options{Addr: addr, Username: s.Username, Password: s.Password,
				TLSConfig: s.TLS, DisableIdentity: true})
			ps := sc.Subscribe(context.Background()) // no channel yet: no I/O
			r.watch.clients = append(r.watch.clients, sc)
			r.watch.subs = append(r.watch.subs, ps)
			go func() {
				_ = ps.Subscribe(context.Background(), "+switch-master")
				for msg := range ps.Channel() { // closed by stopWatch
					// <master name> <old ip> <old port> <new ip> <new port>
					f := strings.Fields(msg.Payload)
					if len(f) == 5 && f[0] == s.MasterName {
						r.switched(net.JoinHostPort(f[3], f[4]))
					}
				}
			}()
		}
	})
}

// switched records the master a sentinel announced; a new address starts a new generation.
// (Each sentinel announces the same switch: only the first of them counts.)
func (r *Raw) switched(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if addr == r.master {
		return
	}
	r.master, r.masterAt = addr, time.Now()
	r.gen.Add(1)
	for a, list := range r.idle { // closed now, as go-redis closes its own: no MULTI left open on the old master
		for _, c := range list {
			c.nc.Close()
		}
		delete(r.idle, a)
	}
}

// switchSettle is how long after an announced switch a new connection must reach the announced
// master: the sentinels pass a new configuration on to each other within seconds (hello messages
// every 2 s). Past that, the sentinels' answer is taken as it is, so a switch this pool did not
// hear (every subscription down at the time) holds up writes for no longer than this.
const switchSettle = 10 * time.Second

// checkDialed fails a connection dialed to another master than the one a sentinel announced
// within switchSettle: the sentinel the dialer asked may not have learnt of the switch yet. Only
// an announced IP address is compared with the connection's peer (a host name is not resolved).
func (r *Raw) checkDialed(c *RawConn) error {
	r.mu.Lock()
	master, at := r.master, r.masterAt
	r.mu.Unlock()
	host, _, err := net.SplitHostPort(master)
	if master == "" || err != nil || net.ParseIP(host) == nil || time.Since(at) > switchSettle {
		return nil
	}
	if peer := c.nc.RemoteAddr(); peer != nil && peer.String() != master {
		return ErrMasterSwitched
	}
	return nil
}

// stopWatch ends the subscriptions (and keeps any from starting).
func (r *Raw) stopWatch() {
	r.watch.once.Do(func() {})
	for _, ps := range r.watch.subs {
		_ = ps.Close()
	}
	for _, sc := range r.watch.clients {
		_ = sc.Close()
	}
}
