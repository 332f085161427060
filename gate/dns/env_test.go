package dns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"flowgate/gate"
	"flowgate/gate/netnsx"
	"flowgate/gate/nstest"
	"flowgate/integration/simnet"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// env is the proxy serving inside a sandbox namespace S that is attached
// to the simulated internet; upstream is simnet's resolver reached through
// S's own uplink.
type env struct {
	in    *simnet.Internet
	ns    *nstest.NS
	up    *simnet.Uplink
	srv   *Server
	names *gate.Names
	rec   *recorder
	push  *pushLog
	seq   *seqCounter
	// Listener addresses inside S.
	udp4, udp6, tcp4, tcp6 string
}

// newEnv starts simnet (record TTL 5s), a namespace attached to it, and
// the proxy on 127.0.0.1 and ::1 inside it, all removed at the end.
func newEnv(t testing.TB, p *gate.Policy, tweak func(*Config)) *env {
	t.Helper()
	nstest.RequireRoot(t)
	in, err := simnet.Start(simnet.Options{Prefix: "fg-dns-inet", TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("starting simnet: %v", err)
	}
	t.Cleanup(func() {
		if err := in.Close(); err != nil {
			t.Errorf("closing simnet: %v", err)
		}
	})
	ns := nstest.New(t, "fg-dns")
	up, err := in.Attach(ns.Handle, simnet.AttachOptions{})
	if err != nil {
		t.Fatalf("attaching: %v", err)
	}
	// ::1 takes the kernel's address work queue to become local; on a
	// busy machine that can lag behind the namespace's creation.
	deadline := time.Now().Add(5 * time.Second)
	for {
		rs, err := ns.Netlink().RouteGet(net.IPv6loopback)
		if err == nil && len(rs) > 0 && rs[0].Type == unix.RTN_LOCAL {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("::1 not local in %s after 5s: %v %v", ns.Name, rs, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	e := &env{in: in, ns: ns, up: up, rec: &recorder{}, seq: &seqCounter{}}
	e.push = &pushLog{seq: e.seq}
	e.names = gate.NewNames(e.push.push)
	d := &netnsx.Dialer{NS: ns.Handle}
	cfg := Config{
		Policy:    p,
		Names:     e.names,
		Upstreams: []netip.AddrPort{up.Resolver},
		Dial:      d.DialContext,
		Record:    e.rec,
		Sandbox:   "fg-dns-test",
		UID:       nstest.AgentUID,
		Timeout:   2 * time.Second,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.srv = srv
	serveErr := make(chan error, 4)
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		pc, err := netnsx.ListenPacket(ns.Handle, "udp", addr)
		if err != nil {
			t.Fatalf("listening udp %s: %v", addr, err)
		}
		l, err := netnsx.Listen(ns.Handle, "tcp", addr)
		if err != nil {
			pc.Close()
			t.Fatalf("listening tcp %s: %v", addr, err)
		}
		if addr[0] == '[' {
			e.udp6, e.tcp6 = pc.LocalAddr().String(), l.Addr().String()
		} else {
			e.udp4, e.tcp4 = pc.LocalAddr().String(), l.Addr().String()
		}
		go func() { serveErr <- srv.ServeUDP(pc) }()
		go func() { serveErr <- srv.ServeTCP(l) }()
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("closing the proxy: %v", err)
		}
		for range 4 {
			if err := <-serveErr; err != nil {
				t.Errorf("Serve returned %v after Close, want nil", err)
			}
		}
	})
	return e
}

// dial opens a client socket inside S.
func (e *env) dial(t testing.TB, network, addr string) net.Conn {
	t.Helper()
	d := &netnsx.Dialer{NS: e.ns.Handle}
	c, err := d.DialContext(context.Background(), network, addr)
	if err != nil {
		t.Fatalf("dialing %s %s: %v", network, addr, err)
	}
	return c
}

// query asks one question from inside S, as a stub resolver would. The
// proxy writes a query's record just after its answer; an answered query
// to the proxy returns once its record is there too.
func (e *env) query(t testing.TB, network, addr, name string, qtype uint16, edns bool) (*dns.Msg, error) {
	t.Helper()
	c := e.dial(t, network, addr)
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	if edns {
		m.SetEdns0(4096, false)
	}
	before := len(e.rec.all())
	cl := &dns.Client{Net: network, Timeout: 3 * time.Second}
	r, _, err := cl.ExchangeWithConn(m, &dns.Conn{Conn: c})
	if err == nil && slices.Contains([]string{e.udp4, e.udp6, e.tcp4, e.tcp6}, addr) {
		eventually(t, "the record of the query for "+name, func() bool { return len(e.rec.all()) > before })
	}
	return r, err
}

// mustQuery is query that fails the test on a transport error.
func (e *env) mustQuery(t testing.TB, network, addr, name string, qtype uint16, edns bool) *dns.Msg {
	t.Helper()
	r, err := e.query(t, network, addr, name, qtype, edns)
	if err != nil {
		t.Fatalf("%s %s %s via %s: %v", network, name, dns.Type(qtype), addr, err)
	}
	return r
}

// recordFor returns the last record naming name, failing if none.
func (e *env) recordFor(t testing.TB, name string) gate.Record {
	t.Helper()
	recs := e.rec.all()
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].Name == name {
			return recs[i]
		}
	}
	t.Fatalf("no record for %s in %v", name, recs)
	return gate.Record{}
}

// wantRecord checks a record's verdict, reason and rule.
func wantRecord(t testing.TB, r gate.Record, verdict string, reason gate.Reason, rule string) {
	t.Helper()
	if r.Verdict != verdict || r.Reason != reason || r.Rule != rule || r.Proto != gate.ProtoDNS {
		t.Errorf("record %+v, want %s %s by %q", r, verdict, reason, rule)
	}
}

func rcode(r *dns.Msg) string { return dns.RcodeToString[r.Rcode] }

func wantAddrs(t testing.TB, r *dns.Msg, want ...string) {
	t.Helper()
	got := addrsOf(r)
	if len(got) != len(want) {
		t.Fatalf("addresses %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != netip.MustParseAddr(want[i]) {
			t.Fatalf("addresses %v, want %v", got, want)
		}
	}
}

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ruleText(field string, i int, canonical string) string {
	return fmt.Sprintf("sandbox.%s[%d] %s", field, i, canonical)
}
