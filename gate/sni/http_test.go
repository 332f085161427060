package sni

import (
	"bufio"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"flowgate/gate"
)

var denyPaper = spec(gate.Denylist, []string{"blocked.example.net"}, "http://example.org/papers/lattice-qcd-2026")

func TestHTTPHostAndPath(t *testing.T) {
	cases := []struct {
		name, host, target string
		sp                 gate.Spec
		dst                netip.Addr
		status             string
		reason             gate.Reason
		rule               string
		upstreamURI        string // what the upstream must see, when allowed
	}{
		{name: "allowed host", host: "example.org", target: "/papers/other", sp: denyPaper, dst: addrOrg,
			status: "200", reason: gate.ReasonNotBlocked, rule: "default", upstreamURI: "/papers/other"},
		{name: "blocked host", host: "blocked.example.net", target: "/", sp: denyPaper, dst: addrBlocked,
			status: "403", reason: gate.ReasonHostBlocked, rule: "sandbox.blocked_hosts[0] blocked.example.net"},
		{name: "blocked url", host: "example.org", target: "/papers/lattice-qcd-2026", sp: denyPaper, dst: addrOrg,
			status: "403", reason: gate.ReasonURLBlocked, rule: "sandbox.blocked_urls[0] http://example.org/papers/lattice-qcd-2026"},
		{name: "below blocked url", host: "example.org", target: "/papers/lattice-qcd-2026/v2.pdf?x=1", sp: denyPaper, dst: addrOrg,
			status: "403", reason: gate.ReasonURLBlocked, rule: "sandbox.blocked_urls[0] http://example.org/papers/lattice-qcd-2026"},
		{name: "dot-dot escape", host: "example.org", target: "/x/%2e%2e/papers/lattice-qcd-2026", sp: denyPaper, dst: addrOrg,
			status: "403", reason: gate.ReasonURLBlocked, rule: "sandbox.blocked_urls[0] http://example.org/papers/lattice-qcd-2026"},
		{name: "double slash", host: "example.org", target: "//papers//lattice-qcd-2026", sp: denyPaper, dst: addrOrg,
			status: "403", reason: gate.ReasonURLBlocked, rule: "sandbox.blocked_urls[0] http://example.org/papers/lattice-qcd-2026"},
		{name: "encoded slash", host: "example.org", target: "/papers%2Flattice-qcd-2026", sp: denyPaper, dst: addrOrg,
			status: "403", reason: gate.ReasonURLBlocked, rule: "sandbox.blocked_urls[0] http://example.org/papers/lattice-qcd-2026"},
		{name: "case", host: "EXAMPLE.org.", target: "/Papers/Lattice-QCD-2026", sp: denyPaper, dst: addrOrg,
			status: "403", reason: gate.ReasonURLBlocked, rule: "sandbox.blocked_urls[0] http://example.org/papers/lattice-qcd-2026"},
		{name: "subdomain of url host", host: "www.example.com", target: "/papers/x", sp: spec(gate.Denylist, nil, "http://example.com/papers"), dst: addrCom,
			status: "403", reason: gate.ReasonURLBlocked, rule: "sandbox.blocked_urls[0] http://example.com/papers"},
		{name: "canonical path upstream", host: "example.org", target: "/a/./b/../c//d%7e?q=%2e%2e", sp: denyPaper, dst: addrOrg,
			status: "200", reason: gate.ReasonNotBlocked, rule: "default", upstreamURI: "/a/c/d~?q=%2e%2e"},
		{name: "fronting by Host", host: "example.com", target: "/", sp: denyPaper, dst: addrBlocked,
			status: "403", reason: gate.ReasonAddrMismatch, rule: "default"},
		{name: "allowlist host", host: "example.com", target: "/", sp: allowCom, dst: addrCom,
			status: "200", reason: gate.ReasonHostAllowed, rule: "sandbox.allowed_hosts[0] example.com", upstreamURI: "/"},
		{name: "allowlist refused", host: "example.net", target: "/", sp: allowCom, dst: addrCom,
			status: "403", reason: gate.ReasonNotAllowed, rule: "default"},
		{name: "bad host", host: "exa mple.com", target: "/", sp: denyPaper, dst: addrCom,
			status: "400", reason: gate.ReasonBadName, rule: "default"},
		{name: "bad path", host: "example.com", target: "/a%zz", sp: denyPaper, dst: addrCom,
			status: "400", reason: gate.ReasonBadRequest, rule: "default"},
		{name: "IP host equal to destination", host: "198.51.100.11", target: "/papers/lattice-qcd-2026", sp: denyPaper, dst: addrOrg,
			status: "403", reason: gate.ReasonURLBlocked, rule: "sandbox.blocked_urls[0] http://example.org/papers/lattice-qcd-2026"},
		{name: "IP host not the destination", host: "198.51.100.10", target: "/", sp: denyPaper, dst: addrOrg,
			status: "403", reason: gate.ReasonAddrMismatch, rule: "default"},
		// A rule written for an address binds whatever name is sent there.
		{name: "name to an address with rules of its own", host: "example.com", target: "/papers/x", sp: spec(gate.Denylist, nil, "http://198.51.100.10/papers"), dst: addrCom,
			status: "403", reason: gate.ReasonURLBlocked, rule: "sandbox.blocked_urls[0] http://198.51.100.10/papers"},
		{name: "name to an address with rules of its own, other path", host: "example.com", target: "/ok", sp: spec(gate.Denylist, nil, "http://198.51.100.10/papers"), dst: addrCom,
			status: "200", reason: gate.ReasonNotBlocked, rule: "default", upstreamURI: "/ok"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newLoopFixture(t, tc.sp, nil)
			dst := ap(tc.dst, portHTTP)
			resp := f.rawHTTP(t, dst, "GET "+tc.target+" HTTP/1.1\r\nHost: "+tc.host+"\r\nConnection: close\r\n\r\n")
			if !strings.HasPrefix(resp, "HTTP/1.1 "+tc.status+" ") {
				t.Fatalf("response %q, want status %s", resp, tc.status)
			}
			r := f.expectRecord(t, gate.ProtoHTTP, dst, tc.reason)
			if r.Rule != tc.rule {
				t.Errorf("rule %q, want %q", r.Rule, tc.rule)
			}
			if tc.status != "200" {
				if !strings.Contains(resp, ReasonHeader+": "+string(tc.reason)) {
					t.Errorf("no %s header in %q", ReasonHeader, resp)
				}
				if !strings.Contains(resp, "denied ("+string(tc.reason)+") by "+tc.rule) {
					t.Errorf("body does not name reason and rule: %q", resp)
				}
				if seen := f.seenHTTP(); len(seen) != 0 {
					t.Errorf("a refused request reached the upstream: %q", seen)
				}
				return
			}
			seen := f.seenHTTP()
			if len(seen) != 1 || !strings.HasPrefix(seen[0], "GET "+tc.upstreamURI+" host=") {
				t.Fatalf("upstream saw %q, want GET %s", seen, tc.upstreamURI)
			}
		})
	}
}

// TestHTTPKeepAliveSecondRequestChecked sends an allowed request and then,
// on the same connection, a blocked one (and pipelined, in one write): the
// first is answered, the second refused, and the upstream never sees it.
func TestHTTPKeepAliveSecondRequestChecked(t *testing.T) {
	f := newLoopFixture(t, denyPaper, nil)
	dst := ap(addrOrg, portHTTP)
	resp := f.rawHTTP(t, dst,
		"GET /ok HTTP/1.1\r\nHost: example.org\r\n\r\n"+
			"GET /papers/lattice-qcd-2026/ HTTP/1.1\r\nHost: example.org\r\n\r\n"+
			"GET /after HTTP/1.1\r\nHost: example.org\r\n\r\n")
	first := strings.Index(resp, "HTTP/1.1 200 OK")
	second := strings.Index(resp, "HTTP/1.1 403 Forbidden")
	if first < 0 || second < first {
		t.Fatalf("want 200 then 403, got %q", resp)
	}
	if !strings.Contains(resp, "flowgate: example.org/papers/lattice-qcd-2026/ denied (url_blocked)") {
		t.Fatalf("403 body does not name the path: %q", resp)
	}
	seen := f.seenHTTP()
	if len(seen) != 1 || !strings.HasPrefix(seen[0], "GET /ok ") {
		t.Fatalf("upstream saw %q, want only GET /ok", seen)
	}
	recs := f.rec.all()
	if len(recs) != 2 || recs[0].Reason != gate.ReasonNotBlocked || recs[1].Reason != gate.ReasonURLBlocked {
		t.Fatalf("want one record per request (not_blocked, url_blocked):\n%s", f.rec.dump())
	}
}

// TestHTTPBodyCannotSmuggle puts a blocked request inside a body: it is
// forwarded as the body, with the framing net/http read, never as a request.
func TestHTTPBodyCannotSmuggle(t *testing.T) {
	f := newLoopFixture(t, denyPaper, nil)
	dst := ap(addrOrg, portHTTP)
	inner := "GET /papers/lattice-qcd-2026 HTTP/1.1\r\nHost: example.org\r\n\r\n"
	resp := f.rawHTTP(t, dst, "POST /form HTTP/1.1\r\nHost: example.org\r\nContent-Length: "+itoa(len(inner))+"\r\n\r\n"+inner+
		"POST /chunked HTTP/1.1\r\nHost: example.org\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
	if strings.Count(resp, "HTTP/1.1 200 OK") != 2 {
		t.Fatalf("want two 200s, got %q", resp)
	}
	seen := f.seenHTTP()
	if len(seen) != 2 || !strings.HasPrefix(seen[0], "POST /form ") || !strings.HasPrefix(seen[1], "POST /chunked ") {
		t.Fatalf("upstream saw %q", seen)
	}
	if !strings.Contains(resp, `body="hello"`) {
		t.Fatalf("chunked body not forwarded: %q", resp)
	}
}

func TestHTTPNoHost(t *testing.T) {
	f := newLoopFixture(t, denyPaper, nil)
	dst := ap(addrOrg, portHTTP)
	// HTTP/1.1 requires Host.
	if resp := f.rawHTTP(t, dst, "GET / HTTP/1.1\r\n\r\n"); !strings.HasPrefix(resp, "HTTP/1.1 400 ") {
		t.Fatalf("HTTP/1.1 without Host: %q", resp)
	}
	f.expectRecord(t, gate.ProtoHTTP, dst, gate.ReasonBadRequest)
	// HTTP/1.0 without Host is judged by the address and the URL rules of
	// every name the address belongs to.
	f2 := newLoopFixture(t, denyPaper, nil)
	if resp := f2.rawHTTP(t, dst, "GET /papers/lattice-qcd-2026 HTTP/1.0\r\n\r\n"); !strings.HasPrefix(resp, "HTTP/1.1 403 ") {
		t.Fatalf("HTTP/1.0 to a blocked path by address: %q", resp)
	}
	f2.expectRecord(t, gate.ProtoHTTP, dst, gate.ReasonURLBlocked)
	f3 := newLoopFixture(t, denyPaper, nil)
	if resp := f3.rawHTTP(t, dst, "GET /fine HTTP/1.0\r\n\r\n"); !strings.Contains(resp, " 200 OK") {
		t.Fatalf("HTTP/1.0 allowed path: %q", resp)
	}
	f3.expectRecord(t, gate.ProtoHTTP, dst, gate.ReasonNotBlocked)
}

// TestHTTPUpgrades passes WebSocket upgrades on and strips h2c, which would
// carry HTTP/2 requests no one checks.
func TestHTTPUpgrades(t *testing.T) {
	f := newLoopFixture(t, denyPaper, nil)
	dst := ap(addrOrg, portHTTP)
	f.rawHTTP(t, dst, "GET /h2 HTTP/1.1\r\nHost: example.org\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\nGET /ws HTTP/1.1\r\nHost: example.org\r\nConnection: close\r\nUpgrade: websocket\r\n\r\n")
	seen := f.seenHTTP()
	if len(seen) != 2 || !strings.HasSuffix(seen[0], "upgrade=") || !strings.HasSuffix(seen[1], "upgrade=websocket") {
		t.Fatalf("upstream saw %q; want h2c stripped and websocket kept", seen)
	}
}

// TestHTTPReroutingHeadersDropped: headers that some servers and
// frameworks take in place of the checked path or Host never reach the
// upstream; the request is judged and served by what it says itself.
func TestHTTPReroutingHeadersDropped(t *testing.T) {
	f := newLoopFixture(t, denyPaper, nil)
	dst := ap(addrOrg, portHTTP)
	var req strings.Builder
	req.WriteString("GET /ok HTTP/1.1\r\nHost: example.org\r\nConnection: close\r\nX-Custom: kept\r\n")
	for _, h := range []string{"X-Original-URL", "X_Original_URL", "x-rewrite-url", "X-Envoy-Original-Path", "X-Forwarded-Uri", "X-Forwarded-Prefix",
		"X-Script-Name", "X-Replaced-Path"} {
		req.WriteString(h + ": /papers/lattice-qcd-2026\r\n")
	}
	for _, h := range []string{"X-Forwarded-Host", "X_Forwarded_Host", "X-Original-Host", "X-Host", "X-Forwarded-Server"} {
		req.WriteString(h + ": blocked.example.net\r\n")
	}
	req.WriteString("Forwarded: host=blocked.example.net\r\n\r\n")
	if resp := f.rawHTTP(t, dst, req.String()); !strings.HasPrefix(resp, "HTTP/1.1 200 ") {
		t.Fatalf("request with rerouting headers: %q", resp)
	}
	if seen := f.seenHTTP(); len(seen) != 1 || seen[0] != "GET /ok host=example.org upgrade= X-Custom=kept" {
		t.Fatalf("upstream saw %q; want the rerouting headers gone and the rest kept", seen)
	}
}

func TestHTTPLeadingNewlinesAndUnknownWords(t *testing.T) {
	f := newLoopFixture(t, denyPaper, nil)
	dst := ap(addrOrg, portHTTP)
	// Servers skip empty lines before a request: so does the check.
	resp := f.rawHTTP(t, dst, "\r\n\r\nGET /papers/lattice-qcd-2026 HTTP/1.1\r\nHost: example.org\r\n\r\n")
	if !strings.HasPrefix(resp, "HTTP/1.1 403 ") {
		t.Fatalf("leading CRLF: %q", resp)
	}
	f.expectRecord(t, gate.ProtoHTTP, dst, gate.ReasonURLBlocked)
	// HTTP/0.9 ("GET /path") is not passed on unchecked.
	f2 := newLoopFixture(t, denyPaper, nil)
	if resp := f2.rawHTTP(t, dst, "GET /papers/lattice-qcd-2026\r\n"); !strings.HasPrefix(resp, "HTTP/1.1 400 ") {
		t.Fatalf("HTTP/0.9: %q", resp)
	}
	f2.expectRecord(t, gate.ProtoHTTP, dst, gate.ReasonBadRequest)
}

// TestHTTPExpectContinue: flowgate answers 100 Continue itself once the
// request is allowed, and never for a refused one.
func TestHTTPExpectContinue(t *testing.T) {
	f := newLoopFixture(t, denyPaper, nil)
	dst := ap(addrOrg, portHTTP)
	c := f.dialTransparent(t, dst)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "POST /upload HTTP/1.1\r\nHost: example.org\r\nExpect: 100-continue\r\nContent-Length: 5\r\nConnection: close\r\n\r\n")
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("want 100 Continue before the body, got %q %v", line, err)
	}
	io.WriteString(c, "hello")
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "200 OK") || !strings.Contains(string(rest), `body="hello"`) {
		t.Fatalf("after the body: %q", rest)
	}
	resp := f.rawHTTP(t, dst, "POST /papers/lattice-qcd-2026 HTTP/1.1\r\nHost: example.org\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	if !strings.HasPrefix(resp, "HTTP/1.1 403 ") {
		t.Fatalf("refused upload: %q", resp)
	}
}
