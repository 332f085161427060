package gate

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func mustCompile(t testing.TB, s Spec) *Policy {
	t.Helper()
	p, err := Compile(s)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return p
}

func entries(field string, vals ...string) []Entry {
	out := make([]Entry, len(vals))
	for i, v := range vals {
		out[i] = Entry{Value: v, Field: fmt.Sprintf("%s[%d]", field, i)}
	}
	return out
}

func TestHostMatching(t *testing.T) {
	p := mustCompile(t, Spec{Mode: Denylist, BlockedHosts: entries("sandbox.blocked_hosts",
		"example.com", "*.wild.example.net", "Bücher.example", "10.0.0.0/8", "2001:db8:bad::/48", "192.0.2.99")})
	tests := []struct {
		target string
		reason Reason
		rule   string
	}{
		{"example.com", ReasonHostBlocked, "sandbox.blocked_hosts[0] example.com"},
		{"EXAMPLE.COM.", ReasonHostBlocked, "sandbox.blocked_hosts[0] example.com"},
		{"www.example.com", ReasonHostBlocked, "sandbox.blocked_hosts[0] example.com"},
		{"a.b.c.example.com:443", ReasonHostBlocked, "sandbox.blocked_hosts[0] example.com"},
		{"badexample.com", ReasonNotBlocked, "default"},
		{"example.com.evil.net", ReasonNotBlocked, "default"},
		{"example.co", ReasonNotBlocked, "default"},
		{"com", ReasonNotBlocked, "default"},
		{"wild.example.net", ReasonNotBlocked, "default"},
		{"a.wild.example.net", ReasonHostBlocked, "sandbox.blocked_hosts[1] *.wild.example.net"},
		{"a.b.wild.example.net", ReasonHostBlocked, "sandbox.blocked_hosts[1] *.wild.example.net"},
		{"xn--bcher-kva.example", ReasonHostBlocked, "sandbox.blocked_hosts[2] xn--bcher-kva.example"},
		{"www.BÜCHER.example", ReasonHostBlocked, "sandbox.blocked_hosts[2] xn--bcher-kva.example"},
		{"10.1.2.3", ReasonCIDRBlocked, "sandbox.blocked_hosts[3] 10.0.0.0/8"},
		{"[::ffff:10.1.2.3]:80", ReasonCIDRBlocked, "sandbox.blocked_hosts[3] 10.0.0.0/8"},
		{"11.0.0.1", ReasonNotBlocked, "default"},
		{"[2001:db8:bad::1]:443", ReasonCIDRBlocked, "sandbox.blocked_hosts[4] 2001:db8:bad::/48"},
		{"2001:db8:bae::1", ReasonNotBlocked, "default"},
		{"192.0.2.99", ReasonCIDRBlocked, "sandbox.blocked_hosts[5] 192.0.2.99/32"},
		{"169.254.169.254", ReasonMetadata, "builtin 169.254.0.0/16"},
		{"[64:ff9b::a9fe:a9fe]", ReasonMetadata, "builtin 64:ff9b::a9fe:0/112"},
		{"fd00:ec2::254", ReasonMetadata, "builtin fd00:ec2::254/128"},
		{"metadata.google.internal", ReasonMetadata, "builtin metadata.google.internal"},
		{"use-application-dns.net", ReasonDoHCanary, "default"},
	}
	for _, tt := range tests {
		d, err := p.Target(tt.target)
		if err != nil {
			t.Errorf("Target(%q): %v", tt.target, err)
			continue
		}
		if d.Reason != tt.reason || d.RuleText() != tt.rule {
			t.Errorf("Target(%q) = %s/%s by %q; want %s by %q", tt.target, d.Verdict(), d.Reason, d.RuleText(), tt.reason, tt.rule)
		}
		if d.Allow != (tt.reason == ReasonNotBlocked) {
			t.Errorf("Target(%q) verdict %s with reason %s", tt.target, d.Verdict(), d.Reason)
		}
	}
}

func TestAllowlistMatching(t *testing.T) {
	p := mustCompile(t, Spec{Mode: Allowlist, AllowedHosts: entries("sandbox.allowed_hosts",
		"pypi.org", "*.pythonhosted.org", "db", "172.16.0.0/12")})
	tests := []struct {
		target string
		reason Reason
	}{
		{"pypi.org", ReasonHostAllowed},
		{"files.pypi.org", ReasonHostAllowed},
		{"pythonhosted.org", ReasonNotAllowed},
		{"files.pythonhosted.org", ReasonHostAllowed},
		{"db", ReasonServiceAllowed},
		{"x.db", ReasonNotAllowed},
		{"example.com", ReasonNotAllowed},
		{"172.20.0.5", ReasonCIDRAllowed},
		{"192.0.2.1", ReasonUnknownAddress},
		{"169.254.169.254", ReasonMetadata},
		{"use-application-dns.net", ReasonDoHCanary},
	}
	for _, tt := range tests {
		d, err := p.Target(tt.target)
		if err != nil || d.Reason != tt.reason {
			t.Errorf("Target(%q) = %s/%s, %v; want %s", tt.target, d.Verdict(), d.Reason, err, tt.reason)
		}
	}
	empty := mustCompile(t, Spec{Mode: Allowlist})
	if d := empty.Name("pypi.org"); d.Allow || d.Reason != ReasonNotAllowed {
		t.Errorf("empty allowlist: pypi.org = %s/%s, want deny/not_allowed", d.Verdict(), d.Reason)
	}
}

func TestModeDefaults(t *testing.T) {
	pub := mustCompile(t, Spec{Mode: Public})
	nonet := mustCompile(t, Spec{Mode: NoNetwork})
	for _, c := range []struct {
		p      *Policy
		target string
		reason Reason
	}{
		{pub, "example.com", ReasonPublic},
		{pub, "192.0.2.1", ReasonPublic},
		{pub, "169.254.169.254", ReasonMetadata},
		{nonet, "example.com", ReasonNoNetwork},
		{nonet, "192.0.2.1", ReasonNoNetwork},
		{nonet, "[fd20:ce::254]:80", ReasonMetadata},
	} {
		d, err := c.p.Target(c.target)
		if err != nil || d.Reason != c.reason {
			t.Errorf("%s: Target(%q) = %s, %v; want %s", c.p.Mode, c.target, d.Reason, err, c.reason)
		}
	}
}

func TestCompileErrors(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		want string // substrings, "|"-separated
	}{
		{"blocked_hosts under allowlist", Spec{Mode: Allowlist, BlockedHosts: entries("sandbox.blocked_hosts", "a.com")},
			"sandbox.blocked_hosts: blocked_hosts applies only to network_mode denylist, not allowlist|set network_mode: denylist"},
		{"allowed_hosts under denylist", Spec{Mode: Denylist, AllowedHosts: entries("sandbox.allowed_hosts", "a.com")},
			"sandbox.allowed_hosts: allowed_hosts applies only to network_mode allowlist, not denylist"},
		{"blocked_urls under public", Spec{Mode: Public, BlockedURLs: entries("sandbox.blocked_urls", "https://a.com/x")},
			"blocked_urls applies only to network_mode denylist, not public"},
		{"allowed_hosts under no-network", Spec{Mode: NoNetwork, AllowedHosts: entries("sandbox.allowed_hosts", "a.com")},
			"allowed_hosts applies only to network_mode allowlist, not no-network"},
		{"empty host", Spec{Mode: Denylist, BlockedHosts: entries("sandbox.blocked_hosts", " ")}, `sandbox.blocked_hosts[0]: " ": empty host entry`},
		{"URL as host", Spec{Mode: Denylist, BlockedHosts: entries("sandbox.blocked_hosts", "https://a.com/x")}, "a URL is not a host entry|put the URL in blocked_urls"},
		{"bad CIDR", Spec{Mode: Allowlist, AllowedHosts: entries("sandbox.allowed_hosts", "10.0.0.0/33")}, `sandbox.allowed_hosts[0]: "10.0.0.0/33": not a valid CIDR`},
		{"CIDR host bits", Spec{Mode: Allowlist, AllowedHosts: entries("sandbox.allowed_hosts", "10.0.0.1/8")}, "host bits set|write 10.0.0.0/8"},
		{"bad wildcard", Spec{Mode: Allowlist, AllowedHosts: entries("sandbox.allowed_hosts", "*.com")}, "at least two labels"},
		{"mid wildcard", Spec{Mode: Allowlist, AllowedHosts: entries("sandbox.allowed_hosts", "a.*.com")}, `only be a leading "*."`},
		{"bad name", Spec{Mode: Denylist, BlockedHosts: entries("sandbox.blocked_hosts", "exa_mple.com")}, `sandbox.blocked_hosts[0]: "exa_mple.com": host "exa_mple.com": not a valid host name`},
		{"port on host", Spec{Mode: Denylist, BlockedHosts: entries("sandbox.blocked_hosts", "a.com:443")}, "match every port|remove the port"},
		{"service in denylist", Spec{Mode: Denylist, BlockedHosts: entries("sandbox.blocked_hosts", "db")}, "single-label name is a service name"},
		{"relative URL", Spec{Mode: Denylist, BlockedURLs: entries("sandbox.blocked_urls", "example.org/papers")}, "not an absolute URL|write https://example.org/papers"},
		{"ftp URL", Spec{Mode: Denylist, BlockedURLs: entries("sandbox.blocked_urls", "ftp://a.com/x")}, `scheme "ftp" is not http or https`},
		{"URL without host", Spec{Mode: Denylist, BlockedURLs: entries("sandbox.blocked_urls", "https:///x")}, "URL has no host"},
		{"URL user info", Spec{Mode: Denylist, BlockedURLs: entries("sandbox.blocked_urls", "https://u:p@a.com/x")}, "user info"},
		{"URL query", Spec{Mode: Denylist, BlockedURLs: entries("sandbox.blocked_urls", "https://a.com/x?id=1")}, "not a query|remove the ?query"},
		{"URL fragment", Spec{Mode: Denylist, BlockedURLs: entries("sandbox.blocked_urls", "https://a.com/x#top")}, "fragment"},
		{"URL bad path", Spec{Mode: Denylist, BlockedURLs: entries("sandbox.blocked_urls", "https://a.com/%zz")}, "not a valid URL"},
		{"URL bad host", Spec{Mode: Denylist, BlockedURLs: entries("sandbox.blocked_urls", "https://a..com/x")}, "empty label"},
	}
	for _, tt := range tests {
		_, err := Compile(tt.spec)
		if err == nil {
			t.Errorf("%s: Compile succeeded, want error", tt.name)
			continue
		}
		if _, ok := err.(*FieldError); !ok {
			t.Errorf("%s: error %T, want *FieldError", tt.name, err)
		}
		for _, w := range strings.Split(tt.want, "|") {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not contain %q", tt.name, err, w)
			}
		}
	}
}

func TestCIDRMappedAndOverlap(t *testing.T) {
	p := mustCompile(t, Spec{Mode: Allowlist, AllowedHosts: entries("allowed_hosts", "::ffff:192.0.2.0/120", "192.0.2.0/25")})
	if d := p.Addr(netip.MustParseAddr("192.0.2.7")); d.Reason != ReasonCIDRAllowed || d.Rule.Canonical != "192.0.2.0/25" {
		t.Errorf("longest prefix: got %s by %s", d.Reason, d.RuleText())
	}
	if d := p.Addr(netip.MustParseAddr("192.0.2.200")); d.Reason != ReasonCIDRAllowed || d.Rule.Canonical != "192.0.2.0/24" {
		t.Errorf("mapped prefix: got %s by %s", d.Reason, d.RuleText())
	}
}

func TestParseMode(t *testing.T) {
	for _, n := range ModeNames() {
		m, err := ParseMode(n)
		if err != nil || m.String() != n {
			t.Errorf("ParseMode(%q) = %v, %v", n, m, err)
		}
	}
	if m, err := ParseMode(""); err != nil || m != Public {
		t.Errorf("ParseMode(\"\") = %v, %v; want public", m, err)
	}
	for in, hint := range map[string]string{"no_network": `"no-network"`, "blacklist": `"denylist"`, "Allowlist": `"allowlist"`, "open": "valid: public, no-network, denylist, allowlist"} {
		if _, err := ParseMode(in); err == nil || !strings.Contains(err.Error(), hint) {
			t.Errorf("ParseMode(%q) err = %v, want %s", in, err, hint)
		}
	}
}

func TestTargetErrors(t *testing.T) {
	p := mustCompile(t, Spec{Mode: Public})
	for _, in := range []string{"", "ftp://a.com/", "https:///x", "exa_mple.com", "https://a.com/%zz", "a.com:99999"} {
		if _, err := p.Target(in); err == nil {
			t.Errorf("Target(%q): no error", in)
		}
	}
}

// TestTargetNeedsIntercept: check answers as this build's gateway does,
// which refuses HTTPS to a host that URL rules cover (no interception).
func TestTargetNeedsIntercept(t *testing.T) {
	p := mustCompile(t, Spec{Mode: Denylist, BlockedURLs: entries("sandbox.blocked_urls", "http://example.org/papers/x", "http://www.example.org/y")})
	tests := []struct {
		target string
		reason Reason
	}{
		{"https://example.org/papers/x", ReasonURLBlocked},
		{"https://example.org/other", ReasonNeedsIntercept},
		{"HTTPS://www.example.org/", ReasonNeedsIntercept},
		{"http://example.org/other", ReasonNotBlocked},
		{"http://example.org/papers/x/y", ReasonURLBlocked},
		{"https://example.com/other", ReasonNotBlocked},
		{"example.org", ReasonNotBlocked},
		{"example.org:443", ReasonNotBlocked},
	}
	for _, tt := range tests {
		d, err := p.Target(tt.target)
		if err != nil || d.Reason != tt.reason || d.Allow != (tt.reason == ReasonNotBlocked) {
			t.Errorf("Target(%q) = %s/%s, %v; want %s", tt.target, d.Verdict(), d.Reason, err, tt.reason)
		}
	}
	// A needs_intercept refusal names the rule that covers the host: the
	// host's own before its parent domain's.
	for target, want := range map[string]string{
		"https://example.org/other":     "sandbox.blocked_urls[0] http://example.org/papers/x",
		"https://www.example.org/":      "sandbox.blocked_urls[1] http://www.example.org/y",
		"https://cdn.www.example.org/z": "sandbox.blocked_urls[1] http://www.example.org/y",
	} {
		if d, _ := p.Target(target); d.Reason != ReasonNeedsIntercept || d.Rule.String() != want {
			t.Errorf("Target(%q) = %s by %q, want needs_intercept by %q", target, d.Reason, d.Rule, want)
		}
	}
}

// TestNAT64Forms: in denylist an address in 64:ff9b::/96 is also judged as
// the IPv4 address it reaches; allowlist does not widen.
func TestNAT64Forms(t *testing.T) {
	if v4, ok := NAT64Embedded(netip.MustParseAddr("64:ff9b::c633:6409")); !ok || v4 != netip.MustParseAddr("198.51.100.9") {
		t.Errorf("NAT64Embedded(64:ff9b::c633:6409) = %v, %v", v4, ok)
	}
	for _, a := range []string{"64:ff9b:1::c633:6409", "2001:db8::c633:6409", "198.51.100.9"} {
		if v4, ok := NAT64Embedded(netip.MustParseAddr(a)); ok {
			t.Errorf("NAT64Embedded(%s) = %v, want none", a, v4)
		}
	}
	deny := mustCompile(t, Spec{Mode: Denylist, BlockedHosts: entries("sandbox.blocked_hosts", "198.51.100.0/24")})
	if d := deny.Addr(netip.MustParseAddr("64:ff9b::c633:6409")); d.Allow || d.Reason != ReasonCIDRBlocked || d.Rule.String() != "sandbox.blocked_hosts[0] 198.51.100.0/24" {
		t.Errorf("denylist: the NAT64 form of a blocked address: %s %s %v", d.Verdict(), d.Reason, d.Rule)
	}
	if d := deny.Addr(netip.MustParseAddr("64:ff9b::cb00:7109")); !d.Allow {
		t.Errorf("denylist: the NAT64 form of another address: %s %s", d.Verdict(), d.Reason)
	}
	allow := mustCompile(t, Spec{Mode: Allowlist, AllowedHosts: entries("sandbox.allowed_hosts", "198.51.100.0/24")})
	if d := allow.Addr(netip.MustParseAddr("64:ff9b::c633:6409")); d.Allow {
		t.Errorf("allowlist admits the NAT64 form of an allowed CIDR: %s", d.Reason)
	}
}

// TestTargetLoopback: check answers loopback targets as the sandbox does:
// in the restricted modes 127.0.0.1, ::1, the unspecified addresses (a
// connect to them reaches loopback) and localhost are the agent's own
// (local), other loopback addresses are refused (loopback); public mode
// leaves loopback alone.
func TestTargetLoopback(t *testing.T) {
	deny := mustCompile(t, Spec{Mode: Denylist})
	none := mustCompile(t, Spec{Mode: NoNetwork})
	all := mustCompile(t, Spec{Mode: Allowlist, AllowedHosts: entries("sandbox.allowed_hosts", "0.0.0.0/0")})
	pub := mustCompile(t, Spec{Mode: Public})
	for _, c := range []struct {
		p      *Policy
		target string
		reason Reason
	}{
		{deny, "127.0.0.1:8080", ReasonLocal}, {none, "127.0.0.1", ReasonLocal}, {none, "http://[::1]:8080/v1", ReasonLocal},
		{deny, "127.0.0.2", ReasonLoopback}, {deny, "127.0.0.11:53", ReasonLoopback}, {deny, "0.0.0.0", ReasonLocal},
		{all, "127.0.0.2", ReasonLoopback}, {all, "http://[::]:80/", ReasonLocal}, {none, "[::ffff:127.0.0.2]:80", ReasonLoopback},
		{none, "localhost:8080", ReasonLocal}, {all, "http://localhost/v1", ReasonLocal},
		{pub, "127.0.0.2", ReasonPublic},
	} {
		d, err := c.p.Target(c.target)
		if err != nil || d.Reason != c.reason || d.Allow != (c.reason != ReasonLoopback) {
			t.Errorf("%s: Target(%q) = %s %s, %v; want %s", c.p.Mode, c.target, d.Verdict(), d.Reason, err, c.reason)
		}
	}
}
