package gate

import (
	"net/netip"
	"slices"
)

// PrefixSet matches addresses against CIDR rules, longest prefix first. A
// lookup probes one map per distinct prefix length present.
type PrefixSet struct {
	byLen map[int]map[netip.Prefix]*Rule
	lens4 []int // distinct IPv4 prefix lengths, longest first
	lens6 []int
	all   []netip.Prefix
}

// Add inserts a prefix (masked) with the rule that wrote it. The first rule
// for a prefix wins.
func (s *PrefixSet) Add(p netip.Prefix, r *Rule) {
	p = p.Masked()
	if s.byLen == nil {
		s.byLen = make(map[int]map[netip.Prefix]*Rule)
	}
	key := p.Bits()
	if p.Addr().Is6() {
		key += 1000
	}
	m := s.byLen[key]
	if m == nil {
		m = make(map[netip.Prefix]*Rule)
		s.byLen[key] = m
		if p.Addr().Is4() {
			s.lens4 = insertDesc(s.lens4, p.Bits())
		} else {
			s.lens6 = insertDesc(s.lens6, p.Bits())
		}
	}
	if _, ok := m[p]; !ok {
		m[p] = r
		s.all = append(s.all, p)
	}
}

func insertDesc(l []int, v int) []int {
	l = append(l, v)
	slices.SortFunc(l, func(a, b int) int { return b - a })
	return l
}

// Match returns the rule of the longest prefix holding a, or nil. An
// IPv4-mapped IPv6 address is matched as IPv4.
func (s *PrefixSet) Match(a netip.Addr) *Rule {
	if s == nil || !a.IsValid() {
		return nil
	}
	a = a.Unmap().WithZone("")
	lens, off := s.lens4, 0
	if a.Is6() {
		lens, off = s.lens6, 1000
	}
	for _, bits := range lens {
		p, _ := a.Prefix(bits)
		if r := s.byLen[bits+off][p]; r != nil {
			return r
		}
	}
	return nil
}

// Prefixes returns the prefixes in the order they were added.
func (s *PrefixSet) Prefixes() []netip.Prefix {
	if s == nil {
		return nil
	}
	return slices.Clone(s.all)
}

// Len is the number of prefixes in the set.
func (s *PrefixSet) Len() int {
	if s == nil {
		return 0
	}
	return len(s.all)
}
