package gate

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"
)

// Entry is one value of a policy list with the field path it was read from,
// so that a compile error can name it.
type Entry struct {
	Value string
	Field string // e.g. "sandbox.blocked_hosts[2]"
}

// Spec is a policy as written: the keys of a task's sandbox section.
type Spec struct {
	Mode         Mode
	ModeField    string // where network_mode was read, for errors
	AllowedHosts []Entry
	BlockedHosts []Entry
	BlockedURLs  []Entry
}

// FieldError is a bad policy value. File and Line are filled in by the
// loader; Field is empty for an error about the file as a whole.
type FieldError struct {
	File  string
	Line  int // 1-based line in File, 0 when unknown
	Field string
	Value string
	Msg   string
	Fix   string
}

func (e *FieldError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		if e.Value != "" {
			fmt.Fprintf(&b, ": %q", e.Value)
		}
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	if e.Fix != "" {
		b.WriteString(" (")
		b.WriteString(e.Fix)
		b.WriteString(")")
	}
	return b.String()
}

// Policy is a compiled policy: canonical rules in matchers. It is immutable
// once compiled and safe for concurrent use.
type Policy struct {
	Mode Mode
	// Hosts holds the name rules of allowed_hosts (allowlist) or
	// blocked_hosts (denylist).
	Hosts *HostSet
	// CIDRs holds the address and prefix rules of the same list.
	CIDRs *PrefixSet
	// URLs holds blocked_urls (denylist).
	URLs *URLSet
	// Rules lists every rule in the order written.
	Rules []*Rule
}

// Compile checks and canonicalises a spec. Errors are *FieldError naming the
// entry; the first error is returned.
func Compile(s Spec) (*Policy, error) {
	p := &Policy{Mode: s.Mode, CIDRs: &PrefixSet{}, URLs: &URLSet{}}
	modeField := s.ModeField
	if modeField == "" {
		modeField = "network_mode"
	}
	wrongMode := func(list []Entry, key, mode string) error {
		if len(list) == 0 {
			return nil
		}
		return &FieldError{Field: parentField(list[0].Field, key), Msg: fmt.Sprintf("%s applies only to network_mode %s, not %s", key, mode, s.Mode),
			Fix: fmt.Sprintf("set %s: %s, or remove %s", modeField, mode, key)}
	}
	switch s.Mode {
	case Denylist:
		if err := wrongMode(s.AllowedHosts, "allowed_hosts", "allowlist"); err != nil {
			return nil, err
		}
	case Allowlist:
		if err := wrongMode(s.BlockedHosts, "blocked_hosts", "denylist"); err != nil {
			return nil, err
		}
		if err := wrongMode(s.BlockedURLs, "blocked_urls", "denylist"); err != nil {
			return nil, err
		}
	case Public, NoNetwork:
		for _, l := range []struct {
			list      []Entry
			key, mode string
		}{{s.AllowedHosts, "allowed_hosts", "allowlist"}, {s.BlockedHosts, "blocked_hosts", "denylist"}, {s.BlockedURLs, "blocked_urls", "denylist"}} {
			if err := wrongMode(l.list, l.key, l.mode); err != nil {
				return nil, err
			}
		}
	default:
		return nil, &FieldError{Field: modeField, Value: s.Mode.String(), Msg: "unknown network_mode"}
	}
	hosts := s.BlockedHosts
	if s.Mode == Allowlist {
		hosts = s.AllowedHosts
	}
	p.Hosts = NewHostSet(len(hosts))
	for _, e := range hosts {
		r, err := compileHost(e, s.Mode == Allowlist)
		if err != nil {
			return nil, err
		}
		switch r.Kind {
		case KindHost:
			p.Hosts.addApex(r.Canonical, r)
		case KindWildcard:
			p.Hosts.addWildcard(strings.TrimPrefix(r.Canonical, "*."), r)
		case KindService:
			p.Hosts.addExact(r.Canonical, r)
		case KindCIDR:
			p.CIDRs.Add(r.Prefix, r)
		}
		p.Rules = append(p.Rules, r)
	}
	for _, e := range s.BlockedURLs {
		r, err := compileURL(e)
		if err != nil {
			return nil, err
		}
		p.URLs.add(r)
		p.Rules = append(p.Rules, r)
	}
	return p, nil
}

// parentField turns "sandbox.blocked_hosts[0]" into "sandbox.blocked_hosts".
func parentField(f, key string) string {
	if i := strings.LastIndexByte(f, '['); i > 0 {
		return f[:i]
	}
	if f == "" {
		return key
	}
	return f
}

// compileHost reads one host entry: a name, "*.name", an address, a CIDR, or
// (in allowed_hosts) a single-label service name.
func compileHost(e Entry, services bool) (*Rule, error) {
	v := strings.TrimSpace(e.Value)
	bad := func(msg, fix string) error {
		return &FieldError{Field: e.Field, Value: e.Value, Msg: msg, Fix: fix}
	}
	if v == "" {
		return nil, bad("empty host entry", "remove it")
	}
	if strings.Contains(v, "://") {
		return nil, bad("a URL is not a host entry", "write the host alone, or put the URL in blocked_urls")
	}
	if strings.ContainsAny(v, "/") {
		pfx, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, bad("not a valid CIDR: "+err.Error(), "write an address/length such as 10.0.0.0/8")
		}
		if pfx.Addr().Zone() != "" {
			return nil, bad("zoned IPv6 prefixes are not accepted", "")
		}
		if pfx.Addr().Is4In6() {
			pfx = netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()-96)
		}
		if pfx != pfx.Masked() {
			return nil, bad("CIDR has host bits set", "write "+pfx.Masked().String())
		}
		return &Rule{Kind: KindCIDR, Field: e.Field, Written: e.Value, Canonical: pfx.String(), Prefix: pfx}, nil
	}
	if rest, ok := strings.CutPrefix(v, "*."); ok {
		name, err := CanonicalName(rest)
		if err != nil {
			return nil, bad("not a valid wildcard: "+err.Error(), "write *.example.com")
		}
		if !strings.Contains(name, ".") {
			return nil, bad("a wildcard must name a domain with at least two labels", "write *.example.com, not *.com")
		}
		return &Rule{Kind: KindWildcard, Field: e.Field, Written: e.Value, Canonical: "*." + name}, nil
	}
	if strings.Contains(v, "*") {
		return nil, bad("a wildcard may only be a leading \"*.\"", "write *.example.com")
	}
	h, port, err := ParseTarget(v)
	if err != nil {
		return nil, bad(err.Error(), "")
	}
	if port != 0 {
		return nil, bad("host entries match every port", "remove the port")
	}
	if h.IsAddr() {
		pfx := netip.PrefixFrom(h.Addr, h.Addr.BitLen())
		return &Rule{Kind: KindCIDR, Field: e.Field, Written: e.Value, Canonical: pfx.String(), Prefix: pfx}, nil
	}
	if !strings.Contains(h.Name, ".") {
		if !services {
			return nil, bad("a single-label name is a service name, only meaningful in allowed_hosts", "write the full host name, such as example.com")
		}
		return &Rule{Kind: KindService, Field: e.Field, Written: e.Value, Canonical: h.Name}, nil
	}
	return &Rule{Kind: KindHost, Field: e.Field, Written: e.Value, Canonical: h.Name}, nil
}

// compileURL reads one blocked_urls entry: an absolute http(s) URL with a
// host, no user info, query or fragment.
func compileURL(e Entry) (*Rule, error) {
	bad := func(msg, fix string) error {
		return &FieldError{Field: e.Field, Value: e.Value, Msg: msg, Fix: fix}
	}
	v := strings.TrimSpace(e.Value)
	u, err := url.Parse(v)
	if err != nil {
		return nil, bad("not a valid URL: "+strings.TrimPrefix(err.Error(), "parse "), "")
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" {
		if u.Scheme == "" {
			return nil, bad("not an absolute URL", "write https://"+strings.TrimPrefix(v, "//"))
		}
		return nil, bad(fmt.Sprintf("scheme %q is not http or https", u.Scheme), "")
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, bad("URL has no host", "write https://host/path")
	}
	if u.User != nil {
		return nil, bad("URL has user info", "remove the user@ part")
	}
	if u.RawQuery != "" || u.ForceQuery {
		return nil, bad("blocked_urls match a path and everything under it, not a query", "remove the ?query")
	}
	if u.Fragment != "" || strings.Contains(v, "#") {
		return nil, bad("a fragment is never sent to a server", "remove the #fragment")
	}
	h, _, err := ParseTarget(u.Host)
	if err != nil {
		return nil, bad(err.Error(), "")
	}
	path, err := CanonicalPath(u.EscapedPath())
	if err != nil {
		return nil, bad(err.Error(), "")
	}
	r := &Rule{Kind: KindURL, Field: e.Field, Written: e.Value, Host: h.String(), Path: path, Scheme: scheme,
		Canonical: scheme + "://" + hostForURL(h) + path, pathKey: pathKey(path)}
	return r, nil
}

func hostForURL(h Host) string {
	if h.Addr.Is6() {
		return "[" + h.Addr.String() + "]"
	}
	return h.String()
}

// URLSet holds blocked_urls rules, keyed by host. A rule for example.org
// applies to example.org and every name under it, like a host rule.
type URLSet struct {
	byHost map[string][]*Rule
}

func (s *URLSet) add(r *Rule) {
	if s.byHost == nil {
		s.byHost = make(map[string][]*Rule)
	}
	s.byHost[r.Host] = append(s.byHost[r.Host], r)
}

// Len is the number of URL rules.
func (s *URLSet) Len() int {
	n := 0
	if s != nil {
		for _, l := range s.byHost {
			n += len(l)
		}
	}
	return n
}

// forHost calls f with the rules of host and of each parent domain, most
// specific first, until f returns false.
func (s *URLSet) forHost(host string, f func([]*Rule) bool) {
	if s == nil || len(s.byHost) == 0 {
		return
	}
	if l := s.byHost[host]; l != nil && !f(l) {
		return
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return
	}
	for rest := host; ; {
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			return
		}
		rest = rest[i+1:]
		if l := s.byHost[rest]; l != nil && !f(l) {
			return
		}
	}
}

// HasRules reports whether any URL rule applies to the canonical host, that
// is whether its HTTPS traffic has to be intercepted to be checked.
func (s *URLSet) HasRules(host string) bool {
	found := false
	s.forHost(host, func([]*Rule) bool { found = true; return false })
	return found
}

// First returns the first URL rule that applies to the canonical host (the
// host's own before its parent domains'), or nil.
func (s *URLSet) First(host string) *Rule {
	var first *Rule
	s.forHost(host, func(l []*Rule) bool { first = l[0]; return false })
	return first
}

// Match returns the first URL rule covering the canonical host and
// canonical path, or nil.
func (s *URLSet) Match(host, canonicalPath string) *Rule {
	var hit *Rule
	key := pathKey(canonicalPath)
	s.forHost(host, func(l []*Rule) bool {
		for _, r := range l {
			if pathUnder(key, r.pathKey) {
				hit = r
				return false
			}
		}
		return true
	})
	return hit
}

// HTTPSRules returns the URL rules written with https, in the order
// written; they need TLS interception to be enforced.
func (p *Policy) HTTPSRules() []*Rule {
	var out []*Rule
	for _, r := range p.Rules {
		if r.Kind == KindURL && r.Scheme == "https" {
			out = append(out, r)
		}
	}
	return out
}
