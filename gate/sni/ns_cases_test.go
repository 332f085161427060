package sni

import (
	"net/netip"
	"strings"
	"testing"

	"flowgate/gate"
)

// TestNSDenylist runs agent clients (uid 1000: curl, python3 urllib, the
// test client) in a real sandbox namespace whose TCP is redirected by
// nftables, under a denylist.
func TestNSDenylist(t *testing.T) {
	f := newNSFixture(t, spec(gate.Denylist, []string{"blocked.example.net"}, "http://example.org/papers/lattice-qcd-2026"))

	t.Run("TLS allowed over IPv4 and IPv6", func(t *testing.T) {
		out, err := f.curl(t, "--resolve", "example.com:443:198.51.100.10", "https://example.com/v4")
		if err != nil || !strings.HasPrefix(out, "sni=example.com host=example.com uri=/v4") {
			t.Fatalf("curl v4: %v %q", err, out)
		}
		f.expectNS(t, gate.ProtoTLS, "198.51.100.10:443", gate.ReasonNotBlocked)
		out, err = f.curl(t, "--resolve", "example.com:443:[2001:db8::10]", "https://example.com/v6")
		if err != nil || !strings.HasPrefix(out, "sni=example.com host=example.com uri=/v6") {
			t.Fatalf("curl v6: %v %q", err, out)
		}
		f.expectNS(t, gate.ProtoTLS, "[2001:db8::10]:443", gate.ReasonNotBlocked)
	})
	t.Run("TLS blocked host gets access_denied", func(t *testing.T) {
		out, err := f.curl(t, "--resolve", "blocked.example.net:443:198.51.100.12", "https://blocked.example.net/")
		if err == nil || !strings.Contains(out, "alert access denied") {
			t.Fatalf("curl to a blocked host: %v %q", err, out)
		}
		f.expectNS(t, gate.ProtoTLS, "198.51.100.12:443", gate.ReasonHostBlocked)
	})
	t.Run("needs interception", func(t *testing.T) {
		if out, err := f.curl(t, "--resolve", "example.org:443:198.51.100.11", "https://example.org/"); err == nil {
			t.Fatalf("HTTPS to a host with blocked_urls passed: %q", out)
		}
		f.expectNS(t, gate.ProtoTLS, "198.51.100.11:443", gate.ReasonNeedsIntercept)
	})
	t.Run("plain HTTP path blocked with 403", func(t *testing.T) {
		out, err := f.curl(t, "-i", "http://198.51.100.11/x/..%2fpapers/lattice-qcd-2026/v2", "-H", "Host: example.org")
		if err != nil || !strings.HasPrefix(out, "HTTP/1.1 403 Forbidden") ||
			!strings.Contains(out, "flowgate: example.org/papers/lattice-qcd-2026/v2 denied (url_blocked) by sandbox.blocked_urls[0] http://example.org/papers/lattice-qcd-2026") {
			t.Fatalf("curl: %v %q", err, out)
		}
		out, err = f.curl(t, "http://example.org/fine", "--resolve", "example.org:80:198.51.100.11")
		if err != nil || out != "sni= host=example.org uri=/fine" {
			t.Fatalf("curl allowed path: %v %q", err, out)
		}
	})
	t.Run("python urllib through the proxy", func(t *testing.T) {
		proxy := []string{"HTTPS_PROXY=http://127.0.0.1:15080", "HTTP_PROXY=http://127.0.0.1:15080"}
		if out := f.python(t, "https://blocked.example.net/", proxy...); out != "unreachable: URLError <urlopen error Tunnel connection failed: 403 Forbidden>" {
			t.Fatalf("python to a blocked host: %q", out)
		}
		if out := f.python(t, "https://example.com/", proxy...); !strings.HasPrefix(out, "reachable (HTTP 200) sni=example.com") {
			t.Fatalf("python to an allowed host: %q", out)
		}
		if out := f.python(t, "http://example.org/papers/lattice-qcd-2026", proxy...); out != "reachable (HTTP 403)" {
			t.Fatalf("python absolute-form to a blocked URL: %q", out)
		}
		f.rec.wait(t, "connect deny", func(r gate.Record) bool {
			return r.Proto == gate.ProtoConnect && r.Name == "blocked.example.net" && r.Reason == gate.ReasonHostBlocked
		})
	})
	t.Run("large ClientHello in small segments", func(t *testing.T) {
		out, err := f.client(t, "-addr", "198.51.100.10:443", "-sni", "example.com", "-path", "/big", "-pad", "4000", "-chunk", "61", "-delay", "2ms")
		if err != nil || out != "OK 200 sni=example.com host=example.com uri=/big\n" {
			t.Fatalf("client: %v %q", err, out)
		}
	})
	t.Run("other TCP", func(t *testing.T) {
		out, err := f.client(t, "-mode", "tcp", "-addr", "198.51.100.10:7")
		if err != nil || out != "OK ping\n" {
			t.Fatalf("echo to an allowed address: %v %q", err, out)
		}
		f.expectNS(t, gate.ProtoTCP, "198.51.100.10:7", gate.ReasonNotBlocked)
		if out, err := f.client(t, "-mode", "tcp", "-addr", "198.51.100.12:7"); err == nil {
			t.Fatalf("echo to a blocked host's address: %q", out)
		}
		f.expectNS(t, gate.ProtoTCP, "198.51.100.12:7", gate.ReasonAddressBlocked)
	})
	t.Run("loop and metadata", func(t *testing.T) {
		// Loopback is not redirected: the transparent port sees a
		// connection whose original destination is itself.
		if out, err := f.client(t, "-mode", "tcp", "-addr", "127.0.0.1:15001"); err == nil {
			t.Fatalf("loop: %q", out)
		}
		f.expectNS(t, gate.ProtoTCP, "127.0.0.1:15001", gate.ReasonLoop)
		if out, err := f.curl(t, "--max-time", "5", "http://169.254.169.254/latest/meta-data/"); err == nil {
			t.Fatalf("metadata: %q", out)
		}
		f.expectNS(t, gate.ProtoTCP, "169.254.169.254:80", gate.ReasonMetadata)
	})
	for _, r := range f.rec.all() {
		if r.Sandbox != "ns-test" || r.UID != 1000 {
			t.Fatalf("record not stamped: %+v", r)
		}
	}
}

func TestNSAllowlist(t *testing.T) {
	f := newNSFixture(t, spec(gate.Allowlist, []string{"example.com"}))
	out, err := f.curl(t, "--resolve", "www.example.com:443:198.51.100.10", "https://www.example.com/a")
	if err != nil || !strings.HasPrefix(out, "sni=www.example.com") {
		t.Fatalf("allowed: %v %q", err, out)
	}
	f.expectNS(t, gate.ProtoTLS, "198.51.100.10:443", gate.ReasonHostAllowed)

	if out, err := f.curl(t, "--resolve", "example.org:443:198.51.100.11", "https://example.org/"); err == nil || !strings.Contains(out, "alert access denied") {
		t.Fatalf("not allowed: %v %q", err, out)
	}
	f.expectNS(t, gate.ProtoTLS, "198.51.100.11:443", gate.ReasonNotAllowed)

	// An allowed name sent to another host's address: fronting.
	if out, err := f.curl(t, "--resolve", "example.com:8443:198.51.100.11", "https://example.com:8443/"); err == nil {
		t.Fatalf("fronting passed: %q", out)
	}
	f.expectNS(t, gate.ProtoTLS, "198.51.100.11:8443", gate.ReasonAddrMismatch)

	// No SNI: by address.
	if out, err := f.client(t, "-addr", "198.51.100.10:8443", "-host", "x"); err != nil || !strings.HasPrefix(out, "OK 200 sni= ") {
		t.Fatalf("no SNI to a learned address: %v %q", err, out)
	}
	f.expectNS(t, gate.ProtoTLS, "198.51.100.10:8443", gate.ReasonLearned)
	if out, err := f.client(t, "-addr", "198.51.100.12:443", "-host", "x"); err == nil {
		t.Fatalf("no SNI to an unknown address: %q", out)
	}
	f.expectNS(t, gate.ProtoTLS, "198.51.100.12:443", gate.ReasonUnknownAddress)

	// ECH hides the name: refused in allowlist.
	out, err = f.client(t, "-addr", "[2001:db8::10]:443", "-sni", "inner.example.org", "-ech", "example.com")
	if err == nil || !strings.Contains(out, "access denied") {
		t.Fatalf("ECH: %v %q", err, out)
	}
	f.expectNS(t, gate.ProtoTLS, "[2001:db8::10]:443", gate.ReasonECH)

	// CONNECT with an SNI other than the target.
	out, err = f.client(t, "-proxy", "127.0.0.1:15080", "-addr", "example.com:443", "-sni", "www.example.com")
	if err == nil || !strings.Contains(out, "access denied") {
		t.Fatalf("CONNECT name mismatch: %v %q", err, out)
	}
	f.rec.wait(t, "name_mismatch", func(r gate.Record) bool {
		return r.Proto == gate.ProtoConnect && r.Reason == gate.ReasonNameMismatch && r.Name == "example.com"
	})
}

// expectNS waits for the record of proto to dest and checks its reason.
func (f *nsFixture) expectNS(t testing.TB, proto, dest string, reason gate.Reason) {
	t.Helper()
	if _, err := netip.ParseAddrPort(dest); err != nil {
		t.Fatalf("bad dest %q", dest)
	}
	r := f.rec.wait(t, proto+" "+dest, func(r gate.Record) bool { return r.Proto == proto && r.Dest == dest })
	if r.Reason != reason {
		t.Fatalf("%s %s: reason %s, want %s\n%s", proto, dest, r.Reason, reason, f.rec.dump())
	}
}
