package integration

import (
	"testing"

	"github.com/miekg/dns"

	"flowgate/gate"
)

// TestNoSNIAllowlist connects by address with no SNI: an address the
// agent never looked up is refused by the kernel (a reset, no record);
// once the agent has resolved pypi.org, its addresses are admitted as
// learned, and only those.
func TestNoSNIAllowlist(t *testing.T) {
	inet := startInternet(t)
	s := newSandbox(t, inet)
	s.attach(loadPolicy(t, allowlistPolicy))
	env := s.env(false)

	mark := s.log.mark()
	for _, a := range []string{example4 + ":443", pypi4 + ":443", "[" + pypi6 + "]:443"} {
		if r := s.goOne(env, "tls", "-sni", "", a); r.Kind != "refused" {
			t.Errorf("%s before any lookup: %+v, want refused by the kernel", a, r)
		}
	}
	s.wantDenials(t, mark)
	if n := len(s.log.since(mark)); n != 0 {
		t.Errorf("%d records for connections the kernel refused, want none", n)
	}

	if r := s.goOne(env, "lookup", "pypi.org"); !r.OK {
		t.Fatalf("lookup pypi.org: %+v", r)
	}
	mark = s.log.mark()
	for _, a := range []string{pypi4, pypi6} {
		target := "[" + a + "]:443"
		if a == pypi4 {
			target = a + ":443"
		}
		r := s.goOne(env, "tls", "-sni", "", target)
		if !r.OK || r.Status != 200 || r.Body != "simnet pypi.org /\n" || r.Addr != a {
			t.Errorf("%s after the lookup: %+v, want pypi.org's page", target, r)
		}
	}
	s.wantAllowed(t, mark,
		allow(gate.ProtoTLS, pypi4+":443", "", gate.ReasonLearned, ruleAllowPypi),
		allow(gate.ProtoTLS, "["+pypi6+"]:443", "", gate.ReasonLearned, ruleAllowPypi))
	// Learning pypi.org admits its addresses, not another allowed host's.
	if r := s.goOne(env, "tls", "-sni", "", "198.51.100.41:443"); r.Kind != "refused" {
		t.Errorf("files.pythonhosted.org's address, never looked up: %+v, want refused", r)
	}
	s.wantDenials(t, mark)
}

// TestNoSNIDenylist connects by address with no SNI in denylist: an
// address of a blocked host is refused (address_blocked) and one of a host
// whose paths blocked_urls restricts is refused (needs_intercept), though
// the agent never looked either name up: flowgate resolved the names its
// policy spells out when it attached, so an agent that finds the address
// elsewhere (DNS over HTTPS through an allowed host) is refused the same
// way. Other addresses pass.
func TestNoSNIDenylist(t *testing.T) {
	inet := startInternet(t)
	s := newSandbox(t, inet)
	s.attach(loadPolicy(t, denylistPolicy+"blocked_urls:\n  - http://pypi.org/private/\n"))
	env := s.env(false)

	mark := s.log.mark()
	if r := s.goOne(env, "tls", "-sni", "", "192.0.2.20:443"); !r.OK || r.Body != "simnet example.org /\n" {
		t.Errorf("example.org's address, not blocked: %+v, want its page", r)
	}
	s.wantAllowed(t, mark, allow(gate.ProtoTLS, "192.0.2.20:443", "", gate.ReasonNotBlocked, ruleDefault))

	mark = s.log.mark()
	for _, c := range []struct{ dest, want string }{
		{example4 + ":443", "tls_access_denied"},
		{"[2001:db8::10]:443", "tls_access_denied"},
		{pypi4 + ":443", "tls_access_denied"},
	} {
		if r := s.goOne(env, "tls", "-sni", "", c.dest); r.Kind != c.want {
			t.Errorf("%s, never looked up by the agent: %+v, want %s", c.dest, r, c.want)
		}
	}
	s.wantDenials(t, mark,
		deny(gate.ProtoTLS, example4+":443", "", gate.ReasonAddressBlocked, ruleBlockExample),
		deny(gate.ProtoTLS, "[2001:db8::10]:443", "", gate.ReasonAddressBlocked, ruleBlockExample),
		deny(gate.ProtoTLS, pypi4+":443", "", gate.ReasonNeedsIntercept, "blocked_urls[0] http://pypi.org/private/"))
	for _, q := range []struct {
		name  string
		qtype uint16
	}{{"example.com", dns.TypeA}, {"example.com", dns.TypeAAAA}, {"pypi.org", dns.TypeA}} {
		if inet.QueriesOf(q.name, q.qtype) == 0 {
			t.Errorf("flowgate never looked up %s %s", q.name, dns.TypeToString[q.qtype])
		}
	}
	// Plain TCP and HTTP to that address are judged by it too.
	mark = s.log.mark()
	if r := s.goClient(env, "http", "-host", example4, example4+":80"); r[0].Status != 403 || r[0].Reason != string(gate.ReasonAddressBlocked) {
		t.Errorf("HTTP by address: %+v, want 403 address_blocked", r)
	}
	d := deny(gate.ProtoHTTP, example4+":80", example4, gate.ReasonAddressBlocked, ruleBlockExample)
	d.Path = "/hello"
	s.wantDenials(t, mark, d)
}
