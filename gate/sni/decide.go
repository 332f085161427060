package sni

import (
	"context"
	"crypto/tls"
	"errors"
	"net/netip"
	"slices"

	"flowgate/gate"
)

// The decisions of the data plane, on top of the policy's own: a name is
// trusted only for its own addresses, and a stream that names no host is
// judged by what is known about its destination address.
//
// Binding: a TLS SNI or HTTP Host is let through only when the destination
// is among the addresses the name resolves to through the sandbox's
// resolver (learned from the agent's lookups, or resolved now), else
// address_mismatch: one host's address under another host's name is
// fronting by address. Two exceptions, both where the name cannot matter:
// public mode admits every non-metadata address anyway, and in allowlist an
// address admitted by a CIDR rule is admitted whatever name is sent to it
// (a client could send none).
//
// ECH: in allowlist a hello with an encrypted_client_hello extension is
// refused (ech_refused), since the name that decides is hidden; this also
// refuses GREASE ECH, which looks the same on the wire. In denylist the
// outer SNI decides, bound to the destination like any SNI: the inner name
// is one the destination's operator serves under the outer name.
//
// IP literals: an SNI that is an IP address (invalid under RFC 6066) and an
// HTTP Host that is one are judged as no name, provided they equal the
// destination (else address_mismatch).

// decideAddr decides a destination by its address alone: metadata and CIDR
// rules first; then, in allowlist, an address learned for an allowed name
// is admitted (learned) and any other refused (unknown_address); in
// denylist, an address known to belong to a refused name is refused
// (address_blocked) and any other admitted.
func (s *Server) decideAddr(a netip.Addr) gate.Decision {
	p := s.cfg.Policy
	d := p.Addr(a)
	if d.Reason == gate.ReasonMetadata {
		return d
	}
	switch p.Mode {
	case gate.Allowlist:
		if d.Allow {
			return d
		}
		for _, n := range s.namesOf(a) {
			if nd := p.Name(n); nd.Allow {
				return gate.Decision{Allow: true, Reason: gate.ReasonLearned, Rule: nd.Rule}
			}
		}
	case gate.Denylist:
		if !d.Allow {
			return d
		}
		for _, n := range s.namesOf(a) {
			if nd := p.Name(n); !nd.Allow {
				return gate.Decision{Reason: gate.ReasonAddressBlocked, Rule: nd.Rule}
			}
		}
	}
	return d
}

// namesOf lists the live names of an address in a stable order, so that
// the rule a decision reports does not depend on map order. In denylist a
// NAT64 address also has the names of the IPv4 address it reaches.
func (s *Server) namesOf(a netip.Addr) []string {
	names := s.cfg.Names.NamesOf(a)
	if v4, ok := gate.NAT64Embedded(a); ok && s.cfg.Policy.Mode == gate.Denylist {
		names = append(names, s.cfg.Names.NamesOf(v4)...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// decideBound turns the policy's verdict nd on a name into the verdict on
// that name sent to dst: see the binding rules above.
func (s *Server) decideBound(ctx context.Context, name string, nd gate.Decision, dst netip.Addr) gate.Decision {
	p := s.cfg.Policy
	ad := p.Addr(dst)
	if ad.Reason == gate.ReasonMetadata {
		return ad
	}
	switch p.Mode {
	case gate.Public, gate.NoNetwork:
		return nd
	case gate.Allowlist:
		if ad.Allow && nd.Allow {
			return nd
		}
		if ad.Allow && nd.Reason == gate.ReasonNotAllowed {
			return ad
		}
	case gate.Denylist:
		if nd.Allow && !ad.Allow {
			return ad
		}
	}
	if !nd.Allow {
		return nd
	}
	if s.cfg.Names.Has(name, dst) {
		return nd
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	addrs, err := s.cfg.Resolve(ctx, name)
	if err != nil {
		s.log.Debug("resolving to bind a name", "name", name, "err", err)
		return resolveRefusal(err)
	}
	for _, a := range addrs {
		if a.Unmap().WithZone("") == dst {
			return nd
		}
	}
	return gate.Deny(gate.ReasonAddrMismatch)
}

// decideTLS decides a ClientHello sent to dst. want, when not empty, is the
// CONNECT target the SNI must name. It returns the decision and the
// canonical name judged ("" when none).
func (s *Server) decideTLS(ctx context.Context, h *tls.ClientHelloInfo, dst netip.Addr, want string) (gate.Decision, string) {
	p := s.cfg.Policy
	if p.Mode == gate.Allowlist && hasECH(h) {
		return gate.Deny(gate.ReasonECH), h.ServerName
	}
	if h.ServerName == "" {
		return s.decideNoName(dst), ""
	}
	host, err := gate.CanonicalHost(h.ServerName)
	if err != nil {
		return gate.Deny(gate.ReasonBadName), h.ServerName
	}
	if want != "" && host.Name != want {
		return gate.Deny(gate.ReasonNameMismatch), host.String()
	}
	if host.IsAddr() {
		if host.Addr != dst {
			return gate.Deny(gate.ReasonAddrMismatch), host.String()
		}
		return s.decideNoName(dst), host.String()
	}
	nd := p.Name(host.Name)
	if nd.Allow && p.NeedsIntercept(host) {
		return p.InterceptRefusal(host), host.Name
	}
	if nd.Allow && p.Mode == gate.Denylist {
		// Rules written for the address bind whatever name is sent to it.
		for _, h := range addrHosts(dst) {
			if p.NeedsIntercept(h) {
				return p.InterceptRefusal(h), host.Name
			}
		}
	}
	return s.decideBound(ctx, host.Name, nd, dst), host.Name
}

// decideNoName decides TLS without a usable SNI, or a stream that is neither
// TLS nor HTTP, by the address; in denylist an address known to serve a
// host whose paths are restricted is refused as well, since its default
// site may be that host and no path can be checked.
func (s *Server) decideNoName(dst netip.Addr) gate.Decision {
	d := s.decideAddr(dst)
	if !d.Allow {
		return d
	}
	if r, ok := s.interceptRefusalAt(dst); ok {
		return r
	}
	return d
}

// interceptRefusalAt is, in denylist, the refusal of a stream to dst that
// names no host when blocked_urls rules apply to dst: rules written for the
// address itself (http://192.0.2.20/x, in its NAT64 form too), or for a
// name it is known to serve.
func (s *Server) interceptRefusalAt(dst netip.Addr) (gate.Decision, bool) {
	p := s.cfg.Policy
	if p.Mode != gate.Denylist {
		return gate.Decision{}, false
	}
	hosts := addrHosts(dst)
	for _, n := range s.namesOf(dst) {
		hosts = append(hosts, gate.Host{Name: n})
	}
	for _, h := range hosts {
		if p.NeedsIntercept(h) {
			return p.InterceptRefusal(h), true
		}
	}
	return gate.Decision{}, false
}

// decideRequest decides an HTTP request for host (as the request names
// it, "" for none) and canonical path, sent to dst. want, when not empty,
// is the CONNECT target the host must name. It returns the decision and the
// canonical host judged.
func (s *Server) decideRequest(ctx context.Context, rawHost, path string, dst netip.Addr, want string) (gate.Decision, string) {
	if rawHost == "" {
		return s.requestByAddr(dst, path), ""
	}
	host, err := gate.CanonicalHost(rawHost)
	if err != nil {
		return gate.Deny(gate.ReasonBadName), rawHost
	}
	if want != "" && host.Name != want {
		return gate.Deny(gate.ReasonNameMismatch), host.String()
	}
	if host.IsAddr() {
		if host.Addr != dst {
			return gate.Deny(gate.ReasonAddrMismatch), host.String()
		}
		return s.requestByAddr(dst, path), host.String()
	}
	d := s.decideBound(ctx, host.Name, s.cfg.Policy.Request(host, path), dst)
	if d.Allow {
		// Rules written for the address bind whatever name is sent to it.
		if r := s.addrURLRule(dst, path); r != nil {
			return gate.Decision{Reason: gate.ReasonURLBlocked, Rule: r}, host.Name
		}
	}
	return d, host.Name
}

// addrHosts are the destination as URL rules may name it: the address, and
// the IPv4 address a NAT64 address reaches.
func addrHosts(dst netip.Addr) []gate.Host {
	hosts := []gate.Host{{Addr: dst}}
	if v4, ok := gate.NAT64Embedded(dst); ok {
		hosts = append(hosts, gate.Host{Addr: v4})
	}
	return hosts
}

// addrURLRule returns, in denylist, a blocked_urls rule written for the
// destination's address that covers path, or nil.
func (s *Server) addrURLRule(dst netip.Addr, path string) *gate.Rule {
	if s.cfg.Policy.Mode != gate.Denylist {
		return nil
	}
	for _, h := range addrHosts(dst) {
		if r := s.cfg.Policy.URLs.Match(h.String(), path); r != nil {
			return r
		}
	}
	return nil
}

// requestByAddr decides an HTTP request that names no host, or names the
// destination's address: by the address, then, in denylist, by the
// blocked_urls of the address itself and of every name it is known to
// belong to (the server may route a hostless request to any of them).
func (s *Server) requestByAddr(a netip.Addr, path string) gate.Decision {
	p := s.cfg.Policy
	d := s.decideAddr(a)
	if !d.Allow || p.Mode != gate.Denylist {
		return d
	}
	if r := s.addrURLRule(a, path); r != nil {
		return gate.Decision{Reason: gate.ReasonURLBlocked, Rule: r}
	}
	for _, n := range s.namesOf(a) {
		if r := p.URLs.Match(n, path); r != nil {
			return gate.Decision{Reason: gate.ReasonURLBlocked, Rule: r}
		}
	}
	return d
}

// decideTarget decides an explicit-proxy target before it is dialled: a
// name by the policy (and, for CONNECT, hasPath false, whether its HTTPS
// would need interception), an IP literal by its address. path is the
// canonical path of an absolute-form request.
func (s *Server) decideTarget(host gate.Host, path string, hasPath bool) gate.Decision {
	p := s.cfg.Policy
	if host.IsAddr() {
		if hasPath {
			return s.requestByAddr(host.Addr, path)
		}
		return s.decideAddr(host.Addr)
	}
	if hasPath {
		return p.Request(host, path)
	}
	d := p.Name(host.Name)
	if d.Allow && p.NeedsIntercept(host) {
		return p.InterceptRefusal(host)
	}
	return d
}

// candidates resolves a target name and keeps the addresses that may be
// dialled for it: never a metadata address, never an address a CIDR rule
// blocks, never flowgate's own port. Every address came from the name's own
// resolution, which is what binds it to the name, and it is these checked
// addresses that are dialled, never the name (a second lookup could answer
// differently). On refusal it returns the decision.
func (s *Server) candidates(ctx context.Context, host gate.Host, port uint16) ([]netip.AddrPort, gate.Decision) {
	if host.IsAddr() {
		ap := netip.AddrPortFrom(host.Addr, port)
		if r := s.local(ap); r != "" {
			return nil, gate.Deny(r)
		}
		return []netip.AddrPort{ap}, gate.Decision{Allow: true}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	addrs, err := s.cfg.Resolve(ctx, host.Name)
	if err != nil || len(addrs) == 0 {
		s.log.Debug("resolving a proxy target", "name", host.Name, "err", err)
		return nil, resolveRefusal(err)
	}
	var out []netip.AddrPort
	refusal := gate.Deny(gate.ReasonResolveFailed)
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		d := s.cfg.Policy.Addr(a)
		if d.Reason == gate.ReasonMetadata || d.Reason == gate.ReasonCIDRBlocked || d.Reason == gate.ReasonNoNetwork {
			refusal = d
			continue
		}
		ap := netip.AddrPortFrom(a, port)
		if r := s.local(ap); r != "" {
			refusal = gate.Deny(r)
			continue
		}
		out = append(out, ap)
	}
	if len(out) == 0 {
		return nil, refusal
	}
	return out, gate.Decision{Allow: true}
}

// resolveRefusal is the decision when resolving a name failed: a refusal
// by the resolver itself (an answer holding a metadata address, an alias
// to a refused name, which the DNS proxy's Resolve returns as a
// *gate.DeniedError) keeps its reason and rule; anything else is
// resolve_failed.
func resolveRefusal(err error) gate.Decision {
	var denied *gate.DeniedError
	if errors.As(err, &denied) && !denied.Decision.Allow {
		return denied.Decision
	}
	return gate.Deny(gate.ReasonResolveFailed)
}

// local says why flowgate does not dial a destination on this host for
// the agent: one of flowgate's own ports on loopback (loop), or a loopback
// address other than 127.0.0.1 and ::1, or an unspecified one (loopback).
// The agent's own loopback is those two (nftables refuses it the rest);
// the rest of 127/8 can hold the namespace's own forwarders, such as
// Docker's embedded resolver at 127.0.0.11, which flowgate's root sockets
// must not reach on the agent's behalf either. "" for any other address.
func (s *Server) local(ap netip.AddrPort) gate.Reason {
	if s.isLoop(ap, netip.AddrPort{}) {
		return gate.ReasonLoop
	}
	a := ap.Addr().Unmap()
	if a.IsUnspecified() || a.IsLoopback() && a != netip.AddrFrom4([4]byte{127, 0, 0, 1}) && a != netip.IPv6Loopback() {
		return gate.ReasonLoopback
	}
	return ""
}
