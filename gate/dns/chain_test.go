package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"flowgate/gate"

	"github.com/miekg/dns"
)

func TestNewChecksConfig(t *testing.T) {
	deny := policy(t, gate.Denylist)
	names := gate.NewNames(nil)
	ups := []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")}
	dial := (&fakeResolver{}).dial
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no policy", Config{Names: names}, "no policy"},
		{"no names", Config{Policy: deny}, "no names table"},
		{"public", Config{Policy: policy(t, gate.Public), Names: names}, "public is not proxied"},
		{"no upstream", Config{Policy: deny, Names: names, Dial: dial}, "at least one upstream"},
		{"no dial", Config{Policy: deny, Names: names, Upstreams: ups}, "no upstream dial"},
		{"bad upstream", Config{Policy: deny, Names: names, Upstreams: []netip.AddrPort{{}}, Dial: dial}, "bad upstream"},
		{"negative", Config{Policy: deny, Names: names, Upstreams: ups, Dial: dial, MaxTCPConns: -1}, "negative limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("New = %v, want an error containing %q", err, c.want)
			}
		})
	}
	// No-network needs no upstream: it answers everything itself.
	s, err := New(Config{Policy: policy(t, gate.NoNetwork), Names: names})
	if err != nil {
		t.Fatalf("New(no-network) = %v", err)
	}
	s.Close()
}

func TestRefusals(t *testing.T) {
	u := newUnit(t, policy(t, gate.Denylist, "blocked.test", "*.wild.test"), func(c *Config) { c.BlockedLookups = -1 })
	cases := []struct {
		name   string
		qname  string
		qtype  uint16
		rcode  int
		reason gate.Reason
		rule   string
		ede    uint16
	}{
		{"blocked apex", "blocked.test.", dns.TypeA, dns.RcodeNameError, gate.ReasonHostBlocked, "sandbox.blocked_hosts[0] blocked.test", dns.ExtendedErrorCodeBlocked},
		{"blocked subdomain, odd case", "A.B.Blocked.TEST.", dns.TypeAAAA, dns.RcodeNameError, gate.ReasonHostBlocked, "sandbox.blocked_hosts[0] blocked.test", dns.ExtendedErrorCodeBlocked},
		{"wildcard child", "x.wild.test.", dns.TypeA, dns.RcodeNameError, gate.ReasonHostBlocked, "sandbox.blocked_hosts[1] *.wild.test", dns.ExtendedErrorCodeBlocked},
		{"doh canary", "use-application-dns.net.", dns.TypeA, dns.RcodeNameError, gate.ReasonDoHCanary, "default", dns.ExtendedErrorCodeBlocked},
		{"metadata name", "metadata.google.internal.", dns.TypeA, dns.RcodeNameError, gate.ReasonMetadata, "builtin metadata.google.internal", dns.ExtendedErrorCodeBlocked},
		{"service name under a blocked host", "_dmarc.Blocked.test.", dns.TypeTXT, dns.RcodeNameError, gate.ReasonHostBlocked, "sandbox.blocked_hosts[0] blocked.test", dns.ExtendedErrorCodeBlocked},
		{"service name on a numeric host", "_x.1.2.3.4.", dns.TypeTXT, dns.RcodeNameError, gate.ReasonBadName, "default", dns.ExtendedErrorCodeOther},
		{"escaped byte in a label", "a\\ b.test.", dns.TypeA, dns.RcodeNameError, gate.ReasonBadName, "default", dns.ExtendedErrorCodeOther},
		{"root", ".", dns.TypeNS, dns.RcodeNameError, gate.ReasonBadName, "default", dns.ExtendedErrorCodeOther},
		{"numeric final label", "1.2.3.4.", dns.TypeA, dns.RcodeNameError, gate.ReasonBadName, "default", dns.ExtendedErrorCodeOther},
		{"ANY", "ok.test.", dns.TypeANY, dns.RcodeNotImplemented, gate.ReasonUnsupported, "default", dns.ExtendedErrorCodeNotSupported},
		{"AXFR", "ok.test.", dns.TypeAXFR, dns.RcodeNotImplemented, gate.ReasonUnsupported, "default", dns.ExtendedErrorCodeNotSupported},
		{"CNAME to blocked", "outside.test.", dns.TypeA, dns.RcodeNameError, gate.ReasonHostBlocked, "sandbox.blocked_hosts[0] blocked.test", dns.ExtendedErrorCodeBlocked},
		{"metadata address in answer", "meta.test.", dns.TypeA, dns.RcodeNameError, gate.ReasonMetadata, "builtin 169.254.0.0/16", dns.ExtendedErrorCodeBlocked},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := u.ask(t, c.qname, c.qtype, true, false)
			if r.Rcode != c.rcode {
				t.Errorf("rcode = %s, want %s", dns.RcodeToString[r.Rcode], dns.RcodeToString[c.rcode])
			}
			if len(r.Answer) != 0 {
				t.Errorf("refusal carries answers: %v", r.Answer)
			}
			if len(r.Question) != 1 || r.Question[0].Name != c.qname {
				t.Errorf("question = %v, want the client's %q", r.Question, c.qname)
			}
			e := edeOf(r)
			if e == nil || e.InfoCode != c.ede || !strings.Contains(e.ExtraText, string(c.reason)) {
				t.Errorf("EDE = %v, want code %d naming %s", e, c.ede, c.reason)
			}
			rec := u.rec.last(t)
			if rec.Verdict != gate.VerdictDeny || rec.Reason != c.reason || rec.Rule != c.rule || rec.Proto != gate.ProtoDNS {
				t.Errorf("record = %+v, want deny %s by %q", rec, c.reason, c.rule)
			}
			if rec.Sandbox != "unit" || rec.UID != 1000 {
				t.Errorf("record sandbox/uid = %q/%d", rec.Sandbox, rec.UID)
			}
		})
	}
	for _, n := range []string{"blocked.test", "a.b.blocked.test", "x.wild.test", "use-application-dns.net", "metadata.google.internal", "_dmarc.blocked.test", "_x.1.2.3.4", "a\\ b.test"} {
		if got := u.fake.asked(n); got != 0 {
			t.Errorf("%s was sent upstream %d times", n, got)
		}
	}
	t.Run("no EDE without EDNS", func(t *testing.T) {
		r := u.ask(t, "blocked.test.", dns.TypeA, false, false)
		if r.Rcode != dns.RcodeNameError || r.IsEdns0() != nil {
			t.Errorf("reply = %s with OPT %v, want NXDOMAIN without OPT", dns.RcodeToString[r.Rcode], r.IsEdns0())
		}
	})
	t.Run("class CHAOS", func(t *testing.T) {
		m := new(dns.Msg)
		m.SetQuestion("version.bind.", dns.TypeTXT)
		m.Question[0].Qclass = dns.ClassCHAOS
		r := u.raw(t, m, false)
		if r.Rcode != dns.RcodeRefused {
			t.Errorf("rcode = %s, want REFUSED", dns.RcodeToString[r.Rcode])
		}
		if rec := u.rec.last(t); rec.Reason != gate.ReasonUnsupported {
			t.Errorf("reason = %s, want unsupported", rec.Reason)
		}
	})
	t.Run("opcode NOTIFY", func(t *testing.T) {
		m := new(dns.Msg)
		m.SetNotify("ok.test.")
		r := u.raw(t, m, false)
		if r.Rcode != dns.RcodeNotImplemented {
			t.Errorf("rcode = %s, want NOTIMP", dns.RcodeToString[r.Rcode])
		}
	})
	t.Run("EDNS version 1", func(t *testing.T) {
		m := new(dns.Msg)
		m.SetQuestion("ok.test.", dns.TypeA)
		m.SetEdns0(1232, false)
		m.IsEdns0().SetVersion(1)
		r := u.raw(t, m, false)
		if r.Rcode != dns.RcodeBadVers {
			t.Errorf("rcode = %s, want BADVERS", dns.RcodeToString[r.Rcode])
		}
		if rec := u.rec.last(t); rec.Reason != gate.ReasonBadRequest {
			t.Errorf("reason = %s, want bad_request", rec.Reason)
		}
	})
	t.Run("two questions", func(t *testing.T) {
		m := new(dns.Msg)
		m.SetQuestion("ok.test.", dns.TypeA)
		m.Question = append(m.Question, dns.Question{Name: "blocked.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
		r := u.raw(t, m, false)
		if r.Rcode != dns.RcodeFormatError {
			t.Errorf("rcode = %s, want FORMERR", dns.RcodeToString[r.Rcode])
		}
		if rec := u.rec.last(t); rec.Reason != gate.ReasonBadRequest {
			t.Errorf("reason = %s, want bad_request", rec.Reason)
		}
	})
}

// raw sends a prepared message through the handler.
func (u *unit) raw(t testing.TB, m *dns.Msg, tcp bool) *dns.Msg {
	t.Helper()
	raw, err := m.Pack()
	if err != nil {
		t.Fatalf("packing: %v", err)
	}
	out := u.srv.handle(context.Background(), raw, tcp)
	if out == nil {
		t.Fatal("no reply")
	}
	r := new(dns.Msg)
	if err := r.Unpack(out); err != nil {
		t.Fatalf("unpacking reply: %v", err)
	}
	return r
}

func TestMalformedBytes(t *testing.T) {
	u := newUnit(t, policy(t, gate.Denylist), nil)
	ok := new(dns.Msg)
	ok.SetQuestion("ok.test.", dns.TypeA)
	okRaw, _ := ok.Pack()
	resp := okRaw[:len(okRaw):len(okRaw)]
	resp = append([]byte(nil), resp...)
	resp[2] |= 0x80
	cases := []struct {
		name  string
		raw   []byte
		tcp   bool
		drop  bool
		rcode int
	}{
		{"empty", nil, false, true, 0},
		{"short", []byte{1, 2, 3}, false, true, 0},
		{"a response", resp, false, true, 0},
		{"garbage after header", append(okRaw[:12:12], 0xff, 0xff, 0xff), false, false, dns.RcodeFormatError},
		{"question count lies", append([]byte{0xab, 0xcd, 0x01, 0x00, 0x00, 0x05}, make([]byte, 6)...), false, false, dns.RcodeFormatError},
		{"too long", append(okRaw[:12:12], make([]byte, MaxQuery)...), false, false, dns.RcodeFormatError},
		{"too long over TCP", append(okRaw[:12:12], make([]byte, MaxQuery)...), true, false, dns.RcodeFormatError},
		{"records in the answer section", withCounts(okRaw, 1, 1, 0, 0), false, false, dns.RcodeFormatError},
		{"records in the authority section", withCounts(okRaw, 1, 0, 1, 0), false, false, dns.RcodeFormatError},
		{"two additional records", withCounts(okRaw, 1, 0, 0, 2), false, false, dns.RcodeFormatError},
		{"no question", withCounts(okRaw, 0, 0, 0, 0), false, false, dns.RcodeFormatError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := len(u.rec.all())
			out := u.srv.handle(context.Background(), c.raw, c.tcp)
			if recs := u.rec.all(); len(recs) != before+1 || recs[len(recs)-1].Reason != gate.ReasonBadRequest {
				t.Errorf("want exactly one bad_request record, got %v", recs[before:])
			}
			if c.drop {
				if out != nil {
					t.Errorf("reply %x, want none", out)
				}
				return
			}
			r := new(dns.Msg)
			if err := r.Unpack(out); err != nil {
				t.Fatalf("unpacking reply: %v", err)
			}
			if r.Rcode != c.rcode || !r.Response || r.Id != uint16(c.raw[0])<<8|uint16(c.raw[1]) {
				t.Errorf("reply %v, want %s with the client's ID", r.MsgHdr, dns.RcodeToString[c.rcode])
			}
		})
	}
	// The server still answers.
	if r := u.ask(t, "ok.test.", dns.TypeA, false, false); r.Rcode != dns.RcodeSuccess || len(addrsOf(r)) != 1 {
		t.Errorf("after malformed input: %v", r)
	}
}

func TestForwardAndLearn(t *testing.T) {
	u := newUnit(t, policy(t, gate.Allowlist, "cname.test", "ech.test", "stray.test", "long.test", "ok.test", "big.test", "nx.test"), nil)

	t.Run("cname chain", func(t *testing.T) {
		r := u.ask(t, "CNAME.test.", dns.TypeA, true, false)
		if got := addrsOf(r); len(got) != 1 || got[0] != netip.MustParseAddr("192.0.2.1") {
			t.Fatalf("addresses = %v", got)
		}
		a := netip.MustParseAddr("192.0.2.1")
		if !u.names.Has("cname.test", a) || !u.names.Has("target.test", a) {
			t.Errorf("Names: cname.test %v, target.test %v; want both", u.names.Has("cname.test", a), u.names.Has("target.test", a))
		}
		evs := u.push.pushed(a)
		if len(evs) != 1 || evs[0].ttl != 60*time.Second {
			t.Errorf("push events = %+v, want one with the A record's TTL (60s, smaller than the CNAME's)", evs)
		}
		rec := u.rec.last(t)
		if rec.Verdict != gate.VerdictAllow || rec.Reason != gate.ReasonHostAllowed || rec.Name != "cname.test" || rec.Dest != "192.0.2.53:53" {
			t.Errorf("record = %+v", rec)
		}
	})
	t.Run("ttl raised to 30s for learning, kept in the answer", func(t *testing.T) {
		r := u.ask(t, "ok.test.", dns.TypeAAAA, false, false)
		a := netip.MustParseAddr("2001:db8::1")
		if len(r.Answer) != 1 || r.Answer[0].Header().Ttl != 5 {
			t.Fatalf("answer = %v, want TTL 5 passed on", r.Answer)
		}
		evs := u.push.pushed(a)
		if len(evs) == 0 || evs[len(evs)-1].ttl != gate.MinLearnTTL {
			t.Errorf("push = %+v, want TTL %v", evs, gate.MinLearnTTL)
		}
	})
	t.Run("ttl cut to MaxLearnTTL", func(t *testing.T) {
		r := u.ask(t, "long.test.", dns.TypeA, false, false)
		if len(r.Answer) != 1 || r.Answer[0].Header().Ttl != maxAnswerTTL {
			t.Errorf("answer = %v, want TTL %d", r.Answer, maxAnswerTTL)
		}
	})
	t.Run("ech stripped", func(t *testing.T) {
		r := u.ask(t, "ech.test.", dns.TypeHTTPS, true, false)
		if len(r.Answer) != 1 {
			t.Fatalf("answer = %v", r.Answer)
		}
		h := r.Answer[0].(*dns.HTTPS)
		for _, kv := range h.Value {
			if kv.Key() == dns.SVCB_ECHCONFIG {
				t.Errorf("ech left in %v", h)
			}
			if m, ok := kv.(*dns.SVCBMandatory); ok && (len(m.Code) != 1 || m.Code[0] != dns.SVCB_ALPN) {
				t.Errorf("mandatory = %v, want alpn alone", m.Code)
			}
		}
		if !strings.Contains(h.String(), "alpn=\"h2\"") && !strings.Contains(h.String(), "alpn=h2") {
			t.Errorf("alpn lost: %v", h)
		}
		for _, rr := range r.Extra {
			if strings.Contains(rr.String(), "ech=") {
				t.Errorf("ech left in additional %v", rr)
			}
			if rr.Header().Rrtype == dns.TypeA {
				t.Errorf("address in additional section passed on: %v", rr)
			}
		}
	})
	t.Run("stray records dropped", func(t *testing.T) {
		r := u.ask(t, "stray.test.", dns.TypeA, false, false)
		if got := addrsOf(r); len(got) != 1 || got[0] != netip.MustParseAddr("192.0.2.7") {
			t.Errorf("addresses = %v, want 192.0.2.7 alone", got)
		}
		if len(u.names.NamesOf(netip.MustParseAddr("192.0.2.77"))) != 0 {
			t.Errorf("stray address learned")
		}
	})
	// big.test has 120 addresses: flowgate learns and passes on the first
	// gate.MaxAddrsPerName.
	t.Run("truncated upstream retried over tcp; udp reply truncated to 512", func(t *testing.T) {
		r := u.ask(t, "big.test.", dns.TypeA, true, false)
		if len(r.Answer) != gate.MaxAddrsPerName || r.Truncated {
			t.Errorf("EDNS 4096: %d answers, TC=%v; want %d", len(r.Answer), r.Truncated, gate.MaxAddrsPerName)
		}
		r = u.ask(t, "big.test.", dns.TypeA, false, false)
		if !r.Truncated || len(r.Answer) >= gate.MaxAddrsPerName {
			t.Errorf("no EDNS: %d answers, TC=%v; want truncated", len(r.Answer), r.Truncated)
		}
		r = u.ask(t, "big.test.", dns.TypeA, false, true)
		if len(r.Answer) != gate.MaxAddrsPerName || r.Truncated {
			t.Errorf("TCP: %d answers, TC=%v; want %d", len(r.Answer), r.Truncated, gate.MaxAddrsPerName)
		}
		last := netip.AddrFrom4([4]byte{198, 51, 100, gate.MaxAddrsPerName})
		if n := len(u.names.NamesOf(last)); n != 1 {
			t.Errorf("%v, the last address kept, learned under %d names, want 1", last, n)
		}
		if n := len(u.names.NamesOf(last.Next())); n != 0 || slices.Contains(addrsOf(r), last.Next()) {
			t.Errorf("%v, past the bound, learned under %d names or passed on", last.Next(), n)
		}
	})
	t.Run("upstream NXDOMAIN passed on", func(t *testing.T) {
		r := u.ask(t, "nx.test.", dns.TypeA, false, false)
		if r.Rcode != dns.RcodeNameError {
			t.Errorf("rcode = %s", dns.RcodeToString[r.Rcode])
		}
		if rec := u.rec.last(t); rec.Verdict != gate.VerdictAllow || !strings.Contains(rec.Detail, "NXDOMAIN") {
			t.Errorf("record = %+v", rec)
		}
	})
	t.Run("not allowed never asked", func(t *testing.T) {
		r := u.ask(t, "other.test.", dns.TypeA, true, false)
		if r.Rcode != dns.RcodeNameError {
			t.Errorf("rcode = %s", dns.RcodeToString[r.Rcode])
		}
		if rec := u.rec.last(t); rec.Reason != gate.ReasonNotAllowed {
			t.Errorf("reason = %s, want not_allowed", rec.Reason)
		}
		if u.fake.asked("other.test") != 0 {
			t.Errorf("other.test was sent upstream")
		}
	})
}

func TestLearnFailureIsServfail(t *testing.T) {
	u := newUnit(t, policy(t, gate.Allowlist, "ok.test"), nil)
	u.push.err = errors.New("nft set full")
	r := u.ask(t, "ok.test.", dns.TypeA, true, false)
	if r.Rcode != dns.RcodeServerFailure || len(r.Answer) != 0 {
		t.Errorf("reply = %s %v, want SERVFAIL without answers", dns.RcodeToString[r.Rcode], r.Answer)
	}
	if u.names.Has("ok.test", netip.MustParseAddr("192.0.2.1")) {
		t.Errorf("address recorded although the push failed")
	}
	if rec := u.rec.last(t); !strings.Contains(rec.Detail, "nft set full") {
		t.Errorf("record detail = %q, want the push error", rec.Detail)
	}
}

func TestNoNetworkAnswersItself(t *testing.T) {
	u := newUnit(t, policy(t, gate.NoNetwork), func(c *Config) { c.Upstreams = nil; c.Dial = nil })
	r := u.ask(t, "example.com.", dns.TypeA, true, false)
	if r.Rcode != dns.RcodeNameError {
		t.Errorf("rcode = %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}
	if rec := u.rec.last(t); rec.Reason != gate.ReasonNoNetwork {
		t.Errorf("reason = %s, want no_network", rec.Reason)
	}
}

func TestResolveUnit(t *testing.T) {
	u := newUnit(t, policy(t, gate.Allowlist, "ok.test", "meta.test"), nil)
	got, err := u.srv.Resolve(context.Background(), "ok.test")
	if err != nil || len(got) != 2 {
		t.Fatalf("Resolve(ok.test) = %v, %v", got, err)
	}
	for _, a := range got {
		if !u.names.Has("ok.test", a) || len(u.push.pushed(a)) != 1 {
			t.Errorf("%s not learned and pushed", a)
		}
	}
	var denied *gate.DeniedError
	if _, err := u.srv.Resolve(context.Background(), "other.test"); !errors.As(err, &denied) || denied.Decision.Reason != gate.ReasonNotAllowed {
		t.Errorf("Resolve(other.test) err = %v, want not_allowed", err)
	}
	if u.fake.asked("other.test") != 0 {
		t.Errorf("not-allowed name sent upstream by Resolve")
	}
	if _, err := u.srv.Resolve(context.Background(), "meta.test"); !errors.As(err, &denied) || denied.Decision.Reason != gate.ReasonMetadata {
		t.Errorf("Resolve(meta.test) err = %v, want metadata", err)
	}
	if _, err := u.srv.Resolve(context.Background(), "OK.test"); err == nil || !strings.Contains(err.Error(), "not a canonical name") {
		t.Errorf("Resolve(OK.test) err = %v, want not canonical", err)
	}
}

// withCounts copies a message with its section counts set as given.
func withCounts(raw []byte, qd, an, ns, ar uint16) []byte {
	out := append([]byte(nil), raw...)
	for i, n := range []uint16{qd, an, ns, ar} {
		binary.BigEndian.PutUint16(out[4+2*i:], n)
	}
	return out
}

func TestBlockedLookupInBackground(t *testing.T) {
	u := newUnit(t, policy(t, gate.Denylist, "blocked.test"), nil)
	r := u.ask(t, "blocked.test.", dns.TypeTXT, true, false)
	if r.Rcode != dns.RcodeNameError {
		t.Fatalf("rcode = %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}
	a4, a6 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	deadline := time.Now().Add(5 * time.Second)
	for !(u.names.Has("blocked.test", a4) && u.names.Has("blocked.test", a6)) {
		if time.Now().After(deadline) {
			t.Fatalf("blocked.test's addresses never reached Names")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(u.push.pushed(a4)) != 0 || len(u.push.pushed(a6)) != 0 {
		t.Errorf("a blocked name's addresses were pushed to the kernel")
	}
	u.fake.mu.Lock()
	for _, q := range u.fake.queries {
		if q.Qtype != dns.TypeA && q.Qtype != dns.TypeAAAA {
			t.Errorf("the agent's own query went upstream: %v", q)
		}
	}
	u.fake.mu.Unlock()
	// A second refusal soon after does not look the name up again.
	u.ask(t, "blocked.test.", dns.TypeA, true, false)
	time.Sleep(50 * time.Millisecond)
	if n := u.fake.asked("blocked.test"); n != 2 {
		t.Errorf("blocked.test asked upstream %d times, want 2 (A and AAAA once)", n)
	}
	if n := len(u.rec.all()); n != 2 {
		t.Errorf("%d records, want 2: background lookups write none", n)
	}
	// Resolve in denylist looks a blocked host up, without pushing.
	got, err := u.srv.Resolve(context.Background(), "blocked.test")
	if err != nil || len(got) != 2 || len(u.push.pushed(a4)) != 0 {
		t.Errorf("Resolve(blocked.test) = %v, %v; pushes %v", got, err, u.push.pushed(a4))
	}
}

// TestStripSvcParams: ech and the address hints go, from the record and
// from its mandatory list (a hint pointing at a metadata address included);
// other parameters stay.
func TestStripSvcParams(t *testing.T) {
	h := &dns.HTTPS{SVCB: dns.SVCB{Hdr: dns.RR_Header{Name: "x.test.", Rrtype: dns.TypeHTTPS, Class: dns.ClassINET}, Priority: 1, Target: "."}}
	h.Value = []dns.SVCBKeyValue{
		&dns.SVCBMandatory{Code: []dns.SVCBKey{dns.SVCB_ALPN, dns.SVCB_IPV4HINT}},
		&dns.SVCBAlpn{Alpn: []string{"h2"}},
		&dns.SVCBIPv4Hint{Hint: []net.IP{net.ParseIP("169.254.169.254").To4()}},
		&dns.SVCBIPv6Hint{Hint: []net.IP{net.ParseIP("fd00:ec2::254")}},
		&dns.SVCBECHConfig{ECH: fakeECH},
	}
	if !stripSvcParams(h) {
		t.Fatal("nothing stripped")
	}
	if got := h.String(); got != `x.test.	0	IN	HTTPS	1 . mandatory="alpn" alpn="h2"` {
		t.Errorf("after stripping: %s", got)
	}
	if stripSvcParams(h) {
		t.Error("stripped twice")
	}
}
