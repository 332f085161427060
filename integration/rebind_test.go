package integration

import (
	"strings"
	"testing"

	"flowgate/gate"
	"flowgate/integration/simnet"
)

// rebindPolicy blocks cdn.example.net, the target of the alias
// static.example.com.
const rebindPolicy = "network_mode: denylist\nblocked_hosts:\n  - cdn.example.net\n"

const ruleBlockCDN = "blocked_hosts[0] cdn.example.net"

// TestResolverRefusals checks that a name refused for what it resolves to
// (DNS rebinding: an ordinary name whose answer is the metadata address;
// an alias to a blocked host) is refused with the same reason on every
// path the agent can take: its own DNS query, the explicit proxy (an
// absolute-form request and CONNECT), and a TLS SNI to an ordinary address,
// which flowgate resolves itself to bind the name. A refusal by the
// resolver is a policy refusal (403 with its reason), not a failure to
// resolve (502 resolve_failed).
func TestResolverRefusals(t *testing.T) {
	inet := startInternet(t)
	s := newSandbox(t, inet)
	s.attach(loadPolicy(t, rebindPolicy))
	const metaURL = "http://" + simnet.RebindName + "/latest/meta-data/"
	// flowgate asks A and AAAA at once and reports the first refusal
	// back, so the rule may be the IPv4 or the IPv6 metadata rule.
	const metaRule = "*"
	cases := []struct {
		name, host string
		reason     gate.Reason
		rule       string
	}{
		{"rebinding to the metadata address", simnet.RebindName, gate.ReasonMetadata, metaRule},
		{"alias to a blocked host", "static.example.com", gate.ReasonHostBlocked, ruleBlockCDN},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Run("agent's DNS", func(t *testing.T) {
				mark := s.log.mark()
				if r := s.goOne(s.env(false), "lookup", c.host); r.Kind != "nxdomain" {
					t.Errorf("lookup %s: %+v, want NXDOMAIN", c.host, r)
				}
				s.wantDenials(t, mark, deny(gate.ProtoDNS, resolver4, c.host, c.reason, c.rule))
			})
			t.Run("proxy request", func(t *testing.T) {
				mark := s.log.mark()
				u := "http://" + c.host + "/latest/meta-data/"
				got := s.curl(s.env(true), u)
				if got.exit != 0 || got.status != 403 || !strings.HasPrefix(got.body, "flowgate: "+c.host+"/latest/meta-data/ denied ("+string(c.reason)+") by ") {
					t.Errorf("curl %s via the proxy: %+v, want 403 %s", u, got, c.reason)
				}
				d := deny(gate.ProtoHTTP, "", c.host, c.reason, c.rule)
				d.Path = "/latest/meta-data/"
				s.wantDenials(t, mark, d)
			})
			t.Run("CONNECT", func(t *testing.T) {
				mark := s.log.mark()
				r := s.goOne(s.env(false), "tls", "-connect", c.host+":443", "-sni", c.host, proxyAddr)
				if r.Kind != "proxy_status" || r.Status != 403 || r.Reason != string(c.reason) {
					t.Errorf("CONNECT %s: %+v, want 403 %s", c.host, r, c.reason)
				}
				s.wantDenials(t, mark, deny(gate.ProtoConnect, "", c.host, c.reason, c.rule))
			})
			t.Run("TLS SNI to an ordinary address", func(t *testing.T) {
				mark := s.log.mark()
				r := s.goOne(s.env(false), "tls", "-sni", c.host, pypi4+":443")
				if r.Kind != "tls_access_denied" {
					t.Errorf("SNI %s to %s: %+v, want access_denied", c.host, pypi4, r)
				}
				s.wantDenials(t, mark, deny(gate.ProtoTLS, pypi4+":443", c.host, c.reason, c.rule))
			})
		})
	}
	if got := s.python(s.env(true), metaURL)[metaURL]; got != "reachable (HTTP 403)" {
		t.Errorf("python %s via the proxy: %s, want reachable (HTTP 403)", metaURL, got)
	}
}
