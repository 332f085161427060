package simnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Uplink addresses come from ranges that are not documentation ranges, so
// they never collide with a site:
//
//   - IPv4: 100.64.0.0/16, one /30 per uplink (gateway .1, client .2);
//   - IPv6: fd00:f10::/48, one /64 per uplink (gateway ::1, client ::2).
//
// A third party that joins a namespace to the internet with its own veth
// (the local sandbox runtime does) must use other parts of 100.64.0.0/10
// and fd00::/8 (for example 100.65.0.0/16 and fd00:f11::/48), put an
// address on its end inside NS() whose prefix covers the client's address
// (or add a route to the client's address via that end), and point the
// client's default routes at that end. Nothing else is needed: the
// internet answers every packet locally and forwards nothing. Before the
// first packet, wait as Attach does (waitOperUp, waitLocal): a fresh veth
// end drops what it sends until the kernel attaches its queue, and a fresh
// IPv6 address drops what it receives until its local route is in.
var (
	uplinkBase4 = netip.MustParseAddr("100.64.0.0")
	uplinkBase6 = netip.MustParseAddr("fd00:f10::")
)

// maxUplinks is how many /30s fit in 100.64.0.0/16.
const maxUplinks = 1 << 14

// DefaultUplinkName is the client-side link name when AttachOptions.Name
// is empty.
const DefaultUplinkName = "uplink0"

// AttachOptions configure Attach.
type AttachOptions struct {
	// Name is the link's name inside the client namespace. Default
	// DefaultUplinkName.
	Name string
	// NoDefaultRoutes leaves the client's routes alone: only the
	// connected /30 and /64 are reachable until the caller adds routes.
	NoDefaultRoutes bool
}

// Uplink is a client namespace's veth link into the internet.
type Uplink struct {
	// Name is the link in the client namespace; PeerName is its other end
	// inside the internet namespace.
	Name, PeerName string
	// Addr4 and Addr6 are the client's addresses with their prefixes.
	Addr4, Addr6 netip.Prefix
	// Gateway4 and Gateway6 are the internet's ends, the client's default
	// gateways.
	Gateway4, Gateway6 netip.Addr
	// Resolver and Resolver6 are the simulated DNS server.
	Resolver, Resolver6 netip.AddrPort

	in     *Internet
	once   sync.Once
	closed error
}

// Attach connects client to the internet with a veth pair: addresses from
// a fresh /30 and /64, and (unless opts say otherwise) default routes in
// the client through the internet's end. The client namespace stays the
// caller's; the link goes away with Uplink.Close, Internet.Close, or
// either namespace.
func (in *Internet) Attach(client netns.NsHandle, opts AttachOptions) (_ *Uplink, err error) {
	name := opts.Name
	if name == "" {
		name = DefaultUplinkName
	}
	if len(name) > unix.IFNAMSIZ-1 {
		return nil, fmt.Errorf("attach: link name %q longer than %d bytes", name, unix.IFNAMSIZ-1)
	}
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return nil, errors.New("attach: the simulated internet is closed")
	}
	if in.next >= maxUplinks {
		in.mu.Unlock()
		return nil, fmt.Errorf("attach: all %d uplinks used", maxUplinks)
	}
	idx := in.next
	in.next++
	in.mu.Unlock()

	b4 := uplinkBase4.As4()
	v4 := uint32(b4[0])<<24 | uint32(b4[1])<<16 | uint32(idx*4)
	a4 := func(host uint32) netip.Addr {
		x := v4 | host
		return netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
	}
	a6 := func(host byte) netip.Addr {
		b := uplinkBase6.As16()
		b[6], b[7] = byte(idx>>8), byte(idx)
		b[15] = host
		return netip.AddrFrom16(b)
	}
	u := &Uplink{
		Name:      name,
		PeerName:  fmt.Sprintf("sim%d", idx),
		Addr4:     netip.PrefixFrom(a4(2), 30),
		Addr6:     netip.PrefixFrom(a6(2), 64),
		Gateway4:  a4(1),
		Gateway6:  a6(1),
		Resolver:  Resolver,
		Resolver6: Resolver6,
		in:        in,
	}

	cl, err := netlink.NewHandleAt(client)
	if err != nil {
		return nil, fmt.Errorf("attach: netlink handle in client netns: %w", err)
	}
	defer cl.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: u.PeerName, Namespace: netlink.NsFd(in.ns)},
		PeerName:      name,
		PeerNamespace: netlink.NsFd(client),
	}
	if err := in.nl.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("attach: adding veth %s/%s: %w", u.PeerName, name, err)
	}
	in.mu.Lock()
	in.uplinks[u] = struct{}{}
	in.mu.Unlock()
	defer func() {
		if err != nil {
			err = errors.Join(err, u.Close())
		}
	}()
	sides := []struct {
		h     *netlink.Handle
		name  string
		addrs []netip.Prefix
	}{
		{in.nl, u.PeerName, []netip.Prefix{netip.PrefixFrom(u.Gateway4, 30), netip.PrefixFrom(u.Gateway6, 64)}},
		{cl, name, []netip.Prefix{u.Addr4, u.Addr6}},
	}
	// Both ends up and carrying first, addresses after: see waitOperUp.
	for _, side := range sides {
		l, err := side.h.LinkByName(side.name)
		if err != nil {
			return nil, fmt.Errorf("attach: finding %s: %w", side.name, err)
		}
		if err := side.h.LinkSetUp(l); err != nil {
			return nil, fmt.Errorf("attach: bringing %s up: %w", side.name, err)
		}
	}
	for _, side := range sides {
		l, err := waitOperUp(side.h, side.name)
		if err != nil {
			return nil, err
		}
		for _, p := range side.addrs {
			na := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
			if p.Addr().Is6() {
				na.Flags = unix.IFA_F_NODAD
			}
			if err := side.h.AddrAdd(l, na); err != nil {
				return nil, fmt.Errorf("attach: adding %s to %s: %w", p, side.name, err)
			}
		}
	}
	for _, w := range []struct {
		h *netlink.Handle
		a netip.Addr
	}{{in.nl, u.Gateway6}, {cl, u.Addr6.Addr()}} {
		if err := waitLocal(w.h, w.a); err != nil {
			return nil, fmt.Errorf("attach: %w", err)
		}
	}
	if err := staticNeighbours(in.nl, u.PeerName, cl, name, []netip.Addr{u.Gateway4, u.Gateway6}, []netip.Addr{u.Addr4.Addr(), u.Addr6.Addr()}); err != nil {
		return nil, err
	}
	if opts.NoDefaultRoutes {
		return u, nil
	}
	l, err := cl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("attach: finding %s: %w", name, err)
	}
	for _, gw := range []netip.Addr{u.Gateway4, u.Gateway6} {
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}
		if err := cl.RouteAdd(r); err != nil {
			return nil, fmt.Errorf("attach: adding default route via %s: %w", gw, err)
		}
	}
	return u, nil
}

// waitLocal waits until the kernel delivers packets for a just-added
// address locally. For IPv6 the local route is inserted by the kernel's
// address work queue after the address exists (even without DAD); until
// then packets to it are dropped as address errors. On a loaded machine
// that takes tens of milliseconds.
func waitLocal(h *netlink.Handle, a netip.Addr) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		rs, err := h.RouteGet(a.AsSlice())
		if err == nil && len(rs) > 0 && rs[0].Type == unix.RTN_LOCAL {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("address %s not local after 5s (%v, %v)", a, rs, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// staticNeighbours writes permanent neighbour entries on both ends (each
// side's addresses to the other's MAC), so that no packet waits for ARP or
// neighbour discovery: on a fresh veth the first IPv6 solicitation is
// sometimes lost, and the retry comes a second later.
func staticNeighbours(ha *netlink.Handle, a string, hb *netlink.Handle, b string, aAddrs, bAddrs []netip.Addr) error {
	la, err := ha.LinkByName(a)
	if err != nil {
		return fmt.Errorf("attach: finding %s: %w", a, err)
	}
	lb, err := hb.LinkByName(b)
	if err != nil {
		return fmt.Errorf("attach: finding %s: %w", b, err)
	}
	for _, n := range []struct {
		h     *netlink.Handle
		link  netlink.Link
		peer  netlink.Link
		addrs []netip.Addr
	}{{ha, la, lb, bAddrs}, {hb, lb, la, aAddrs}} {
		for _, ad := range n.addrs {
			fam := netlink.FAMILY_V4
			if ad.Is6() {
				fam = netlink.FAMILY_V6
			}
			err := n.h.NeighSet(&netlink.Neigh{
				LinkIndex:    n.link.Attrs().Index,
				Family:       fam,
				State:        netlink.NUD_PERMANENT,
				IP:           ad.AsSlice(),
				HardwareAddr: n.peer.Attrs().HardwareAddr,
			})
			if err != nil {
				return fmt.Errorf("attach: neighbour %s on %s: %w", ad, n.link.Attrs().Name, err)
			}
		}
	}
	return nil
}

// waitOperUp waits until the kernel reports the link's operational state
// up. A veth end brought up before its peer has no carrier; when the peer
// comes up, its queueing discipline is attached later, by the kernel's
// link-watch work, and until then it silently drops what it sends (seen
// here: the first answer lost on about one uplink in eight). The
// operational state is set by that same work, just before.
func waitOperUp(h *netlink.Handle, name string) (netlink.Link, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := h.LinkByName(name)
		if err != nil {
			return nil, fmt.Errorf("attach: finding %s: %w", name, err)
		}
		if l.Attrs().OperState == netlink.OperUp {
			return l, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("attach: %s still %s after 5s", name, l.Attrs().OperState)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Close removes the veth pair (both ends). Calling it again, or after the
// internet or the client namespace is gone, is fine.
func (u *Uplink) Close() error {
	u.once.Do(func() {
		in := u.in
		in.mu.Lock()
		delete(in.uplinks, u)
		in.mu.Unlock()
		l, err := in.nl.LinkByName(u.PeerName)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if !errors.As(err, &nf) {
				u.closed = fmt.Errorf("removing uplink %s: %w", u.PeerName, err)
			}
			return
		}
		if err := in.nl.LinkDel(l); err != nil {
			u.closed = fmt.Errorf("removing uplink %s: %w", u.PeerName, err)
		}
	})
	return u.closed
}
