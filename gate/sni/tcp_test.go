package sni

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"flowgate/gate"
)

// nat64 is a's form under the well-known NAT64 prefix 64:ff9b::/96.
func nat64(a netip.Addr) netip.Addr {
	b := netip.MustParseAddr("64:ff9b::").As16()
	copy(b[12:], a.AsSlice())
	return netip.AddrFrom16(b)
}

func TestOtherTCPByAddress(t *testing.T) {
	cases := []struct {
		name   string
		sp     gate.Spec
		dst    netip.Addr
		reason gate.Reason
	}{
		{"allowlist learned", allowCom, addrCom, gate.ReasonLearned},
		{"allowlist unknown", allowCom, addrUnknown, gate.ReasonUnknownAddress},
		{"allowlist cidr", spec(gate.Allowlist, []string{"203.0.113.0/24"}), addrUnknown, gate.ReasonCIDRAllowed},
		{"denylist unknown", denyBlocked, addrUnknown, gate.ReasonNotBlocked},
		{"denylist blocked host's address", denyBlocked, addrBlocked, gate.ReasonAddressBlocked},
		{"denylist cidr", spec(gate.Denylist, []string{"203.0.113.0/24"}), addrUnknown, gate.ReasonCIDRBlocked},
		{"allowlist IPv6 learned", allowCom, addrCom6, gate.ReasonLearned},
		// A stream flowgate cannot read as a request may still be one a
		// lenient server takes: refused like TLS without a name.
		{"denylist host with blocked_urls", spec(gate.Denylist, nil, "http://example.com/papers"), addrCom, gate.ReasonNeedsIntercept},
		{"denylist other host than one with blocked_urls", spec(gate.Denylist, nil, "http://example.com/papers"), addrUnknown, gate.ReasonNotBlocked},
		{"denylist address with blocked_urls of its own", spec(gate.Denylist, nil, "http://203.0.113.5/papers"), addrUnknown, gate.ReasonNeedsIntercept},
		{"denylist address next to one with blocked_urls", spec(gate.Denylist, nil, "http://203.0.113.99/papers"), addrUnknown, gate.ReasonNotBlocked},
		{"denylist NAT64 form of an address with blocked_urls", spec(gate.Denylist, nil, "http://203.0.113.5/papers"), nat64(addrUnknown), gate.ReasonNeedsIntercept},
		// Behind a NAT64 gateway 64:ff9b::a.b.c.d reaches a.b.c.d.
		{"denylist NAT64 form of a blocked host's address", denyBlocked, nat64(addrBlocked), gate.ReasonAddressBlocked},
		{"denylist NAT64 form in a blocked CIDR", spec(gate.Denylist, []string{"203.0.113.0/24"}), nat64(addrUnknown), gate.ReasonCIDRBlocked},
		{"allowlist NAT64 form of a learned address", allowCom, nat64(addrCom), gate.ReasonUnknownAddress},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newLoopFixture(t, tc.sp, nil)
			dst := ap(tc.dst, portEcho)
			c := f.dialTransparent(t, dst)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, "ping\n")
			line, err := bufio.NewReader(c).ReadString('\n')
			r := f.expectRecord(t, gate.ProtoTCP, dst, tc.reason)
			if r.Verdict == gate.VerdictAllow {
				if line != "ping\n" {
					t.Fatalf("echo %q, %v", line, err)
				}
				// Half-close reaches the upstream: the echo server then closes.
				c.CloseWrite()
				if rest, err := io.ReadAll(c); err != nil || len(rest) != 0 {
					t.Fatalf("after half-close: %q %v", rest, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("refused, but the client read %q", line)
			}
		})
	}
}

// TestServerFirst: a client that says nothing to an address the policy
// admits gets the server's banner; its own first bytes are still judged.
func TestServerFirst(t *testing.T) {
	f := newLoopFixture(t, denyBlocked, func(c *Config) { c.ServerFirstWait = 50 * time.Millisecond })
	dst := ap(addrCom, portBanner)
	c := f.dialTransparent(t, dst)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	banner, err := br.ReadString('\n')
	if err != nil || banner != "220 banner.example ready\r\n" {
		t.Fatalf("banner %q %v", banner, err)
	}
	io.WriteString(c, "EHLO agent\r\n")
	if echo, err := br.ReadString('\n'); err != nil || echo != "EHLO agent\r\n" {
		t.Fatalf("echo %q %v", echo, err)
	}
	f.expectRecord(t, gate.ProtoTCP, dst, gate.ReasonNotBlocked)

	// After the banner, a TLS hello with a blocked name is still refused.
	dst2 := ap(addrUnknown, portEcho)
	c2 := f.dialTransparent(t, dst2)
	c2.SetDeadline(time.Now().Add(10 * time.Second))
	time.Sleep(150 * time.Millisecond) // past ServerFirstWait: upstream dialled
	hello := captureHello(t, tlsConfigFor("blocked.example.net"))
	c2.Write(hello)
	if b, _ := io.ReadAll(c2); len(b) != 0 {
		t.Fatalf("refused stream delivered %q", b)
	}
	f.expectRecord(t, gate.ProtoTLS, dst2, gate.ReasonHostBlocked)
}

func TestMetadataAndLoop(t *testing.T) {
	f := newLoopFixture(t, spec(gate.Public, nil), nil)
	for _, dst := range []netip.AddrPort{ap(addrMeta, 80), netip.MustParseAddrPort("[fd00:ec2::254]:80")} {
		c := f.dialTransparent(t, dst)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")
		if b, _ := io.ReadAll(c); len(b) != 0 {
			t.Fatalf("metadata got an answer %q", b)
		}
		f.expectRecord(t, gate.ProtoTCP, dst, gate.ReasonMetadata)
	}
	// A connection that was not redirected reports its own local address.
	self, _ := netip.ParseAddrPort(f.tl.Addr().String())
	c := f.dialTransparent(t, self)
	io.ReadAll(c)
	f.expectRecord(t, gate.ProtoTCP, self, gate.ReasonLoop)
	// The proxy port on loopback is flowgate too.
	pp, _ := netip.ParseAddrPort(f.pl.Addr().String())
	c2 := f.dialTransparent(t, pp)
	io.ReadAll(c2)
	f.expectRecord(t, gate.ProtoTCP, pp, gate.ReasonLoop)
	for _, d := range f.dialledAddrs() {
		if strings.HasPrefix(d, "169.254.") || strings.HasPrefix(d, "127.") {
			t.Fatalf("dialled %s", d)
		}
	}
}

// TestStalledClient: a client that never sends is cut off after the hello
// timeout; another client is served meanwhile.
func TestStalledClient(t *testing.T) {
	f := newLoopFixture(t, allowCom, func(c *Config) { c.HelloTimeout = 500 * time.Millisecond })
	stalled := ap(addrUnknown, portTLS)
	c := f.dialTransparent(t, stalled)
	start := time.Now()
	if _, err := f.tlsGet(t, ap(addrCom, portTLS), "example.com", "/"); err != nil {
		t.Fatalf("a stalled client blocked another: %v", err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.ReadAll(c)
	if el := time.Since(start); el < 400*time.Millisecond || el > 8*time.Second {
		t.Fatalf("stalled client cut after %v, want about the hello timeout", el)
	}
	f.expectRecord(t, gate.ProtoTCP, stalled, gate.ReasonTimeout)

	// A client that starts a hello and stalls in the middle of it.
	half := ap(addrCom, 8443)
	c2 := f.dialTransparent(t, half)
	hello := captureHello(t, tlsConfigFor("example.com"))
	c2.Write(hello[:40])
	c2.SetDeadline(time.Now().Add(10 * time.Second))
	b, _ := io.ReadAll(c2)
	if len(b) != 7 || b[0] != 0x15 || b[6] != 49 {
		t.Fatalf("stalled hello answer %x, want an access_denied alert", b)
	}
	f.expectRecord(t, gate.ProtoTLS, half, gate.ReasonTimeout)
}

// TestProcessConnectionBudget: Servers of one process share a budget sized
// from its descriptors; past it a connection is refused like one over
// MaxConns, with a record saying which limit.
func TestProcessConnectionBudget(t *testing.T) {
	for nofile, want := range map[uint64]int{1024: 128, 20000: 3162, 1 << 20: 174592, 64: 16} {
		if got := connBudget(nofile); got != want {
			t.Errorf("connBudget(%d) = %d, want %d", nofile, got, want)
		}
	}
	old := processSlots
	small := make(chan struct{}, 2)
	processSlots = func() chan struct{} { return small }
	defer func() { processSlots = old }()
	f := newLoopFixture(t, allowCom, func(c *Config) { c.HelloTimeout = 3 * time.Second })
	g := newLoopFixture(t, allowCom, func(c *Config) { c.HelloTimeout = 3 * time.Second })
	f.dialTransparent(t, ap(addrUnknown, 1000))
	g.dialTransparent(t, ap(addrUnknown, 1001))
	time.Sleep(100 * time.Millisecond) // both accepted and holding a slot
	wantClosedAtOnce(t, f, "a connection past the process's budget")
	r := f.rec.wait(t, "limit", func(r gate.Record) bool { return r.Reason == gate.ReasonLimit })
	if !strings.Contains(r.Detail, "the process serves 2 connections") {
		t.Errorf("limit record %+v does not name the process budget", r)
	}
}

// wantClosedAtOnce connects to f's transparent port and wants the
// connection reset at once: at connect, or at the first read.
func wantClosedAtOnce(t *testing.T, f *loopFixture, what string) {
	t.Helper()
	c, err := net.Dial("tcp", f.tl.Addr().String())
	if err == nil {
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		_, err = c.Read(make([]byte, 1))
	}
	if err == nil || isTimeout(err) {
		t.Fatalf("%s not closed at once: %v", what, err)
	}
}

func TestConnectionLimit(t *testing.T) {
	f := newLoopFixture(t, allowCom, func(c *Config) { c.MaxConns = 2; c.HelloTimeout = 3 * time.Second })
	for i := range 2 {
		f.dialTransparent(t, ap(addrUnknown, uint16(1000+i)))
	}
	time.Sleep(100 * time.Millisecond) // both accepted and holding a slot
	wantClosedAtOnce(t, f, "the third connection")
	f.rec.wait(t, "limit", func(r gate.Record) bool { return r.Reason == gate.ReasonLimit && r.Verdict == gate.VerdictDeny })
	// A flood of connections over the limit is counted, not logged one by
	// one: at most one record a second (gate.Throttle).
	const flood = 50
	for range flood {
		if c, err := net.Dial("tcp", f.tl.Addr().String()); err == nil {
			c.Close()
		}
	}
	limits := func() (recs, events int) {
		for _, r := range f.rec.all() {
			if r.Reason == gate.ReasonLimit {
				recs++
				events += r.Events()
			}
		}
		return recs, events
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, n := limits(); n < flood+1 && time.Now().Before(deadline); _, n = limits() {
		time.Sleep(20 * time.Millisecond)
	}
	if recs, events := limits(); recs > 3 || events != flood+1 {
		t.Errorf("%d limit records standing for %d refusals; want at most 3 for %d", recs, events, flood+1)
	}
}

func TestIdleTimeoutOnSplice(t *testing.T) {
	f := newLoopFixture(t, denyBlocked, func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
	dst := ap(addrUnknown, portEcho)
	c := f.dialTransparent(t, dst)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "x\n") // a line: plain TCP at once
	if _, err := io.ReadFull(c, make([]byte, 2)); err != nil {
		t.Fatalf("echo: %v", err)
	}
	start := time.Now()
	_, err := c.Read(make([]byte, 1))
	if err == nil || isTimeout(err) {
		t.Fatalf("idle splice not closed: %v", err)
	}
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Fatalf("closed after %v, before the idle timeout", el)
	}
}

func TestCloseEndsLiveConnections(t *testing.T) {
	f := newLoopFixture(t, denyBlocked, nil)
	dst := ap(addrUnknown, portEcho)
	c := f.dialTransparent(t, dst)
	io.WriteString(c, "x")
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Read(make([]byte, 1))
	done := make(chan error, 1)
	go func() { done <- f.srv.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection still open after Close")
	}
	if _, err := net.Dial("tcp", f.tl.Addr().String()); err == nil {
		t.Fatal("listener still open after Close")
	}
}

func TestNewValidates(t *testing.T) {
	pol, _ := gate.Compile(spec(gate.Denylist, nil))
	f := &loopFixture{}
	for _, cfg := range []Config{
		{Names: gate.NewNames(nil), Resolve: f.resolve, Dial: f.dial},
		{Policy: pol, Resolve: f.resolve, Dial: f.dial},
		{Policy: pol, Names: gate.NewNames(nil), Dial: f.dial},
		{Policy: pol, Names: gate.NewNames(nil), Resolve: f.resolve},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New accepted an incomplete config %+v", cfg)
		}
	}
}

func tlsConfigFor(name string) *tls.Config { return &tls.Config{ServerName: name} }

// TestUpstreamUnreachable: an allowed flow whose upstream refuses is reset
// (as a direct connection would be) and recorded as allowed, with why it
// failed; the proxy answers 502 without a reason code, as it is no refusal.
func TestUpstreamUnreachable(t *testing.T) {
	f := newLoopFixture(t, denyBlocked, nil)
	dst := ap(addrUnknown, portTLS)
	if _, err := f.tlsGet(t, dst, "", "/"); err == nil || !strings.Contains(err.Error(), "reset") {
		t.Fatalf("want a reset, got %v", err)
	}
	r := f.expectRecord(t, gate.ProtoTLS, dst, gate.ReasonNotBlocked)
	if !strings.HasPrefix(r.Detail, "upstream: dialling 203.0.113.5:443") {
		t.Fatalf("detail %q", r.Detail)
	}
	_, resp, _ := f.connect(t, "203.0.113.5:443")
	if resp.StatusCode != 502 || resp.Header.Get(ReasonHeader) != "" {
		t.Fatalf("CONNECT to an unreachable address: %d %q", resp.StatusCode, resp.Header.Get(ReasonHeader))
	}
}
