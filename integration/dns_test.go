package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"flowgate/gate"
	"flowgate/integration/simnet"
)

// TestDNSPaths checks that every way the agent asks DNS ends at flowgate's
// proxy: UDP and TCP, to the configured resolver or any other address,
// over IPv4 and IPv6, and glibc's retry over TCP after a truncated answer.
func TestDNSPaths(t *testing.T) {
	inet := startInternet(t)
	s := newSandbox(t, inet)
	s.attach(loadPolicy(t, denylistPolicy))
	env := s.env(false)
	const blockedEDE = "15 flowgate: host_blocked by " + ruleBlockExample

	cases := []struct {
		name, server, qtype string
		tcp                 bool
	}{
		{"UDP to the resolver", resolver4, "A", false},
		{"TCP to the resolver", resolver4, "A", true},
		{"UDP to an address that is no resolver", "203.0.113.99:53", "A", false},
		{"TCP to an address that is no resolver", "203.0.113.99:53", "A", true},
		{"UDP to the IPv6 resolver", resolver6, "AAAA", false},
		{"TCP to the IPv6 resolver", resolver6, "AAAA", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mark := s.log.mark()
			args := []string{"-server", c.server, "-type", c.qtype}
			if c.tcp {
				args = append(args, "-tcp")
			}
			rs := s.goClient(env, "dns", append(args, "pypi.org", "example.com")...)
			want := pypi4
			if c.qtype == "AAAA" {
				want = pypi6
			}
			if r := rs[0]; !r.OK || r.Rcode != "NOERROR" || !slices.Equal(r.Answers, []string{want}) {
				t.Errorf("pypi.org %s: %+v, want NOERROR %s", c.qtype, r, want)
			}
			if r := rs[1]; !r.OK || r.Rcode != "NXDOMAIN" || r.EDE != blockedEDE || len(r.Answers) != 0 {
				t.Errorf("example.com %s: %+v, want NXDOMAIN with %q", c.qtype, r, blockedEDE)
			}
			s.wantDenials(t, mark, deny(gate.ProtoDNS, "", "example.com", gate.ReasonHostBlocked, ruleBlockExample))
			s.wantAllowed(t, mark, dnsAllowPypi(gate.ReasonNotBlocked, ruleDefault))
		})
	}

	t.Run("truncated over UDP, retried over TCP by glibc", func(t *testing.T) {
		mark := s.log.mark()
		const script = `import socket
print(len({a[4][0] for a in socket.getaddrinfo("` + simnet.ManyName + `", 443, socket.AF_INET, socket.SOCK_STREAM)}))`
		p := s.agent(env, "/usr/bin/python3", "-c", script)
		want := min(simnet.ManyCount, gate.MaxAddrsPerName)
		if p.code != 0 || strings.TrimSpace(p.stdout) != fmt.Sprint(want) {
			t.Errorf("getaddrinfo(%s): %s, want %d addresses", simnet.ManyName, p, want)
		}
		// glibc asks without EDNS, so the UDP answer is cut to 512 bytes
		// (29 addresses, with TC) and it asks again over TCP: the
		// addresses came over TCP, through flowgate (the only way out for
		// port 53), as many as flowgate learns of the 100. glibc asks
		// twice, so the records come in pairs.
		var details []string
		for _, r := range s.log.since(mark) {
			if r.Name == simnet.ManyName {
				details = append(details, fmt.Sprintf("%s %s %s", r.Verdict, r.Reason, r.Detail))
			}
		}
		if len(details) == 0 || len(details)%2 != 0 || slices.ContainsFunc(details, func(d string) bool { return d != "allow not_blocked A NOERROR" }) {
			t.Errorf("records for %s: %q, want pairs of allowed A queries (UDP, then TCP)", simnet.ManyName, details)
		}
		s.wantDenials(t, mark)
	})

	t.Run("glibc over TCP only (use-vc), A and AAAA on one connection", func(t *testing.T) {
		s.resolvConf("nameserver "+simnet.Resolver.Addr().String(), "options use-vc")
		t.Cleanup(func() { s.resolvConf("nameserver " + simnet.Resolver.Addr().String()) })
		mark := s.log.mark()
		const script = `import socket
print(" ".join(sorted({a[4][0] for a in socket.getaddrinfo("pypi.org", 443, proto=socket.IPPROTO_TCP)})))`
		p := s.agent(env, "/usr/bin/python3", "-c", script)
		if want := pypi4 + " " + pypi6; p.code != 0 || strings.TrimSpace(p.stdout) != want {
			t.Errorf("getaddrinfo(pypi.org) over TCP: %s, want %s", p, want)
		}
		got := s.python(env, exampleURL, pypiURL)
		if want := wantPython(exampleURL, expect{out: nxdomain}); got[exampleURL] != want {
			t.Errorf("python %s: %s, want %s", exampleURL, got[exampleURL], want)
		}
		if want := wantPython(pypiURL, expect{out: reach}); got[pypiURL] != want {
			t.Errorf("python %s: %s, want %s", pypiURL, got[pypiURL], want)
		}
		s.wantDenials(t, mark, deny(gate.ProtoDNS, "", "example.com", gate.ReasonHostBlocked, ruleBlockExample))
		s.wantAllowed(t, mark, dnsAllowPypi(gate.ReasonNotBlocked, ruleDefault))
	})

	t.Run("IPv6 resolver in resolv.conf", func(t *testing.T) {
		s.resolvConf("nameserver " + simnet.Resolver6.Addr().String())
		t.Cleanup(func() { s.resolvConf("nameserver " + simnet.Resolver.Addr().String()) })
		mark := s.log.mark()
		if got := s.curl(env, pypiURL, "-6"); got.exit != 0 || got.status != 200 || got.body != siteBody(pypiURL) {
			t.Errorf("curl -6 %s: %+v, want 200", pypiURL, got)
		}
		got := s.python(env, exampleURL, pypiURL)
		if want := wantPython(exampleURL, expect{out: nxdomain}); got[exampleURL] != want {
			t.Errorf("python %s: %s, want %s", exampleURL, got[exampleURL], want)
		}
		if want := wantPython(pypiURL, expect{out: reach}); got[pypiURL] != want {
			t.Errorf("python %s: %s, want %s", pypiURL, got[pypiURL], want)
		}
		s.wantDenials(t, mark, deny(gate.ProtoDNS, "", "example.com", gate.ReasonHostBlocked, ruleBlockExample))
		s.wantAllowed(t, mark, dnsAllowPypi(gate.ReasonNotBlocked, ruleDefault),
			allow(gate.ProtoTLS, "["+pypi6+"]:443", "pypi.org", gate.ReasonNotBlocked, ruleDefault))
	})
}

// TestDNSOverTCPLearns checks that an allowlist learns an address from an
// answer given over TCP, as from one over UDP.
func TestDNSOverTCPLearns(t *testing.T) {
	inet := startInternet(t)
	s := newSandbox(t, inet)
	s.attach(loadPolicy(t, allowlistPolicy))
	env := s.env(false)
	if r := s.goOne(env, "tls", "-sni", "", pypi4+":443"); r.Kind != "refused" {
		t.Fatalf("before the lookup: %+v, want refused", r)
	}
	if r := s.goOne(env, "dns", "-tcp", "pypi.org"); !r.OK || !slices.Equal(r.Answers, []string{pypi4}) {
		t.Fatalf("DNS over TCP: %+v", r)
	}
	mark := s.log.mark()
	if r := s.goOne(env, "tls", "-sni", "", pypi4+":443"); !r.OK || r.Status != 200 {
		t.Errorf("after the lookup over TCP: %+v, want 200", r)
	}
	s.wantAllowed(t, mark, allow(gate.ProtoTLS, pypi4+":443", "", gate.ReasonLearned, ruleAllowPypi))
}

// TestDNSNoNetwork checks that DNS fails at once under no-network, over
// UDP (EPERM from send) and TCP (a reset), to any server.
func TestDNSNoNetwork(t *testing.T) {
	inet := startInternet(t)
	s := newSandbox(t, inet)
	s.attach(loadPolicy(t, noNetworkPolicy))
	env := s.env(false)
	for _, server := range []string{resolver4, resolver6, "203.0.113.99:53"} {
		if r := s.goOne(env, "dns", "-server", server, "pypi.org"); r.Kind != "eperm" {
			t.Errorf("UDP to %s: %+v, want EPERM", server, r)
		}
		if r := s.goOne(env, "dns", "-tcp", "-server", server, "pypi.org"); r.Kind != "refused" {
			t.Errorf("TCP to %s: %+v, want refused", server, r)
		}
	}
	if n := inet.Queries("pypi.org"); n != 0 {
		t.Errorf("the simulated resolver got %d queries for pypi.org, want 0", n)
	}
}

// TestUpstreamFlowsForgotten: flowgate's own upstream UDP sockets leave no
// conntrack flow behind when they close. Such a flow has no NAT; an agent
// socket that got its port from the kernel within the flow's half minute
// would miss the redirect to flowgate and be refused by the guard chain.
func TestUpstreamFlowsForgotten(t *testing.T) {
	inet := startInternet(t)
	s := newSandbox(t, inet)
	h := s.attach(loadPolicy(t, denylistPolicy))
	if r := s.goOne(s.env(false), "lookup", "pypi.org"); !r.OK {
		t.Fatalf("lookup pypi.org: %+v", r)
	}
	ct, err := netlink.NewHandleAt(s.ns.Handle, unix.NETLINK_NETFILTER)
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	resolver := simnet.Resolver.Addr().AsSlice()
	// flowgate's upstream flows: to the resolver's port 53, not NATed (the
	// reply comes from the resolver itself, not from a redirect).
	upstreamFlows := func() int {
		flows, err := ct.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range flows {
			if f.Forward.Protocol == unix.IPPROTO_UDP && f.Forward.DstPort == 53 && f.Forward.DstIP.Equal(resolver) && f.Reverse.SrcIP.Equal(resolver) {
				n++
			}
		}
		return n
	}
	if n := upstreamFlows(); n == 0 {
		t.Fatal("no upstream flow while flowgate's sockets are open: the test cannot see them")
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if n := upstreamFlows(); n != 0 {
		t.Errorf("%d upstream flows left after flowgate closed its sockets, want 0", n)
	}
}
