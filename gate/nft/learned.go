package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"flowgate/gate"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Learner adds addresses from allowed DNS answers to the learned sets of an
// allowlist ruleset (learned4, learned6), each with its own timeout, over
// one long-lived netlink socket. It is safe for concurrent use; Close it
// when the sandbox goes away. Its Add has the signature of gate.NewNames's
// push hook.
type Learner struct {
	mu     sync.Mutex
	conn   *nftables.Conn
	set4   *nftables.Set
	set6   *nftables.Set
	until  map[netip.Addr]time.Time
	pruneN int
	now    func() time.Time
	closed bool
}

// NewLearner opens a Learner for the namespace's flowgate table, which
// must hold the learned sets (an allowlist ruleset, applied). The handle
// is only used here; the caller keeps it.
func NewLearner(ns netns.NsHandle) (*Learner, error) {
	c, err := dial(ns)
	if err != nil {
		return nil, fmt.Errorf("opening learned sets: %w", err)
	}
	l := &Learner{conn: c, until: make(map[netip.Addr]time.Time), pruneN: 1024, now: time.Now}
	for _, s := range []struct {
		name string
		dst  **nftables.Set
		kt   nftables.SetDatatype
	}{{SetLearned4, &l.set4, nftables.TypeIPAddr}, {SetLearned6, &l.set6, nftables.TypeIP6Addr}} {
		got, err := c.GetSetByName(table(), s.name)
		if err != nil {
			c.CloseLasting()
			return nil, fmt.Errorf("opening learned sets: set %s in table inet %s: %w (is an allowlist ruleset applied?)", s.name, TableName, err)
		}
		if !got.HasTimeout || got.KeyType.Name != s.kt.Name {
			c.CloseLasting()
			return nil, fmt.Errorf("opening learned sets: set %s is not a %s set with timeouts", s.name, s.kt.Name)
		}
		// google/nftables sends element timeouts only for a Set with
		// HasTimeout; the name finds the set in the kernel.
		*s.dst = &nftables.Set{Table: table(), Name: s.name, KeyType: s.kt, HasTimeout: true}
	}
	return l, nil
}

// Add puts the addresses into learned4 (IPv4, IPv4-mapped included) and
// learned6 with timeout ttl, in one netlink transaction. An address that is
// already there keeps the later of its current expiry and now+ttl, so one
// name's short TTL never cuts short another name's longer one. Invalid
// addresses are skipped.
func (l *Learner) Add(addrs []netip.Addr, ttl time.Duration) error {
	if ttl < time.Millisecond {
		return fmt.Errorf("adding learned addresses: timeout %v is shorter than 1ms", ttl)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("adding learned addresses: learner is closed")
	}
	now := l.now()
	var e4, e6 []nftables.SetElement
	seen := make(map[netip.Addr]bool, len(addrs))
	updates := make(map[netip.Addr]time.Time, len(addrs))
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		if !a.IsValid() || seen[a] {
			continue
		}
		seen[a] = true
		t := ttl
		if u, ok := l.until[a]; ok && u.Sub(now) > t {
			t = u.Sub(now)
		} else {
			updates[a] = now.Add(ttl)
		}
		e := nftables.SetElement{Key: a.AsSlice(), Timeout: t.Round(time.Millisecond)}
		if a.Is4() {
			e4 = append(e4, e)
		} else {
			e6 = append(e6, e)
		}
	}
	if len(e4)+len(e6) == 0 {
		return nil
	}
	for _, b := range []struct {
		s     *nftables.Set
		elems []nftables.SetElement
	}{{l.set4, e4}, {l.set6, e6}} {
		if len(b.elems) == 0 {
			continue
		}
		if err := addElements(l.conn, b.s, b.elems); err != nil {
			return fmt.Errorf("adding learned addresses to %s: %w", b.s.Name, err)
		}
	}
	if err := l.conn.Flush(); err != nil {
		if errors.Is(err, unix.ENFILE) {
			// The kernel's word for a full set is "too many open files".
			return fmt.Errorf("adding %d learned addresses: a learned set is full (%d addresses each); "+
				"addresses leave it as their DNS TTL (at least %v) runs out: %w", len(e4)+len(e6), LearnedSetSize, gate.MinLearnTTL, err)
		}
		return fmt.Errorf("adding %d learned addresses: %w", len(e4)+len(e6), err)
	}
	for a, u := range updates {
		l.until[a] = u
	}
	if len(l.until) > l.pruneN {
		for a, u := range l.until {
			if !u.After(now) {
				delete(l.until, a)
			}
		}
		l.pruneN = max(1024, 2*len(l.until))
	}
	return nil
}

// Close closes the Learner's netlink socket. The learned addresses stay in
// the table until they expire.
func (l *Learner) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if err := l.conn.CloseLasting(); err != nil {
		return fmt.Errorf("closing learned sets: %w", err)
	}
	return nil
}
