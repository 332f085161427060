package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
)

// Read reads table inet flowgate from the namespace as it is now. When
// there is no such table it returns a Ruleset whose Exists is false, so
// that Diff reports the table as missing. The reading is several netlink
// dumps, not one snapshot: a change made meanwhile may show half done,
// which Diff reports as a difference.
func Read(ns netns.NsHandle) (*Ruleset, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)), nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("reading table inet %s: opening netlink socket: %w", TableName, err)
	}
	defer closeLater(c)
	r, err := read(c, ns)
	if err != nil {
		return nil, fmt.Errorf("reading table inet %s: %w", TableName, err)
	}
	return r, nil
}

func read(c *nftables.Conn, ns netns.NsHandle) (*Ruleset, error) {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("listing tables: %w", err)
	}
	var t *nftables.Table
	for _, x := range tables {
		if x.Name == TableName {
			t = x
		}
	}
	if t == nil {
		return &Ruleset{}, nil
	}
	// google/nftables decodes the table's flags in host byte order; the
	// kernel sends them in network byte order.
	flags := binary.BigEndian.Uint32(binaryutil.NativeEndian.PutUint32(t.Flags))
	r := &Ruleset{present: true, flags: flags}
	sets, err := c.GetSets(t)
	if err != nil {
		return nil, fmt.Errorf("listing sets: %w", err)
	}
	for _, s := range sets {
		if s.Anonymous {
			continue
		}
		raw, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("listing elements of set %s: %w", s.Name, err)
		}
		ls := &set{name: s.Name, keyType: s.KeyType, interval: s.Interval, timeout: s.HasTimeout, constant: s.Constant,
			size: s.Size, learned: s.Name == SetLearned4 || s.Name == SetLearned6}
		if ls.elems, err = liveElements(s, raw); err != nil {
			return nil, fmt.Errorf("set %s: %w", s.Name, err)
		}
		r.sets = append(r.sets, ls)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("listing chains: %w", err)
	}
	rules, err := dumpRules(ns)
	if err != nil {
		return nil, err
	}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != TableName {
			continue
		}
		lc := &chain{name: ch.Name}
		if ch.Hooknum != nil && ch.Priority != nil {
			lc.hook = &hookSpec{typ: ch.Type, hooknum: *ch.Hooknum, prio: *ch.Priority}
			if ch.Policy != nil {
				lc.hook.policy, lc.hook.hasPolicy = *ch.Policy, true
			}
		}
		lc.rules = rules[ch.Name]
		r.chains = append(r.chains, lc)
	}
	r.nameCgroups()
	return r, nil
}

// liveElements decodes a set's elements: address ranges for an interval
// set, addresses with their timeouts otherwise, raw keys for a set whose
// key is not an address.
func liveElements(s *nftables.Set, raw []nftables.SetElement) ([]element, error) {
	isAddr := s.KeyType.Name == nftables.TypeIPAddr.Name || s.KeyType.Name == nftables.TypeIP6Addr.Name
	if isAddr && s.Interval {
		return decodeInterval(raw)
	}
	out := make([]element, 0, len(raw))
	for _, e := range raw {
		el := element{timeout: e.Timeout, expires: e.Expires}
		if a, ok := netip.AddrFromSlice(e.Key); isAddr && ok {
			el.from, el.to = a, a
		} else {
			el.raw = append([]byte{}, e.Key...)
		}
		out = append(out, el)
	}
	return out, nil
}

// nameCgroups finds the path of every cgroup id a rule compares with, the
// way nft names them when it lists rules.
func (r *Ruleset) nameCgroups() {
	var ids []uint64
	for _, ch := range r.chains {
		for _, ru := range ch.rules {
			for i, e := range ru.exprs {
				s, ok := e.(*expr.Socket)
				if !ok || s.Key != expr.SocketKeyCgroupv2 || i+1 >= len(ru.exprs) {
					continue
				}
				if cmp, ok := ru.exprs[i+1].(*expr.Cmp); ok && len(cmp.Data) == 8 {
					ids = append(ids, binaryutil.NativeEndian.Uint64(cmp.Data))
				}
			}
		}
	}
	if len(ids) == 0 {
		return
	}
	m, err := findCgroup2()
	if err != nil {
		return
	}
	r.cgroupNames = make(map[uint64]string)
	for _, id := range ids {
		if _, done := r.cgroupNames[id]; done {
			continue
		}
		if p, ok := m.cgroupPath(id); ok {
			r.cgroupNames[id] = p
		}
	}
}
