package runtime

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"flowgate/gate/netnsx"
)

// sandboxLink is the sandbox's end of its veth pair.
const sandboxLink = "eth0"

// openUplink returns a handle to the uplink namespace; the caller closes
// it. path "" is this process's own namespace (the host's).
func openUplink(path string) (netns.NsHandle, error) {
	p := path
	if p == "" {
		p = "/proc/self/ns/net"
	}
	h, err := netns.GetFromPath(p)
	if err != nil {
		return netns.None(), fmt.Errorf("opening uplink netns %s: %w", p, err)
	}
	return h, nil
}

// netnsExists reports whether /run/netns/<name> exists.
func netnsExists(name string) bool {
	_, err := os.Lstat("/run/netns/" + name)
	return err == nil
}

// deleteNetNS removes /run/netns/<name>; a missing one is not an error.
// It reports whether it removed something.
func deleteNetNS(name string) (bool, error) {
	if !netnsExists(name) {
		return false, nil
	}
	if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("removing netns %s: %w", name, err)
	}
	return true, nil
}

// linkExists reports whether the uplink namespace has a link of that name.
func linkExists(h *netlink.Handle, name string) (bool, error) {
	_, err := h.LinkByName(name)
	if err == nil {
		return true, nil
	}
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return false, nil
	}
	return false, fmt.Errorf("looking up link %s: %w", name, err)
}

// deleteLink removes a link from the uplink namespace (the pair goes with
// it); a missing link is not an error. It reports whether it removed one.
func deleteLink(uplink netns.NsHandle, name string) (bool, error) {
	h, err := netlink.NewHandleAt(uplink)
	if err != nil {
		return false, fmt.Errorf("netlink handle in uplink: %w", err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return false, nil
		}
		return false, fmt.Errorf("looking up link %s: %w", name, err)
	}
	if err := h.LinkDel(l); err != nil {
		return false, fmt.Errorf("removing link %s: %w", name, err)
	}
	return true, nil
}

// usedPrefixes lists what the uplink namespace's addresses and routes
// (every table, default routes left out) cover, so a sandbox subnet never
// shadows or duplicates them.
func usedPrefixes(h *netlink.Handle) ([]netip.Prefix, error) {
	var out []netip.Prefix
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing uplink addresses: %w", err)
	}
	for _, a := range addrs {
		if p, ok := ipnetPrefix(a.IPNet); ok {
			out = append(out, p.Masked())
		}
	}
	var routes []netlink.Route
	for range 3 {
		routes, err = h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("listing uplink routes: %w", err)
	}
	for _, r := range routes {
		if p, ok := ipnetPrefix(r.Dst); ok && p.Bits() > 0 {
			out = append(out, p.Masked())
		}
	}
	return out, nil
}

func ipnetPrefix(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	a = a.Unmap()
	if a.Is4() && ones > 32 {
		ones -= 96
	}
	return netip.PrefixFrom(a, ones), true
}

func prefixIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// plumb joins the sandbox namespace to the uplink: the veth pair (host
// side in the uplink, eth0 in the sandbox), addresses, default routes in
// the sandbox. Without IPv6, eth0 gets IPv6 disabled, so the sandbox has
// no IPv6 route out; loopback keeps ::1.
func plumb(st *state, uplink, sb netns.NsHandle) error {
	up, err := netlink.NewHandleAt(uplink)
	if err != nil {
		return fmt.Errorf("netlink handle in uplink: %w", err)
	}
	defer up.Close()
	in, err := netlink.NewHandleAt(sb)
	if err != nil {
		return fmt.Errorf("netlink handle in sandbox netns: %w", err)
	}
	defer in.Close()
	lo, err := in.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("finding lo in sandbox netns: %w", err)
	}
	if err := in.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bringing lo up in sandbox netns: %w", err)
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: st.HostLink},
		PeerName:      sandboxLink,
		PeerNamespace: netlink.NsFd(sb),
	}
	if err := up.LinkAdd(veth); err != nil {
		return fmt.Errorf("adding veth %s: %w", st.HostLink, err)
	}
	if !st.IPv6 {
		if err := writeSysctl(sb, "net/ipv6/conf/"+sandboxLink+"/disable_ipv6", "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	} else if err := writeSysctl(sb, "net/ipv6/conf/"+sandboxLink+"/accept_dad", "0"); err != nil {
		// Its link-local address is usable at once, like the NODAD ones.
		return err
	}
	sides := []struct {
		h     *netlink.Handle
		name  string
		addrs []netip.Prefix
	}{
		{up, st.HostLink, []netip.Prefix{hostAddr(st.Net4)}},
		{in, sandboxLink, []netip.Prefix{peerAddr(st.Net4)}},
	}
	if st.IPv6 {
		sides[0].addrs = append(sides[0].addrs, hostAddr(st.Net6))
		sides[1].addrs = append(sides[1].addrs, peerAddr(st.Net6))
	}
	var sbLink netlink.Link
	for _, s := range sides {
		l, err := s.h.LinkByName(s.name)
		if err != nil {
			return fmt.Errorf("finding %s: %w", s.name, err)
		}
		for _, p := range s.addrs {
			na := &netlink.Addr{IPNet: prefixIPNet(p)}
			if p.Addr().Is6() {
				na.Flags = unix.IFA_F_NODAD
			}
			if err := s.h.AddrAdd(l, na); err != nil {
				return fmt.Errorf("adding %s to %s: %w", p, s.name, err)
			}
		}
		if err := s.h.LinkSetUp(l); err != nil {
			return fmt.Errorf("bringing %s up: %w", s.name, err)
		}
		sbLink = l
	}
	gws := []netip.Addr{hostAddr(st.Net4).Addr()}
	if st.IPv6 {
		gws = append(gws, hostAddr(st.Net6).Addr())
	}
	for _, gw := range gws {
		r := &netlink.Route{LinkIndex: sbLink.Attrs().Index, Gw: gw.AsSlice()}
		if err := in.RouteAdd(r); err != nil {
			return fmt.Errorf("adding default route via %s in sandbox: %w", gw, err)
		}
	}
	return nil
}

// readSysctl reads /proc/sys/<key> as seen from inside ns (net sysctls
// are per namespace, resolved by the reading thread's namespace).
func readSysctl(ns netns.NsHandle, key string) (string, error) {
	var v string
	err := netnsx.Do(ns, func() error {
		b, err := os.ReadFile("/proc/sys/" + key)
		v = strings.TrimSpace(string(b))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("reading sysctl %s: %w", strings.ReplaceAll(key, "/", "."), err)
	}
	return v, nil
}

// writeSysctl writes /proc/sys/<key> inside ns.
func writeSysctl(ns netns.NsHandle, key, val string) error {
	err := netnsx.Do(ns, func() error {
		return os.WriteFile("/proc/sys/"+key, []byte(val), 0o644)
	})
	if err != nil {
		return fmt.Errorf("setting sysctl %s=%s: %w", strings.ReplaceAll(key, "/", "."), val, err)
	}
	return nil
}

// v6DefaultLinks lists the links the uplink's IPv6 default routes leave by.
func v6DefaultLinks(h *netlink.Handle) ([]string, error) {
	routes, err := h.RouteList(nil, netlink.FAMILY_V6)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("listing uplink IPv6 routes: %w", err)
	}
	seen := make(map[int]bool)
	var out []string
	add := func(idx int) {
		if idx == 0 || seen[idx] {
			return
		}
		seen[idx] = true
		if l, err := h.LinkByIndex(idx); err == nil {
			out = append(out, l.Attrs().Name)
		}
	}
	for _, r := range routes {
		if p, ok := ipnetPrefix(r.Dst); ok && p.Bits() != 0 {
			continue
		}
		add(r.LinkIndex)
		for _, nh := range r.MultiPath {
			add(nh.LinkIndex)
		}
	}
	return out, nil
}
