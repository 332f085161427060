package gate

import (
	"net/netip"
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
// then arbitrary ones: the table is a cache, and every check that misses it
// resolves the name again.
const DefaultMaxNames = 65536

// Names is the table of names and the addresses they resolved to through the
// sandbox's resolver, with expiry. The DNS proxy fills it; the SNI and HTTP
// paths read it to bind a name to its addresses; the gateway pushes what is
// learned for allowed names into the nftables address sets.
type Names struct {
	mu     sync.Mutex
	byName map[string]map[netip.Addr]time.Time
	byAddr map[netip.Addr]map[string]time.Time
	max    int
	now    func() time.Time
	push   func([]netip.Addr, time.Duration) error
}

// NewNames returns an empty table. push, if not nil, is called by Learn for
// addresses of allowed names, before Learn returns, so that the kernel admits
// an address before the client sees it; its error is Learn's.
func NewNames(push func(addrs []netip.Addr, ttl time.Duration) error) *Names {
	return &Names{
		byName: make(map[string]map[netip.Addr]time.Time),
		byAddr: make(map[netip.Addr]map[string]time.Time),
		max:    DefaultMaxNames,
		now:    time.Now,
		push:   push,
	}
}

// ClampTTL applies MinLearnTTL and MaxLearnTTL.
func ClampTTL(ttl time.Duration) time.Duration {
	return min(max(ttl, MinLearnTTL), MaxLearnTTL)
}

// Learn records that name resolved to addrs for ttl (clamped). When allowed
// is true, the addresses are also pushed to the kernel's learned sets first;
// if that fails nothing is recorded and the error is returned.
func (n *Names) Learn(name string, addrs []netip.Addr, ttl time.Duration, allowed bool) error {
	if len(addrs) == 0 {
		return nil
	}
	ttl = ClampTTL(ttl)
	clean := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if a.IsValid() {
			clean = append(clean, a.Unmap().WithZone(""))
		}
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
	if _, ok := n.byName[name]; !ok && len(n.byName) >= n.max {
		n.evictLocked(now)
	}
	m := n.byName[name]
	if m == nil {
		m = make(map[netip.Addr]time.Time, len(clean))
		n.byName[name] = m
	}
	for _, a := range clean {
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

// evictLocked drops expired entries, then, if still full, one in eight.
func (n *Names) evictLocked(now time.Time) {
	for name, m := range n.byName {
		for a, exp := range m {
			if !exp.After(now) {
				n.dropLocked(name, a)
			}
		}
	}
	if len(n.byName) < n.max {
		return
	}
	drop := max(n.max/8, 1)
	for name, m := range n.byName {
		for a := range m {
			n.dropLocked(name, a)
		}
		if drop--; drop == 0 {
			return
		}
	}
}

func (n *Names) dropLocked(name string, a netip.Addr) {
	if m := n.byName[name]; m != nil {
		delete(m, a)
		if len(m) == 0 {
			delete(n.byName, name)
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
