package gate

import (
	"net/netip"
	"slices"
	"sync"
	"time"
)

// TTL bounds for learned addresses: an answer's TTL is raised to at least
// MinLearnTTL (clients cache answers a little longer than they should) and
// cut to at most MaxLearnTTL.
const (
	MinLearnTTL = 30 * time.Second
	MaxLearnTTL = 24 * time.Hour
)

// DefaultMaxNames bounds the table. When full, expired entries go first,
// then arbitrary ones: for most names the table is a cache, and every check
// that misses it resolves the name again. Not so for what it knows of
// refused names (an address known to belong to a blocked host is refused
// with no name sent, and nothing resolves it again at that moment), so
// names that Protect covers are evicted only to make room for each other,
// and pinned names never (see Protect and Pin).
const DefaultMaxNames = 65536

// Bounds on addresses: an answer can carry thousands (an operator's zone
// can serve 2,000 AAAA records over TCP), and a name's addresses can
// rotate with every answer. At most MaxAddrsPerName addresses of one name
// are kept (the latest learned; beyond them an answer's addresses are not
// learned at all, so they are neither admitted nor pushed), or
// MaxAddrsPerProtectedName for a name Protect or Pin covers (what is known
// of a blocked host must not stop at 64 of its addresses); and at most
// DefaultMaxEntries (name, address) pairs in all, evicted like names.
const (
	MaxAddrsPerName          = 64
	MaxAddrsPerProtectedName = 1024
	DefaultMaxEntries        = 1 << 18
)

// Names is the table of names and the addresses they resolved to through the
// sandbox's resolver, with expiry. The DNS proxy fills it; the SNI and HTTP
// paths read it to bind a name to its addresses; the gateway pushes what is
// learned for allowed names into the nftables address sets.
type Names struct {
	mu     sync.Mutex
	byName map[string]map[netip.Addr]time.Time
	byAddr map[netip.Addr]map[string]time.Time
	max    int
	// entries counts (name, address) pairs; maxEntries bounds them.
	entries, maxEntries int
	now                 func() time.Time
	push                func([]netip.Addr, time.Duration) error

	protect func(name string) bool // nil: nothing is protected
	pinned  map[string]bool
	// The names in byName by class, so that eviction finds its victims
	// without walking the whole table: unprotected, protected (pinned
	// ones included).
	plain, kept map[string]struct{}
	// swept is when expired entries were last dropped to make room; a full
	// table is swept at most once per sweepEvery.
	swept time.Time
}

// sweepEvery bounds how often a full table is walked for expired entries.
const sweepEvery = time.Second

// NewNames returns an empty table. push, if not nil, is called by Learn for
// addresses of allowed names, before Learn returns, so that the kernel admits
// an address before the client sees it; its error is Learn's.
func NewNames(push func(addrs []netip.Addr, ttl time.Duration) error) *Names {
	return &Names{
		byName:     make(map[string]map[netip.Addr]time.Time),
		byAddr:     make(map[netip.Addr]map[string]time.Time),
		plain:      make(map[string]struct{}),
		kept:       make(map[string]struct{}),
		max:        DefaultMaxNames,
		maxEntries: DefaultMaxEntries,
		now:        time.Now,
		push:       push,
	}
}

// Protect says which names' entries survive a full table: when the table
// is full, a new name evicts only names protect reports false for; a
// protected new name may evict protected ones too (never pinned ones). So
// an agent that resolves many names cannot push out what is known of the
// refused ones. When nothing may go, the new name is not recorded (Learn
// still succeeds; checks that miss resolve again). Call it before use.
func (n *Names) Protect(protect func(name string) bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.protect = protect
}

// Pin marks names whose entries are never evicted for room (they still
// expire): the few names kept resolved ahead of the agent.
func (n *Names) Pin(names ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.pinned == nil {
		n.pinned = make(map[string]bool, len(names))
	}
	for _, name := range names {
		n.pinned[name] = true
		if _, ok := n.plain[name]; ok {
			delete(n.plain, name)
			n.kept[name] = struct{}{}
		}
	}
}

// ClampTTL applies MinLearnTTL and MaxLearnTTL.
func ClampTTL(ttl time.Duration) time.Duration {
	return min(max(ttl, MinLearnTTL), MaxLearnTTL)
}

// Learn records that name resolved to addrs for ttl (clamped). When allowed
// is true, the addresses are also pushed to the kernel's learned sets first;
// if that fails nothing is recorded and the error is returned. Only the
// first MaxAddrsPerName distinct addresses of an answer are learned
// (MaxAddrsPerProtectedName for a protected name).
func (n *Names) Learn(name string, addrs []netip.Addr, ttl time.Duration, allowed bool) error {
	ttl = ClampTTL(ttl)
	protected := n.Protected(name) // once: Protect's policy lookup is not free
	limit := MaxAddrsPerName
	if protected {
		limit = MaxAddrsPerProtectedName
	}
	clean := make([]netip.Addr, 0, min(len(addrs), limit))
	seen := make(map[netip.Addr]bool, min(len(addrs), limit))
	for _, a := range addrs {
		if a = a.Unmap().WithZone(""); a.IsValid() && !seen[a] {
			seen[a] = true
			if clean = append(clean, a); len(clean) == limit {
				break
			}
		}
	}
	if len(clean) == 0 {
		return nil
	}
	if allowed && n.push != nil {
		if err := n.push(clean, ttl); err != nil {
			return err
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.now()
	exp := now.Add(ttl)
	missing := func() int {
		need := 0
		for _, a := range clean {
			if _, ok := n.byName[name][a]; !ok {
				need++
			}
		}
		return need
	}
	need := missing()
	if over := len(n.byName[name]) + need - limit; over > 0 {
		n.dropOldestLocked(name, over, seen)
		need = missing()
	}
	if !n.roomLocked(n.byName[name] == nil, need) {
		n.evictLocked(now, protected, n.byName[name] == nil, need)
		// Eviction may have taken this name's own entries: count again.
		if need = missing(); !n.roomLocked(n.byName[name] == nil, need) {
			return nil // full of names that must stay
		}
	}
	m := n.byName[name]
	if m == nil {
		m = make(map[netip.Addr]time.Time, len(clean))
		n.byName[name] = m
		if protected {
			n.kept[name] = struct{}{}
		} else {
			n.plain[name] = struct{}{}
		}
	}
	for _, a := range clean {
		if _, ok := m[a]; !ok {
			n.entries++
		}
		if m[a].Before(exp) {
			m[a] = exp
		}
		r := n.byAddr[a]
		if r == nil {
			r = make(map[string]time.Time, 1)
			n.byAddr[a] = r
		}
		if r[name].Before(exp) {
			r[name] = exp
		}
	}
	return nil
}

// dropOldestLocked drops count of name's addresses that are not in keep,
// those that expire first.
func (n *Names) dropOldestLocked(name string, count int, keep map[netip.Addr]bool) {
	type entry struct {
		a   netip.Addr
		exp time.Time
	}
	var old []entry
	for a, exp := range n.byName[name] {
		if !keep[a] {
			old = append(old, entry{a, exp})
		}
	}
	slices.SortFunc(old, func(x, y entry) int { return x.exp.Compare(y.exp) })
	for _, e := range old[:min(count, len(old))] {
		n.dropLocked(name, e.a)
	}
}

// roomLocked reports whether a name (new or not) with need more entries
// fits.
func (n *Names) roomLocked(newName bool, need int) bool {
	return (!newName || len(n.byName) < n.max) && n.entries+need <= n.maxEntries
}

// Protected reports whether a full table keeps name's entries from other
// names (Protect), and Pinned whether it keeps them always (Pin).
func (n *Names) Protected(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.protectedLocked(name)
}

// Pinned: see Protected.
func (n *Names) Pinned(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pinned[name]
}

func (n *Names) protectedLocked(name string) bool {
	return n.pinned[name] || (n.protect != nil && n.protect(name))
}

// evictLocked makes room for a name (new or not) with need more entries:
// it drops expired entries (at most once per sweepEvery), then names, an
// eighth of the bound at a time: unprotected ones, and, when they are not
// enough and the name making room is protected, protected ones; never
// pinned ones. It reports whether there is room.
func (n *Names) evictLocked(now time.Time, forProtected, newName bool, need int) bool {
	if now.Sub(n.swept) >= sweepEvery || now.Before(n.swept) {
		n.swept = now
		for name, m := range n.byName {
			for a, exp := range m {
				if !exp.After(now) {
					n.dropLocked(name, a)
				}
			}
		}
	}
	classes := []map[string]struct{}{n.plain}
	if forProtected {
		classes = append(classes, n.kept)
	}
	for _, class := range classes {
		for !n.roomLocked(newName, need) {
			if n.dropNamesLocked(class, max(n.max/8, 1)) == 0 {
				break
			}
		}
	}
	return n.roomLocked(newName, need)
}

// dropNamesLocked drops up to count names of class (plain or kept) that
// are not pinned, and returns how many it dropped.
func (n *Names) dropNamesLocked(class map[string]struct{}, count int) int {
	dropped := 0
	for name := range class {
		if dropped == count {
			break
		}
		if n.pinned[name] {
			continue
		}
		for a := range n.byName[name] {
			n.dropLocked(name, a)
		}
		dropped++
	}
	return dropped
}

func (n *Names) dropLocked(name string, a netip.Addr) {
	if m := n.byName[name]; m != nil {
		if _, ok := m[a]; ok {
			delete(m, a)
			n.entries--
		}
		if len(m) == 0 {
			delete(n.byName, name)
			delete(n.plain, name)
			delete(n.kept, name)
		}
	}
	if r := n.byAddr[a]; r != nil {
		delete(r, name)
		if len(r) == 0 {
			delete(n.byAddr, a)
		}
	}
}

// Has reports whether name currently resolves to a (not expired).
func (n *Names) Has(name string, a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	n.mu.Lock()
	defer n.mu.Unlock()
	exp, ok := n.byName[name][a]
	return ok && exp.After(n.now())
}

// Expires returns when the first of name's live addresses expires; false
// when it has none.
func (n *Names) Expires(name string) (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.now()
	var first time.Time
	for _, exp := range n.byName[name] {
		if exp.After(now) && (first.IsZero() || exp.Before(first)) {
			first = exp
		}
	}
	return first, !first.IsZero()
}

// NamesOf returns the names a currently belongs to.
func (n *Names) NamesOf(a netip.Addr) []string {
	a = a.Unmap().WithZone("")
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.now()
	var out []string
	for name, exp := range n.byAddr[a] {
		if exp.After(now) {
			out = append(out, name)
		}
	}
	return out
}

// Len is the number of names in the table, expired ones included until
// they are evicted.
func (n *Names) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.byName)
}
