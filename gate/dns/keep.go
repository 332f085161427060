package dns

import (
	"net/netip"
	"sync"
	"time"

	"flowgate/gate"
)

// Keeping the policy's blocked names resolved. In denylist the agent can
// learn a blocked host's address without asking flowgate (DNS over HTTPS
// through an allowed host, an address it remembers) and connect to it with
// no name: TLS without SNI, HTTP with no Host or an address for one, any
// other TCP. The data plane refuses such a connection only for an address
// it knows belongs to a blocked host (address_blocked) or to a host whose
// paths blocked_urls restricts (needs_intercept). The agent's own refused
// lookups teach it some (lookupBlocked); KeepBlockedResolved teaches it the
// names the policy spells out before the agent runs: every blocked_hosts
// name and every blocked_urls host, resolved through the sandbox's
// resolver at start and again before their addresses expire, pinned in
// Names so that a flood of other lookups cannot evict them. Names under
// a rule (a subdomain of a blocked host) cannot be listed in advance and
// stay with the agent's lookups; a resolver that answers flowgate with
// other addresses than it answered the agent leaves those unknown.

// MaxKeptNames bounds the names KeepBlockedResolved keeps resolved: the
// first in the policy's order. The rest are looked up when the agent asks
// for them.
const MaxKeptNames = 256

// keepConcurrency is how many kept names are resolved at once.
const keepConcurrency = 4

// The schedule of kept names: resolved again keepMargin before the first of
// their addresses expires, but never sooner than keepMin after the last
// lookup; a failed lookup is tried again after keepRetry, doubling up to
// keepRetryMax. Variables so that tests can run the schedule fast.
var (
	keepMargin   = 5 * time.Second
	keepMin      = 20 * time.Second
	keepRetry    = 30 * time.Second
	keepRetryMax = 10 * time.Minute
)

// keptName is one name kept resolved and when it is due again.
type keptName struct {
	name  string
	next  time.Time
	retry time.Duration
}

// KeepBlockedResolved starts keeping the policy's blocked names resolved
// until Close (denylist, with background lookups on; otherwise it does
// nothing). It returns a channel closed once every kept name was tried
// once, how many names are kept and how many more the policy names beyond
// MaxKeptNames. Call it once.
func (s *Server) KeepBlockedResolved() (ready <-chan struct{}, kept, skipped int) {
	done := make(chan struct{})
	var names []*keptName
	if s.blocked != nil {
		for _, n := range blockedNames(s.cfg.Policy) {
			names = append(names, &keptName{name: n})
		}
	}
	if len(names) > MaxKeptNames {
		skipped = len(names) - MaxKeptNames
		names = names[:MaxKeptNames]
	}
	for _, k := range names {
		s.cfg.Names.Pin(k.name) // a full table never evicts them
	}
	s.mu.Lock()
	start := !s.closed && len(names) > 0
	if start {
		s.wg.Add(1)
	}
	s.mu.Unlock()
	if !start {
		close(done)
		return done, 0, skipped
	}
	go s.keepResolved(names, done)
	return done, len(names), skipped
}

// blockedNames lists, in the policy's order and once each, the names of
// blocked_hosts rules and the hosts of blocked_urls rules (not addresses).
func blockedNames(p *gate.Policy) []string {
	if p.Mode != gate.Denylist {
		return nil
	}
	seen := make(map[string]bool)
	var out []string
	for _, r := range p.Rules {
		var name string
		switch r.Kind {
		case gate.KindHost:
			name = r.Canonical
		case gate.KindURL:
			name = r.Host
		default:
			continue
		}
		if _, err := netip.ParseAddr(name); err == nil || seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, name)
	}
	return out
}

// keepResolved resolves the due names, closes ready after the first round,
// and sleeps until the next is due, until Close.
func (s *Server) keepResolved(names []*keptName, ready chan struct{}) {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for first := true; ; first = false {
		s.keepRound(names)
		if first {
			close(ready)
		}
		next := names[0].next
		for _, k := range names[1:] {
			if k.next.Before(next) {
				next = k.next
			}
		}
		timer.Reset(time.Until(next))
		select {
		case <-s.ctx.Done():
			return
		case <-timer.C:
		}
	}
}

// keepRound resolves every name that is due, keepConcurrency at a time.
func (s *Server) keepRound(names []*keptName) {
	now := time.Now()
	sem := make(chan struct{}, keepConcurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, k := range names {
		if k.next.After(now) {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-s.ctx.Done():
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s.keepOne(k)
		}()
	}
}

// keepOne resolves one kept name (recorded in Names, never pushed: the name
// is refused or restricted) and schedules its next lookup.
func (s *Server) keepOne(k *keptName) {
	_, err := s.resolve(s.ctx, k.name, false)
	now := time.Now()
	if err != nil {
		k.retry = min(max(2*k.retry, keepRetry), keepRetryMax)
		k.next = now.Add(k.retry)
		s.log.Debug("dns proxy: resolving a blocked name ahead of the agent", "name", k.name, "retry_in", k.retry, "err", err)
		return
	}
	k.retry = 0
	k.next = now.Add(keepMin)
	if exp, ok := s.cfg.Names.Expires(k.name); ok && exp.Add(-keepMargin).After(k.next) {
		k.next = exp.Add(-keepMargin)
	}
}
