package simnet

import (
	"net/netip"
	"slices"
)

// Well-known service addresses of the simulated internet.
var (
	// Resolver and Resolver6 are the simulated DNS server, UDP and TCP.
	Resolver  = netip.MustParseAddrPort("192.0.2.53:53")
	Resolver6 = netip.MustParseAddrPort("[2001:db8::53]:53")
	// Echo and Echo6 echo TCP and UDP on port 7 (echo.example.net).
	Echo  = netip.MustParseAddrPort("203.0.113.7:7")
	Echo6 = netip.MustParseAddrPort("[2001:db8:2::7]:7")
	// Metadata and Metadata6 answer HTTP on port 80 like a cloud instance
	// metadata service (metadata.google.internal).
	Metadata  = netip.MustParseAddr("169.254.169.254")
	Metadata6 = netip.MustParseAddr("fd00:ec2::254")
)

// Names with special DNS behaviour.
const (
	// ECHName has an HTTPS record with an ech= SvcParam.
	ECHName = "example.com"
	// ManyName has ManyCount A records: its answer does not fit in 1232
	// bytes, so a UDP query gets a truncated answer and must retry on TCP.
	ManyName  = "many.example.net"
	ManyCount = 100
	// BlackholeName is never answered: queries for it time out.
	BlackholeName = "blackhole.example.net"
	// SharedA and SharedB are two names on one address, for fronting tests.
	SharedA = "shared-a.example.net"
	SharedB = "shared-b.example.net"
	// RebindName is an ordinary-looking name whose addresses are the
	// metadata server's.
	RebindName = "rebind.example.net"
)

// site is a group of names served from the same addresses with one
// certificate.
type site struct {
	names []string
	addrs []netip.Addr
	// imds marks the metadata server: it answers like AWS IMDS.
	imds bool
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

// siteTable is the one table of sites. Every site serves HTTP on 80 and
// HTTPS on 443 on each of its addresses.
var siteTable = []site{
	{names: []string{"example.com", "www.example.com"}, addrs: addrs("192.0.2.10", "2001:db8::10")},
	{names: []string{"api.example.com"}, addrs: addrs("192.0.2.12", "2001:db8::12")},
	{names: []string{"example.org"}, addrs: addrs("192.0.2.20", "2001:db8::20")},
	{names: []string{"badexample.com"}, addrs: addrs("192.0.2.30", "2001:db8::30")},
	{names: []string{"mirror.example.net"}, addrs: addrs("198.51.100.30", "2001:db8:1::30")},
	{names: []string{"pypi.org"}, addrs: addrs("198.51.100.40", "2001:db8:1::40")},
	{names: []string{"files.pythonhosted.org"}, addrs: addrs("198.51.100.41", "2001:db8:1::41")},
	{names: []string{"cdn.example.net"}, addrs: addrs("198.51.100.50", "2001:db8:1::50")},
	{names: []string{SharedA, SharedB}, addrs: addrs("203.0.113.50", "2001:db8:2::50")},
	{names: []string{"echo.example.net"}, addrs: addrs("203.0.113.7", "2001:db8:2::7")},
	// rebind.example.net is an ordinary-looking name on the metadata
	// address (DNS rebinding).
	{names: []string{"metadata.google.internal", RebindName}, addrs: []netip.Addr{Metadata, Metadata6}, imds: true},
}

// cnames are DNS-only aliases: static.example.com is a CDN-style alias
// outside its own domain, chain.example.org reaches an address through two
// CNAMEs.
var cnames = map[string]string{
	"static.example.com": "cdn.example.net",
	"chain.example.org":  "static.example.com",
}

// manyAddrs are ManyName's addresses: 203.0.113.100 and up.
func manyAddrs() []netip.Addr {
	out := make([]netip.Addr, ManyCount)
	a := netip.MustParseAddr("203.0.113.100")
	for i := range out {
		out[i] = a
		a = a.Next()
	}
	return out
}

// Sites returns the table of site names and their addresses (IPv4 first).
// The map is a fresh copy.
func Sites() map[string][]netip.Addr {
	m := make(map[string][]netip.Addr)
	for _, s := range siteTable {
		for _, n := range s.names {
			m[n] = slices.Clone(s.addrs)
		}
	}
	return m
}

// CNAMEs returns the DNS aliases the simulated resolver serves, alias to
// target. The map is a fresh copy.
func CNAMEs() map[string]string {
	m := make(map[string]string, len(cnames))
	for k, v := range cnames {
		m[k] = v
	}
	return m
}

// siteOfName returns the site serving name, or nil.
func siteOfName(name string) *site {
	for i := range siteTable {
		if slices.Contains(siteTable[i].names, name) {
			return &siteTable[i]
		}
	}
	return nil
}

// siteOfAddr returns the site on address a, or nil.
func siteOfAddr(a netip.Addr) *site {
	a = a.Unmap()
	for i := range siteTable {
		if slices.Contains(siteTable[i].addrs, a) {
			return &siteTable[i]
		}
	}
	return nil
}

// lookup returns the addresses of a name as the resolver answers it,
// following aliases, and the alias chain (the queried name first).
func lookup(name string) (chain []string, out []netip.Addr, ok bool) {
	chain = []string{name}
	for range 8 {
		if t, ok := cnames[name]; ok {
			name = t
			chain = append(chain, name)
			continue
		}
		break
	}
	if name == ManyName {
		return chain, manyAddrs(), true
	}
	if s := siteOfName(name); s != nil {
		return chain, s.addrs, true
	}
	return chain, nil, false
}
