package sni

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"flowgate/gate"
	"flowgate/gate/sni/internal/snitest"
)

var (
	denyBlocked = spec(gate.Denylist, []string{"blocked.example.net"})
	allowCom    = spec(gate.Allowlist, []string{"example.com", "*.example.org"})
)

func TestTLSBySNI(t *testing.T) {
	cases := []struct {
		name   string
		sp     gate.Spec
		dst    netip.Addr
		sni    string
		reason gate.Reason
		rule   string
	}{
		{"denylist allows others", denyBlocked, addrCom, "example.com", gate.ReasonNotBlocked, "default"},
		{"denylist blocks host", denyBlocked, addrBlocked, "blocked.example.net", gate.ReasonHostBlocked, "sandbox.blocked_hosts[0] blocked.example.net"},
		{"denylist blocks subdomain", spec(gate.Denylist, []string{"example.com"}), addrCom, "www.example.com", gate.ReasonHostBlocked, "sandbox.blocked_hosts[0] example.com"},
		{"allowlist allows host", allowCom, addrCom, "example.com", gate.ReasonHostAllowed, "sandbox.allowed_hosts[0] example.com"},
		{"allowlist refuses others", allowCom, addrOrg, "example.org", gate.ReasonNotAllowed, "default"},
		{"upper case and trailing form canonicalised", allowCom, addrCom, "WWW.Example.COM", gate.ReasonHostAllowed, "sandbox.allowed_hosts[0] example.com"},
		{"fronting: allowed name at a blocked host's address", denyBlocked, addrBlocked, "example.com", gate.ReasonAddrMismatch, "default"},
		{"fronting in allowlist", allowCom, addrOrg, "www.example.com", gate.ReasonAddrMismatch, "default"},
		{"metadata name", spec(gate.Denylist, nil), addrCom, "metadata.google.internal", gate.ReasonMetadata, "builtin metadata.google.internal"},
		{"public mode", spec(gate.Public, nil), addrOrg, "example.org", gate.ReasonPublic, "default"},
		{"a name to an address with URL rules of its own", spec(gate.Denylist, nil, "http://198.51.100.10/papers"), addrCom, "example.com",
			gate.ReasonNeedsIntercept, "sandbox.blocked_urls[0] http://198.51.100.10/papers"},
		{"no-network", spec(gate.NoNetwork, nil), addrOrg, "example.org", gate.ReasonNoNetwork, "default"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newLoopFixture(t, tc.sp, nil)
			dst := ap(tc.dst, portTLS)
			body, err := f.tlsGet(t, dst, tc.sni, "/x")
			r := f.expectRecord(t, gate.ProtoTLS, dst, tc.reason)
			if want := strings.ToLower(tc.sni); r.Name != want {
				t.Errorf("record name %q, want canonical %q", r.Name, want)
			}
			if r.Rule != tc.rule {
				t.Errorf("rule %q, want %q", r.Rule, tc.rule)
			}
			if r.Verdict == gate.VerdictAllow {
				if err != nil {
					t.Fatalf("allowed, but the client failed: %v", err)
				}
				// The hello is replayed as sent: the upstream sees the client's spelling.
				if want := "sni=" + tc.sni; !strings.HasPrefix(body, want) {
					t.Fatalf("body %q, want prefix %q", body, want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "access denied") {
				t.Fatalf("refused, the client should see an access_denied alert; got body %q err %v", body, err)
			}
		})
	}
}

func TestTLSBindingResolvesUnknownName(t *testing.T) {
	f := newLoopFixture(t, spec(gate.Allowlist, []string{"*.example.com"}), nil)
	dst := ap(addrLate, portTLS)
	if _, err := f.tlsGet(t, dst, "late.example.com", "/"); err != nil {
		t.Fatalf("late.example.com resolves to %s, should pass: %v", addrLate, err)
	}
	f.expectRecord(t, gate.ProtoTLS, dst, gate.ReasonHostAllowed)
	if n := f.resolveCount("late.example.com"); n != 1 {
		t.Fatalf("resolver asked %d times, want 1", n)
	}
	// Now learned: no second lookup.
	if _, err := f.tlsGet(t, dst, "late.example.com", "/"); err != nil {
		t.Fatal(err)
	}
	if n := f.resolveCount("late.example.com"); n != 1 {
		t.Fatalf("resolver asked %d times after learning, want 1", n)
	}
	// A name the resolver does not know cannot be bound.
	dst2 := ap(addrOrg, portTLS)
	f.tlsGet(t, dst2, "nx.example.com", "/")
	f.expectRecord(t, gate.ProtoTLS, dst2, gate.ReasonResolveFailed)
}

func TestTLSNoSNI(t *testing.T) {
	cases := []struct {
		name   string
		sp     gate.Spec
		dst    netip.Addr
		reason gate.Reason
	}{
		{"allowlist learned", allowCom, addrCom, gate.ReasonLearned},
		{"allowlist unknown", allowCom, addrUnknown, gate.ReasonUnknownAddress},
		{"allowlist learned for a refused name only", allowCom, addrBlocked, gate.ReasonUnknownAddress},
		{"allowlist cidr", spec(gate.Allowlist, []string{"198.51.100.0/24"}), addrOrg, gate.ReasonCIDRAllowed},
		{"denylist known blocked address", denyBlocked, addrBlocked, gate.ReasonAddressBlocked},
		{"denylist shared address with a blocked name", denyBlocked, addrShared, gate.ReasonAddressBlocked},
		{"denylist other address", denyBlocked, addrCom, gate.ReasonNotBlocked},
		{"denylist host with blocked_urls", spec(gate.Denylist, nil, "http://example.com/papers"), addrCom, gate.ReasonNeedsIntercept},
		{"denylist address with blocked_urls of its own", spec(gate.Denylist, nil, "http://198.51.100.11/papers"), addrOrg, gate.ReasonNeedsIntercept},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newLoopFixture(t, tc.sp, nil)
			dst := ap(tc.dst, portTLS)
			_, err := f.tlsGet(t, dst, "", "/")
			r := f.expectRecord(t, gate.ProtoTLS, dst, tc.reason)
			if r.Name != "" {
				t.Errorf("record names %q for a hello without SNI", r.Name)
			}
			if (r.Verdict == gate.VerdictAllow) != (err == nil) {
				t.Fatalf("verdict %s but client error %v", r.Verdict, err)
			}
		})
	}
}

func TestTLSNeedsIntercept(t *testing.T) {
	f := newLoopFixture(t, spec(gate.Denylist, nil, "http://example.org/papers/lattice-qcd-2026"), nil)
	dst := ap(addrOrg, portTLS)
	if _, err := f.tlsGet(t, dst, "example.org", "/"); err == nil {
		t.Fatal("HTTPS to a host with blocked_urls must be refused without interception")
	}
	r := f.expectRecord(t, gate.ProtoTLS, dst, gate.ReasonNeedsIntercept)
	if r.Name != "example.org" {
		t.Fatalf("name %q", r.Name)
	}
}

func TestNewRefusesHTTPSBlockedURLs(t *testing.T) {
	pol, err := gate.Compile(spec(gate.Denylist, nil, "https://example.org/papers/x"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{Policy: pol, Names: gate.NewNames(nil), Resolve: (&loopFixture{}).resolve, Dial: (&loopFixture{}).dial})
	if err == nil || !strings.Contains(err.Error(), "sandbox.blocked_urls[0] https://example.org/papers/x") ||
		!strings.Contains(err.Error(), "TLS interception") {
		t.Fatalf("New error %v, want a refusal naming the rule and TLS interception", err)
	}
}

func TestTLSECH(t *testing.T) {
	for _, tc := range []struct {
		sp     gate.Spec
		reason gate.Reason
	}{
		{allowCom, gate.ReasonECH},
		// In denylist the outer name decides: example.com is not blocked.
		{denyBlocked, gate.ReasonNotBlocked},
	} {
		t.Run(tc.sp.Mode.String(), func(t *testing.T) {
			f := newLoopFixture(t, tc.sp, nil)
			list, err := snitest.ECHConfigList("example.com")
			if err != nil {
				t.Fatal(err)
			}
			dst := ap(addrCom, portTLS)
			c := f.dialTransparent(t, dst)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			tc2 := tls.Client(c, &tls.Config{ServerName: "inner.example.org", RootCAs: f.ca.Pool,
				MinVersion: tls.VersionTLS13, EncryptedClientHelloConfigList: list})
			err = tc2.Handshake()
			if err == nil {
				t.Fatal("handshake succeeded; the upstream has no ECH keys, so it cannot")
			}
			r := f.expectRecord(t, gate.ProtoTLS, dst, tc.reason)
			if tc.reason == gate.ReasonECH && !strings.Contains(err.Error(), "access denied") {
				t.Fatalf("client error %v, want access denied", err)
			}
			if r.Name != "example.com" {
				t.Fatalf("record name %q, want the outer name example.com", r.Name)
			}
		})
	}
}

// TestHelloReplayedExactly sends a ClientHello larger than 1.5 KB in small
// delayed segments and checks that the upstream received exactly the bytes
// the client wrote.
func TestHelloReplayedExactly(t *testing.T) {
	f := newLoopFixture(t, denyBlocked, nil)
	dst := ap(addrCom, portCapture)
	raw := f.dialTransparent(t, dst)
	cc := &snitest.ChunkConn{Conn: raw, Size: 97, Delay: 3 * time.Millisecond, Limit: 1 << 20}
	tcn := tls.Client(cc, &tls.Config{ServerName: "example.com", NextProtos: snitest.PaddedProtos(3000)})
	go func() {
		raw.SetDeadline(time.Now().Add(10 * time.Second))
		tcn.Handshake() // blocks: the capture server never answers
	}()
	// Wait until the hello is written, then close so the capture returns.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := f.rec.all()
		if len(r) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	rec := f.expectRecord(t, gate.ProtoTLS, dst, gate.ReasonNotBlocked)
	if rec.Name != "example.com" {
		t.Fatalf("name %q", rec.Name)
	}
	time.Sleep(50 * time.Millisecond)
	raw.CloseWrite()
	var got []byte
	select {
	case got = <-f.captured:
	case <-time.After(10 * time.Second):
		t.Fatal("capture server got nothing")
	}
	if len(cc.Written) < 3000 {
		t.Fatalf("hello only %d bytes, want > 3000", len(cc.Written))
	}
	if !bytes.Equal(got, cc.Written) {
		t.Fatalf("upstream got %d bytes, client wrote %d; they differ", len(got), len(cc.Written))
	}
}

// TestPeekHelloFakeConn reads a real Go ClientHello from a fake conn and
// checks that peeking consumed nothing it does not replay.
func TestPeekHelloFakeConn(t *testing.T) {
	hello := captureHello(t, &tls.Config{ServerName: "Example.COM", NextProtos: snitest.PaddedProtos(2000)})
	trailer := []byte("after the hello")
	src := &countingReader{r: io.MultiReader(&oneByteReader{bytes.NewReader(hello)}, bytes.NewReader(trailer))}
	p := &peeker{r: src}
	kind, err := classify(p)
	if err != nil || kind != kindTLS {
		t.Fatalf("classify: %v %v", kind, err)
	}
	h, err := peekHello(p)
	if err != nil {
		t.Fatalf("peekHello: %v", err)
	}
	if h.ServerName != "Example.COM" {
		t.Fatalf("SNI %q", h.ServerName)
	}
	if src.n != len(p.Bytes()) {
		t.Fatalf("read %d bytes, kept %d for replay", src.n, len(p.Bytes()))
	}
	if !bytes.Equal(p.Bytes(), hello[:len(p.Bytes())]) || len(p.Bytes()) != len(hello) {
		t.Fatalf("kept %d bytes, hello is %d; replay must be the hello itself", len(p.Bytes()), len(hello))
	}
	rest, _ := io.ReadAll(src)
	if !bytes.Equal(rest, trailer) {
		t.Fatalf("bytes after the hello were consumed: left %q", rest)
	}
}

func TestAlertVersion(t *testing.T) {
	for _, tc := range []struct {
		vers []uint16
		want uint16
	}{
		{nil, tls.VersionTLS10},
		{[]uint16{0x0a0a, tls.VersionTLS13, tls.VersionTLS12}, tls.VersionTLS12},
		{[]uint16{tls.VersionTLS11, tls.VersionTLS10}, tls.VersionTLS11},
	} {
		var h *tls.ClientHelloInfo
		if tc.vers != nil {
			h = &tls.ClientHelloInfo{SupportedVersions: tc.vers}
		}
		if got := alertVersion(h); got != tc.want {
			t.Errorf("alertVersion(%x) = %x, want %x", tc.vers, got, tc.want)
		}
	}
	if got := accessDenied(tls.VersionTLS12); !bytes.Equal(got, []byte{0x15, 3, 3, 0, 2, 2, 0x31}) {
		t.Fatalf("alert %x", got)
	}
}

// captureHello returns the bytes a Go client writes as its ClientHello.
func captureHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		tls.Client(b, cfg).Handshake()
		b.Close()
	}()
	var buf bytes.Buffer
	hdr := make([]byte, 5)
	a.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(a, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(a, body); err != nil {
		t.Fatal(err)
	}
	buf.Write(hdr)
	buf.Write(body)
	return buf.Bytes()
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += n
	return n, err
}

// oneByteReader returns at most one byte per Read, like a hello arriving
// in the smallest pieces.
type oneByteReader struct{ r io.Reader }

func (o *oneByteReader) Read(b []byte) (int, error) {
	if len(b) > 1 {
		b = b[:1]
	}
	return o.r.Read(b)
}
