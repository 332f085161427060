package gate

import (
	"fmt"
	"net/netip"
)

// RuleKind says what a rule matches.
type RuleKind uint8

// The kinds of rule a policy holds.
const (
	KindHost     RuleKind = iota + 1 // a name and every name under it
	KindWildcard                     // *.name: only names under it
	KindService                      // a single-label service name, that name alone
	KindCIDR                         // an address or a prefix
	KindURL                          // a URL path and every path under it, on a host and its subdomains
	KindMetadata                     // built in: a cloud metadata address or name
)

var kindNames = [...]string{
	KindHost: "host", KindWildcard: "wildcard", KindService: "service",
	KindCIDR: "cidr", KindURL: "url", KindMetadata: "metadata",
}

// String names the kind.
func (k RuleKind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Rule is one entry of a compiled policy. Rules are created by Compile and
// never change afterwards; matchers hand out pointers to them.
type Rule struct {
	Kind RuleKind
	// Field is where the rule was written, e.g. "sandbox.blocked_hosts[2]",
	// or "builtin" for the metadata rules.
	Field string
	// Written is the entry as the policy file spells it.
	Written string
	// Canonical is the entry in canonical form: "example.com",
	// "*.example.com", "10.0.0.0/8", "example.org/papers/x".
	Canonical string

	// Host and Path are set for URL rules: the canonical host and the
	// canonical path.
	Host string
	Path string
	// Scheme is the URL rule's scheme, "http" or "https". A URL rule blocks
	// its path on both schemes; the scheme only says whether TLS
	// interception was asked for explicitly.
	Scheme string
	// Prefix is set for CIDR and metadata address rules.
	Prefix netip.Prefix

	pathKey []string
}

// String returns "field canonical", the form decisions report.
func (r *Rule) String() string {
	if r == nil {
		return ""
	}
	return r.Field + " " + r.Canonical
}
