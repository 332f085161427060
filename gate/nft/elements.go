package nft

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
)

// intervalElements turns prefixes into the ranges of an interval set:
// masked, IPv4-mapped ones as IPv4, duplicates and prefixes inside another
// dropped (the kernel refuses overlapping intervals), sorted. Prefixes are
// either nested or disjoint, so dropping the nested ones is the merge.
// v6 selects the family kept.
func intervalElements(prefixes []netip.Prefix, v6 bool) []element {
	var ps []netip.Prefix
	for _, p := range prefixes {
		if !p.IsValid() {
			continue
		}
		a := p.Addr().WithZone("")
		bits := p.Bits()
		if a.Is4In6() && bits >= 96 {
			a, bits = a.Unmap(), bits-96
		}
		if a.Is6() != v6 {
			continue
		}
		ps = append(ps, netip.PrefixFrom(a, bits).Masked())
	}
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(a.Bits(), b.Bits())
	})
	var out []element
	for _, p := range ps {
		from, to := p.Addr(), lastAddr(p)
		if n := len(out); n > 0 && out[n-1].to.Compare(from) >= 0 {
			continue // inside the previous prefix (sorted by start, shortest first)
		}
		out = append(out, element{from: from, to: to})
	}
	return out
}

// lastAddr is the highest address of a masked prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// isMax reports whether a is the highest address of its family.
func isMax(a netip.Addr) bool { return !a.Next().IsValid() }

// kernelElements encodes ranges as the kernel's interval set elements: a
// start, and an end flagged IntervalEnd one past the range (omitted when
// the range reaches the top of the address space).
func kernelElements(elems []element) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, 2*len(elems))
	for _, e := range elems {
		out = append(out, nftables.SetElement{Key: e.from.AsSlice()})
		if !isMax(e.to) {
			out = append(out, nftables.SetElement{Key: e.to.Next().AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// decodeInterval turns the kernel's interval elements back into ranges.
// A leading end at the zero address (which the nft command adds) opens
// nothing and is skipped.
func decodeInterval(raw []nftables.SetElement) ([]element, error) {
	type point struct {
		a   netip.Addr
		end bool
	}
	pts := make([]point, 0, len(raw))
	for _, e := range raw {
		a, ok := netip.AddrFromSlice(e.Key)
		if !ok {
			return nil, fmt.Errorf("interval element key of %d bytes is not an address", len(e.Key))
		}
		pts = append(pts, point{a, e.IntervalEnd})
	}
	// At equal keys, an end (of the previous range) sorts before a start.
	slices.SortFunc(pts, func(x, y point) int {
		if c := x.a.Compare(y.a); c != 0 {
			return c
		}
		switch {
		case x.end == y.end:
			return 0
		case x.end:
			return -1
		}
		return 1
	})
	var out []element
	var open *netip.Addr
	for _, p := range pts {
		switch {
		case !p.end:
			if open != nil {
				return nil, fmt.Errorf("interval starting at %s has no end before %s", *open, p.a)
			}
			a := p.a
			open = &a
		case open != nil:
			out = append(out, element{from: *open, to: p.a.Prev()})
			open = nil
		case !p.a.IsUnspecified():
			return nil, fmt.Errorf("interval end %s has no start", p.a)
		}
	}
	if open != nil {
		last := topAddr4
		if open.Is6() {
			last = topAddr6
		}
		out = append(out, element{from: *open, to: last})
	}
	return out, nil
}

// The highest IPv4 and IPv6 addresses: the end of a range that the kernel
// leaves open.
var (
	topAddr4 = netip.AddrFrom4([4]byte{255, 255, 255, 255})
	topAddr6 = netip.AddrFrom16([16]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
)

// elementText prints one element the way nft does: an address, a prefix
// when the range is one, else "from-to"; timeouts in nft's time format.
func elementText(e element) string {
	var s string
	switch {
	case e.raw != nil:
		s = fmt.Sprintf("0x%x", e.raw)
	case e.from == e.to:
		s = addrText(e.from)
	default:
		if bits, ok := rangePrefix(e.from, e.to); ok {
			s = addrText(e.from) + "/" + fmt.Sprint(bits)
		} else {
			s = addrText(e.from) + "-" + addrText(e.to)
		}
	}
	if e.timeout > 0 {
		s += " timeout " + nftDuration(e.timeout)
	}
	if e.expires > 0 {
		s += " expires " + nftDuration(e.expires)
	}
	return s
}

// rangePrefix reports whether [from, to] is exactly one prefix.
func rangePrefix(from, to netip.Addr) (int, bool) {
	for bits := 0; bits <= from.BitLen(); bits++ {
		p := netip.PrefixFrom(from, bits)
		if p.Masked().Addr() == from && lastAddr(p.Masked()) == to {
			return bits, true
		}
	}
	return 0, false
}

// nftDuration prints a duration as nft does: 1d2h3m4s5ms, zero parts left
// out.
func nftDuration(d time.Duration) string {
	ms := uint64(d.Milliseconds())
	var b strings.Builder
	for _, u := range []struct {
		n    uint64
		name string
	}{{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}, {1, "ms"}} {
		if v := ms / u.n; v > 0 {
			fmt.Fprintf(&b, "%d%s", v, u.name)
		}
		ms %= u.n
	}
	return b.String()
}

// addrText prints an address as inet_ntop does, which nft uses: Go's form,
// except that an IPv4-compatible IPv6 address (the first 96 bits zero and
// the next 16 not) keeps glibc's dotted quad, ::a.b.c.d.
func addrText(a netip.Addr) string {
	if a.Is6() && !a.Is4In6() {
		b := a.As16()
		if [12]byte(b[:12]) == [12]byte{} && (b[12] != 0 || b[13] != 0) {
			return "::" + netip.AddrFrom4([4]byte(b[12:])).String()
		}
	}
	return a.String()
}
