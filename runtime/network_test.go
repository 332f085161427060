package runtime

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"flowgate/gate/netnsx"
)

// TestTwoSandboxes runs two sandboxes at once in one uplink: different
// subnets, both online, neither reaching the other or the host, and the
// host table gone only when the last one closes.
func TestTwoSandboxes(t *testing.T) {
	e := newEnv(t)
	var a, b *LocalSandbox
	var wg sync.WaitGroup
	var errA, errB error
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wg.Go(func() { a, errA = e.local.Create(ctx, Spec{Name: randName("rta"), LogsDir: e.logsDir(t)}) })
	wg.Go(func() { b, errB = e.local.Create(ctx, Spec{Name: randName("rtb"), LogsDir: e.logsDir(t)}) })
	wg.Wait()
	if errA != nil || errB != nil {
		for _, s := range []*LocalSandbox{a, b} {
			if s != nil {
				s.Close()
			}
		}
		t.Fatalf("Create: %v / %v", errA, errB)
	}
	stA, stB := a.st, b.st
	closed := false
	defer func() {
		if !closed {
			a.Close()
			b.Close()
		}
	}()

	a4, a6 := a.Addrs()
	b4, b6 := b.Addrs()
	if a4.Masked() == b4.Masked() || a6.Masked() == b6.Masked() || !a6.IsValid() || !b6.IsValid() {
		t.Fatalf("subnets: a %v %v, b %v %v", a4, a6, b4, b6)
	}
	if a.HostLink() == b.HostLink() {
		t.Fatalf("host links share a name: %s", a.HostLink())
	}

	// Listeners in b (the test's own root sockets inside b's netns) and on
	// H's own address of b's link.
	var hits sync.Map
	lb4, err := netnsx.Listen(b.NetNS(), "tcp4", "0.0.0.0:8080")
	if err != nil {
		t.Fatal(err)
	}
	defer lb4.Close()
	lb6, err := netnsx.Listen(b.NetNS(), "tcp6", "[::]:8080")
	if err != nil {
		t.Fatal(err)
	}
	defer lb6.Close()
	lh, err := netnsx.Listen(e.h.Handle, "tcp", ":8081")
	if err != nil {
		t.Fatal(err)
	}
	defer lh.Close()
	for _, l := range []net.Listener{lb4, lb6, lh} {
		go countAccepts(l, &hits)
	}

	hostSideOfA := hostAddr(stA.Net4).Addr()
	hostSideOfB := hostAddr(stB.Net4).Addr()
	targets := []string{
		"http://" + b4.Addr().String() + ":8080/",
		"http://[" + b6.Addr().String() + "]:8080/",
		"http://" + hostSideOfA.String() + ":8081/",
		"http://" + hostSideOfB.String() + ":8081/",
		"http://[" + hostAddr(stA.Net6).Addr().String() + "]:8081/",
	}
	script := "for u in " + strings.Join(targets, " ") + "; do curl -s -o /dev/null --max-time 1 $u; echo \"$u $?\"; done"
	for _, as := range []Owner{Root, Agent} {
		out := mustRun(t, a, as, "sh", "-c", script)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			// 28: timed out (dropped). Anything else means an answer came.
			if !strings.HasSuffix(line, " 28") {
				t.Errorf("sandbox a as %v: %s (want curl's timeout, 28)", as, line)
			}
		}
	}
	// Both sandboxes are online, with phases running at the same time.
	var outs [2]syncBuffer
	var errs [2]error
	var ress [2]Result
	for i, s := range []*LocalSandbox{a, b} {
		wg.Go(func() {
			ress[i], errs[i] = s.Run(ctx, Process{Argv: []string{"sh", "-c", "for i in 1 2 3; do curl -sS --max-time 20 http://example.com/$i; done; hostname"}, Env: stdEnv(s, Agent), As: Agent, Stdout: &outs[i], Stderr: &outs[i]})
		})
	}
	wg.Wait()
	for i, s := range []*LocalSandbox{a, b} {
		want := "simnet example.com /1\nsimnet example.com /2\nsimnet example.com /3\n" + s.Name() + "\n"
		if errs[i] != nil || ress[i].ExitCode != 0 || outs[i].String() != want {
			t.Errorf("%s: %+v %v:\n%s", s.Name(), ress[i], errs[i], outs[i].String())
		}
	}
	n := 0
	hits.Range(func(_, _ any) bool { n++; return true })
	if n != 0 {
		t.Errorf("%d connections from sandbox a reached a listener of b or H", n)
	}
	// b's listener works for b itself: the probe above was not vacuous.
	run(t, b, Agent, "curl", "-sS", "-o", "/dev/null", "--max-time", "5", "http://127.0.0.1:8080/")
	n = 0
	hits.Range(func(_, _ any) bool { n++; return true })
	if n != 1 {
		t.Errorf("b's own connection to its listener: %d accepts, want 1", n)
	}

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	e.assertGone(t, stA)
	if !e.tableInH(t) || e.rulesOf(t, stB.Name) == 0 {
		t.Errorf("closing a removed b's rules or the table")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	e.assertGone(t, stB)
	if e.tableInH(t) {
		t.Errorf("table inet %s left in H after the last sandbox closed", HostTable)
	}
	if v, err := readSysctl(e.h.Handle, "net/ipv6/conf/"+"uplink0"+"/force_forwarding"); err != nil || v != "0" {
		t.Errorf("force_forwarding on H's uplink after the last sandbox: %q, %v (want it set back to 0)", v, err)
	}
}

func countAccepts(l net.Listener, hits *sync.Map) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		hits.Store(c.RemoteAddr().String(), true)
		c.Close()
	}
}

// TestHostRules checks the host table against what `nft list` prints,
// and that applying a sandbox's rules twice changes nothing.
func TestHostRules(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, Spec{Name: randName("rtn")})
	before := e.nftList(t)
	n := e.rulesOf(t, sb.Name())
	if err := addHostRules(e.h.Handle, sb.st, nil); err != nil {
		t.Fatal(err)
	}
	if got := e.rulesOf(t, sb.Name()); got != n {
		t.Errorf("applying the rules again: %d rules, want %d", got, n)
	}
	if after := e.nftList(t); stripHandles(after) != stripHandles(before) {
		t.Errorf("applying the rules again changed the table:\n%s\nwas:\n%s", after, before)
	}
	l, net4, net6 := sb.HostLink(), sb.st.Net4.String(), sb.st.Net6.String()
	c := `comment "flowgate sandbox=` + sb.Name() + `: `
	for _, want := range []string{
		"table inet flowgate_host {",
		"type nat hook postrouting priority srcnat; policy accept;",
		"ip saddr " + net4 + ` oifname != "` + l + `" masquerade ` + c + `masquerade IPv4"`,
		"ip6 saddr " + net6 + ` oifname != "` + l + `" masquerade ` + c + `masquerade IPv6"`,
		"type filter hook forward priority filter; policy accept;",
		`oifname "` + l + `" ct state established,related accept ` + c + `replies into the sandbox"`,
		`oifname "` + l + `" drop ` + c + `nothing else enters the sandbox"`,
		`iifname "` + l + `" ip saddr != ` + net4 + " drop " + c + `no spoofed IPv4 source"`,
		"type filter hook input priority filter; policy accept;",
		`iifname "` + l + `" icmpv6 type nd-neighbor-solicit accept ` + c + `IPv6 neighbour discovery"`,
		`iifname "` + l + `" drop ` + c + `the sandbox cannot reach the host"`,
	} {
		if !strings.Contains(before, want) {
			t.Errorf("nft list lacks %q:\n%s", want, before)
		}
	}
}

func (e *env) nftList(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", e.h.Name, "nft", "list", "table", "inet", HostTable).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	return string(out)
}

func stripHandles(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if i := strings.Index(line, " # handle"); i >= 0 {
			line = line[:i]
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// TestBusySubnetSkipped: a subnet already on a link of the uplink is not
// handed out.
func TestBusySubnetSkipped(t *testing.T) {
	e := newEnv(t)
	pool := DefaultPool()
	first4, first6 := pool.subnets(0)
	lo, err := e.h.Netlink().LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.h.Netlink().AddrAdd(lo, &netlink.Addr{IPNet: prefixIPNet(netip.PrefixFrom(first4.Addr().Next(), 30))}); err != nil {
		t.Fatal(err)
	}
	sb := e.create(t, Spec{})
	if sb.st.Net4 == first4 || sb.st.Net6 == first6 || sb.st.Slot != 1 {
		t.Errorf("sandbox took slot %d (%v %v) although %v is on H's lo", sb.st.Slot, sb.st.Net4, sb.st.Net6, first4)
	}
}

// TestNoIPv6Pool: a pool without IPv6 gives a sandbox none.
func TestNoIPv6Pool(t *testing.T) {
	e := newEnv(t)
	e.local.Pool = Pool{V4: netip.MustParsePrefix("10.209.128.0/24")}
	sb := e.create(t, Spec{})
	if sb.IPv6() {
		t.Fatalf("IPv6() = true without an IPv6 pool")
	}
	if out := mustRun(t, sb, Agent, "cat", "/proc/sys/net/ipv6/conf/eth0/disable_ipv6"); out != "1\n" {
		t.Errorf("eth0 disable_ipv6 = %q", out)
	}
	if _, res := run(t, sb, Root, "curl", "-6", "-sS", "--max-time", "3", "http://example.com/"); res.ExitCode == 0 {
		t.Errorf("curl -6 worked without IPv6")
	}
	if out := mustRun(t, sb, Agent, "curl", "-4", "-sS", "--max-time", "20", "http://example.com/v4"); out != "simnet example.com /v4\n" {
		t.Errorf("curl -4 = %q", out)
	}
}

// TestLocalResolverReachable: a resolver that is an address of the uplink
// itself stays reachable on port 53 although the sandbox cannot reach the
// host otherwise.
func TestLocalResolverReachable(t *testing.T) {
	e := newEnv(t)
	local := e.up.Addr4.Addr()
	e.local.DNS = []netip.Addr{local}
	var hits sync.Map
	for _, port := range []string{"53", "54"} {
		l, err := netnsx.Listen(e.h.Handle, "tcp4", net.JoinHostPort(local.String(), port))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go countAccepts(l, &hits)
	}
	sb := e.create(t, Spec{})
	if out := mustRun(t, sb, Agent, "grep", "^nameserver", "/etc/resolv.conf"); out != "nameserver "+local.String()+"\n" {
		t.Errorf("resolv.conf = %q", out)
	}
	script := "for p in 53 54; do timeout 3 bash -c \"exec 3<>/dev/tcp/" + local.String() + "/$p\"; echo \"$p $?\"; done"
	out := mustRun(t, sb, Agent, "sh", "-c", script)
	if out != "53 0\n54 124\n" {
		t.Errorf("connecting to the uplink's resolver address on 53 and 54:\n%s(want 53 to connect, 54 to time out)", out)
	}
}
