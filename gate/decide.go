package gate

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"
)

// DoHCanary is the name whose NXDOMAIN tells browsers not to turn on DNS
// over HTTPS by themselves, which would bypass the DNS proxy.
const DoHCanary = "use-application-dns.net"

// Name decides a canonical host name, as a DNS query, a TLS SNI, a Host
// header or a CONNECT target names it. It does not look at addresses: a name
// allowed here still has to match its destination (see Names).
func (p *Policy) Name(name string) Decision {
	if r := metadataHosts.Match(name); r != nil {
		return deny(ReasonMetadata, r)
	}
	switch p.Mode {
	case Public:
		return allow(ReasonPublic, nil)
	case NoNetwork:
		return deny(ReasonNoNetwork, nil)
	case Denylist:
		if name == DoHCanary {
			return deny(ReasonDoHCanary, nil)
		}
		if r := p.Hosts.Match(name); r != nil {
			return deny(ReasonHostBlocked, r)
		}
		return allow(ReasonNotBlocked, nil)
	case Allowlist:
		if name == DoHCanary {
			return deny(ReasonDoHCanary, nil)
		}
		if r := p.Hosts.Match(name); r != nil {
			if r.Kind == KindService {
				return allow(ReasonServiceAllowed, r)
			}
			return allow(ReasonHostAllowed, r)
		}
		return deny(ReasonNotAllowed, nil)
	}
	return deny(ReasonNotAllowed, nil)
}

// Addr decides a destination address by the address rules alone: metadata,
// the mode, and CIDR rules. In allowlist an address no rule names is denied
// here; the data plane admits it when it was learned from an allowed answer.
func (p *Policy) Addr(a netip.Addr) Decision {
	a = a.Unmap().WithZone("")
	if r := metadataAddrs.Match(a); r != nil {
		return deny(ReasonMetadata, r)
	}
	switch p.Mode {
	case Public:
		return allow(ReasonPublic, nil)
	case NoNetwork:
		return deny(ReasonNoNetwork, nil)
	case Denylist:
		if r := p.CIDRs.Match(a); r != nil {
			return deny(ReasonCIDRBlocked, r)
		}
		if v4, ok := NAT64Embedded(a); ok {
			if r := p.CIDRs.Match(v4); r != nil {
				return deny(ReasonCIDRBlocked, r)
			}
		}
		return allow(ReasonNotBlocked, nil)
	case Allowlist:
		if r := p.CIDRs.Match(a); r != nil {
			return allow(ReasonCIDRAllowed, r)
		}
		return deny(ReasonUnknownAddress, nil)
	}
	return deny(ReasonNotAllowed, nil)
}

// nat64Prefix is the well-known NAT64 prefix (RFC 6052): behind a NAT64
// gateway, 64:ff9b::c000:20a reaches 192.0.2.10.
var nat64Prefix = netip.MustParsePrefix("64:ff9b::/96")

// NAT64Embedded returns the IPv4 address a well-known-prefix NAT64 address
// reaches. In denylist an address is judged as itself and as that address,
// so that a blocked IPv4 address or host is not reached through its NAT64
// form (allowlist admits only what it learned or a rule names, so it needs
// no such widening).
func NAT64Embedded(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() || !nat64Prefix.Contains(a) {
		return netip.Addr{}, false
	}
	b := a.As16()
	return netip.AddrFrom4([4]byte(b[12:])), true
}

// Host decides a canonical host: by name, or by address for an IP literal.
func (p *Policy) Host(h Host) Decision {
	if h.IsAddr() {
		return p.Addr(h.Addr)
	}
	return p.Name(h.Name)
}

// Request decides an HTTP request: the host, then the blocked_urls rules
// against the canonical path (from CanonicalPath).
func (p *Policy) Request(h Host, canonicalPath string) Decision {
	d := p.Host(h)
	if !d.Allow || p.Mode != Denylist {
		return d
	}
	if r := p.URLs.Match(h.String(), canonicalPath); r != nil {
		return deny(ReasonURLBlocked, r)
	}
	return d
}

// NeedsIntercept reports whether HTTPS to this host can only be enforced by
// reading its requests: some blocked_urls rule covers it.
func (p *Policy) NeedsIntercept(h Host) bool {
	return p.Mode == Denylist && p.URLs.HasRules(h.String())
}

// InterceptRefusal is the refusal of HTTPS to a host that NeedsIntercept,
// naming the first blocked_urls rule that covers it.
func (p *Policy) InterceptRefusal(h Host) Decision {
	return deny(ReasonNeedsIntercept, p.URLs.First(h.String()))
}

// local decides, in the restricted modes, a loopback or unspecified
// address as the sandbox does: 127.0.0.1 and ::1 are the agent's own
// loopback, always reachable (the model proxy listens there), and so are
// 0.0.0.0 and :: (a connect to them goes to 127.0.0.1 and ::1) and the
// name localhost (the sandbox's /etc/hosts); any other loopback address is
// refused (reason loopback: such addresses can hold forwarders, as
// Docker's resolver at 127.0.0.11).
func (p *Policy) local(h Host) (Decision, bool) {
	if p.Mode == Public {
		return Decision{}, false
	}
	if h.Name == "localhost" {
		return allow(ReasonLocal, nil), true
	}
	if !h.IsAddr() {
		return Decision{}, false
	}
	a := h.Addr.Unmap()
	switch {
	case a == netip.AddrFrom4([4]byte{127, 0, 0, 1}) || a == netip.IPv6Loopback() || a.IsUnspecified():
		return allow(ReasonLocal, nil), true
	case a.IsLoopback():
		return deny(ReasonLoopback, nil), true
	}
	return Decision{}, false
}

// Target decides what `flowgate check` is given: a host, "host:port", or an
// http(s) URL (its query is ignored), without touching the network, as the
// gateway of this build would. An https URL to a host that blocked_urls
// rules cover is refused whole (needs_intercept) unless its path is
// blocked: without TLS interception no path of it can be checked.
func (p *Policy) Target(t string) (Decision, error) {
	if !strings.Contains(t, "://") {
		h, _, err := ParseTarget(t)
		if err != nil {
			return Decision{}, err
		}
		if d, ok := p.local(h); ok {
			return d, nil
		}
		return p.Host(h), nil
	}
	u, err := url.Parse(t)
	if err != nil {
		return Decision{}, fmt.Errorf("target %q: %w", t, err)
	}
	if s := strings.ToLower(u.Scheme); s != "http" && s != "https" {
		return Decision{}, fmt.Errorf("target %q: scheme %q is not http or https", t, u.Scheme)
	}
	if u.Host == "" || u.Opaque != "" {
		return Decision{}, fmt.Errorf("target %q: URL has no host", t)
	}
	h, _, err := ParseTarget(u.Host)
	if err != nil {
		return Decision{}, err
	}
	if d, ok := p.local(h); ok {
		return d, nil
	}
	path, err := CanonicalPath(u.EscapedPath())
	if err != nil {
		return Decision{}, fmt.Errorf("target %q: %w", t, err)
	}
	d := p.Request(h, path)
	if d.Allow && strings.EqualFold(u.Scheme, "https") && p.NeedsIntercept(h) {
		return p.InterceptRefusal(h), nil
	}
	return d, nil
}
