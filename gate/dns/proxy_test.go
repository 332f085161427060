package dns

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"flowgate/gate"
	"flowgate/integration/simnet"

	"github.com/miekg/dns"
)

func TestDenylist(t *testing.T) {
	e := newEnv(t, policy(t, gate.Denylist, "mirror.example.net", "example.com", "cdn.example.net"), nil)
	blockedMirror := ruleText("blocked_hosts", 0, "mirror.example.net")

	t.Run("blocked name: NXDOMAIN with EDE, agent's query not forwarded", func(t *testing.T) {
		r := e.mustQuery(t, "udp", e.udp4, "mirror.example.net", dns.TypeTXT, true)
		if r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
			t.Fatalf("reply %s %v, want NXDOMAIN", rcode(r), r.Answer)
		}
		ede := edeOf(r)
		if ede == nil || ede.InfoCode != dns.ExtendedErrorCodeBlocked || !strings.Contains(ede.ExtraText, "host_blocked by "+blockedMirror) {
			t.Errorf("EDE %v, want Blocked naming host_blocked and the rule", ede)
		}
		wantRecord(t, e.recordFor(t, "mirror.example.net"), gate.VerdictDeny, gate.ReasonHostBlocked, blockedMirror)
		// The background lookup asks A and AAAA; the agent's TXT never
		// leaves.
		eventually(t, "the blocked name's addresses in Names", func() bool {
			return e.names.Has("mirror.example.net", netip.MustParseAddr("198.51.100.30")) &&
				e.names.Has("mirror.example.net", netip.MustParseAddr("2001:db8:1::30"))
		})
		if n := e.in.QueriesOf("mirror.example.net", dns.TypeTXT); n != 0 {
			t.Errorf("the agent's TXT query reached the resolver %d times", n)
		}
		if len(e.push.pushed(netip.MustParseAddr("198.51.100.30"))) != 0 {
			t.Errorf("a blocked host's address was pushed to the kernel")
		}
	})
	t.Run("subdomain of a blocked host", func(t *testing.T) {
		r := e.mustQuery(t, "tcp", e.tcp4, "www.example.com", dns.TypeA, true)
		if r.Rcode != dns.RcodeNameError {
			t.Errorf("reply %s, want NXDOMAIN", rcode(r))
		}
		wantRecord(t, e.recordFor(t, "www.example.com"), gate.VerdictDeny, gate.ReasonHostBlocked, ruleText("blocked_hosts", 1, "example.com"))
	})
	t.Run("lookalike is forwarded", func(t *testing.T) {
		r := e.mustQuery(t, "udp", e.udp4, "badexample.com", dns.TypeA, false)
		wantAddrs(t, r, "192.0.2.30")
		if n := e.in.QueriesOf("badexample.com", dns.TypeA); n != 1 {
			t.Errorf("resolver saw %d queries for badexample.com, want 1", n)
		}
		wantRecord(t, e.recordFor(t, "badexample.com"), gate.VerdictAllow, gate.ReasonNotBlocked, "default")
		if rec := e.recordFor(t, "badexample.com"); rec.Dest != simnet.Resolver.String() || rec.Detail != "A NOERROR" {
			t.Errorf("record dest %q detail %q", rec.Dest, rec.Detail)
		}
	})
	t.Run("service name under an allowed host is forwarded", func(t *testing.T) {
		e.mustQuery(t, "udp", e.udp4, "_dmarc.Example.ORG", dns.TypeTXT, true)
		if n := e.in.QueriesOf("_dmarc.example.org", dns.TypeTXT); n != 1 {
			t.Errorf("resolver saw %d TXT queries for _dmarc.example.org, want 1", n)
		}
		wantRecord(t, e.recordFor(t, "_dmarc.example.org"), gate.VerdictAllow, gate.ReasonNotBlocked, "default")
	})
	t.Run("service name under a blocked host", func(t *testing.T) {
		r := e.mustQuery(t, "udp", e.udp4, "_acme-challenge.www.example.com", dns.TypeTXT, true)
		if r.Rcode != dns.RcodeNameError {
			t.Errorf("reply %s, want NXDOMAIN", rcode(r))
		}
		wantRecord(t, e.recordFor(t, "_acme-challenge.www.example.com"), gate.VerdictDeny, gate.ReasonHostBlocked, ruleText("blocked_hosts", 1, "example.com"))
		if n := e.in.Queries("_acme-challenge.www.example.com"); n != 0 {
			t.Errorf("resolver saw %d queries for a blocked service name", n)
		}
	})
	t.Run("CNAME into a blocked host", func(t *testing.T) {
		r := e.mustQuery(t, "udp", e.udp4, "static.example.com", dns.TypeA, true)
		if r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
			t.Fatalf("reply %s %v, want NXDOMAIN", rcode(r), r.Answer)
		}
		// static.example.com is itself under example.com; chain.example.org
		// is not, and reaches cdn.example.net through two CNAMEs.
		r = e.mustQuery(t, "udp", e.udp4, "chain.example.org", dns.TypeA, true)
		if r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
			t.Fatalf("chain.example.org: reply %s %v, want NXDOMAIN", rcode(r), r.Answer)
		}
		rec := e.recordFor(t, "chain.example.org")
		wantRecord(t, rec, gate.VerdictDeny, gate.ReasonHostBlocked, ruleText("blocked_hosts", 1, "example.com"))
		if !strings.Contains(rec.Detail, "CNAME to static.example.com") {
			t.Errorf("detail %q, want the CNAME named", rec.Detail)
		}
	})
	t.Run("doh canary", func(t *testing.T) {
		r := e.mustQuery(t, "udp", e.udp4, gate.DoHCanary, dns.TypeA, true)
		if r.Rcode != dns.RcodeNameError {
			t.Errorf("reply %s, want NXDOMAIN", rcode(r))
		}
		wantRecord(t, e.recordFor(t, gate.DoHCanary), gate.VerdictDeny, gate.ReasonDoHCanary, "default")
		if n := e.in.Queries(gate.DoHCanary); n != 0 {
			t.Errorf("canary reached the resolver %d times", n)
		}
	})
	t.Run("rebinding to the metadata address", func(t *testing.T) {
		r := e.mustQuery(t, "udp", e.udp4, simnet.RebindName, dns.TypeA, true)
		if r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
			t.Fatalf("reply %s %v, want NXDOMAIN", rcode(r), r.Answer)
		}
		wantRecord(t, e.recordFor(t, simnet.RebindName), gate.VerdictDeny, gate.ReasonMetadata, "builtin 169.254.0.0/16")
		if len(e.names.NamesOf(simnet.Metadata)) != 0 {
			t.Errorf("metadata address learned")
		}
	})
	t.Run("upstream timeout is SERVFAIL", func(t *testing.T) {
		r := e.mustQuery(t, "udp", e.udp4, simnet.BlackholeName, dns.TypeA, true)
		if r.Rcode != dns.RcodeServerFailure {
			t.Errorf("reply %s, want SERVFAIL", rcode(r))
		}
		rec := e.recordFor(t, simnet.BlackholeName)
		wantRecord(t, rec, gate.VerdictAllow, gate.ReasonNotBlocked, "default")
		if !strings.Contains(rec.Detail, "SERVFAIL: upstream") {
			t.Errorf("detail %q, want the upstream failure", rec.Detail)
		}
	})
}

func TestDenylistNoBlockedLookups(t *testing.T) {
	e := newEnv(t, policy(t, gate.Denylist, "mirror.example.net"), func(c *Config) { c.BlockedLookups = -1 })
	r := e.mustQuery(t, "udp", e.udp4, "mirror.example.net", dns.TypeA, false)
	if r.Rcode != dns.RcodeNameError {
		t.Fatalf("reply %s, want NXDOMAIN", rcode(r))
	}
	// A later allowed query through the same upstream path proves the
	// proxy was running; the blocked name never reached the resolver.
	e.mustQuery(t, "udp", e.udp4, "example.org", dns.TypeA, false)
	time.Sleep(100 * time.Millisecond)
	if n := e.in.Queries("mirror.example.net"); n != 0 {
		t.Errorf("blocked name reached the resolver %d times with lookups off", n)
	}
}

func TestAllowlist(t *testing.T) {
	e := newEnv(t, policy(t, gate.Allowlist, "example.com", "*.pythonhosted.org", "static.example.com", "db", "example.org"), nil)

	t.Run("allowed: answered, learned and pushed before the reply", func(t *testing.T) {
		e.push.mu.Lock()
		e.push.delay = 150 * time.Millisecond
		e.push.mu.Unlock()
		defer func() {
			e.push.mu.Lock()
			e.push.delay = 0
			e.push.mu.Unlock()
		}()
		r := e.mustQuery(t, "udp", e.udp4, "example.com", dns.TypeA, false)
		replied := e.seq.next()
		wantAddrs(t, r, "192.0.2.10")
		if r.Answer[0].Header().Ttl != 5 {
			t.Errorf("answer TTL %d, want simnet's 5", r.Answer[0].Header().Ttl)
		}
		a := netip.MustParseAddr("192.0.2.10")
		if !e.names.Has("example.com", a) {
			t.Errorf("example.com -> %s not in Names when the reply arrived", a)
		}
		evs := e.push.pushed(a)
		if len(evs) != 1 {
			t.Fatalf("push events %+v, want 1", evs)
		}
		if evs[0].done >= replied {
			t.Errorf("push finished at seq %d, after the reply arrived at %d", evs[0].done, replied)
		}
		if evs[0].ttl < gate.MinLearnTTL {
			t.Errorf("pushed TTL %v, want at least %v", evs[0].ttl, gate.MinLearnTTL)
		}
		wantRecord(t, e.recordFor(t, "example.com"), gate.VerdictAllow, gate.ReasonHostAllowed, ruleText("allowed_hosts", 0, "example.com"))
	})
	t.Run("subdomain of an allowed host", func(t *testing.T) {
		r := e.mustQuery(t, "udp", e.udp6, "api.example.com", dns.TypeAAAA, true)
		wantAddrs(t, r, "2001:db8::12")
		wantRecord(t, e.recordFor(t, "api.example.com"), gate.VerdictAllow, gate.ReasonHostAllowed, ruleText("allowed_hosts", 0, "example.com"))
	})
	t.Run("service name under an allowed host", func(t *testing.T) {
		e.mustQuery(t, "udp", e.udp4, "_http._tcp.example.com", dns.TypeSRV, true)
		if n := e.in.QueriesOf("_http._tcp.example.com", dns.TypeSRV); n != 1 {
			t.Errorf("resolver saw %d SRV queries, want 1", n)
		}
		wantRecord(t, e.recordFor(t, "_http._tcp.example.com"), gate.VerdictAllow, gate.ReasonHostAllowed, ruleText("allowed_hosts", 0, "example.com"))
	})
	t.Run("wildcard", func(t *testing.T) {
		r := e.mustQuery(t, "udp", e.udp4, "files.pythonhosted.org", dns.TypeA, false)
		wantAddrs(t, r, "198.51.100.41")
		r = e.mustQuery(t, "udp", e.udp4, "pythonhosted.org", dns.TypeA, false)
		if r.Rcode != dns.RcodeNameError {
			t.Errorf("pythonhosted.org: %s, want NXDOMAIN (the wildcard covers subdomains only)", rcode(r))
		}
		wantRecord(t, e.recordFor(t, "pythonhosted.org"), gate.VerdictDeny, gate.ReasonNotAllowed, "default")
	})
	t.Run("not allowed: NXDOMAIN, nothing upstream", func(t *testing.T) {
		for _, n := range []string{"mirror.example.net", "badexample.com", "example.com.evil.example.net", "pypi.org", "metadata.google.internal"} {
			r := e.mustQuery(t, "udp", e.udp4, n, dns.TypeA, true)
			if r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
				t.Errorf("%s: %s %v, want NXDOMAIN", n, rcode(r), r.Answer)
			}
			if q := e.in.Queries(n); q != 0 {
				t.Errorf("%s reached the resolver %d times", n, q)
			}
		}
		wantRecord(t, e.recordFor(t, "badexample.com"), gate.VerdictDeny, gate.ReasonNotAllowed, "default")
		wantRecord(t, e.recordFor(t, "metadata.google.internal"), gate.VerdictDeny, gate.ReasonMetadata, "builtin metadata.google.internal")
		if e.in.Queries(gate.DoHCanary) != 0 {
			t.Errorf("canary forwarded")
		}
	})
	t.Run("CNAME outside the list is tied to the allowed name", func(t *testing.T) {
		r := e.mustQuery(t, "udp", e.udp4, "static.example.com", dns.TypeA, false)
		wantAddrs(t, r, "198.51.100.50")
		a := netip.MustParseAddr("198.51.100.50")
		if !e.names.Has("static.example.com", a) || !e.names.Has("cdn.example.net", a) {
			t.Errorf("Names: static %v cdn %v, want both", e.names.Has("static.example.com", a), e.names.Has("cdn.example.net", a))
		}
		if len(e.push.pushed(a)) != 1 {
			t.Errorf("pushed %d times, want once", len(e.push.pushed(a)))
		}
		// Querying the CDN name itself is still not allowed.
		r = e.mustQuery(t, "udp", e.udp4, "cdn.example.net", dns.TypeA, false)
		if r.Rcode != dns.RcodeNameError {
			t.Errorf("cdn.example.net: %s, want NXDOMAIN", rcode(r))
		}
	})
	t.Run("service name", func(t *testing.T) {
		r := e.mustQuery(t, "udp", e.udp4, "db", dns.TypeA, false)
		if r.Rcode != dns.RcodeNameError {
			t.Errorf("db: %s, want simnet's NXDOMAIN", rcode(r))
		}
		if e.in.Queries("db") != 1 {
			t.Errorf("service name not forwarded")
		}
		wantRecord(t, e.recordFor(t, "db"), gate.VerdictAllow, gate.ReasonServiceAllowed, ruleText("allowed_hosts", 3, "db"))
	})
	t.Run("other types forwarded", func(t *testing.T) {
		r := e.mustQuery(t, "tcp", e.tcp6, "example.org", dns.TypeTXT, false)
		if len(r.Answer) != 1 || r.Answer[0].(*dns.TXT).Txt[0] != "simnet example.org" {
			t.Errorf("TXT = %v", r.Answer)
		}
		r = e.mustQuery(t, "udp", e.udp4, "example.com", dns.TypeMX, false)
		if len(r.Answer) != 1 || r.Answer[0].Header().Rrtype != dns.TypeMX {
			t.Errorf("MX = %v", r.Answer)
		}
	})
	t.Run("Resolve", func(t *testing.T) {
		got, err := e.srv.Resolve(context.Background(), "example.org")
		if err != nil || len(got) != 2 || got[0] != netip.MustParseAddr("192.0.2.20") && got[1] != netip.MustParseAddr("192.0.2.20") {
			t.Fatalf("Resolve(example.org) = %v, %v", got, err)
		}
		if !e.names.Has("example.org", netip.MustParseAddr("2001:db8::20")) {
			t.Errorf("Resolve did not record the AAAA")
		}
		var denied *gate.DeniedError
		if _, err := e.srv.Resolve(context.Background(), "pypi.org"); !errors.As(err, &denied) || denied.Decision.Reason != gate.ReasonNotAllowed {
			t.Errorf("Resolve(pypi.org) = %v, want not_allowed", err)
		}
		if e.in.Queries("pypi.org") != 0 {
			t.Errorf("Resolve sent a not-allowed name upstream")
		}
	})
}

// TestECHStripped: HTTPS records lose ech (the name would hide from the
// ClientHello) and the address hints (neither screened nor learned); the
// rest stays.
func TestECHStripped(t *testing.T) {
	e := newEnv(t, policy(t, gate.Denylist), nil)
	direct, err := e.query(t, "udp", e.up.Resolver.String(), simnet.ECHName, dns.TypeHTTPS, true)
	if err != nil || len(direct.Answer) != 1 || !strings.Contains(direct.Answer[0].String(), "ech=") ||
		!strings.Contains(direct.Answer[0].String(), "ipv4hint=") || !strings.Contains(direct.Answer[0].String(), "ipv6hint=") {
		t.Fatalf("simnet's own HTTPS answer lacks ech or hints: %v %v", direct, err)
	}
	for _, c := range []struct{ network, addr string }{{"udp", e.udp4}, {"tcp", e.tcp6}} {
		r := e.mustQuery(t, c.network, c.addr, simnet.ECHName, dns.TypeHTTPS, true)
		if len(r.Answer) != 1 {
			t.Fatalf("%s: answer %v", c.network, r.Answer)
		}
		h, ok := r.Answer[0].(*dns.HTTPS)
		if !ok {
			t.Fatalf("%s: answer is %T", c.network, r.Answer[0])
		}
		var keys []dns.SVCBKey
		for _, kv := range h.Value {
			keys = append(keys, kv.Key())
		}
		if !slices.Equal(keys, []dns.SVCBKey{dns.SVCB_ALPN}) {
			t.Errorf("%s: SvcParams %v, want alpn alone (ech and hints removed)", c.network, keys)
		}
	}
}

func TestTCPManyMessagesOneStream(t *testing.T) {
	e := newEnv(t, policy(t, gate.Denylist, "mirror.example.net"), nil)
	for _, addr := range []string{e.tcp4, e.tcp6} {
		c := e.dial(t, "tcp", addr)
		conn := &dns.Conn{Conn: c}
		names := []string{"example.com.", "pypi.org.", "mirror.example.net.", "example.org."}
		ids := map[uint16]string{}
		// All queries first, then all answers: pipelined, as RFC 7766 allows.
		for i, n := range names {
			m := new(dns.Msg)
			m.SetQuestion(n, dns.TypeA)
			m.Id = uint16(1000 + i)
			ids[m.Id] = n
			if err := conn.WriteMsg(m); err != nil {
				t.Fatalf("writing %s: %v", n, err)
			}
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for range names {
			r, err := conn.ReadMsg()
			if err != nil {
				t.Fatalf("reading answers on %s: %v", addr, err)
			}
			n, ok := ids[r.Id]
			if !ok || r.Question[0].Name != n {
				t.Fatalf("answer ID %d for %v, not one of ours", r.Id, r.Question)
			}
			delete(ids, r.Id)
			if n == "mirror.example.net." {
				if r.Rcode != dns.RcodeNameError {
					t.Errorf("%s: %s, want NXDOMAIN", n, rcode(r))
				}
			} else if len(addrsOf(r)) != 1 {
				t.Errorf("%s: %v", n, r.Answer)
			}
		}
		c.Close()
	}
}

func TestIPv6(t *testing.T) {
	e := newEnv(t, policy(t, gate.Allowlist, "pypi.org"), func(c *Config) { c.Upstreams = []netip.AddrPort{e6Resolver} })
	for _, c := range []struct{ network, addr string }{{"udp", e.udp6}, {"tcp", e.tcp6}} {
		r := e.mustQuery(t, c.network, c.addr, "pypi.org", dns.TypeAAAA, true)
		wantAddrs(t, r, "2001:db8:1::40")
		if rec := e.recordFor(t, "pypi.org"); rec.Dest != e6Resolver.String() {
			t.Errorf("record dest %q, want %s", rec.Dest, e6Resolver)
		}
	}
	if !e.names.Has("pypi.org", netip.MustParseAddr("2001:db8:1::40")) {
		t.Errorf("IPv6 address not learned")
	}
}

var e6Resolver = simnet.Resolver6

// TestTruncatedUpstreamRetriedOverTCP: simnet.ManyName has more addresses
// than a UDP answer holds; flowgate gets them over TCP and passes on the
// gate.MaxAddrsPerName it learns.
func TestTruncatedUpstreamRetriedOverTCP(t *testing.T) {
	e := newEnv(t, policy(t, gate.Denylist), nil)
	want := min(simnet.ManyCount, gate.MaxAddrsPerName)
	r := e.mustQuery(t, "udp", e.udp4, simnet.ManyName, dns.TypeA, true)
	if r.Truncated || len(r.Answer) != want {
		t.Errorf("EDNS 4096 over UDP: TC=%v, %d answers; want %d", r.Truncated, len(r.Answer), want)
	}
	// Without EDNS the reply is cut to 512 bytes with TC set, and the
	// client's TCP retry gets everything.
	cl := &dns.Client{Net: "udp", Timeout: 3 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion(simnet.ManyName+".", dns.TypeA)
	c := e.dial(t, "udp", e.udp4)
	defer c.Close()
	r, _, err := cl.ExchangeWithConn(m, &dns.Conn{Conn: c})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Truncated {
		t.Errorf("no EDNS: TC not set with %d answers", len(r.Answer))
	}
	r = e.mustQuery(t, "tcp", e.tcp4, simnet.ManyName, dns.TypeA, false)
	if len(r.Answer) != want {
		t.Errorf("TCP: %d answers, want %d", len(r.Answer), want)
	}
	if n := e.in.QueriesOf(simnet.ManyName, dns.TypeA); n != 6 {
		t.Errorf("resolver saw %d queries, want 6: UDP, then TCP, for each of the three forwarded", n)
	}
}
