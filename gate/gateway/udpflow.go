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
// sockets in the sandbox's namespace when they close. Such a flow (from
// the sandbox's address and port to the resolver's port 53) has no NAT,
// and stays in conntrack for half a minute after the socket is gone; if
// the kernel gave one of the agent's sockets the same port meanwhile, the
// agent's query would match the stale flow, miss the redirect to flowgate,
// and be refused by the guard chain: a lookup that fails for no reason.
type flowForgetter struct {
	mu sync.Mutex
	h  *netlink.Handle // in the sandbox's namespace
}

func newFlowForgetter(ns netns.NsHandle) (*flowForgetter, error) {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, err
	}
	return &flowForgetter{h: h}, nil
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

// forget deletes the conntrack flows from local to remote over UDP.
func (f *flowForgetter) forget(local, remote net.Addr) {
	l, ok1 := local.(*net.UDPAddr)
	r, ok2 := remote.(*net.UDPAddr)
	if !ok1 || !ok2 {
		return
	}
	family := netlink.InetFamily(unix.AF_INET)
	if l.IP.To4() == nil {
		family = unix.AF_INET6
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
	if f.h != nil {
		f.h.ConntrackDeleteFilters(netlink.ConntrackTable, family, filter)
	}
}

// Close releases the netlink socket; later forgets do nothing.
func (f *flowForgetter) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.h != nil {
		f.h.Close()
		f.h = nil
	}
	return nil
}

// forgetfulConn is an upstream UDP conn whose flow is deleted when it
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
