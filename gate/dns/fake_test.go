package dns

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"flowgate/gate"

	"github.com/miekg/dns"
)

// fakeECH is an ech= value for the fake resolver's HTTPS records.
var fakeECH = []byte{0x00, 0x08, 0xfe, 0x0d, 0x00, 0x04, 0x01, 0x02, 0x03, 0x04}

// fakeResolver is an upstream in memory: Dial returns one end of a pipe
// whose other end answers from fakeAnswer. UDP is a pipe whose writes are
// whole datagrams; TCP uses the 2-byte length framing.
type fakeResolver struct {
	mu      sync.Mutex
	queries []dns.Question
	wg      sync.WaitGroup
}

func (f *fakeResolver) dial(_ context.Context, network, _ string) (net.Conn, error) {
	a, b := net.Pipe()
	f.wg.Go(func() { f.serve(b, network == "tcp") })
	return a, nil
}

func (f *fakeResolver) asked(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, q := range f.queries {
		if norm(q.Name) == name {
			n++
		}
	}
	return n
}

func (f *fakeResolver) serve(c net.Conn, tcp bool) {
	defer c.Close()
	buf := make([]byte, dns.MaxMsgSize)
	for {
		var msg []byte
		if tcp {
			var hdr [2]byte
			if _, err := io.ReadFull(c, hdr[:]); err != nil {
				return
			}
			msg = buf[:binary.BigEndian.Uint16(hdr[:])]
			if _, err := io.ReadFull(c, msg); err != nil {
				return
			}
		} else {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			msg = buf[:n]
		}
		q := new(dns.Msg)
		if q.Unpack(msg) != nil || len(q.Question) != 1 {
			continue
		}
		f.mu.Lock()
		f.queries = append(f.queries, q.Question[0])
		f.mu.Unlock()
		r := fakeAnswer(q)
		if !tcp {
			size := dns.MinMsgSize
			if o := q.IsEdns0(); o != nil {
				size = int(o.UDPSize())
			}
			r.Truncate(size)
		}
		out, err := r.Pack()
		if err != nil {
			continue
		}
		if tcp {
			out = append(binary.BigEndian.AppendUint16(nil, uint16(len(out))), out...)
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// fakeAnswer knows a few names under .test:
//
//	cname.test     CNAME target.test, A 192.0.2.1 (TTL 60 and 600)
//	outside.test   CNAME blocked.test, A 192.0.2.66
//	ech.test       HTTPS with ech and mandatory=ech,alpn
//	big.test       120 A records (needs TCP)
//	meta.test      A 169.254.169.254 (rebinding)
//	stray.test     A 192.0.2.7 plus an A for unrelated.test
//	long.test      A 192.0.2.8 with a TTL of ten days
//	nx.test        NXDOMAIN
//	anything else  A 192.0.2.1, AAAA 2001:db8::1, TXT, TTL 5
func fakeAnswer(q *dns.Msg) *dns.Msg {
	r := new(dns.Msg)
	r.SetReply(q)
	r.RecursionAvailable = true
	qq := q.Question[0]
	name := norm(qq.Name)
	hdr := func(owner string, t uint16, ttl uint32) dns.RR_Header {
		return dns.RR_Header{Name: dns.Fqdn(owner), Rrtype: t, Class: dns.ClassINET, Ttl: ttl}
	}
	a := func(owner, addr string, ttl uint32) dns.RR {
		return &dns.A{Hdr: hdr(owner, dns.TypeA, ttl), A: net.ParseIP(addr)}
	}
	switch name {
	case "cname.test":
		r.Answer = append(r.Answer, &dns.CNAME{Hdr: hdr(name, dns.TypeCNAME, 600), Target: "target.test."})
		if qq.Qtype == dns.TypeA {
			r.Answer = append(r.Answer, a("target.test", "192.0.2.1", 60))
		}
	case "outside.test":
		r.Answer = append(r.Answer, &dns.CNAME{Hdr: hdr(name, dns.TypeCNAME, 600), Target: "blocked.test."},
			a("blocked.test", "192.0.2.66", 60))
	case "ech.test":
		h := &dns.HTTPS{SVCB: dns.SVCB{Hdr: hdr(name, dns.TypeHTTPS, 300), Priority: 1, Target: "."}}
		h.Value = []dns.SVCBKeyValue{
			&dns.SVCBMandatory{Code: []dns.SVCBKey{dns.SVCB_ALPN, dns.SVCB_ECHCONFIG}},
			&dns.SVCBAlpn{Alpn: []string{"h2"}},
			&dns.SVCBECHConfig{ECH: fakeECH},
		}
		r.Answer = append(r.Answer, h)
		s := &dns.SVCB{Hdr: hdr("_dns.ech.test", dns.TypeSVCB, 300), Priority: 1, Target: "."}
		s.Value = []dns.SVCBKeyValue{&dns.SVCBECHConfig{ECH: fakeECH}}
		r.Extra = append(r.Extra, s, a("glue.test", "192.0.2.99", 300))
	case "big.test":
		for i := range 120 {
			r.Answer = append(r.Answer, a(name, fmt.Sprintf("198.51.100.%d", i+1), 300))
		}
	case "meta.test":
		r.Answer = append(r.Answer, a(name, "169.254.169.254", 300))
	case "stray.test":
		r.Answer = append(r.Answer, a(name, "192.0.2.7", 300), a("unrelated.test", "192.0.2.77", 300))
	case "long.test":
		r.Answer = append(r.Answer, a(name, "192.0.2.8", 864000))
	case "nx.test":
		r.Rcode = dns.RcodeNameError
	default:
		switch qq.Qtype {
		case dns.TypeA:
			r.Answer = append(r.Answer, a(name, "192.0.2.1", 5))
		case dns.TypeAAAA:
			r.Answer = append(r.Answer, &dns.AAAA{Hdr: hdr(name, dns.TypeAAAA, 5), AAAA: net.ParseIP("2001:db8::1")})
		case dns.TypeTXT:
			r.Answer = append(r.Answer, &dns.TXT{Hdr: hdr(name, dns.TypeTXT, 5), Txt: []string{"fake " + name}})
		}
	}
	if o := q.IsEdns0(); o != nil {
		r.SetEdns0(4096, o.Do())
	}
	return r
}

// recorder keeps records for assertions.
type recorder struct {
	mu   sync.Mutex
	recs []gate.Record
}

func (r *recorder) Record(rec gate.Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
}

func (r *recorder) all() []gate.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.recs)
}

// last returns the newest record, failing the test if there is none.
func (r *recorder) last(t testing.TB) gate.Record {
	t.Helper()
	recs := r.all()
	if len(recs) == 0 {
		t.Fatal("no record written")
	}
	return recs[len(recs)-1]
}

// pushEvent is one call of the Names push hook.
type pushEvent struct {
	seq   int64
	addrs []netip.Addr
	ttl   time.Duration
	done  int64 // seq when the hook returned
}

// pushLog is a Names push hook that logs calls in a global sequence and
// can be made slow or failing.
type pushLog struct {
	mu     sync.Mutex
	seq    *seqCounter
	events []pushEvent
	delay  time.Duration
	err    error
}

type seqCounter struct {
	mu sync.Mutex
	n  int64
}

func (s *seqCounter) next() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return s.n
}

func (p *pushLog) push(addrs []netip.Addr, ttl time.Duration) error {
	start := p.seq.next()
	p.mu.Lock()
	delay, err := p.delay, p.err
	p.mu.Unlock()
	time.Sleep(delay)
	if err != nil {
		return err
	}
	ev := pushEvent{seq: start, addrs: slices.Clone(addrs), ttl: ttl, done: p.seq.next()}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, ev)
	return nil
}

// pushed returns the push events that included a.
func (p *pushLog) pushed(a netip.Addr) []pushEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []pushEvent
	for _, ev := range p.events {
		if slices.Contains(ev.addrs, a) {
			out = append(out, ev)
		}
	}
	return out
}

// unit is a server on the fake resolver, for tests that need no kernel.
type unit struct {
	srv   *Server
	fake  *fakeResolver
	names *gate.Names
	rec   *recorder
	push  *pushLog
}

// policy compiles a test policy: hosts go to allowed_hosts or
// blocked_hosts depending on the mode.
func policy(t testing.TB, mode gate.Mode, hosts ...string) *gate.Policy {
	t.Helper()
	spec := gate.Spec{Mode: mode}
	for i, h := range hosts {
		if mode == gate.Allowlist {
			spec.AllowedHosts = append(spec.AllowedHosts, gate.Entry{Value: h, Field: fmt.Sprintf("sandbox.allowed_hosts[%d]", i)})
		} else {
			spec.BlockedHosts = append(spec.BlockedHosts, gate.Entry{Value: h, Field: fmt.Sprintf("sandbox.blocked_hosts[%d]", i)})
		}
	}
	p, err := gate.Compile(spec)
	if err != nil {
		t.Fatalf("compiling policy: %v", err)
	}
	return p
}

func newUnit(t testing.TB, p *gate.Policy, tweak func(*Config)) *unit {
	t.Helper()
	u := &unit{fake: &fakeResolver{}, rec: &recorder{}, push: &pushLog{seq: &seqCounter{}}}
	u.names = gate.NewNames(u.push.push)
	cfg := Config{
		Policy:    p,
		Names:     u.names,
		Upstreams: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")},
		Dial:      u.fake.dial,
		Record:    u.rec,
		Sandbox:   "unit",
		UID:       1000,
		Timeout:   2 * time.Second,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	u.srv = srv
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		u.fake.wg.Wait()
	})
	return u
}

// ask packs a query, runs it through the handler and unpacks the reply.
func (u *unit) ask(t testing.TB, name string, qtype uint16, edns, tcp bool) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if edns {
		m.SetEdns0(4096, false)
	}
	raw, err := m.Pack()
	if err != nil {
		t.Fatalf("packing query: %v", err)
	}
	out := u.srv.handle(context.Background(), raw, tcp)
	if out == nil {
		t.Fatalf("no reply to %s %s", name, dns.Type(qtype))
	}
	r := new(dns.Msg)
	if err := r.Unpack(out); err != nil {
		t.Fatalf("unpacking reply: %v", err)
	}
	if r.Id != m.Id {
		t.Errorf("reply ID %d, want the client's %d", r.Id, m.Id)
	}
	return r
}

// edeOf returns the extended error of a reply, or nil.
func edeOf(r *dns.Msg) *dns.EDNS0_EDE {
	if o := r.IsEdns0(); o != nil {
		for _, opt := range o.Option {
			if e, ok := opt.(*dns.EDNS0_EDE); ok {
				return e
			}
		}
	}
	return nil
}

func addrsOf(r *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range r.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			a, _ := netip.AddrFromSlice(rr.A.To4())
			out = append(out, a)
		case *dns.AAAA:
			a, _ := netip.AddrFromSlice(rr.AAAA)
			out = append(out, a)
		}
	}
	return out
}

// handle is serve returning the bytes to send back, or nil to send
// nothing; the record is written when it returns.
func (s *Server) handle(ctx context.Context, raw []byte, tcp bool) []byte {
	var out []byte
	s.serve(ctx, raw, tcp, func(b []byte) { out = b })
	return out
}
