package integration

import (
	"strings"
	"testing"

	"flowgate/gate"
)

// alertRecord is a TLS warning alert (no_renegotiation). Go's TLS servers
// skip it before the ClientHello, so a stream that starts with it is TLS
// whose hello must be judged like any other.
const alertRecord = "15030100020164"

// TestTLSAfterAnotherRecord: a ClientHello behind another TLS record is
// judged by its SNI, transparently and in a CONNECT tunnel, in denylist and
// allowlist; not passed on by its address as plain TCP.
func TestTLSAfterAnotherRecord(t *testing.T) {
	inet := startInternet(t)
	t.Run("denylist", func(t *testing.T) {
		s := newSandbox(t, inet)
		s.attach(loadPolicy(t, denylistPolicy+"blocked_urls:\n  - http://example.org/papers/\n"))
		env := s.env(false)
		mark := s.log.mark()
		for _, c := range []struct{ sni, dest string }{{"example.com", pypi4 + ":443"}, {"example.org", "192.0.2.20:443"}} {
			if r := s.goOne(env, "tls", "-sni", c.sni, "-prefix", alertRecord, c.dest); r.Kind != "tls_access_denied" {
				t.Errorf("an alert, then SNI %s to %s: %+v, want access_denied", c.sni, c.dest, r)
			}
		}
		s.wantDenials(t, mark,
			deny(gate.ProtoTLS, pypi4+":443", "example.com", gate.ReasonHostBlocked, ruleBlockExample),
			deny(gate.ProtoTLS, "192.0.2.20:443", "example.org", gate.ReasonNeedsIntercept, "blocked_urls[0] http://example.org/papers/"))
	})
	t.Run("allowlist", func(t *testing.T) {
		s := newSandbox(t, inet)
		s.attach(loadPolicy(t, allowlistPolicy))
		env := s.env(false)
		if r := s.goOne(env, "lookup", "pypi.org"); !r.OK {
			t.Fatalf("lookup pypi.org: %+v", r)
		}
		mark := s.log.mark()
		if r := s.goOne(env, "tls", "-sni", "example.com", "-prefix", alertRecord, pypi4+":443"); r.Kind != "tls_access_denied" {
			t.Errorf("an alert, then SNI example.com to pypi.org's address: %+v, want access_denied", r)
		}
		if r := s.goOne(env, "tls", "-sni", "example.com", "-prefix", alertRecord, "-connect", "pypi.org:443", proxyAddr); r.OK {
			t.Errorf("CONNECT pypi.org:443, an alert, then SNI example.com: %+v, want refused", r)
		}
		s.wantDenials(t, mark,
			deny(gate.ProtoTLS, pypi4+":443", "example.com", gate.ReasonNotAllowed, ruleDefault),
			deny(gate.ProtoConnect, "*", "pypi.org", gate.ReasonNameMismatch, ruleDefault))
		// The same with nothing in front is served: the prefix is all
		// that differs.
		if r := s.goOne(env, "tls", "-sni", "pypi.org", "-prefix", alertRecord, pypi4+":443"); !r.OK || r.Body != "simnet pypi.org /\n" {
			t.Errorf("an alert, then SNI pypi.org: %+v, want pypi.org's page", r)
		}
	})
}

// TestHTTPAnyMethod: a plain-HTTP request whose method is not an upper-case
// word flowgate knows (Go's servers take any token) is checked like any
// request, by path and by Host.
func TestHTTPAnyMethod(t *testing.T) {
	inet := startInternet(t)
	s := newSandbox(t, inet)
	s.attach(loadPolicy(t, denylistPolicy+"blocked_urls:\n  - http://example.org/papers/\n"))
	env := s.env(false)
	mark := s.log.mark()
	for _, c := range []struct{ data, dest string }{
		{`get /papers/x HTTP/1.1\r\nHost: example.org\r\n\r\n`, "192.0.2.20:80"},
		{`G.ET /papers/x HTTP/1.1\r\nHost: example.org\r\n\r\n`, "192.0.2.20:80"},
		{strings.Repeat("A", 40) + ` /papers/x HTTP/1.1\r\nHost: example.org\r\n\r\n`, "192.0.2.20:80"},
		{`get / HTTP/1.1\r\nHost: example.com\r\n\r\n`, pypi4 + ":80"},
	} {
		r := s.goOne(env, "raw", "-data", c.data, c.dest)
		if !strings.HasPrefix(r.Body, "HTTP/1.1 403 ") || strings.Contains(r.Body, "simnet") {
			t.Errorf("%.40q to %s: %q, want 403 from flowgate", c.data, c.dest, r.Body)
		}
	}
	recs := distinct(t, s.log.since(mark), gate.VerdictDeny)
	want := map[gate.Reason]int{gate.ReasonURLBlocked: 0, gate.ReasonHostBlocked: 0}
	for _, r := range recs {
		if r.Proto != gate.ProtoHTTP {
			t.Errorf("a refusal recorded as %s: %+v", r.Proto, r)
		}
		want[r.Reason]++
	}
	if want[gate.ReasonURLBlocked] == 0 || want[gate.ReasonHostBlocked] == 0 || len(want) != 2 {
		t.Errorf("refusals %+v, want url_blocked and host_blocked only", recs)
	}
}
