package gateway

import (
	"context"
	"net"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"flowgate/gate"
)

// flowForgetter deletes conntrack flows of flowgate's own upstream UDP
// sockets in the sandbox's namespace once they close. Such a flow (from
// the sandbox's address and port to the resolver's port 53) has no NAT,
// and stays in conntrack for half a minute after the socket is gone; if
// the kernel gave one of the agent's sockets the same port meanwhile, the
// agent's query would match the stale flow, miss the redirect to flowgate,
// and be refused by the guard chain: a lookup that fails for no reason.
//
// Deleting is a dump of the namespace's conntrack table, so it is done off
// the DNS path, by one goroutine, for every flow queued since its last
// pass. A flow that finds the queue full is left to expire.
type flowForgetter struct {
	h     *netlink.Handle // in the sandbox's namespace
	queue chan flowFilter
	done  chan struct{}

	mu     sync.Mutex
	closed bool
}

// flowFilter picks one flow to delete from its family's table.
type flowFilter struct {
	family netlink.InetFamily
	filter *netlink.ConntrackFilter
}

// forgetQueue bounds the flows waiting to be deleted.
const forgetQueue = 1024

func newFlowForgetter(ns netns.NsHandle) (*flowForgetter, error) {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, err
	}
	f := &flowForgetter{h: h, queue: make(chan flowFilter, forgetQueue), done: make(chan struct{})}
	go f.run()
	return f, nil
}

// dial wraps next: the UDP conns it opens forget their flow on Close.
func (f *flowForgetter) dial(next gate.DialFunc) gate.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil || !strings.HasPrefix(network, "udp") {
			return c, err
		}
		return &forgetfulConn{Conn: c, f: f}, nil
	}
}

// forget queues the deletion of the UDP flow from local to remote.
func (f *flowForgetter) forget(local, remote net.Addr) {
	l, ok1 := local.(*net.UDPAddr)
	r, ok2 := remote.(*net.UDPAddr)
	if !ok1 || !ok2 {
		return
	}
	family := netlink.InetFamily(unix.AF_INET6)
	if l.IP.To4() != nil {
		family = unix.AF_INET
	}
	filter := &netlink.ConntrackFilter{}
	if filter.AddProtocol(unix.IPPROTO_UDP) != nil ||
		filter.AddIP(netlink.ConntrackOrigSrcIP, l.IP) != nil ||
		filter.AddIP(netlink.ConntrackOrigDstIP, r.IP) != nil ||
		filter.AddPort(netlink.ConntrackOrigSrcPort, uint16(l.Port)) != nil ||
		filter.AddPort(netlink.ConntrackOrigDstPort, uint16(r.Port)) != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	select {
	case f.queue <- flowFilter{family, filter}:
	default:
	}
}

// run deletes the queued flows, all of those queued at once in one pass
// over each family's table.
func (f *flowForgetter) run() {
	defer close(f.done)
	for first := range f.queue {
		batch := map[netlink.InetFamily][]netlink.CustomConntrackFilter{first.family: {first.filter}}
	drain:
		for {
			select {
			case x, ok := <-f.queue:
				if !ok {
					break drain
				}
				batch[x.family] = append(batch[x.family], x.filter)
			default:
				break drain
			}
		}
		for family, filters := range batch {
			f.h.ConntrackDeleteFilters(netlink.ConntrackTable, family, filters...)
		}
	}
}

// Close deletes what is queued, then releases the netlink socket; later
// forgets do nothing.
func (f *flowForgetter) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	close(f.queue)
	f.mu.Unlock()
	<-f.done
	f.h.Close()
	return nil
}

// forgetfulConn is an upstream UDP conn whose flow is forgotten when it
// closes.
type forgetfulConn struct {
	net.Conn
	f    *flowForgetter
	once sync.Once
}

func (c *forgetfulConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.f.forget(c.LocalAddr(), c.RemoteAddr()) })
	return err
}
