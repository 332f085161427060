package runtime

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Pool is the address space sandboxes take their links from: a /30 of V4
// per sandbox (host side .1, sandbox .2) and, if V6 is set, one subnet of
// V6 per sandbox (a /64 when V6 is shorter than /64, else a /126; host
// side ::1, sandbox ::2). Sandbox n takes the n-th subnet of both.
type Pool struct {
	V4 netip.Prefix
	// V6 may be left unset (with V4 set) to give sandboxes no IPv6 at all.
	V6 netip.Prefix
}

// DefaultPool is 10.209.0.0/16 and fd66:6c67:7700::/48 ("fg" in the ULA's
// global id).
func DefaultPool() Pool {
	return Pool{
		V4: netip.MustParsePrefix("10.209.0.0/16"),
		V6: netip.MustParsePrefix("fd66:6c67:7700::/48"),
	}
}

// maxSlots bounds how many sandboxes a pool is searched for.
const maxSlots = 1 << 16

// ParsePool reads a pool from its two prefixes as flags give them; v6 may
// be "" or "none" for no IPv6.
func ParsePool(v4, v6 string) (Pool, error) {
	var p Pool
	var err error
	if p.V4, err = netip.ParsePrefix(v4); err != nil {
		return Pool{}, fmt.Errorf("address pool: IPv4 prefix: %w", err)
	}
	if v6 != "" && v6 != "none" {
		if p.V6, err = netip.ParsePrefix(v6); err != nil {
			return Pool{}, fmt.Errorf("address pool: IPv6 prefix: %w", err)
		}
	}
	return p, p.validate()
}

func (p Pool) orDefault() Pool {
	if !p.V4.IsValid() && !p.V6.IsValid() {
		return DefaultPool()
	}
	return p
}

func (p Pool) validate() error {
	if !p.V4.IsValid() || !p.V4.Addr().Is4() {
		return fmt.Errorf("address pool: %v is not an IPv4 prefix", p.V4)
	}
	if p.V4.Bits() > 30 {
		return fmt.Errorf("address pool: %v is smaller than one /30", p.V4)
	}
	if p.V4 != p.V4.Masked() {
		return fmt.Errorf("address pool: %v has host bits set (did you mean %v?)", p.V4, p.V4.Masked())
	}
	a4 := p.V4.Addr()
	if a4.IsLoopback() || a4.IsMulticast() || a4.IsLinkLocalUnicast() || a4.IsUnspecified() {
		return fmt.Errorf("address pool: %v is not a unicast range a sandbox can use", p.V4)
	}
	if !p.V6.IsValid() {
		return nil
	}
	a6 := p.V6.Addr()
	if !a6.Is6() || a6.Is4In6() {
		return fmt.Errorf("address pool: %v is not an IPv6 prefix", p.V6)
	}
	if p.V6.Bits() > 124 {
		return fmt.Errorf("address pool: %v is smaller than one /126", p.V6)
	}
	if p.V6 != p.V6.Masked() {
		return fmt.Errorf("address pool: %v has host bits set (did you mean %v?)", p.V6, p.V6.Masked())
	}
	if a6.IsLoopback() || a6.IsMulticast() || a6.IsLinkLocalUnicast() || a6.IsUnspecified() {
		return fmt.Errorf("address pool: %v is not a unicast range a sandbox can use", p.V6)
	}
	return nil
}

// slots is how many sandboxes the pool holds.
func (p Pool) slots() int {
	n := 1 << min(30-p.V4.Bits(), 30)
	if p.V6.IsValid() {
		sub := p.v6SubnetBits()
		n = min(n, 1<<min(sub-p.V6.Bits(), 30))
	}
	return min(n, maxSlots)
}

func (p Pool) v6SubnetBits() int {
	if p.V6.Bits() < 64 {
		return 64
	}
	return 126
}

// subnets returns slot i's IPv4 /30 and IPv6 subnet (invalid without V6).
func (p Pool) subnets(i int) (netip.Prefix, netip.Prefix) {
	b4 := p.V4.Addr().As4()
	v := binary.BigEndian.Uint32(b4[:]) + uint32(i)*4
	binary.BigEndian.PutUint32(b4[:], v)
	n4 := netip.PrefixFrom(netip.AddrFrom4(b4), 30)
	if !p.V6.IsValid() {
		return n4, netip.Prefix{}
	}
	b6 := p.V6.Addr().As16()
	hi := binary.BigEndian.Uint64(b6[:8])
	lo := binary.BigEndian.Uint64(b6[8:])
	bits := p.v6SubnetBits()
	if bits == 64 {
		hi += uint64(i)
	} else {
		lo += uint64(i) << 2
	}
	binary.BigEndian.PutUint64(b6[:8], hi)
	binary.BigEndian.PutUint64(b6[8:], lo)
	return n4, netip.PrefixFrom(netip.AddrFrom16(b6), bits)
}

// hostAddr and peerAddr are a subnet's first and second addresses with
// the subnet's length: the host side and the sandbox side.
func hostAddr(n netip.Prefix) netip.Prefix { return netip.PrefixFrom(n.Addr().Next(), n.Bits()) }
func peerAddr(n netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(n.Addr().Next().Next(), n.Bits())
}

// errPoolExhausted is returned (wrapped) when no slot is free.
var errPoolExhausted = errors.New("address pool exhausted")

// pick returns the first slot whose subnets overlap nothing in used.
func (p Pool) pick(used []netip.Prefix) (int, netip.Prefix, netip.Prefix, error) {
	n := p.slots()
	for i := range n {
		n4, n6 := p.subnets(i)
		busy := false
		for _, u := range used {
			if u.Overlaps(n4) || (n6.IsValid() && u.Overlaps(n6)) {
				busy = true
				break
			}
		}
		if !busy {
			return i, n4, n6, nil
		}
	}
	pools := p.V4.String()
	if p.V6.IsValid() {
		pools += " / " + p.V6.String()
	}
	return 0, netip.Prefix{}, netip.Prefix{}, fmt.Errorf("%w: all %d subnets of %s are in use by other sandboxes or by addresses and routes of the uplink namespace; pass another pool or run `bench gc`", errPoolExhausted, n, pools)
}
