package nft

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"flowgate/gate"
	"flowgate/gate/netnsx"
	"flowgate/gate/nstest"
)

// testDir holds the probe binary and the resolv.conf files, readable by the
// agent uid. It is made on first use (fuzzing workers never need it) and
// removed by TestMain.
var (
	testDirOnce sync.Once
	testDirPath string
	testDirErr  error
)

func testDir(t testing.TB) string {
	t.Helper()
	testDirOnce.Do(func() {
		if testDirPath, testDirErr = os.MkdirTemp("", "nfttest-"); testDirErr == nil {
			testDirErr = os.Chmod(testDirPath, 0o755)
		}
	})
	if testDirErr != nil {
		t.Fatalf("making the test directory: %v", testDirErr)
	}
	return testDirPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if testDirPath != "" {
		os.RemoveAll(testDirPath)
	}
	os.Exit(code)
}

var (
	probeOnce sync.Once
	probeBin  string
	probeErr  error
)

// probePath returns the path of the probe binary, built once per test
// binary.
func probePath(t testing.TB) string {
	t.Helper()
	dir := testDir(t)
	probeOnce.Do(func() {
		out := filepath.Join(dir, "probe")
		b, err := exec.Command("go", "build", "-o", out, "flowgate/gate/nft/internal/probe").CombinedOutput()
		if err != nil {
			probeErr = fmt.Errorf("building probe: %v\n%s", err, b)
			return
		}
		probeBin = out
	})
	if probeErr != nil {
		t.Fatal(probeErr)
	}
	return probeBin
}

// Addresses of the test topology: S is the sandbox, P its peer, which also
// holds a metadata address and a "blocked" address on its loopback.
var (
	sAddr4    = netip.MustParsePrefix("192.0.2.2/24")
	sAddr6    = netip.MustParsePrefix("2001:db8::2/64")
	pAddr4    = netip.MustParseAddr("192.0.2.1")
	pAddr6    = netip.MustParseAddr("2001:db8::1")
	meta4     = netip.MustParseAddr("169.254.169.254")
	meta6     = netip.MustParseAddr("fd00:ec2::254")
	blocked4  = netip.MustParseAddr("198.51.100.7")
	blocked6  = netip.MustParseAddr("2001:db8:bad::7")
	peerDNS4  = netip.MustParseAddr("192.0.2.1")    // P's DNS answer, A
	peerDNS6  = netip.MustParseAddr("2001:db8::1")  // P's DNS answer, AAAA
	standDNS4 = netip.MustParseAddr("203.0.113.53") // the DNS stand-in's answer in S, A
	standDNS6 = netip.MustParseAddr("2001:db8::53") // AAAA
)

const (
	peerTCP   = 80
	peerUDP   = 9999
	localPort = 7777 // an echo listener on S's loopback
)

type topo struct {
	t    *testing.T
	s, p *nstest.NS
}

// newTopo makes S and P joined by a veth pair, with P's servers (TCP on
// :80 answering "peer ADDR", UDP echo on :9999, DNS on :53) and a loopback
// echo listener in S. Everything goes away when the test ends.
func newTopo(t *testing.T) *topo {
	t.Helper()
	s, p := nstest.New(t, "fgs"), nstest.New(t, "fgp")
	nstest.Link(t, s, "veth-s", []netip.Prefix{sAddr4, sAddr6}, p, "veth-p",
		[]netip.Prefix{netip.PrefixFrom(pAddr4, 24), netip.PrefixFrom(pAddr6, 64)})
	s.DefaultRoutes(t, "veth-s", pAddr4, pAddr6)
	lo, err := p.Netlink().LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{meta4, meta6, blocked4, blocked6} {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
		if a.Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := p.Netlink().AddrAdd(lo, addr); err != nil {
			t.Fatalf("adding %s to P's lo: %v", a, err)
		}
	}
	// Ping sockets for every gid, in S only (the sysctl is per netns).
	if err := netnsx.Do(s.Handle, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte("0 2147483647"), 0)
	}); err != nil {
		t.Fatalf("setting ping_group_range in S: %v", err)
	}
	tp := &topo{t: t, s: s, p: p}
	tp.serveTCP(p, "tcp", fmt.Sprintf(":%d", peerTCP), func(c net.Conn) string { return "peer " + c.LocalAddr().String() })
	defer tp.waitReachable()
	// One UDP socket per address: a reply must come from the address the
	// probe's connected socket sent to.
	for _, a := range []netip.Addr{pAddr4, pAddr6, meta4} {
		tp.serveUDP(p, netip.AddrPortFrom(a, peerUDP).String(), "peer")
	}
	tp.serveDNS(p, "udp", ":53", peerDNS4, peerDNS6)
	tp.serveDNS(p, "tcp", ":53", peerDNS4, peerDNS6)
	tp.serveTCP(s, "tcp4", fmt.Sprintf("127.0.0.1:%d", localPort), func(net.Conn) string { return "local" })
	tp.serveTCP(s, "tcp6", fmt.Sprintf("[::1]:%d", localPort), func(net.Conn) string { return "local" })
	return tp
}

// waitReachable waits until root in S reaches P over IPv4 and IPv6: the
// first IPv6 packets can wait for neighbour discovery on the new link.
func (tp *topo) waitReachable() {
	tp.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := tp.probe(0, tcpPeer4, tcpPeer6)
		if got[tcpPeer4] == open[tcpPeer4] && got[tcpPeer6] == open[tcpPeer6] {
			return
		}
		if time.Now().After(deadline) {
			tp.t.Fatalf("S does not reach P 15s after setup: %v", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// standIns plays flowgate in S: a DNS server on the DNS port answering
// standDNS4/6, and a listener on the transparent port answering
// "transparent ORIGINAL-DESTINATION".
func (tp *topo) standIns(ports gate.Ports) {
	for _, host := range []string{"127.0.0.1", "::1"} {
		tp.serveDNS(tp.s, "udp", net.JoinHostPort(host, fmt.Sprint(ports.DNS)), standDNS4, standDNS6)
		tp.serveDNS(tp.s, "tcp", net.JoinHostPort(host, fmt.Sprint(ports.DNS)), standDNS4, standDNS6)
		tp.serveTCP(tp.s, "tcp", net.JoinHostPort(host, fmt.Sprint(ports.Transparent)), func(c net.Conn) string {
			dst, err := originalDst(c.(*net.TCPConn))
			if err != nil {
				return "transparent error " + err.Error()
			}
			return "transparent " + dst.String()
		})
	}
}

// serveTCP answers every connection with one line.
func (tp *topo) serveTCP(ns *nstest.NS, network, addr string, line func(net.Conn) string) {
	l, err := netnsx.Listen(ns.Handle, network, addr)
	if err != nil {
		tp.t.Fatalf("listening on %s in %s: %v", addr, ns.Name, err)
	}
	var wg sync.WaitGroup
	tp.t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, line(c))
			c.Close()
		}
	}()
}

// serveUDP answers every datagram with reply.
func (tp *topo) serveUDP(ns *nstest.NS, addr, reply string) {
	pc, err := netnsx.ListenPacket(ns.Handle, "udp", addr)
	if err != nil {
		tp.t.Fatalf("listening on udp %s in %s: %v", addr, ns.Name, err)
	}
	var wg sync.WaitGroup
	tp.t.Cleanup(func() { pc.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 512)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(reply+"\n"), from)
		}
	}()
}

// serveDNS answers every A and AAAA question with a4 and a6.
func (tp *topo) serveDNS(ns *nstest.NS, network, addr string, a4, a6 netip.Addr) {
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		for _, qu := range q.Question {
			hdr := dns.RR_Header{Name: qu.Name, Class: dns.ClassINET, Ttl: 60, Rrtype: qu.Qtype}
			switch qu.Qtype {
			case dns.TypeA:
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a4.AsSlice()})
			case dns.TypeAAAA:
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a6.AsSlice()})
			}
		}
		w.WriteMsg(m)
	})
	srv := &dns.Server{Handler: h}
	if network == "udp" {
		pc, err := netnsx.ListenPacket(ns.Handle, "udp", addr)
		if err != nil {
			tp.t.Fatalf("listening for DNS on udp %s in %s: %v", addr, ns.Name, err)
		}
		srv.PacketConn = pc
	} else {
		l, err := netnsx.Listen(ns.Handle, "tcp", addr)
		if err != nil {
			tp.t.Fatalf("listening for DNS on tcp %s in %s: %v", addr, ns.Name, err)
		}
		srv.Listener = l
	}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	done := make(chan struct{})
	go func() { defer close(done); srv.ActivateAndServe() }()
	<-started
	tp.t.Cleanup(func() { srv.Shutdown(); <-done })
}

// originalDst reads SO_ORIGINAL_DST of a redirected connection.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	v6 := netip.MustParseAddrPort(c.LocalAddr().String()).Addr().Is6()
	raw.Control(func(fd uintptr) {
		if !v6 {
			var m *unix.IPv6Mreq
			if m, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST); serr == nil {
				ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Multiaddr[4:8])), uint16(m.Multiaddr[2])<<8|uint16(m.Multiaddr[3]))
			}
			return
		}
		var mi *unix.IPv6MTUInfo
		if mi, serr = unix.GetsockoptIPv6MTUInfo(int(fd), unix.SOL_IPV6, 80); serr == nil {
			// The port is in network byte order in memory.
			port := binary.BigEndian.Uint16(binary.NativeEndian.AppendUint16(nil, mi.Addr.Port))
			ap = netip.AddrPortFrom(netip.AddrFrom16(mi.Addr.Addr), port)
		}
	})
	return ap, serr
}

// probe runs the probe binary in S as uid and returns "RESULT [DETAIL]"
// for each probe, timing left out.
func (tp *topo) probe(uid uint32, probes ...string) map[string]string {
	tp.t.Helper()
	cmd := tp.s.Command(uid, probePath(tp.t), probes...)
	out, err := tp.s.Output(cmd)
	if err != nil {
		tp.t.Fatalf("running probe as uid %d: %v\n%s", uid, err, out)
	}
	res := make(map[string]string)
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			tp.t.Fatalf("probe printed %q", line)
		}
		res[f[0]] = strings.Join(f[1:len(f)-1], " ")
	}
	return res
}

// expect runs the probes as uid and checks each result.
func (tp *topo) expect(uid uint32, want map[string]string) {
	tp.t.Helper()
	var probes []string
	for p := range want {
		probes = append(probes, p)
	}
	got := tp.probe(uid, probes...)
	for _, p := range probes {
		if got[p] != want[p] {
			tp.t.Errorf("uid %d: %s: got %q, want %q", uid, p, got[p], want[p])
		}
	}
}

var lookupScript = `import socket, sys, time
t = time.monotonic()
try:
    r = sorted({a[4][0] for a in socket.getaddrinfo(sys.argv[1], 80, proto=socket.IPPROTO_TCP)})
    out = "ok " + ",".join(r)
except Exception as e:
    out = "err " + str(e)
print(out + " |%.6f" % (time.monotonic() - t))
`

var lookupLine = regexp.MustCompile(`^(.*) \|([0-9.]+)$`)

// lookup runs python's getaddrinfo for name in S as uid, with a private
// resolv.conf naming P's DNS server (over TCP when tcp is set), and returns
// what python printed and how long getaddrinfo took.
func (tp *topo) lookup(uid uint32, name string, tcp bool) (string, time.Duration) {
	tp.t.Helper()
	return tp.lookupVia(uid, name, pAddr4.String(), tcp)
}

// lookupVia is lookup with another nameserver in resolv.conf.
func (tp *topo) lookupVia(uid uint32, name, server string, tcp bool) (string, time.Duration) {
	tp.t.Helper()
	conf := "nameserver " + server + "\noptions timeout:2 attempts:1\n"
	file := "resolv-udp.conf"
	if tcp {
		conf += "options use-vc\n"
		file = "resolv-tcp.conf"
	}
	path := filepath.Join(testDir(tp.t), server+"-"+file)
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		tp.t.Fatal(err)
	}
	args := []string{"-m", "sh", "-c", `mount --bind "$0" /etc/resolv.conf && exec "$@"`, path}
	if uid != 0 {
		args = append(args, "setpriv", fmt.Sprintf("--reuid=%d", uid), fmt.Sprintf("--regid=%d", uid), "--clear-groups")
	}
	args = append(args, "/usr/bin/python3", "-c", lookupScript, name)
	out, err := tp.s.Output(tp.s.Command(0, "unshare", args...))
	if err != nil {
		tp.t.Fatalf("lookup as uid %d: %v\n%s", uid, err, out)
	}
	m := lookupLine.FindStringSubmatch(strings.TrimSpace(string(out)))
	if m == nil {
		tp.t.Fatalf("lookup as uid %d printed %q", uid, out)
	}
	var secs float64
	fmt.Sscanf(m[2], "%g", &secs)
	return m[1], time.Duration(secs * float64(time.Second))
}

// nftList runs `nft list table inet flowgate` in S.
func nftList(t *testing.T, ns *nstest.NS) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns.Name, "nft", "list", "table", "inet", TableName).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list in %s: %v\n%s", ns.Name, err, out)
	}
	return string(out)
}

// nft runs the nft command in S.
func nftRun(t *testing.T, ns *nstest.NS, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns.Name, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s in %s: %v\n%s", strings.Join(args, " "), ns.Name, err, out)
	}
	return string(out)
}

var counterRE = regexp.MustCompile(`counter packets \d+ bytes \d+`)

// zeroCounters normalises counter values in nft text.
func zeroCounters(s string) string {
	return counterRE.ReplaceAllString(s, "counter packets 0 bytes 0")
}

// handleOf finds the handle of the rule with the given comment in `nft -a`
// output of a chain.
func handleOf(t *testing.T, ns *nstest.NS, chain, comment string) string {
	t.Helper()
	out := nftRun(t, ns, "-a", "list", "chain", "inet", TableName, chain)
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, `comment "`+comment+`"`) {
			if i := strings.LastIndex(line, "# handle "); i >= 0 {
				return strings.TrimSpace(line[i+len("# handle "):])
			}
		}
	}
	t.Fatalf("no rule %q in chain %s:\n%s", comment, chain, out)
	return ""
}

// compile compiles a policy spec, failing the test on error.
func compile(t testing.TB, spec gate.Spec, params Params) *Ruleset {
	t.Helper()
	p, err := gate.Compile(spec)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Compile(p, params)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func entries(vals ...string) []gate.Entry {
	out := make([]gate.Entry, len(vals))
	for i, v := range vals {
		out[i] = gate.Entry{Value: v, Field: fmt.Sprintf("sandbox.hosts[%d]", i)}
	}
	return out
}
