package sni

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"flowgate/gate"
	"flowgate/gate/sni/internal/snitest"
)

func TestConnect(t *testing.T) {
	cases := []struct {
		name, target string
		sp           gate.Spec
		status       int
		reason       gate.Reason
		dialled      string // the address dialled, when allowed
	}{
		{"denylist allowed", "example.com:443", denyBlocked, 200, gate.ReasonNotBlocked, "198.51.100.10:443"},
		{"denylist blocked", "blocked.example.net:443", denyBlocked, 403, gate.ReasonHostBlocked, ""},
		{"allowlist allowed", "www.example.com:443", allowCom, 200, gate.ReasonHostAllowed, "198.51.100.10:443"},
		{"allowlist refused", "example.net:443", allowCom, 403, gate.ReasonNotAllowed, ""},
		{"needs interception", "example.org:443", denyPaper, 403, gate.ReasonNeedsIntercept, ""},
		{"rebinding to metadata", "rebind.example.com:443", denyBlocked, 403, gate.ReasonMetadata, ""},
		{"metadata literal", "169.254.169.254:80", denyBlocked, 403, gate.ReasonMetadata, ""},
		{"metadata name", "metadata.google.internal:80", denyBlocked, 403, gate.ReasonMetadata, ""},
		{"no port", "example.com", denyBlocked, 400, gate.ReasonBadRequest, ""},
		{"bad name", "exa_mple.com:443", denyBlocked, 400, gate.ReasonBadName, ""},
		{"unresolvable", "nx.example.com:443", denyBlocked, 502, gate.ReasonResolveFailed, ""},
		{"IP literal learned", "198.51.100.10:443", allowCom, 200, gate.ReasonLearned, "198.51.100.10:443"},
		{"IP literal unknown", "203.0.113.5:443", allowCom, 403, gate.ReasonUnknownAddress, ""},
		{"another loopback address", "127.0.0.11:53", denyBlocked, 403, gate.ReasonLoopback, ""},
		{"unspecified address", "0.0.0.0:8000", denyBlocked, 403, gate.ReasonLoopback, ""},
		{"a name on another loopback address", "lo11.example.net:53", denyBlocked, 403, gate.ReasonLoopback, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newLoopFixture(t, tc.sp, nil)
			c, resp, _ := f.connect(t, tc.target)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if tc.status == 200 {
				c.Close() // the record is written when the tunnel's fate is known
			}
			r := f.rec.wait(t, "connect", func(r gate.Record) bool { return r.Proto == gate.ProtoConnect })
			if r.Reason != tc.reason {
				t.Fatalf("record reason %s, want %s", r.Reason, tc.reason)
			}
			if tc.status != 200 {
				if r.Reason != tc.reason || r.Verdict != gate.VerdictDeny {
					t.Fatalf("record %s %s, want deny %s", r.Verdict, r.Reason, tc.reason)
				}
				if got := resp.Header.Get(ReasonHeader); got != string(tc.reason) {
					t.Fatalf("%s %q, want %q", ReasonHeader, got, tc.reason)
				}
				return
			}
			if d := f.dialledAddrs(); !slices.Equal(d, []string{tc.dialled}) {
				t.Fatalf("dialled %q, want only the checked address %s", d, tc.dialled)
			}
		})
	}
}

// TestConnectTunnel runs TLS through CONNECT: the SNI must be the target.
func TestConnectTunnel(t *testing.T) {
	for _, tc := range []struct {
		name, target, sni string
		sp                gate.Spec
		reason            gate.Reason
	}{
		{"same name", "example.com:443", "example.com", denyBlocked, gate.ReasonNotBlocked},
		{"other name", "example.com:443", "blocked.example.net", denyBlocked, gate.ReasonNameMismatch},
		{"other allowed name", "example.com:443", "www.example.com", allowCom, gate.ReasonNameMismatch},
		{"ECH in allowlist", "example.com:443", "ech", allowCom, gate.ReasonECH},
		{"IP target, SNI bound to it", "198.51.100.10:443", "example.com", allowCom, gate.ReasonHostAllowed},
		{"IP target, SNI of another address", "198.51.100.11:443", "example.com", denyBlocked, gate.ReasonAddrMismatch},
		// An IP literal as server name sends no SNI.
		{"IP target of a host with blocked_urls, no SNI", "198.51.100.11:443", "198.51.100.11", denyPaper, gate.ReasonNeedsIntercept},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newLoopFixture(t, tc.sp, nil)
			c, resp, br := f.connect(t, tc.target)
			if resp.StatusCode != 200 {
				t.Fatalf("CONNECT status %d", resp.StatusCode)
			}
			cfg := &tls.Config{ServerName: tc.sni, RootCAs: f.ca.Pool}
			if tc.sni == "ech" {
				cfg = echConfig(t, f)
			}
			tc2 := tls.Client(&bufConn{Conn: c, r: br}, cfg)
			err := tc2.Handshake()
			r := f.rec.wait(t, "connect", func(r gate.Record) bool { return r.Proto == gate.ProtoConnect })
			if r.Reason != tc.reason || r.Detail != "tls" {
				t.Fatalf("record reason %s detail %q, want %s tls:\n%s", r.Reason, r.Detail, tc.reason, f.rec.dump())
			}
			if r.Verdict == gate.VerdictDeny {
				if err == nil || !strings.Contains(err.Error(), "access denied") {
					t.Fatalf("want access denied, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(tc2, "GET /t HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", tc.sni)
			b, _ := io.ReadAll(tc2)
			if !strings.Contains(string(b), "sni="+tc.sni) {
				t.Fatalf("tunnel answer %q", b)
			}
		})
	}
}

// TestConnectTunnelOpaque: a stream that is neither TLS nor HTTP inside a
// tunnel to an address blocked_urls rules apply to (its own, or a name's
// it serves) is refused like TLS without a name; elsewhere it passes.
func TestConnectTunnelOpaque(t *testing.T) {
	for _, tc := range []struct {
		name, target string
		sp           gate.Spec
		reason       gate.Reason
	}{
		{"address of a host with blocked_urls", "198.51.100.11:7", denyPaper, gate.ReasonNeedsIntercept},
		{"address with blocked_urls of its own", "203.0.113.5:7", spec(gate.Denylist, nil, "http://203.0.113.5/x"), gate.ReasonNeedsIntercept},
		{"other address", "203.0.113.5:7", denyPaper, gate.ReasonNotBlocked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newLoopFixture(t, tc.sp, nil)
			c, resp, br := f.connect(t, tc.target)
			if resp.StatusCode != 200 {
				t.Fatalf("CONNECT status %d", resp.StatusCode)
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, "ping\n")
			line, _ := br.ReadString('\n')
			r := f.rec.wait(t, "connect", func(r gate.Record) bool { return r.Proto == gate.ProtoConnect && r.Detail == "tcp" })
			if r.Reason != tc.reason {
				t.Fatalf("record %+v, want %s:\n%s", r, tc.reason, f.rec.dump())
			}
			if (line == "ping\n") != (r.Verdict == gate.VerdictAllow) {
				t.Fatalf("verdict %s, but the client read %q", r.Verdict, line)
			}
		})
	}
}

// TestConnectTunnelHTTP checks plain HTTP inside a tunnel like the
// transparent path: Host must be the target, each path is checked.
func TestConnectTunnelHTTP(t *testing.T) {
	// A CONNECT to a host with blocked_urls is refused outright; to its
	// address, the requests inside are checked like transparent ones.
	f := newLoopFixture(t, spec(gate.Denylist, nil, "http://example.com/papers"), nil)
	if _, resp, _ := f.connect(t, "www.example.com:80"); resp.StatusCode != 403 || resp.Header.Get(ReasonHeader) != "needs_intercept" {
		t.Fatalf("CONNECT to a host with blocked_urls: %d %s", resp.StatusCode, resp.Header.Get(ReasonHeader))
	}
	c, resp, br := f.connect(t, "198.51.100.10:80")
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT %d", resp.StatusCode)
	}
	io.WriteString(c, "GET /ok HTTP/1.1\r\nHost: www.example.com\r\n\r\nGET /papers/x HTTP/1.1\r\nHost: www.example.com\r\n\r\n")
	b, _ := io.ReadAll(br)
	if !strings.Contains(string(b), "200 OK") || !strings.Contains(string(b), "403 Forbidden") {
		t.Fatalf("tunnel answers %q", b)
	}
	f.rec.wait(t, "url_blocked", func(r gate.Record) bool { return r.Proto == gate.ProtoHTTP && r.Reason == gate.ReasonURLBlocked })

	f2 := newLoopFixture(t, denyBlocked, nil)
	c2, _, br2 := f2.connect(t, "example.com:80")
	io.WriteString(c2, "GET / HTTP/1.1\r\nHost: example.org\r\n\r\n")
	b2, _ := io.ReadAll(br2)
	if !strings.Contains(string(b2), "403 Forbidden") {
		t.Fatalf("Host other than the target: %q", b2)
	}
	f2.rec.wait(t, "name_mismatch", func(r gate.Record) bool { return r.Proto == gate.ProtoHTTP && r.Reason == gate.ReasonNameMismatch })
}

// TestProxyAddressURLRules: blocked_urls rules written for an address bind
// an absolute-form request to a name that resolves there, on every request
// of the connection.
func TestProxyAddressURLRules(t *testing.T) {
	f := newLoopFixture(t, spec(gate.Denylist, nil, "http://198.51.100.11/papers"), nil)
	c := f.proxyConn(t)
	io.WriteString(c, "GET http://example.org/ok HTTP/1.1\r\nHost: example.org\r\n\r\n"+
		"GET http://example.org/papers/x HTTP/1.1\r\nHost: example.org\r\n\r\n")
	br := bufio.NewReader(c)
	r1, err := http.ReadResponse(br, nil)
	if err != nil || r1.StatusCode != 200 {
		t.Fatalf("first: %v %v", r1, err)
	}
	io.ReadAll(r1.Body)
	r2, err := http.ReadResponse(br, nil)
	if err != nil || r2.StatusCode != 403 || r2.Header.Get(ReasonHeader) != "url_blocked" {
		t.Fatalf("second, to an address with rules of its own: %v %v", r2, err)
	}
}

func TestProxyAbsoluteForm(t *testing.T) {
	f := newLoopFixture(t, denyPaper, nil)
	c := f.proxyConn(t)
	io.WriteString(c, "GET http://example.org/ok?a=1 HTTP/1.1\r\nHost: ignored.example\r\nProxy-Authorization: Basic eA==\r\n\r\n"+
		"GET http://EXAMPLE.org/x/../papers/lattice-qcd-2026 HTTP/1.1\r\nHost: example.org\r\n\r\n")
	br := bufio.NewReader(c)
	r1, err := http.ReadResponse(br, nil)
	if err != nil || r1.StatusCode != 200 {
		t.Fatalf("first: %v %v", r1, err)
	}
	b1, _ := io.ReadAll(r1.Body)
	if string(b1) != `host=example.org uri=/ok?a=1 body=""` {
		t.Fatalf("upstream saw %q", b1)
	}
	r2, err := http.ReadResponse(br, nil)
	if err != nil || r2.StatusCode != 403 || r2.Header.Get(ReasonHeader) != "url_blocked" {
		t.Fatalf("second: %v %v", r2, err)
	}
	b2, _ := io.ReadAll(r2.Body)
	if !strings.Contains(string(b2), "example.org/papers/lattice-qcd-2026 denied (url_blocked) by sandbox.blocked_urls[0]") {
		t.Fatalf("403 body %q", b2)
	}
	if d := f.dialledAddrs(); !slices.Equal(d, []string{"198.51.100.11:80"}) {
		t.Fatalf("dialled %q", d)
	}
	// Origin-form to the proxy is not a proxy request.
	c2 := f.proxyConn(t)
	io.WriteString(c2, "GET / HTTP/1.1\r\nHost: example.org\r\n\r\n")
	r3, err := http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil || r3.StatusCode != 400 {
		t.Fatalf("origin-form: %v %v", r3, err)
	}
}

// TestProxyGoClient drives the proxy with net/http's own proxy support.
func TestProxyGoClient(t *testing.T) {
	f := newLoopFixture(t, denyBlocked, nil)
	pu, _ := url.Parse("http://" + f.pl.Addr().String())
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: f.ca.Pool}}}
	resp, err := client.Get("https://example.com/via-proxy")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(string(b), "sni=example.com ") {
		t.Fatalf("body %q", b)
	}
	_, err = client.Get("https://blocked.example.net/")
	if err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Fatalf("blocked via proxy: %v", err)
	}
	resp, err = client.Get("http://example.org/plain")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "uri=/plain") {
		t.Fatalf("plain body %q", b)
	}
}

func echConfig(t testing.TB, f *loopFixture) *tls.Config {
	list, err := snitest.ECHConfigList("example.com")
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{ServerName: "inner.example.org", RootCAs: f.ca.Pool, MinVersion: tls.VersionTLS13,
		EncryptedClientHelloConfigList: list}
}

// bufConn reads first what a bufio.Reader already holds.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }
