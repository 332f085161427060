package dns

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"flowgate/gate"

	"github.com/miekg/dns"
)

// maxChain bounds how many CNAMEs are followed from the queried name.
const maxChain = 16

// maxAnswerTTL is gate.MaxLearnTTL in seconds: no client may cache an
// address longer than the kernel admits it.
const maxAnswerTTL = uint32(gate.MaxLearnTTL / time.Second)

// answerInfo is what an upstream answer says about the queried name.
type answerInfo struct {
	// chain is the queried name, then each CNAME target in order.
	chain []string
	// groups are the answer's addresses by owner depth in chain and TTL.
	groups []addrGroup
	// addrs are all the chain's addresses, without duplicates, at most
	// analyse's limit (the first in the answer).
	addrs []netip.Addr
}

// addrGroup is addresses owned by chain[depth] with one effective TTL (the
// smallest TTL on the way from the queried name to them).
type addrGroup struct {
	depth int
	ttl   time.Duration
	addrs []netip.Addr
}

// norm is the form of a wire name used to follow a chain: lower case,
// without the trailing dot.
func norm(s string) string { return strings.ToLower(strings.TrimSuffix(s, ".")) }

// analyse follows the CNAME chain from qname through resp's answer
// section and collects the addresses on it, the first limit of them. It
// changes nothing.
func analyse(qname string, resp *dns.Msg, limit int) *answerInfo {
	info := &answerInfo{chain: []string{qname}}
	depth := map[string]int{qname: 0}
	reachTTL := []uint32{math.MaxUint32}
	for len(info.chain) <= maxChain {
		cur := info.chain[len(info.chain)-1]
		next := ""
		var ttl uint32
		for _, rr := range resp.Answer {
			if c, ok := rr.(*dns.CNAME); ok && norm(c.Hdr.Name) == cur {
				next, ttl = norm(c.Target), c.Hdr.Ttl
				break
			}
		}
		if next == "" {
			break
		}
		if _, loop := depth[next]; loop {
			break
		}
		depth[next] = len(info.chain)
		info.chain = append(info.chain, next)
		reachTTL = append(reachTTL, min(reachTTL[len(reachTTL)-1], ttl))
	}
	type key struct {
		depth int
		ttl   uint32
	}
	index := make(map[key]int)
	seen := make(map[netip.Addr]bool)
	for _, rr := range resp.Answer {
		a, isAddr := addrOf(rr)
		d, ok := depth[norm(rr.Header().Name)]
		if !isAddr || !ok {
			continue
		}
		if !seen[a] && len(info.addrs) == limit {
			continue // past what the name table keeps: clean drops it
		}
		k := key{d, min(rr.Header().Ttl, reachTTL[d])}
		i, ok := index[k]
		if !ok {
			i = len(info.groups)
			index[k] = i
			info.groups = append(info.groups, addrGroup{depth: d, ttl: time.Duration(k.ttl) * time.Second})
		}
		g := &info.groups[i]
		if !slices.Contains(g.addrs, a) {
			g.addrs = append(g.addrs, a)
		}
		if !seen[a] {
			seen[a] = true
			info.addrs = append(info.addrs, a)
		}
	}
	return info
}

// screenAnswer refuses an answer that leads where the policy refuses to
// go, whatever the queried name: a CNAME to a metadata name or (in
// denylist) to a blocked host, or an address of a metadata service (DNS
// rebinding). In allowlist a CNAME to a name outside the list is fine:
// that is how CDNs work, and the addresses are tied to the queried name.
func (s *Server) screenAnswer(info *answerInfo) (gate.Decision, string, bool) {
	for _, n := range info.chain[1:] {
		d := s.cfg.Policy.Name(n)
		if d.Reason == gate.ReasonMetadata || d.Reason == gate.ReasonHostBlocked {
			return d, "CNAME to " + n, true
		}
	}
	for _, a := range info.addrs {
		if r := gate.IsMetadata(a); r != nil {
			return gate.Decision{Reason: gate.ReasonMetadata, Rule: r}, "answer holds the metadata address " + a.String(), true
		}
	}
	return gate.Decision{}, "", false
}

// clean makes an upstream answer safe to pass on: answer records that are
// not on the chain from the queried name are dropped (the client must not
// see an address that was not learned), and so are addresses past the
// first gate.MaxAddrsPerName and addresses in the additional section, for
// the same reason; TTLs are cut to gate.MaxLearnTTL, and HTTPS/SVCB
// records lose their ECH parameter and address hints.
func clean(resp *dns.Msg, info *answerInfo) {
	onChain := make(map[string]bool, len(info.chain))
	for _, n := range info.chain {
		onChain[n] = true
	}
	answer := resp.Answer[:0]
	for _, rr := range resp.Answer {
		h := rr.Header()
		if !onChain[norm(h.Name)] && h.Rrtype != dns.TypeDNAME {
			continue
		}
		if a, ok := addrOf(rr); ok && !slices.Contains(info.addrs, a) {
			continue
		}
		h.Ttl = min(h.Ttl, maxAnswerTTL)
		stripSvcParams(rr)
		answer = append(answer, rr)
	}
	resp.Answer = answer
	for _, rr := range resp.Ns {
		rr.Header().Ttl = min(rr.Header().Ttl, maxAnswerTTL)
	}
	extra := resp.Extra[:0]
	for _, rr := range resp.Extra {
		switch rr.Header().Rrtype {
		case dns.TypeA, dns.TypeAAAA:
			continue
		case dns.TypeOPT:
		default:
			rr.Header().Ttl = min(rr.Header().Ttl, maxAnswerTTL)
		}
		stripSvcParams(rr)
		extra = append(extra, rr)
	}
	resp.Extra = extra
}

// addrOf returns the address of an A or AAAA record.
func addrOf(rr dns.RR) (netip.Addr, bool) {
	var a netip.Addr
	switch rr := rr.(type) {
	case *dns.A:
		a, _ = netip.AddrFromSlice(rr.A.To4())
	case *dns.AAAA:
		a, _ = netip.AddrFromSlice(rr.AAAA.To16())
	default:
		return a, false
	}
	return a.Unmap(), a.IsValid()
}

// strippedParams are the SvcParams HTTPS and SVCB records lose: ech, which
// would hide the name flowgate decides by from the ClientHello, and the
// address hints, which are neither screened nor learned (a client that
// used one would reach an address flowgate never judged; without them it
// uses the A and AAAA answers, which are).
var strippedParams = []dns.SVCBKey{dns.SVCB_ECHCONFIG, dns.SVCB_IPV4HINT, dns.SVCB_IPV6HINT}

// stripSvcParams removes strippedParams from an HTTPS or SVCB record, and
// from its mandatory list. It reports whether anything was removed.
func stripSvcParams(rr dns.RR) bool {
	var sv *dns.SVCB
	switch r := rr.(type) {
	case *dns.SVCB:
		sv = r
	case *dns.HTTPS:
		sv = &r.SVCB
	default:
		return false
	}
	stripped := false
	kept := make([]dns.SVCBKeyValue, 0, len(sv.Value))
	for _, kv := range sv.Value {
		if slices.Contains(strippedParams, kv.Key()) {
			stripped = true
			continue
		}
		if m, ok := kv.(*dns.SVCBMandatory); ok && slices.ContainsFunc(m.Code, isStripped) {
			codes := slices.DeleteFunc(slices.Clone(m.Code), isStripped)
			stripped = true
			if len(codes) == 0 {
				continue
			}
			kv = &dns.SVCBMandatory{Code: codes}
		}
		kept = append(kept, kv)
	}
	sv.Value = kept
	return stripped
}

func isStripped(k dns.SVCBKey) bool { return slices.Contains(strippedParams, k) }

// learnAnswer records the addresses in Names: under the queried name with
// allowed (which pushes them to the kernel's sets first), and under each
// CNAME target on the way to them without pushing again.
func (s *Server) learnAnswer(info *answerInfo, allowed bool) error {
	for _, g := range info.groups {
		if err := s.cfg.Names.Learn(info.chain[0], g.addrs, g.ttl, allowed); err != nil {
			return fmt.Errorf("learning addresses of %s: %w", info.chain[0], err)
		}
		for _, n := range info.chain[1 : g.depth+1] {
			if err := s.cfg.Names.Learn(n, g.addrs, g.ttl, false); err != nil {
				return fmt.Errorf("learning addresses of %s: %w", n, err)
			}
		}
	}
	return nil
}
