package nft

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flowgate/gate"
	"flowgate/gate/netnsx"
	"flowgate/gate/nstest"
)

// Probe names: what the probe binary is asked to try.
const (
	tcpLocal4 = "tcp:127.0.0.1:7777"
	tcpLocal6 = "tcp:[::1]:7777"
	tcpPeer4  = "tcp:192.0.2.1:80"
	tcpPeer6  = "tcp:[2001:db8::1]:80"
	tcpMeta4  = "tcp:169.254.169.254:80"
	tcpMeta6  = "tcp:[fd00:ec2::254]:80"
	tcpBlock4 = "tcp:198.51.100.7:80"
	tcpBlock6 = "tcp:[2001:db8:bad::7]:80"
	udpPeer4  = "udp:192.0.2.1:9999"
	udpPeer6  = "udp:[2001:db8::1]:9999"
	udpMeta4  = "udp:169.254.169.254:9999"
	pingPeer4 = "ping:192.0.2.1"
	pingPeer6 = "ping:2001:db8::1"
	pingMeta4 = "ping:169.254.169.254"
	pingBlk4  = "ping:198.51.100.7"
)

// What each destination answers when nothing is in the way.
var open = map[string]string{
	tcpLocal4: "ok local",
	tcpLocal6: "ok local",
	tcpPeer4:  "ok peer_192.0.2.1:80",
	tcpPeer6:  "ok peer_[2001:db8::1]:80",
	tcpMeta4:  "ok peer_169.254.169.254:80",
	tcpMeta6:  "ok peer_[fd00:ec2::254]:80",
	tcpBlock4: "ok peer_198.51.100.7:80",
	tcpBlock6: "ok peer_[2001:db8:bad::7]:80",
	udpPeer4:  "ok peer",
	udpPeer6:  "ok peer",
	udpMeta4:  "ok peer",
	pingPeer4: "ok echo-reply",
	pingPeer6: "ok echo-reply",
	pingMeta4: "ok echo-reply",
	pingBlk4:  "ok echo-reply",
}

// with returns open with some results replaced.
func with(changes map[string]string) map[string]string {
	out := make(map[string]string, len(open))
	for k, v := range open {
		out[k] = v
	}
	for k, v := range changes {
		out[k] = v
	}
	return out
}

const (
	refused = "refused" // a TCP reset: connect fails with ECONNREFUSED
	eperm   = "eperm"   // admin-prohibited in the output hook: send fails with EPERM
	// An IPv6 ping socket does not report the output hook's verdict (the
	// kernel drops the error of ip6_push_pending_frames for ICMPv6), so a
	// refused echo shows as no reply. Root's echo to the same address is
	// answered, so the rule is what stops it.
	dropped6 = "timeout"
)

func transparent(dst string) string { return "ok transparent_" + dst }

const (
	eaiAgain = "err [Errno -3] Temporary failure in name resolution"
	fromPeer = "ok 192.0.2.1,2001:db8::1"
	fromGate = "ok 2001:db8::53,203.0.113.53"
)

func TestReach(t *testing.T) {
	nstest.RequireRoot(t)
	ports := gate.DefaultPorts
	params := Params{Sandbox: "reach", UID: nstest.AgentUID, Ports: ports}
	cases := []struct {
		name       string
		spec       gate.Spec
		agent      map[string]string
		agentDNS   string
		standIns   bool
		afterApply func(t *testing.T, tp *topo)
	}{
		{
			name: "public",
			spec: gate.Spec{Mode: gate.Public},
			agent: with(map[string]string{
				tcpMeta4: refused, tcpMeta6: refused, udpMeta4: eperm, pingMeta4: eperm,
			}),
			agentDNS: fromPeer,
		},
		{
			name: "no-network",
			spec: gate.Spec{Mode: gate.NoNetwork},
			agent: with(map[string]string{
				tcpPeer4: refused, tcpPeer6: refused, tcpMeta4: refused, tcpMeta6: refused, tcpBlock4: refused, tcpBlock6: refused,
				udpPeer4: eperm, udpPeer6: eperm, udpMeta4: eperm,
				pingPeer4: eperm, pingPeer6: dropped6, pingMeta4: eperm, pingBlk4: eperm,
			}),
			agentDNS: eaiAgain,
		},
		{
			name: "denylist",
			spec: gate.Spec{Mode: gate.Denylist, BlockedHosts: entries("mirror.example.net", "198.51.100.0/24", "2001:db8:bad::/48")},
			agent: with(map[string]string{
				tcpPeer4: transparent("192.0.2.1:80"), tcpPeer6: transparent("[2001:db8::1]:80"),
				tcpMeta4: refused, tcpMeta6: refused, tcpBlock4: refused, tcpBlock6: refused,
				udpPeer4: eperm, udpPeer6: eperm, udpMeta4: eperm,
				pingMeta4: eperm, pingBlk4: eperm,
			}),
			agentDNS: fromGate,
			standIns: true,
		},
		{
			name: "allowlist",
			spec: gate.Spec{Mode: gate.Allowlist, AllowedHosts: entries("pypi.org", "198.51.100.0/24", "2001:db8:bad::/48")},
			agent: with(map[string]string{
				tcpPeer4: refused, tcpPeer6: refused, tcpMeta4: refused, tcpMeta6: refused,
				tcpBlock4: transparent("198.51.100.7:80"), tcpBlock6: transparent("[2001:db8:bad::7]:80"),
				udpPeer4: eperm, udpPeer6: eperm, udpMeta4: eperm,
				pingPeer4: eperm, pingPeer6: dropped6, pingMeta4: eperm, pingBlk4: eperm,
			}),
			agentDNS:   fromGate,
			standIns:   true,
			afterApply: learnAndExpire,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tp := newTopo(t)
			if tc.standIns {
				tp.standIns(ports)
			}
			// Before any rule, the agent reaches everything directly.
			tp.expect(nstest.AgentUID, open)
			if err := Apply(tp.s.Handle, compile(t, tc.spec, params)); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := Remove(tp.s.Handle); err != nil {
					t.Error(err)
				}
			})
			tp.expect(nstest.AgentUID, tc.agent)
			tp.expect(0, open)
			if got, _ := tp.lookup(nstest.AgentUID, "www.example.com", false); got != tc.agentDNS {
				t.Errorf("agent lookup over UDP: got %q, want %q", got, tc.agentDNS)
			}
			if got, _ := tp.lookup(nstest.AgentUID, "www.example.com", true); got != tc.agentDNS {
				t.Errorf("agent lookup over TCP: got %q, want %q", got, tc.agentDNS)
			}
			if got, _ := tp.lookup(0, "www.example.com", false); got != fromPeer {
				t.Errorf("root lookup: got %q, want %q", got, fromPeer)
			}
			if tc.afterApply != nil {
				tc.afterApply(t, tp)
			}
		})
	}
}

// learnAndExpire shows that TCP to a learned address is admitted (and
// redirected) while other TCP is reset, and that the admission expires.
func learnAndExpire(t *testing.T, tp *topo) {
	l, err := NewLearner(tp.s.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Add(addrs("192.0.2.1", "2001:db8::1"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	tp.expect(nstest.AgentUID, map[string]string{
		tcpPeer4: transparent("192.0.2.1:80"), tcpPeer6: transparent("[2001:db8::1]:80"),
		tcpMeta4: refused, udpPeer4: eperm, pingPeer4: eperm,
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := tp.probe(nstest.AgentUID, tcpPeer4, tcpPeer6)
		if got[tcpPeer4] == refused && got[tcpPeer6] == refused {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("learned addresses still admitted 20s after a 2s timeout: %v", got)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestNoNetworkDNSFast checks that under no-network a lookup fails at once
// with EAI_AGAIN rather than after the resolver's timeout.
func TestNoNetworkDNSFast(t *testing.T) {
	nstest.RequireRoot(t)
	tp := newTopo(t)
	if err := Apply(tp.s.Handle, compile(t, gate.Spec{Mode: gate.NoNetwork}, Params{Sandbox: "fast", UID: nstest.AgentUID})); err != nil {
		t.Fatal(err)
	}
	for _, tcp := range []bool{false, true} {
		best := time.Hour
		var tries []string
		for range 3 {
			got, took := tp.lookup(nstest.AgentUID, "www.example.com", tcp)
			if got != eaiAgain {
				t.Fatalf("lookup (tcp %v): got %q, want %q", tcp, got, eaiAgain)
			}
			best = min(best, took)
			tries = append(tries, took.String())
		}
		t.Logf("no-network lookup refused (tcp %v) in %s", tcp, strings.Join(tries, ", "))
		limit := 100 * time.Millisecond
		if tcp {
			limit = time.Second // below the resolver's 2s timeout: refused, not timed out
		}
		if best >= limit {
			t.Errorf("no-network lookup (tcp %v) took at best %s, want under %s", tcp, best, limit)
		}
	}
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// dockerDNSRuleset is what Docker puts in a container's namespace on a
// user-defined network: queries to its embedded resolver 127.0.0.11:53 are
// DNATed to the port it really listens on, by a nat chain at the standard
// priority (iptables nat OUTPUT, -100).
const dockerDNSRuleset = `table ip dockerlike {
	chain out {
		type nat hook output priority -100; policy accept;
		ip daddr 127.0.0.11 udp dport 53 dnat to 127.0.0.11:5353
		ip daddr 127.0.0.11 tcp dport 53 dnat to 127.0.0.11:5353
	}
}
`

// TestForeignNATChain: a nat chain of another table at the standard
// priority (Docker's embedded DNS, there before flowgate attaches) must not
// take the agent's DNS past flowgate's proxy: flowgate's redirect runs
// first. Root's queries still reach the embedded resolver.
func TestForeignNATChain(t *testing.T) {
	nstest.RequireRoot(t)
	tp := newTopo(t)
	ports := gate.DefaultPorts
	tp.standIns(ports)
	dockerDNS4 := netip.MustParseAddr("192.0.2.111")
	tp.serveDNS(tp.s, "udp", "127.0.0.11:5353", dockerDNS4, netip.MustParseAddr("2001:db8::111"))
	tp.serveDNS(tp.s, "tcp", "127.0.0.11:5353", dockerDNS4, netip.MustParseAddr("2001:db8::111"))
	foreign := filepath.Join(t.TempDir(), "dockerlike.nft")
	if err := os.WriteFile(foreign, []byte(dockerDNSRuleset), 0o644); err != nil {
		t.Fatal(err)
	}
	nftRun(t, tp.s, "-f", foreign)
	r := compile(t, gate.Spec{Mode: gate.Denylist}, Params{Sandbox: "foreign", UID: nstest.AgentUID, Ports: ports})
	if err := Apply(tp.s.Handle, r); err != nil {
		t.Fatal(err)
	}
	check := func(order string) {
		t.Helper()
		for _, tcp := range []bool{false, true} {
			if got, _ := tp.lookupVia(nstest.AgentUID, "www.example.com", "127.0.0.11", tcp); !strings.HasPrefix(got, "ok ") || !strings.Contains(got, standDNS4.String()) {
				t.Errorf("%s: agent's lookup through 127.0.0.11 (tcp %v): %q, want flowgate's answer %s", order, tcp, got, standDNS4)
			}
			if got, _ := tp.lookupVia(0, "www.example.com", "127.0.0.11", tcp); !strings.HasPrefix(got, "ok ") || !strings.Contains(got, dockerDNS4.String()) {
				t.Errorf("%s: root's lookup through 127.0.0.11 (tcp %v): %q, want the embedded resolver's %s", order, tcp, got, dockerDNS4)
			}
		}
	}
	check("foreign table first")
	// The other order: the foreign table comes back after flowgate's.
	nftRun(t, tp.s, "delete", "table", "ip", "dockerlike")
	nftRun(t, tp.s, "-f", foreign)
	check("foreign table last")
}

// TestApplyCutsEarlierConnections: a TCP connection the agent opened
// before the ruleset (flowgate attached to a running container) must not
// keep flowing past flowgate.
func TestApplyCutsEarlierConnections(t *testing.T) {
	nstest.RequireRoot(t)
	tp := newTopo(t)
	ports := gate.DefaultPorts
	tp.standIns(ports)
	// An echo server in P.
	l, err := netnsx.Listen(tp.p.Handle, "tcp4", "0.0.0.0:8081")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	// Conntrack is on in the namespace before flowgate comes, as in a
	// container of Docker's (its embedded-DNS nat rules): the connection
	// below has a conntrack entry, without NAT.
	foreign := filepath.Join(t.TempDir(), "dockerlike.nft")
	if err := os.WriteFile(foreign, []byte(dockerDNSRuleset), 0o644); err != nil {
		t.Fatal(err)
	}
	nftRun(t, tp.s, "-f", foreign)
	c := dialAs(t, tp.s, nstest.AgentUID, netip.AddrPortFrom(pAddr4, 8081))
	defer c.Close()
	echo := func(line string) error {
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := io.WriteString(c, line+"\n"); err != nil {
			return err
		}
		got, err := bufio.NewReader(c).ReadString('\n')
		if err == nil && got != line+"\n" {
			err = fmt.Errorf("echo %q, want %q", got, line)
		}
		return err
	}
	if err := echo("before"); err != nil {
		t.Fatalf("the connection does not work before Apply: %v", err)
	}
	if err := Apply(tp.s.Handle, compile(t, gate.Spec{Mode: gate.Denylist}, Params{Sandbox: "cut", UID: nstest.AgentUID, Ports: ports})); err != nil {
		t.Fatal(err)
	}
	if err := echo("after"); err == nil {
		t.Fatal("a connection opened before Apply still reaches its server directly, past the transparent proxy")
	}
}

// dialAs opens a TCP connection from inside ns whose socket belongs to
// uid (its fsuid at creation, which nftables' skuid matches).
func dialAs(t *testing.T, ns *nstest.NS, uid uint32, dst netip.AddrPort) net.Conn {
	t.Helper()
	var fd int
	err := netnsx.Do(ns.Handle, func() error {
		prev, err := unix.SetfsuidRetUid(int(uid))
		if err != nil {
			return err
		}
		defer unix.SetfsuidRetUid(prev)
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		t.Fatalf("socket as uid %d: %v", uid, err)
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}); err != nil {
		unix.Close(fd)
		t.Fatalf("connect as uid %d to %s: %v", uid, dst, err)
	}
	f := os.NewFile(uintptr(fd), "dialas")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestGuardRefusesUnredirected: a foreign nat chain that runs before
// flowgate's (priority -120) maps the agent's TCP itself, so flowgate's
// redirect never applies; the guard chain, after NAT, refuses what leaves
// for anywhere but loopback. Root is not matched.
func TestGuardRefusesUnredirected(t *testing.T) {
	nstest.RequireRoot(t)
	tp := newTopo(t)
	ports := gate.DefaultPorts
	tp.standIns(ports)
	const early = `table ip early {
	chain out {
		type nat hook output priority -120; policy accept;
		ip daddr 192.0.2.1 tcp dport 80 dnat to 192.0.2.1:80
	}
}
`
	path := filepath.Join(t.TempDir(), "early.nft")
	if err := os.WriteFile(path, []byte(early), 0o644); err != nil {
		t.Fatal(err)
	}
	nftRun(t, tp.s, "-f", path)
	if err := Apply(tp.s.Handle, compile(t, gate.Spec{Mode: gate.Denylist}, Params{Sandbox: "guard", UID: nstest.AgentUID, Ports: ports})); err != nil {
		t.Fatal(err)
	}
	tp.expect(nstest.AgentUID, map[string]string{tcpPeer4: refused, tcpPeer6: transparent("[2001:db8::1]:80")})
	tp.expect(0, map[string]string{tcpPeer4: open[tcpPeer4]})
}

// TestOtherLoopback: in the restricted modes the agent's loopback is
// 127.0.0.1 and ::1. Another 127/8 address can hold a service of the
// namespace's that forwards (Docker's embedded resolver at 127.0.0.11, on
// a port of its own): the agent is refused there, over TCP and UDP, while
// root reaches it; in public mode the agent does too.
func TestOtherLoopback(t *testing.T) {
	nstest.RequireRoot(t)
	tp := newTopo(t)
	ports := gate.DefaultPorts
	tp.standIns(ports)
	const tcp11, udp11 = "tcp:127.0.0.11:5353", "udp:127.0.0.11:5353"
	tp.serveTCP(tp.s, "tcp4", "127.0.0.11:5353", func(net.Conn) string { return "local11" })
	tp.serveUDP(tp.s, "127.0.0.11:5353", "local11")
	open11 := map[string]string{tcp11: "ok local11", udp11: "ok local11", tcpLocal4: open[tcpLocal4]}
	parent := tp.t
	defer func() { tp.t = parent }()
	for _, mode := range []gate.Mode{gate.Public, gate.NoNetwork, gate.Denylist, gate.Allowlist} {
		if err := Apply(tp.s.Handle, compile(t, gate.Spec{Mode: mode}, Params{Sandbox: "lo", UID: nstest.AgentUID, Ports: ports})); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{tcp11: refused, udp11: eperm, tcpLocal4: open[tcpLocal4]}
		if mode == gate.Public {
			want = open11
		}
		t.Run(mode.String(), func(t *testing.T) {
			tp.t = t
			tp.expect(nstest.AgentUID, want)
			tp.expect(0, open11)
		})
	}
}
