package dns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"flowgate/gate"

	"github.com/miekg/dns"
)

var _ gate.ResolveFunc = (*Server)(nil).Resolve

// Resolve resolves a canonical name's A and AAAA records through the
// upstreams and records them in Names (pushed to the kernel only when the
// policy allows the name). It is how the SNI and HTTP paths bind a name to
// its addresses, and satisfies gate.ResolveFunc.
//
// A name the policy refuses is not sent upstream and yields a
// *gate.DeniedError, except a blocked host in denylist mode, which is
// resolved (not pushed) so that its addresses are known to be blocked. An
// answer through a CNAME to a blocked or metadata name, or holding a
// metadata address, is refused the same way as in the proxy.
func (s *Server) Resolve(ctx context.Context, name string) ([]netip.Addr, error) {
	if s.isClosed() {
		return nil, fmt.Errorf("resolving %s: dns proxy closed", name)
	}
	canon, err := gate.CanonicalName(name)
	if err != nil {
		return nil, fmt.Errorf("resolving %q: %w", name, err)
	}
	if canon != name {
		return nil, fmt.Errorf("resolving %q: not a canonical name (want %q)", name, canon)
	}
	d := s.cfg.Policy.Name(name)
	if !d.Allow && !(s.cfg.Policy.Mode == gate.Denylist && d.Reason == gate.ReasonHostBlocked) {
		return nil, &gate.DeniedError{Decision: d, Name: name}
	}
	return s.resolve(ctx, name, d.Allow)
}

// resolve asks for A and AAAA at once and learns what comes back.
func (s *Server) resolve(ctx context.Context, name string, allowed bool) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	type result struct {
		addrs []netip.Addr
		err   error
	}
	results := make(chan result, 2)
	for _, t := range []uint16{dns.TypeA, dns.TypeAAAA} {
		go func() {
			a, err := s.lookup(ctx, name, t, allowed)
			results <- result{a, err}
		}()
	}
	var (
		addrs []netip.Addr
		errs  []error
	)
	for range 2 {
		r := <-results
		addrs = append(addrs, r.addrs...)
		if r.err != nil {
			errs = append(errs, r.err)
		}
	}
	var denied *gate.DeniedError
	for _, err := range errs {
		if errors.As(err, &denied) {
			return nil, err
		}
	}
	if len(addrs) == 0 {
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		return nil, fmt.Errorf("resolving %s: no addresses", name)
	}
	return addrs, nil
}

// lookup asks for one type and learns the addresses of the answer.
func (s *Server) lookup(ctx context.Context, name string, qtype uint16, allowed bool) ([]netip.Addr, error) {
	resp, _, err := s.up.exchange(ctx, upstreamQuery(name, qtype, false))
	if err != nil {
		return nil, fmt.Errorf("resolving %s %s: %w", name, dns.Type(qtype), err)
	}
	if resp.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("resolving %s %s: %s", name, dns.Type(qtype), dns.RcodeToString[resp.Rcode])
	}
	info := analyse(name, resp, gate.MaxAddrsPerProtectedName) // Names keeps what its class allows
	if allowed {
		if d, detail, refused := s.screenAnswer(info); refused {
			return nil, fmt.Errorf("resolving %s: %s: %w", name, detail, &gate.DeniedError{Decision: d, Name: name})
		}
	}
	if err := s.learnAnswer(info, allowed); err != nil {
		return nil, err
	}
	return info.addrs, nil
}

// blockedLookups bounds the background lookups of blocked names.
type blockedLookups struct {
	sem chan struct{}

	mu     sync.Mutex
	recent map[string]time.Time // name -> when it may be looked up again
}

// blockedRecentMax bounds the memory of recent lookups; when full it is
// forgotten at once (a repeated lookup costs one query, nothing more).
const blockedRecentMax = 4096

func newBlockedLookups(n int) *blockedLookups {
	return &blockedLookups{sem: make(chan struct{}, n), recent: make(map[string]time.Time)}
}

// claim reports whether name may be looked up now, and if so marks it.
func (b *blockedLookups) claim(name string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if until, ok := b.recent[name]; ok && now.Before(until) {
		return false
	}
	if len(b.recent) >= blockedRecentMax {
		clear(b.recent)
	}
	b.recent[name] = now.Add(gate.MinLearnTTL)
	return true
}

func (b *blockedLookups) unclaim(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.recent, name)
}

// lookupBlocked resolves a blocked host's addresses in the background, at
// most once per gate.MinLearnTTL and with at most Config.BlockedLookups at
// once (more are skipped), and records them in Names without pushing them:
// a later connection to such an address with no name can then be refused
// as address_blocked. These lookups ask A and AAAA only, never the agent's
// own query, and produce no record. Must be called from a goroutine counted
// in s.wg.
func (s *Server) lookupBlocked(name string) {
	b := s.blocked
	if strings.Contains(name, "_") {
		return // a service name (_dmarc.example.com), not a host: no address to learn
	}
	if b == nil || !b.claim(name, time.Now()) {
		return
	}
	select {
	case b.sem <- struct{}{}:
	default:
		b.unclaim(name)
		return
	}
	s.wg.Add(1)
	go s.runBlockedLookup(name)
}

func (s *Server) runBlockedLookup(name string) {
	defer s.wg.Done()
	defer func() { <-s.blocked.sem }()
	if _, err := s.resolve(s.ctx, name, false); err != nil {
		s.log.Debug("dns proxy: looking up a blocked name", "name", name, "err", err)
	}
}
