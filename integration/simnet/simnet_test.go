package simnet

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"flowgate/gate/netnsx"
	"flowgate/gate/nstest"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
)

// startInternet starts a simulated internet closed at the end of the test.
func startInternet(t *testing.T, opts Options) *Internet {
	t.Helper()
	nstest.RequireRoot(t)
	if opts.Prefix == "" {
		opts.Prefix = "fg-inet-t"
	}
	in, err := Start(opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := in.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return in
}

// client makes a namespace attached to in.
func client(t *testing.T, in *Internet) (*nstest.NS, *Uplink) {
	t.Helper()
	ns := nstest.New(t, "fg-cli")
	up, err := in.Attach(ns.Handle, AttachOptions{})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	t.Cleanup(func() {
		if err := up.Close(); err != nil {
			t.Errorf("Uplink.Close: %v", err)
		}
	})
	return ns, up
}

// query sends one query from inside ns over network ("udp" or "tcp").
func query(t *testing.T, ns netns.NsHandle, network string, server netip.AddrPort, name string, qtype uint16, edns bool) (*dns.Msg, error) {
	t.Helper()
	d := &netnsx.Dialer{NS: ns}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, network, server.String())
	if err != nil {
		t.Fatalf("dialing %s %s: %v", network, server, err)
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	if edns {
		m.SetEdns0(4096, false)
	}
	cl := &dns.Client{Net: network, Timeout: time.Second}
	r, _, err := cl.ExchangeWithConnContext(ctx, m, &dns.Conn{Conn: c})
	return r, err
}

func addrsOf(r *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range r.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			a, _ := netip.AddrFromSlice(rr.A)
			out = append(out, a.Unmap())
		case *dns.AAAA:
			a, _ := netip.AddrFromSlice(rr.AAAA)
			out = append(out, a)
		}
	}
	return out
}

func TestDNS(t *testing.T) {
	in := startInternet(t, Options{TTL: 42 * time.Second})
	ns, up := client(t, in)
	for _, network := range []string{"udp", "tcp"} {
		for _, server := range []netip.AddrPort{up.Resolver, up.Resolver6} {
			r, err := query(t, ns.Handle, network, server, "Example.COM.", dns.TypeA, false)
			if err != nil {
				t.Fatalf("%s %s A example.com: %v", network, server, err)
			}
			if got := addrsOf(r); len(got) != 1 || got[0] != netip.MustParseAddr("192.0.2.10") {
				t.Errorf("%s %s A example.com = %v, want [192.0.2.10]", network, server, got)
			}
			if ttl := r.Answer[0].Header().Ttl; ttl != 42 {
				t.Errorf("TTL = %d, want 42", ttl)
			}
			r, err = query(t, ns.Handle, network, server, "pypi.org", dns.TypeAAAA, false)
			if err != nil {
				t.Fatalf("%s %s AAAA pypi.org: %v", network, server, err)
			}
			if got := addrsOf(r); len(got) != 1 || got[0] != netip.MustParseAddr("2001:db8:1::40") {
				t.Errorf("%s %s AAAA pypi.org = %v", network, server, got)
			}
		}
	}
	if got := in.Queries("example.com"); got != 4 {
		t.Errorf("Queries(example.com) = %d, want 4", got)
	}
	if got := in.QueriesOf("pypi.org", dns.TypeAAAA); got != 4 {
		t.Errorf("QueriesOf(pypi.org, AAAA) = %d, want 4", got)
	}

	t.Run("nxdomain", func(t *testing.T) {
		r, err := query(t, ns.Handle, "udp", up.Resolver, "nothing.example.invalid", dns.TypeA, false)
		if err != nil {
			t.Fatal(err)
		}
		if r.Rcode != dns.RcodeNameError {
			t.Errorf("rcode = %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
		}
		if in.Queries("nothing.example.invalid") != 1 {
			t.Errorf("Queries = %d, want 1", in.Queries("nothing.example.invalid"))
		}
	})
	t.Run("https record with ech", func(t *testing.T) {
		r, err := query(t, ns.Handle, "udp", up.Resolver, ECHName, dns.TypeHTTPS, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Answer) != 1 {
			t.Fatalf("answer = %v", r.Answer)
		}
		h, ok := r.Answer[0].(*dns.HTTPS)
		if !ok {
			t.Fatalf("answer is %T", r.Answer[0])
		}
		var ech bool
		for _, kv := range h.Value {
			if kv.Key() == dns.SVCB_ECHCONFIG {
				ech = true
			}
		}
		if !ech {
			t.Errorf("HTTPS %s has no ech: %v", ECHName, h)
		}
		r, err = query(t, ns.Handle, "udp", up.Resolver, "pypi.org", dns.TypeHTTPS, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Answer) != 1 || strings.Contains(r.Answer[0].String(), "ech=") {
			t.Errorf("HTTPS pypi.org = %v, want one record without ech", r.Answer)
		}
	})
	t.Run("txt", func(t *testing.T) {
		r, err := query(t, ns.Handle, "tcp", up.Resolver6, "example.org", dns.TypeTXT, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Answer) != 1 || r.Answer[0].(*dns.TXT).Txt[0] != "simnet example.org" {
			t.Errorf("TXT = %v", r.Answer)
		}
	})
	t.Run("cname chain", func(t *testing.T) {
		r, err := query(t, ns.Handle, "udp", up.Resolver, "chain.example.org", dns.TypeA, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Answer) != 3 {
			t.Fatalf("answer = %v, want CNAME, CNAME, A", r.Answer)
		}
		if c, ok := r.Answer[0].(*dns.CNAME); !ok || c.Target != "static.example.com." {
			t.Errorf("first = %v", r.Answer[0])
		}
		if got := addrsOf(r); len(got) != 1 || got[0] != netip.MustParseAddr("198.51.100.50") {
			t.Errorf("addresses = %v", got)
		}
		if got := in.Addrs("chain.example.org"); len(got) != 2 || got[0] != netip.MustParseAddr("198.51.100.50") {
			t.Errorf("Addrs(chain.example.org) = %v", got)
		}
	})
	t.Run("truncation", func(t *testing.T) {
		r, err := query(t, ns.Handle, "udp", up.Resolver, ManyName, dns.TypeA, false)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Truncated || len(r.Answer) >= ManyCount {
			t.Errorf("UDP: truncated=%v with %d answers, want TC and fewer than %d", r.Truncated, len(r.Answer), ManyCount)
		}
		r, err = query(t, ns.Handle, "tcp", up.Resolver, ManyName, dns.TypeA, false)
		if err != nil {
			t.Fatal(err)
		}
		if r.Truncated || len(r.Answer) != ManyCount {
			t.Errorf("TCP: truncated=%v with %d answers, want %d", r.Truncated, len(r.Answer), ManyCount)
		}
	})
	t.Run("blackhole", func(t *testing.T) {
		_, err := query(t, ns.Handle, "udp", up.Resolver, BlackholeName, dns.TypeA, false)
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("query for %s: err = %v, want a timeout", BlackholeName, err)
		}
		if in.Queries(BlackholeName) != 1 {
			t.Errorf("Queries = %d, want 1", in.Queries(BlackholeName))
		}
	})
}

// httpClient returns a client whose connections are opened inside ns and
// that trusts only the simulated CA.
func httpClient(in *Internet, ns netns.NsHandle, protos ...string) *http.Client {
	d := &netnsx.Dialer{NS: ns}
	tr := &http.Transport{
		DialContext:       d.DialContext,
		TLSClientConfig:   &tls.Config{RootCAs: in.CertPool(), NextProtos: protos},
		ForceAttemptHTTP2: len(protos) == 0 || protos[0] == "h2",
	}
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

func TestHTTPS(t *testing.T) {
	in := startInternet(t, Options{})
	ns, _ := client(t, in)
	cases := []struct {
		url, addr, wantBody, wantProto string
		protos                         []string
	}{
		{"https://example.com/", "192.0.2.10:443", "simnet example.com /\n", "HTTP/2.0", nil},
		{"https://example.com/", "[2001:db8::10]:443", "simnet example.com /\n", "HTTP/2.0", nil},
		{"https://pypi.org/simple/", "198.51.100.40:443", "simnet pypi.org /simple/\n", "HTTP/1.1", []string{"http/1.1"}},
		{"https://example.org/papers/lattice-qcd-2026", "[2001:db8::20]:443", "simnet example.org /papers/lattice-qcd-2026\n", "HTTP/2.0", nil},
		{"http://mirror.example.net/x", "198.51.100.30:80", "simnet mirror.example.net /x\n", "HTTP/1.1", nil},
		// Fronting: a name served on another name's address answers, so a
		// test sees it if flowgate lets it through.
		{"https://shared-b.example.net/", "203.0.113.50:443", "simnet shared-b.example.net /\n", "HTTP/2.0", nil},
	}
	for _, c := range cases {
		t.Run(c.url+"@"+c.addr, func(t *testing.T) {
			cl := httpClient(in, ns.Handle, c.protos...)
			tr := cl.Transport.(*http.Transport)
			dial := tr.DialContext
			tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
				return dial(ctx, network, c.addr)
			}
			resp, err := cl.Get(c.url)
			if err != nil {
				t.Fatalf("GET: %v", err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || string(body) != c.wantBody {
				t.Errorf("GET = %d %q, want 200 %q", resp.StatusCode, body, c.wantBody)
			}
			if resp.Proto != c.wantProto {
				t.Errorf("proto = %s, want %s", resp.Proto, c.wantProto)
			}
			ap := netip.MustParseAddrPort(c.addr)
			if got := resp.Header.Get(HeaderAddr); got != ap.Addr().String() {
				t.Errorf("%s = %q, want %s", HeaderAddr, got, ap.Addr())
			}
			if strings.HasPrefix(c.url, "https") {
				chains := resp.TLS.VerifiedChains
				if len(chains) == 0 || len(chains[0]) != 2 || !chains[0][1].Equal(in.ca.cert) {
					t.Errorf("verified chain does not end at the simulated CA: %v", chains)
				}
				if pk := chains[0][0].PublicKeyAlgorithm.String(); pk != "ECDSA" {
					t.Errorf("leaf key = %s, want ECDSA", pk)
				}
			}
		})
	}
	if got := in.Hits("example.com"); got != 2 {
		t.Errorf("Hits(example.com) = %d, want 2", got)
	}

	t.Run("untrusted by default roots", func(t *testing.T) {
		d := &netnsx.Dialer{NS: ns.Handle}
		cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return d.DialContext(ctx, network, "192.0.2.10:443")
			}}}
		if _, err := cl.Get("https://example.com/"); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("GET with system roots: err = %v, want a certificate error", err)
		}
	})
	t.Run("metadata", func(t *testing.T) {
		for _, a := range []string{"169.254.169.254:80", "[fd00:ec2::254]:80"} {
			cl := httpClient(in, ns.Handle)
			resp, err := cl.Get("http://" + a + "/latest/meta-data/instance-id")
			if err != nil {
				t.Fatalf("GET %s: %v", a, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != "i-0simnet" {
				t.Errorf("IMDS %s = %q, want i-0simnet", a, body)
			}
		}
	})
	t.Run("curl as agent uid with CA file", func(t *testing.T) {
		cmd := ns.Command(nstest.AgentUID, "curl", "-sS", "--max-time", "5",
			"--cacert", in.CAFile(), "--resolve", "example.com:443:192.0.2.10", "https://example.com/hello")
		out, err := ns.Output(cmd)
		if err != nil || string(out) != "simnet example.com /hello\n" {
			t.Errorf("curl = %q, %v", out, err)
		}
	})
}

func TestEcho(t *testing.T) {
	in := startInternet(t, Options{})
	ns, _ := client(t, in)
	d := &netnsx.Dialer{NS: ns.Handle}
	for _, network := range []string{"tcp", "udp"} {
		for _, ap := range []netip.AddrPort{Echo, Echo6} {
			c, err := d.DialContext(context.Background(), network, ap.String())
			if err != nil {
				t.Fatalf("dial %s %s: %v", network, ap, err)
			}
			c.SetDeadline(time.Now().Add(3 * time.Second))
			msg := "ping " + network + " " + ap.String()
			if _, err := c.Write([]byte(msg)); err != nil {
				t.Fatalf("write: %v", err)
			}
			buf := make([]byte, 100)
			n, err := io.ReadAtLeast(c, buf, len(msg))
			if err != nil || string(buf[:n]) != msg {
				t.Errorf("%s %s echo = %q, %v", network, ap, buf[:n], err)
			}
			c.Close()
		}
	}
}

// netnsList is `ip netns list` as text.
func netnsList(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v: %s", err, out)
	}
	return string(out)
}

func TestCloseRemovesEverything(t *testing.T) {
	nstest.RequireRoot(t)
	in, err := Start(Options{Prefix: "fg-inet-close"})
	if err != nil {
		t.Fatal(err)
	}
	ns := nstest.New(t, "fg-cli")
	up, err := in.Attach(ns.Handle, AttachOptions{Name: "up1"})
	if err != nil {
		in.Close()
		t.Fatal(err)
	}
	if !strings.Contains(netnsList(t), in.Name()) {
		t.Errorf("%s missing from ip netns list while running", in.Name())
	}
	ca := in.CAFile()
	if st, err := os.Stat(ca); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("CA file: %v %v", st, err)
	}
	if err := in.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := in.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := up.Close(); err != nil {
		t.Errorf("Uplink.Close after Close: %v", err)
	}
	if l := netnsList(t); strings.Contains(l, in.Name()) {
		t.Errorf("%s still listed after Close:\n%s", in.Name(), l)
	}
	if _, err := os.Stat(ca); !os.IsNotExist(err) {
		t.Errorf("CA file still there: %v", err)
	}
	if _, err := ns.Netlink().LinkByName("up1"); err == nil {
		t.Errorf("client link up1 still exists after Close")
	}
	if _, err := in.Attach(ns.Handle, AttachOptions{}); err == nil {
		t.Errorf("Attach after Close succeeded")
	}
}

func TestStartFailureCleansUp(t *testing.T) {
	nstest.RequireRoot(t)
	var name, dir string
	testHookStarted = func(in *Internet) error {
		name, dir = in.Name(), in.dir
		return errors.New("injected failure")
	}
	defer func() { testHookStarted = nil }()
	in, err := Start(Options{Prefix: "fg-inet-fail"})
	if err == nil || !strings.Contains(err.Error(), "injected failure") {
		if in != nil {
			in.Close()
		}
		t.Fatalf("Start err = %v, want the injected failure", err)
	}
	if name == "" || strings.Contains(netnsList(t), name) {
		t.Errorf("namespace %q left after a failed Start", name)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("CA dir %q left after a failed Start: %v", dir, err)
	}

	if _, err := Start(Options{Prefix: "bad/prefix"}); err == nil {
		t.Errorf("Start with a prefix holding a slash succeeded")
	}
	if _, err := Start(Options{TTL: -time.Second}); err == nil {
		t.Errorf("Start with a negative TTL succeeded")
	}
}

func TestAttachTwo(t *testing.T) {
	in := startInternet(t, Options{})
	_, a := client(t, in)
	nb, b := client(t, in)
	if a.Addr4 == b.Addr4 || a.Addr6 == b.Addr6 || a.PeerName == b.PeerName {
		t.Errorf("uplinks share addresses or names: %+v %+v", a, b)
	}
	for _, p := range []netip.Prefix{a.Addr4, a.Addr6, b.Addr4, b.Addr6} {
		if !netip.MustParsePrefix("100.64.0.0/10").Contains(p.Addr()) && !netip.MustParsePrefix("fd00::/8").Contains(p.Addr()) {
			t.Errorf("uplink address %s outside 100.64.0.0/10 and fd00::/8", p)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatalf("closing a: %v", err)
	}
	// b still works after a is gone.
	r, err := query(t, nb.Handle, "udp", b.Resolver6, "example.com", dns.TypeA, false)
	if err != nil || len(addrsOf(r)) != 1 {
		t.Errorf("query via b after closing a: %v %v", r, err)
	}
}

// TestAttachFirstPacket checks that an uplink carries its very first
// packets both ways, IPv4 and IPv6: a fresh veth end and a fresh IPv6
// address each drop packets for a moment, and Attach waits that out.
func TestAttachFirstPacket(t *testing.T) {
	in := startInternet(t, Options{})
	for i := range 20 {
		ns := nstest.New(t, "fg-cli")
		up, err := in.Attach(ns.Handle, AttachOptions{})
		if err != nil {
			t.Fatalf("Attach %d: %v", i, err)
		}
		d := &netnsx.Dialer{NS: ns.Handle}
		for _, ap := range []netip.AddrPort{Echo6, Echo} {
			c, err := d.DialContext(context.Background(), "udp", ap.String())
			if err != nil {
				t.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(900 * time.Millisecond))
			c.Write([]byte("first"))
			if _, err := c.Read(make([]byte, 16)); err != nil {
				t.Errorf("uplink %d: first datagram to %s: %v", i, ap, err)
			}
			c.Close()
		}
		if err := up.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBulk(t *testing.T) {
	in := startInternet(t, Options{})
	ns, _ := client(t, in)
	cases := []struct {
		path   string
		status int
		size   int64
	}{
		{"/bulk/0", 200, 0},
		{"/bulk/1", 200, 1},
		{"/bulk/65537", 200, 65537},
		{"/bulk/3000000", 200, 3000000},
		{"/bulk/", 400, -1},
		{"/bulk/-1", 400, -1},
		{"/bulk/+5", 400, -1},
		{"/bulk/0x10", 400, -1},
		{"/bulk/1073741825", 400, -1},
	}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			cl := httpClient(in, ns.Handle, "http/1.1")
			tr := cl.Transport.(*http.Transport)
			dial := tr.DialContext
			tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
				return dial(ctx, network, "198.51.100.40:443")
			}
			resp, err := cl.Get("https://pypi.org" + c.path)
			if err != nil {
				t.Fatalf("GET: %v", err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("reading body: %v", err)
			}
			if resp.StatusCode != c.status {
				t.Fatalf("status = %d (%q), want %d", resp.StatusCode, body, c.status)
			}
			if c.size < 0 {
				if !strings.Contains(string(body), "not a number of bytes") {
					t.Errorf("body = %q, want the size error", body)
				}
				return
			}
			if int64(len(body)) != c.size || resp.ContentLength != c.size {
				t.Errorf("got %d bytes, Content-Length %d, want %d", len(body), resp.ContentLength, c.size)
			}
			for i := range body {
				if body[i] != bulkChunk[i%len(bulkChunk)] {
					t.Fatalf("byte %d = %q, want %q", i, body[i], bulkChunk[i%len(bulkChunk)])
				}
			}
		})
	}
	if got := in.Hits("pypi.org"); got != len(cases) {
		t.Errorf("Hits(pypi.org) = %d, want %d", got, len(cases))
	}
}
