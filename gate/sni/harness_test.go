package sni

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"flowgate/gate"
	"flowgate/gate/sni/internal/snitest"
)

// The loopback fixture runs the Server in the test's own namespace with
// its listeners and the upstream servers on 127.0.0.1: a fake OriginalDst
// says where each client connection "was going" (documentation addresses),
// and the fake Dial maps those addresses to the local upstream servers by
// port. The namespace tests (ns_test.go) check the same paths through a real
// nftables redirect.

// Simulated addresses (documentation ranges only).
var (
	addrCom     = netip.MustParseAddr("198.51.100.10") // example.com, www.example.com
	addrOrg     = netip.MustParseAddr("198.51.100.11") // example.org
	addrBlocked = netip.MustParseAddr("198.51.100.12") // blocked.example.net
	addrShared  = netip.MustParseAddr("198.51.100.20") // a.example.com and blocked.example.net
	addrLate    = netip.MustParseAddr("198.51.100.30") // late.example.com: only the resolver knows it
	addrUnknown = netip.MustParseAddr("203.0.113.5")   // no name at all
	addrCom6    = netip.MustParseAddr("2001:db8::10")  // example.com over IPv6
	addrMeta    = netip.MustParseAddr("169.254.169.254")
)

// Upstream ports the fake Dial knows.
const (
	portTLS     = 443
	portHTTP    = 80
	portEcho    = 7
	portBanner  = 25
	portCapture = 9443
)

// recorder keeps every decision record.
type recorder struct {
	mu   sync.Mutex
	recs []gate.Record
}

func (r *recorder) Record(x gate.Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, x)
}

func (r *recorder) all() []gate.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]gate.Record(nil), r.recs...)
}

// wait returns the first record matching, waiting up to 10 s for it.
func (r *recorder) wait(t testing.TB, what string, match func(gate.Record) bool) gate.Record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, x := range r.all() {
			if match(x) {
				return x
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no record %s; have:\n%s", what, r.dump())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *recorder) dump() string {
	var b strings.Builder
	for _, x := range r.all() {
		fmt.Fprintf(&b, "  %s %s name=%q path=%q %s %s rule=%q detail=%q\n", x.Proto, x.Dest, x.Name, x.Path, x.Verdict, x.Reason, x.Rule, x.Detail)
	}
	return b.String()
}

// byDest matches records for one destination and protocol.
func byDest(proto string, dst netip.AddrPort) func(gate.Record) bool {
	return func(r gate.Record) bool { return r.Proto == proto && r.Dest == dst.String() }
}

// expectRecord waits for the record of proto to dst and checks its verdict
// and reason.
func (f *loopFixture) expectRecord(t testing.TB, proto string, dst netip.AddrPort, reason gate.Reason) gate.Record {
	t.Helper()
	r := f.rec.wait(t, proto+" to "+dst.String(), byDest(proto, dst))
	if r.Reason != reason {
		t.Fatalf("%s to %s: reason %s, want %s (record %+v)", proto, dst, r.Reason, reason, r)
	}
	wantVerdict := gate.VerdictDeny
	for _, a := range []gate.Reason{gate.ReasonPublic, gate.ReasonNotBlocked, gate.ReasonHostAllowed,
		gate.ReasonServiceAllowed, gate.ReasonCIDRAllowed, gate.ReasonLearned} {
		if reason == a {
			wantVerdict = gate.VerdictAllow
		}
	}
	if r.Verdict != wantVerdict {
		t.Fatalf("%s to %s: verdict %s, want %s", proto, dst, r.Verdict, wantVerdict)
	}
	return r
}

type loopFixture struct {
	srv      *Server
	cfg      Config
	tl, pl   net.Listener
	names    *gate.Names
	rec      *recorder
	ca       *snitest.CA
	upstream map[uint16]string // port -> local upstream address

	mu        sync.Mutex
	origDst   map[string]netip.AddrPort // client local addr -> "original" destination
	resolves  map[string]int
	dialled   []string
	httpSeen  []string // request lines the plain HTTP upstream saw
	captured  chan []byte
	serveErrs chan error
}

// resolveTable is what the fake sandbox resolver answers.
var resolveTable = map[string][]netip.Addr{
	"lo11.example.net":    {netip.MustParseAddr("127.0.0.11")},
	"example.com":         {addrCom, addrCom6},
	"www.example.com":     {addrCom},
	"example.org":         {addrOrg},
	"blocked.example.net": {addrBlocked, addrShared},
	"a.example.com":       {addrShared},
	"late.example.com":    {addrLate},
	"rebind.example.com":  {addrMeta},
	"mixed.example.com":   {addrMeta, addrLate},
	"public.example":      {addrCom},
}

func spec(mode gate.Mode, hosts []string, urls ...string) gate.Spec {
	s := gate.Spec{Mode: mode}
	for i, h := range hosts {
		e := gate.Entry{Value: h}
		if mode == gate.Allowlist {
			e.Field = fmt.Sprintf("sandbox.allowed_hosts[%d]", i)
			s.AllowedHosts = append(s.AllowedHosts, e)
		} else {
			e.Field = fmt.Sprintf("sandbox.blocked_hosts[%d]", i)
			s.BlockedHosts = append(s.BlockedHosts, e)
		}
	}
	for i, u := range urls {
		s.BlockedURLs = append(s.BlockedURLs, gate.Entry{Value: u, Field: fmt.Sprintf("sandbox.blocked_urls[%d]", i)})
	}
	return s
}

// newLoopFixture starts upstreams and a Server for the policy sp; tweak may
// change the config before New.
func newLoopFixture(t testing.TB, sp gate.Spec, tweak func(*Config)) *loopFixture {
	t.Helper()
	pol, err := gate.Compile(sp)
	if err != nil {
		t.Fatalf("compiling policy: %v", err)
	}
	ca, err := snitest.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	f := &loopFixture{names: gate.NewNames(nil), rec: &recorder{}, ca: ca, upstream: map[uint16]string{},
		origDst: map[string]netip.AddrPort{}, resolves: map[string]int{}, captured: make(chan []byte, 16), serveErrs: make(chan error, 2)}
	// What the DNS proxy would have learned from the agent's own lookups.
	learn := func(name string, allowed bool, addrs ...netip.Addr) {
		if err := f.names.Learn(name, addrs, time.Hour, allowed); err != nil {
			t.Fatal(err)
		}
	}
	learn("example.com", true, addrCom, addrCom6)
	learn("www.example.com", true, addrCom)
	learn("example.org", true, addrOrg)
	learn("blocked.example.net", false, addrBlocked, addrShared)
	learn("a.example.com", true, addrShared)

	f.startUpstreams(t)
	f.cfg = Config{
		Policy: pol, Names: f.names, Record: f.rec, Sandbox: "test", UID: 1000,
		Resolve:     f.resolve,
		Dial:        f.dial,
		OriginalDst: f.originalDst,
	}
	if tweak != nil {
		tweak(&f.cfg)
	}
	f.srv, err = New(f.cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.tl = listenLoop(t)
	f.pl = listenLoop(t)
	go func() { f.serveErrs <- f.srv.ServeTransparent(f.tl) }()
	go func() { f.serveErrs <- f.srv.ServeProxy(f.pl) }()
	t.Cleanup(func() {
		if err := f.srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		for range 2 {
			if err := <-f.serveErrs; err != nil {
				t.Errorf("Serve returned %v after Close, want nil", err)
			}
		}
	})
	return f
}

func listenLoop(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func (f *loopFixture) resolve(ctx context.Context, name string) ([]netip.Addr, error) {
	f.mu.Lock()
	f.resolves[name]++
	f.mu.Unlock()
	addrs, ok := resolveTable[name]
	if !ok {
		return nil, fmt.Errorf("resolving %s: no such host", name)
	}
	if err := f.names.Learn(name, addrs, time.Minute, false); err != nil {
		return nil, err
	}
	return addrs, nil
}

func (f *loopFixture) resolveCount(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resolves[name]
}

// dial maps a documentation address to a local upstream by port. Only the
// simulated hosts answer; anything else is refused like a closed port.
func (f *loopFixture) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("fake dial wants ip:port, got %q", addr)
	}
	f.mu.Lock()
	f.dialled = append(f.dialled, addr)
	f.mu.Unlock()
	local, ok := f.upstream[ap.Port()]
	if !ok || ap.Addr() == addrUnknown && ap.Port() != portEcho {
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", local)
}

func (f *loopFixture) dialledAddrs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.dialled...)
}

// originalDst waits for the test to say where this connection was going.
func (f *loopFixture) originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	key := c.RemoteAddr().String()
	for range 2000 {
		f.mu.Lock()
		d, ok := f.origDst[key]
		f.mu.Unlock()
		if ok {
			return d, nil
		}
		time.Sleep(time.Millisecond)
	}
	return netip.AddrPort{}, errors.New("fake: no original destination registered")
}

// dialTransparent connects to the transparent port as a client whose
// connection was redirected from dst.
func (f *loopFixture) dialTransparent(t testing.TB, dst netip.AddrPort) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp", f.tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.origDst[c.LocalAddr().String()] = dst
	f.mu.Unlock()
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// tlsGet fetches https://sni/path through the transparent port as if sent to
// dst, and returns the body (the upstream echoes what it saw).
func (f *loopFixture) tlsGet(t testing.TB, dst netip.AddrPort, sni, path string) (string, error) {
	t.Helper()
	c := f.dialTransparent(t, dst)
	tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: f.ca.Pool, InsecureSkipVerify: sni == ""})
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		return "", err
	}
	host := sni
	if host == "" {
		host = dst.Addr().String()
	}
	fmt.Fprintf(tc, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, host)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// rawHTTP sends raw request bytes through the transparent port as if sent
// to dst and returns everything the client receives until close.
func (f *loopFixture) rawHTTP(t testing.TB, dst netip.AddrPort, raw string) string {
	t.Helper()
	c := f.dialTransparent(t, dst)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	return string(b)
}

func (f *loopFixture) seenHTTP() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.httpSeen...)
}

// startUpstreams runs the simulated servers on loopback.
func (f *loopFixture) startUpstreams(t testing.TB) {
	leaf, err := f.ca.Leaf("example.com", "www.example.com", "example.org", "blocked.example.net", "a.example.com",
		"late.example.com", "ech.example.net", addrCom.String())
	if err != nil {
		t.Fatal(err)
	}
	echoSNI := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "sni=%s host=%s uri=%s", r.TLS.ServerName, r.Host, r.RequestURI)
	})
	tl := listenLoop(t)
	ts := &http.Server{Handler: echoSNI, TLSConfig: &tls.Config{Certificates: []tls.Certificate{leaf}},
		ErrorLog: log.New(io.Discard, "", 0)}
	go ts.ServeTLS(tl, "", "")
	t.Cleanup(func() { ts.Close() })
	f.upstream[portTLS] = tl.Addr().String()

	hl := listenLoop(t)
	hsrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		seen := r.Method + " " + r.RequestURI + " host=" + r.Host + " upgrade=" + r.Header.Get("Upgrade")
		var hs []string
		for k, v := range r.Header {
			if isRerouting(k) || k == "X-Custom" {
				hs = append(hs, k+"="+strings.Join(v, ","))
			}
		}
		slices.Sort(hs)
		for _, h := range hs {
			seen += " " + h
		}
		f.httpSeen = append(f.httpSeen, seen)
		f.mu.Unlock()
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "host=%s uri=%s body=%q", r.Host, r.RequestURI, body)
	})}
	go hsrv.Serve(hl)
	t.Cleanup(func() { hsrv.Close() })
	f.upstream[portHTTP] = hl.Addr().String()

	f.upstream[portEcho] = serveLoop(t, func(c net.Conn) { io.Copy(c, c) })
	f.upstream[portBanner] = serveLoop(t, func(c net.Conn) {
		io.WriteString(c, "220 banner.example ready\r\n")
		io.Copy(c, c)
	})
	f.upstream[portCapture] = serveLoop(t, func(c net.Conn) {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, _ := io.ReadAll(c)
		f.captured <- b
	})
}

// serveLoop runs a raw TCP server on loopback and returns its address.
func serveLoop(t testing.TB, handle func(net.Conn)) string {
	l := listenLoop(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// proxyConn connects to the proxy port.
func (f *loopFixture) proxyConn(t testing.TB) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", f.pl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// connect sends CONNECT target and returns the response and a reader for
// the tunnel.
func (f *loopFixture) connect(t testing.TB, target string) (net.Conn, *http.Response, *bufio.Reader) {
	t.Helper()
	c := f.proxyConn(t)
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	return c, resp, br
}

func itoa(n int) string { return strconv.Itoa(n) }
