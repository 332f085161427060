package simnet

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/miekg/dns"
)

// fakeECH is an ECHConfigList as it appears in an ech= SvcParam. The
// bytes only have to survive the trip; nothing decrypts with them.
var fakeECH = []byte{
	0x00, 0x45, 0xfe, 0x0d, 0x00, 0x41, 0x2a, 0x00, 0x20, 0x00, 0x20, 0x5c, 0x1b, 0x3e, 0x9a, 0x01,
	0x77, 0x40, 0x0c, 0x8e, 0x61, 0x2f, 0x33, 0x91, 0xd2, 0x0b, 0x6a, 0xe4, 0x10, 0x3d, 0x58, 0xc7,
	0x0e, 0x25, 0x9f, 0x7b, 0x81, 0x14, 0x6d, 0x02, 0xaa, 0x4f, 0x3c, 0x00, 0x04, 0x00, 0x01, 0x00,
	0x01, 0x00, 0x12, 0x63, 0x6c, 0x6f, 0x75, 0x64, 0x66, 0x6c, 0x61, 0x72, 0x65, 0x2d, 0x65, 0x63,
	0x68, 0x2e, 0x63, 0x6f, 0x6d, 0x00, 0x00,
}

// authority answers for the simulated zones and counts what it is asked.
type authority struct {
	ttl atomic.Uint32

	mu      sync.Mutex
	queries map[string]map[uint16]int
}

func newAuthority(ttl uint32) *authority {
	a := &authority{queries: make(map[string]map[uint16]int)}
	a.ttl.Store(ttl)
	return a
}

func normName(s string) string { return strings.ToLower(strings.TrimSuffix(s, ".")) }

func (a *authority) count(name string, qtype uint16) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.queries[name]
	if m == nil {
		m = make(map[uint16]int)
		a.queries[name] = m
	}
	m[qtype]++
}

func (a *authority) get(name string, qtype uint16) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if qtype == 0 {
		n := 0
		for _, c := range a.queries[name] {
			n += c
		}
		return n
	}
	return a.queries[name][qtype]
}

// ServeDNS answers one query: A, AAAA, HTTPS, TXT, MX and CNAME chains
// for the sites, NXDOMAIN for unknown names, silence for BlackholeName.
// UDP answers are truncated to 512 bytes or the client's EDNS size.
func (a *authority) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	if len(r.Question) != 1 {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeFormatError)
		w.WriteMsg(m)
		return
	}
	q := r.Question[0]
	name := normName(q.Name)
	a.count(name, q.Qtype)
	if name == BlackholeName {
		return
	}
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	m.RecursionAvailable = true
	a.answer(m, q)
	size := dns.MinMsgSize
	if opt := r.IsEdns0(); opt != nil {
		size = max(int(opt.UDPSize()), dns.MinMsgSize)
		m.SetEdns0(4096, false)
	}
	if _, ok := w.RemoteAddr().(*net.UDPAddr); ok {
		m.Truncate(size)
	} else {
		m.Truncate(dns.MaxMsgSize)
	}
	w.WriteMsg(m)
}

func (a *authority) answer(m *dns.Msg, q dns.Question) {
	ttl := a.ttl.Load()
	chain, addrs, ok := lookup(normName(q.Name))
	if !ok {
		m.Rcode = dns.RcodeNameError
		return
	}
	hdr := func(name string, t uint16) dns.RR_Header {
		return dns.RR_Header{Name: dns.Fqdn(name), Rrtype: t, Class: dns.ClassINET, Ttl: ttl}
	}
	for i := 0; i+1 < len(chain); i++ {
		m.Answer = append(m.Answer, &dns.CNAME{Hdr: hdr(chain[i], dns.TypeCNAME), Target: dns.Fqdn(chain[i+1])})
	}
	if q.Qtype == dns.TypeCNAME && len(chain) > 1 {
		m.Answer = m.Answer[:1]
		return
	}
	final := chain[len(chain)-1]
	var v4, v6 []net.IP
	for _, ad := range addrs {
		if ad.Is4() {
			v4 = append(v4, ad.AsSlice())
		} else {
			v6 = append(v6, ad.AsSlice())
		}
	}
	switch q.Qtype {
	case dns.TypeA:
		for _, ip := range v4 {
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr(final, dns.TypeA), A: ip})
		}
	case dns.TypeAAAA:
		for _, ip := range v6 {
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr(final, dns.TypeAAAA), AAAA: ip})
		}
	case dns.TypeTXT:
		m.Answer = append(m.Answer, &dns.TXT{Hdr: hdr(final, dns.TypeTXT), Txt: []string{"simnet " + final}})
	case dns.TypeMX:
		if final == "example.com" {
			m.Answer = append(m.Answer, &dns.MX{Hdr: hdr(final, dns.TypeMX), Preference: 10, Mx: "mail.example.com."})
		}
	case dns.TypeHTTPS:
		rr := &dns.HTTPS{SVCB: dns.SVCB{Hdr: hdr(final, dns.TypeHTTPS), Priority: 1, Target: "."}}
		rr.Value = append(rr.Value, &dns.SVCBAlpn{Alpn: []string{"h2", "http/1.1"}})
		if len(v4) > 0 {
			rr.Value = append(rr.Value, &dns.SVCBIPv4Hint{Hint: v4})
		}
		if final == ECHName {
			rr.Value = append(rr.Value, &dns.SVCBECHConfig{ECH: fakeECH})
		}
		if len(v6) > 0 {
			rr.Value = append(rr.Value, &dns.SVCBIPv6Hint{Hint: v6})
		}
		m.Answer = append(m.Answer, rr)
	}
}
