package integration

import (
	"strings"
	"testing"

	"flowgate/gate"
)

// frontingPolicy blocks example.com and one of the two names that share
// 203.0.113.50.
const frontingPolicy = "network_mode: denylist\nblocked_hosts:\n  - example.com\n  - shared-b.example.net\n"

const ruleBlockSharedB = "blocked_hosts[1] shared-b.example.net"

// TestFronting sends one host's name to another host's address, the ways
// an agent could: a TLS SNI, an HTTP Host, a second request on a kept-alive
// connection, a CONNECT target whose tunnel names another host; and the
// two names of one address.
func TestFronting(t *testing.T) {
	inet := startInternet(t)
	s := newSandbox(t, inet)
	s.attach(loadPolicy(t, frontingPolicy))
	env := s.env(false)

	t.Run("TLS SNI of an allowed host to a blocked host's address", func(t *testing.T) {
		mark := s.log.mark()
		r := s.goOne(env, "tls", "-sni", "pypi.org", example4+":443")
		if r.OK || r.Kind != "tls_access_denied" {
			t.Errorf("got %+v, want an access_denied alert", r)
		}
		s.wantDenials(t, mark, deny(gate.ProtoTLS, example4+":443", "pypi.org", gate.ReasonAddrMismatch, ruleDefault))
	})
	t.Run("curl --resolve an allowed name to a blocked host's address", func(t *testing.T) {
		mark := s.log.mark()
		got := s.curl(env, pypiURL, "--resolve", "pypi.org:443:"+example4)
		if got.exit != 35 || !strings.Contains(got.errMsg, "access denied") {
			t.Errorf("got %+v, want exit 35 with a TLS access denied alert", got)
		}
		s.wantDenials(t, mark, deny(gate.ProtoTLS, example4+":443", "pypi.org", gate.ReasonAddrMismatch, ruleDefault))
	})
	t.Run("HTTP Host of an allowed host to a blocked host's address", func(t *testing.T) {
		mark := s.log.mark()
		got := s.curl(env, "http://"+example4+"/hello", "-H", "Host: pypi.org")
		want := "flowgate: pypi.org/hello denied (address_mismatch) by default\n"
		if got.exit != 0 || got.status != 403 || got.body != want {
			t.Errorf("got %+v, want 403 %q", got, want)
		}
		r := s.goOne(env, "http", "-host", "pypi.org", example4+":80")
		if r.Status != 403 || r.Reason != string(gate.ReasonAddrMismatch) {
			t.Errorf("go: got %+v, want 403 address_mismatch", r)
		}
		d := deny(gate.ProtoHTTP, example4+":80", "pypi.org", gate.ReasonAddrMismatch, ruleDefault)
		d.Path = "/hello"
		s.wantDenials(t, mark, d)
	})
	t.Run("TLS SNI of a blocked host to an allowed host's address", func(t *testing.T) {
		mark := s.log.mark()
		r := s.goOne(env, "tls", "-sni", "example.com", pypi4+":443")
		if r.OK || r.Kind != "tls_access_denied" {
			t.Errorf("got %+v, want an access_denied alert", r)
		}
		s.wantDenials(t, mark, deny(gate.ProtoTLS, pypi4+":443", "example.com", gate.ReasonHostBlocked, ruleBlockExample))
	})
	t.Run("every request on a kept-alive connection", func(t *testing.T) {
		mark := s.log.mark()
		rs := s.goClient(env, "http", "-host", "pypi.org,pypi.org,example.com", pypi4+":80")
		if len(rs) != 3 || !rs[0].OK || rs[0].Status != 200 || rs[1].Status != 200 ||
			rs[2].Status != 403 || rs[2].Reason != string(gate.ReasonHostBlocked) {
			t.Errorf("got %+v, want 200, 200, 403 host_blocked", rs)
		}
		rs = s.goClient(env, "http", "-host", "pypi.org,files.pythonhosted.org", pypi4+":80")
		if len(rs) != 2 || rs[0].Status != 200 || rs[1].Status != 403 || rs[1].Reason != string(gate.ReasonAddrMismatch) {
			t.Errorf("got %+v, want 200, 403 address_mismatch", rs)
		}
		blocked := deny(gate.ProtoHTTP, pypi4+":80", "example.com", gate.ReasonHostBlocked, ruleBlockExample)
		blocked.Path = "/hello"
		mismatch := deny(gate.ProtoHTTP, pypi4+":80", "files.pythonhosted.org", gate.ReasonAddrMismatch, ruleDefault)
		mismatch.Path = "/hello"
		s.wantDenials(t, mark, blocked, mismatch)
	})
	t.Run("CONNECT to one host, SNI of another", func(t *testing.T) {
		mark := s.log.mark()
		r := s.goOne(env, "tls", "-connect", "pypi.org:443", "-sni", "example.com", proxyAddr)
		if r.OK || r.Kind != "tls_access_denied" {
			t.Errorf("got %+v, want the tunnel's hello refused with access_denied", r)
		}
		r = s.goOne(env, "tls", "-connect", "pypi.org:443", "-sni", "files.pythonhosted.org", proxyAddr)
		if r.OK || r.Kind != "tls_access_denied" {
			t.Errorf("got %+v, want the tunnel's hello refused with access_denied", r)
		}
		r = s.goOne(env, "tls", "-connect", "pypi.org:443", "-sni", "pypi.org", proxyAddr)
		if !r.OK || r.Status != 200 || r.Body != "simnet pypi.org /\n" {
			t.Errorf("matching SNI: got %+v, want 200", r)
		}
		s.wantDenials(t, mark,
			deny(gate.ProtoConnect, "*", "pypi.org", gate.ReasonNameMismatch, ruleDefault))
	})
	t.Run("two names on one address", func(t *testing.T) {
		mark := s.log.mark()
		r := s.goOne(env, "tls", "-sni", "shared-a.example.net", shared4+":443")
		if !r.OK || r.Status != 200 || r.Body != "simnet shared-a.example.net /\n" {
			t.Errorf("shared-a: got %+v, want 200", r)
		}
		r = s.goOne(env, "tls", "-sni", "shared-b.example.net", shared4+":443")
		if r.OK || r.Kind != "tls_access_denied" {
			t.Errorf("shared-b: got %+v, want access_denied", r)
		}
		rs := s.goClient(env, "http", "-host", "shared-a.example.net,shared-b.example.net", shared4+":80")
		if len(rs) != 2 || rs[0].Status != 200 || rs[1].Status != 403 || rs[1].Reason != string(gate.ReasonHostBlocked) {
			t.Errorf("HTTP shared-a then shared-b: got %+v, want 200, 403 host_blocked", rs)
		}
		// Known gap, by design: without interception the Host inside TLS
		// is never seen, so an allowed SNI carries a blocked Host to a
		// server that serves both names (the simulated CDN does).
		r = s.goOne(env, "tls", "-sni", "shared-a.example.net", "-host", "shared-b.example.net", shared4+":443")
		if !r.OK || r.Status != 200 || r.Body != "simnet shared-b.example.net /\n" {
			t.Errorf("SNI shared-a, Host shared-b: got %+v; the known gap changed, update this test", r)
		}
		httpB := deny(gate.ProtoHTTP, shared4+":80", "shared-b.example.net", gate.ReasonHostBlocked, ruleBlockSharedB)
		httpB.Path = "/hello"
		s.wantDenials(t, mark,
			deny(gate.ProtoTLS, shared4+":443", "shared-b.example.net", gate.ReasonHostBlocked, ruleBlockSharedB), httpB)
	})
}
