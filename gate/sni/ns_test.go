package sni

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"flowgate/gate"
	"flowgate/gate/netnsx"
	"flowgate/gate/nstest"
	"flowgate/gate/sni/internal/snitest"
)

// The namespace fixture is the real thing: a sandbox namespace S and a peer
// namespace P joined by a veth pair; P holds the simulated hosts (TLS, plain
// HTTP and echo servers on documentation addresses); S holds flowgate's
// listeners and a test-only nftables table that redirects uid 1000's TCP to
// the transparent port. Clients run as uid 1000 inside S.

const (
	nsTransparent = 15001
	nsProxy       = 15080
)

var (
	s0v4 = netip.MustParsePrefix("192.0.2.1/24")
	p0v4 = netip.MustParsePrefix("192.0.2.254/24")
	s0v6 = netip.MustParsePrefix("2001:db8:ffff::1/64")
	p0v6 = netip.MustParsePrefix("2001:db8:ffff::fe/64")
)

// testRuleset redirects the agent's TCP (and, for benchmarks, root's TCP to
// port 443 and 8443 that flowgate itself did not mark) to the transparent
// port. It is a fixture of these tests, not flowgate's ruleset.
const testRuleset = `table inet sni_test {
	chain out {
		type nat hook output priority -100; policy accept;
		meta skuid 1000 ip daddr != 127.0.0.0/8 meta l4proto tcp redirect to :15001
		meta skuid 1000 ip6 daddr != ::1 meta l4proto tcp redirect to :15001
		meta skuid 0 meta mark != 0x1f1 ip daddr 198.51.100.0/24 tcp dport 443 redirect to :15001
	}
}
`

// upstreamMark marks flowgate's own upstream sockets in the benchmark
// fixture, so the root redirect rule above leaves them alone.
const upstreamMark = 0x1f1

type nsFixture struct {
	S, P  *nstest.NS
	srv   *Server
	rec   *recorder
	ca    *snitest.CA
	dir   string // 0755 directory with ca.pem, readable by uid 1000
	names *gate.Names
}

func newNSFixture(t testing.TB, sp gate.Spec) *nsFixture {
	t.Helper()
	nstest.RequireRoot(t)
	pol, err := gate.Compile(sp)
	if err != nil {
		t.Fatal(err)
	}
	f := &nsFixture{rec: &recorder{}, names: gate.NewNames(nil)}
	f.S = nstest.New(t, "sni-s")
	f.P = nstest.New(t, "sni-p")
	nstest.Link(t, f.S, "s0", []netip.Prefix{s0v4, s0v6}, f.P, "p0", []netip.Prefix{p0v4, p0v6})
	f.S.DefaultRoutes(t, "s0", p0v4.Addr(), p0v6.Addr())
	lo, err := f.P.Netlink().LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{addrCom, addrOrg, addrBlocked, addrCom6} {
		if err := f.P.Netlink().AddrAdd(lo, nlAddr(a)); err != nil {
			t.Fatalf("adding %s to lo in P: %v", a, err)
		}
	}
	f.ca, err = snitest.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	f.dir = publicTempDir(t)
	if err := os.WriteFile(filepath.Join(f.dir, "ca.pem"), f.ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	f.startPeerServers(t)
	for name, addrs := range map[string][]netip.Addr{
		"example.com": {addrCom, addrCom6}, "www.example.com": {addrCom}, "example.org": {addrOrg},
	} {
		f.names.Learn(name, addrs, time.Hour, true)
	}
	f.names.Learn("blocked.example.net", []netip.Addr{addrBlocked}, time.Hour, false)

	nftIn(t, f.S, testRuleset)
	d := &netnsx.Dialer{NS: f.S.Handle, Dialer: net.Dialer{Control: markSocket}}
	f.srv, err = New(Config{
		Policy: pol, Names: f.names, Record: f.rec, Sandbox: "ns-test", UID: nstest.AgentUID,
		Dial: d.DialContext,
		Resolve: func(ctx context.Context, name string) ([]netip.Addr, error) {
			addrs, ok := resolveTable[name]
			if !ok {
				return nil, fmt.Errorf("no such host %s", name)
			}
			return addrs, f.names.Learn(name, addrs, time.Minute, false)
		},
		LocalPorts: []uint16{nsTransparent, nsProxy},
	})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 3)
	serve := 0
	for _, l := range []struct {
		network, addr string
		proxy         bool
	}{{"tcp4", "127.0.0.1:15001", false}, {"tcp6", "[::1]:15001", false}, {"tcp4", "127.0.0.1:15080", true}} {
		ln, err := netnsx.Listen(f.S.Handle, l.network, l.addr)
		if err != nil {
			t.Fatalf("listening on %s in S: %v", l.addr, err)
		}
		serve++
		if l.proxy {
			go func() { errc <- f.srv.ServeProxy(ln) }()
		} else {
			go func() { errc <- f.srv.ServeTransparent(ln) }()
		}
	}
	t.Cleanup(func() {
		if err := f.srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		for range serve {
			if err := <-errc; err != nil {
				t.Errorf("Serve: %v", err)
			}
		}
	})
	return f
}

// startPeerServers runs the simulated hosts inside P.
func (f *nsFixture) startPeerServers(t testing.TB) {
	leaf, err := f.ca.Leaf("example.com", "www.example.com", "example.org", "blocked.example.net", addrCom.String())
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/bulk", func(w http.ResponseWriter, r *http.Request) {
		n := 64 << 20
		fmt.Sscan(r.URL.Query().Get("n"), &n)
		buf := make([]byte, 256<<10)
		w.Header().Set("Content-Length", fmt.Sprint(n))
		for n > 0 {
			k, err := w.Write(buf[:min(n, len(buf))])
			if err != nil {
				return
			}
			n -= k
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		sni := ""
		if r.TLS != nil {
			sni = r.TLS.ServerName
		}
		fmt.Fprintf(w, "sni=%s host=%s uri=%s", sni, r.Host, r.RequestURI)
	})
	quiet := log.New(io.Discard, "", 0)
	for _, port := range []string{"443", "8443", "80", "7"} {
		l, err := netnsx.Listen(f.P.Handle, "tcp", "[::]:"+port)
		if err != nil {
			t.Fatalf("listening on %s in P: %v", port, err)
		}
		switch port {
		case "7":
			go echoServe(l)
			t.Cleanup(func() { l.Close() })
		case "80":
			hs := &http.Server{Handler: mux, ErrorLog: quiet}
			go hs.Serve(l)
			t.Cleanup(func() { hs.Close() })
		default:
			hs := &http.Server{Handler: mux, ErrorLog: quiet, TLSConfig: &tls.Config{Certificates: []tls.Certificate{leaf}}}
			go hs.ServeTLS(l, "", "")
			t.Cleanup(func() { hs.Close() })
		}
	}
}

// echoServe is P's echo service: it answers each connection with what it
// reads.
func echoServe(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			io.Copy(c, c)
		}()
	}
}

// run runs a command as uid 1000 inside S and returns its combined output.
func (f *nsFixture) run(t testing.TB, env []string, name string, args ...string) (string, error) {
	t.Helper()
	cmd := f.S.Command(nstest.AgentUID, name, args...)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + f.dir}, env...)
	cmd.Dir = f.dir
	out, err := f.S.Output(cmd)
	return string(out), err
}

// curl runs curl as the agent with the test CA.
func (f *nsFixture) curl(t testing.TB, args ...string) (string, error) {
	t.Helper()
	base := []string{"-sS", "--max-time", "20", "--cacert", filepath.Join(f.dir, "ca.pem"), "--noproxy", "*"}
	return f.run(t, nil, "curl", append(base, args...)...)
}

// client runs the test client as the agent.
func (f *nsFixture) client(t testing.TB, args ...string) (string, error) {
	t.Helper()
	return f.run(t, nil, testClient(t), append([]string{"-ca", filepath.Join(f.dir, "ca.pem")}, args...)...)
}

// python runs a urllib probe as the agent, with env (HTTPS_PROXY...).
func (f *nsFixture) python(t testing.TB, url string, env ...string) string {
	t.Helper()
	script := `import ssl, sys, urllib.request, urllib.error
ctx = ssl.create_default_context(cafile=sys.argv[2])
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=10, context=ctx)
    print("reachable (HTTP %d) %s" % (r.status, r.read().decode()[:80]))
except urllib.error.HTTPError as e:
    print("reachable (HTTP %d)" % e.code)
except Exception as e:
    print("unreachable:", type(e).__name__, str(e)[:120])
`
	out, err := f.run(t, env, "/usr/bin/python3", "-c", script, url, filepath.Join(f.dir, "ca.pem"))
	if err != nil {
		t.Fatalf("python3: %v\n%s", err, out)
	}
	return strings.TrimSpace(out)
}

// nftIn loads a ruleset into ns with the nft CLI (test fixture only).
func nftIn(t testing.TB, ns *nstest.NS, ruleset string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns.Name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft in %s: %v\n%s", ns.Name, err, out)
	}
}

// publicTempDir is a temporary directory uid 1000 can read.
func publicTempDir(t testing.TB) string {
	dir, err := os.MkdirTemp("", "sni-test-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

var (
	clientOnce sync.Once
	clientPath string
	clientErr  error
	clientDir  string
)

// testClient builds internal/testclient once per test binary into a 0755
// directory, removed by TestMain.
func testClient(t testing.TB) string {
	t.Helper()
	clientOnce.Do(func() {
		clientDir, clientErr = os.MkdirTemp("", "sni-client-*")
		if clientErr != nil {
			return
		}
		if clientErr = os.Chmod(clientDir, 0o755); clientErr != nil {
			return
		}
		clientPath = filepath.Join(clientDir, "testclient")
		out, err := exec.Command("go", "build", "-o", clientPath, "flowgate/gate/sni/internal/testclient").CombinedOutput()
		if err != nil {
			clientErr = fmt.Errorf("building testclient: %v\n%s", err, out)
		}
	})
	if clientErr != nil {
		t.Fatal(clientErr)
	}
	return clientPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if clientDir != "" {
		os.RemoveAll(clientDir)
	}
	os.Exit(code)
}

// nlAddr is a host address for netlink (IPv6 without DAD).
func nlAddr(a netip.Addr) *netlink.Addr {
	bits := a.BitLen()
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
	if a.Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	return addr
}

// markSocket sets SO_MARK on flowgate's upstream sockets in these tests.
func markSocket(network, address string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, upstreamMark)
	}); err != nil {
		return err
	}
	return serr
}
