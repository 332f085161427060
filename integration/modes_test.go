package integration

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"flowgate/gate"
)

// outcome is what an agent gets for one URL, in terms every client shows
// in its own way (see wantPython, wantCurl, wantGo).
type outcome int

const (
	reach     outcome = iota + 1 // 200 from the site
	refused                      // the kernel refused the connection (reset)
	nxdomain                     // the resolver answered NXDOMAIN
	noDNS                        // DNS itself was refused (no-network)
	forbidden                    // flowgate's explicit proxy answered 403
	proxyDown                    // nothing listens on the proxy port
)

func (o outcome) String() string {
	return [...]string{"?", "reach", "refused", "nxdomain", "noDNS", "forbidden", "proxyDown"}[o]
}

// expect is what one URL gives: the outcome, and for forbidden the reason
// code and rule the 403 names.
type expect struct {
	out    outcome
	reason gate.Reason
	rule   string
}

// modeCase is one policy with or without the proxy variables: what each
// of the four URLs gives, what the TCP and UDP echo give, what an IPv6
// fetch of pypi.org gives (without proxy only: curl -6 cannot reach the
// IPv4 proxy address), and the records a client's run over the URLs
// leaves: exactly these denials, and at least these allows (Dest "*"
// matches any destination).
type modeCase struct {
	name, policy string
	proxy        bool
	urls         map[string]expect
	echoTCP      bool // the TCP echo answers (else: refused)
	echoUDP      bool // the UDP echo answers (else: EPERM from send)
	ipv6         outcome
	denials      []rec
	allows       []rec
	echoAllows   []rec
}

// Rules as the policy files above compile them.
const (
	ruleDefault      = "default"
	ruleBlockExample = "blocked_hosts[0] example.com"
	ruleAllowPypi    = "allowed_hosts[0] pypi.org"
	ruleMetaName     = "builtin metadata.google.internal"
	ruleMeta4        = "builtin 169.254.0.0/16"
)

func metaPath(r rec) rec { r.Path = "/latest/meta-data/"; return r }

var (
	dnsAllowPypi = func(reason gate.Reason, rule string) rec {
		return allow(gate.ProtoDNS, resolver4, "pypi.org", reason, rule)
	}
	dnsDenyMeta  = deny(gate.ProtoDNS, "", "metadata.google.internal", gate.ReasonMetadata, ruleMetaName)
	httpDenyMeta = []rec{
		metaPath(deny(gate.ProtoHTTP, "", "169.254.169.254", gate.ReasonMetadata, ruleMeta4)),
		metaPath(deny(gate.ProtoHTTP, "", "metadata.google.internal", gate.ReasonMetadata, ruleMetaName)),
	}
	echoAllowed = []rec{
		allow(gate.ProtoTCP, echo4, "", gate.ReasonNotBlocked, ruleDefault),
		allow(gate.ProtoTCP, echo6, "", gate.ReasonNotBlocked, ruleDefault),
	}
)

func modeCases() []modeCase {
	all := func(e expect) map[string]expect {
		return map[string]expect{exampleURL: e, pypiURL: e, metaIPURL: e, metaNameURL: e}
	}
	metaForbidden := func(m map[string]expect) map[string]expect {
		m[metaIPURL] = expect{forbidden, gate.ReasonMetadata, ruleMeta4}
		m[metaNameURL] = expect{forbidden, gate.ReasonMetadata, ruleMetaName}
		return m
	}
	return []modeCase{
		{
			name: "public", policy: publicPolicy,
			urls:    map[string]expect{exampleURL: {out: reach}, pypiURL: {out: reach}, metaIPURL: {out: refused}, metaNameURL: {out: refused}},
			echoTCP: true, echoUDP: true, ipv6: reach,
		},
		{name: "public", policy: publicPolicy, proxy: true, urls: all(expect{out: proxyDown}), echoTCP: true, echoUDP: true},
		{
			name: "no-network", policy: noNetworkPolicy,
			urls: map[string]expect{exampleURL: {out: noDNS}, pypiURL: {out: noDNS}, metaIPURL: {out: refused}, metaNameURL: {out: noDNS}},
			ipv6: noDNS,
		},
		{name: "no-network", policy: noNetworkPolicy, proxy: true, urls: all(expect{out: proxyDown})},
		{
			name: "denylist", policy: denylistPolicy,
			urls:    map[string]expect{exampleURL: {out: nxdomain}, pypiURL: {out: reach}, metaIPURL: {out: refused}, metaNameURL: {out: nxdomain}},
			echoTCP: true, ipv6: reach,
			denials: []rec{deny(gate.ProtoDNS, "", "example.com", gate.ReasonHostBlocked, ruleBlockExample), dnsDenyMeta},
			allows: []rec{dnsAllowPypi(gate.ReasonNotBlocked, ruleDefault),
				allow(gate.ProtoTLS, pypi4+":443", "pypi.org", gate.ReasonNotBlocked, ruleDefault)},
			echoAllows: echoAllowed,
		},
		{
			name: "denylist", policy: denylistPolicy, proxy: true,
			urls:    metaForbidden(map[string]expect{exampleURL: {forbidden, gate.ReasonHostBlocked, ruleBlockExample}, pypiURL: {out: reach}}),
			echoTCP: true,
			denials: append([]rec{deny(gate.ProtoConnect, "", "example.com", gate.ReasonHostBlocked, ruleBlockExample)}, httpDenyMeta...),
			allows:  []rec{allow(gate.ProtoConnect, "*", "pypi.org", gate.ReasonNotBlocked, ruleDefault)},
			// The echo ignores the proxy variables: same as without.
			echoAllows: echoAllowed,
		},
		{
			name: "allowlist", policy: allowlistPolicy,
			urls:    map[string]expect{exampleURL: {out: nxdomain}, pypiURL: {out: reach}, metaIPURL: {out: refused}, metaNameURL: {out: nxdomain}},
			ipv6:    reach,
			denials: []rec{deny(gate.ProtoDNS, "", "example.com", gate.ReasonNotAllowed, ruleDefault), dnsDenyMeta},
			allows: []rec{dnsAllowPypi(gate.ReasonHostAllowed, ruleAllowPypi),
				allow(gate.ProtoTLS, pypi4+":443", "pypi.org", gate.ReasonHostAllowed, ruleAllowPypi)},
		},
		{
			name: "allowlist", policy: allowlistPolicy, proxy: true,
			urls:    metaForbidden(map[string]expect{exampleURL: {forbidden, gate.ReasonNotAllowed, ruleDefault}, pypiURL: {out: reach}}),
			denials: append([]rec{deny(gate.ProtoConnect, "", "example.com", gate.ReasonNotAllowed, ruleDefault)}, httpDenyMeta...),
			allows:  []rec{allow(gate.ProtoConnect, "*", "pypi.org", gate.ReasonHostAllowed, ruleAllowPypi)},
		},
	}
}

var urlOrder = []string{exampleURL, pypiURL, metaIPURL, metaNameURL}

// TestModes runs curl, Python's urllib and the Go client as the agent in
// each mode, with and without the proxy variables, and checks what each
// reaches, the exact error each shows, and the records flowgate wrote.
func TestModes(t *testing.T) {
	byMode := make(map[string][]modeCase)
	var names []string
	for _, c := range modeCases() {
		if _, ok := byMode[c.name]; !ok {
			names = append(names, c.name)
		}
		byMode[c.name] = append(byMode[c.name], c)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			inet := startInternet(t)
			s := newSandbox(t, inet)
			s.attach(loadPolicy(t, byMode[name][0].policy))
			for _, c := range byMode[name] {
				t.Run(proxyName(c.proxy), func(t *testing.T) { s.checkMode(t, c) })
			}
			// What the servers saw, whatever the clients said.
			if n := inet.Hits("metadata.google.internal"); n != 0 {
				t.Errorf("the metadata server answered %d requests, want none", n)
			}
			if n := inet.Hits("example.com"); (name == "public") != (n > 0) {
				t.Errorf("example.com served %d requests under %s", n, name)
			}
			if n := inet.Hits("pypi.org"); (name == "no-network") != (n == 0) {
				t.Errorf("pypi.org served %d requests under %s", n, name)
			}
			t.Run("other uid unfiltered", func(t *testing.T) {
				r := s.goClientAs(directUID, s.env(false), "get", exampleURL)
				if !r[0].OK || r[0].Status != 200 {
					t.Errorf("uid %d: %+v, want 200: flowgate's rules must match only the agent", directUID, r[0])
				}
			})
		})
	}
}

func proxyName(proxy bool) string {
	if proxy {
		return "with HTTPS_PROXY"
	}
	return "without proxy"
}

func (s *sandbox) checkMode(t *testing.T, c modeCase) {
	env := s.env(c.proxy)
	t.Run("python", func(t *testing.T) {
		mark := s.log.mark()
		got := s.python(env, urlOrder...)
		for _, u := range urlOrder {
			if want := wantPython(u, c.urls[u]); got[u] != want {
				t.Errorf("%s:\n got %s\nwant %s", u, got[u], want)
			}
		}
		s.wantRecords(t, mark, c)
	})
	t.Run("curl", func(t *testing.T) {
		mark := s.log.mark()
		for _, u := range urlOrder {
			got := s.curl(env, u)
			if err := checkCurl(got, u, c.urls[u]); err != nil {
				t.Errorf("curl %s: %v (got %+v)", u, err, got)
			}
		}
		s.wantRecords(t, mark, c)
	})
	t.Run("go", func(t *testing.T) {
		mark := s.log.mark()
		for i, r := range s.goClient(env, "get", urlOrder...) {
			if err := checkGo(r, urlOrder[i], c.urls[urlOrder[i]]); err != nil {
				t.Errorf("go %s: %v (got %+v)", urlOrder[i], err, r)
			}
		}
		s.wantRecords(t, mark, c)
	})
	t.Run("echo", func(t *testing.T) {
		mark := s.log.mark()
		for _, r := range s.goClient(env, "echo", echo4, echo6) {
			if c.echoTCP && !r.OK || !c.echoTCP && r.Kind != "refused" {
				t.Errorf("TCP echo %s: %+v, want answered=%v (else refused)", r.Target, r, c.echoTCP)
			}
		}
		for _, r := range s.goClient(env, "echo", "-udp", echo4, echo6) {
			if c.echoUDP && !r.OK || !c.echoUDP && r.Kind != "eperm" {
				t.Errorf("UDP echo %s: %+v, want answered=%v (else EPERM)", r.Target, r, c.echoUDP)
			}
		}
		s.wantDenials(t, mark)
		s.wantAllowed(t, mark, c.echoAllows...)
	})
	if c.ipv6 != 0 {
		t.Run("curl -6", func(t *testing.T) {
			mark := s.log.mark()
			got := s.curl(env, pypiURL, "-6")
			if err := checkCurl(got, pypiURL, expect{out: c.ipv6}); err != nil {
				t.Errorf("curl -6 %s: %v (got %+v)", pypiURL, err, got)
			}
			for _, a := range c.allows {
				if a.Proto == gate.ProtoTLS {
					a.Dest = "[" + pypi6 + "]:443"
					s.wantAllowed(t, mark, a)
				}
			}
			s.wantDenials(t, mark)
		})
	}
}

// wantRecords checks the records of one client's run over the four URLs.
func (s *sandbox) wantRecords(t *testing.T, mark int, c modeCase) {
	t.Helper()
	s.wantDenials(t, mark, c.denials...)
	s.wantAllowed(t, mark, c.allows...)
}

// wantPython is the line the net-probe loop prints after the URL.
func wantPython(u string, e expect) string {
	const un = "unreachable: URLError <urlopen error "
	switch e.out {
	case reach:
		return "reachable (HTTP 200)"
	case refused, proxyDown:
		return un + "[Errno 111] Connection refused>"
	case nxdomain:
		return un + "[Errno -2] Name or service not known>"
	case noDNS:
		return un + "[Errno -3] Temporary failure in name resolution>"
	case forbidden:
		if strings.HasPrefix(u, "http:") {
			// An http:// URL goes to the proxy as a request, not a tunnel:
			// the 403 is the answer.
			return "reachable (HTTP 403)"
		}
		return un + "Tunnel connection failed: 403 Forbidden>"
	}
	return "?"
}

// siteBody is what a simulated site answers for u.
func siteBody(u string) string {
	p, _ := url.Parse(u)
	return fmt.Sprintf("simnet %s %s\n", p.Hostname(), p.EscapedPath())
}

// refusalBody is flowgate's 403 body for u.
func refusalBody(u string, e expect) string {
	p, _ := url.Parse(u)
	return fmt.Sprintf("flowgate: %s%s denied (%s) by %s\n", p.Hostname(), p.EscapedPath(), e.reason, e.rule)
}

func checkCurl(got curlResult, u string, e expect) error {
	p, _ := url.Parse(u)
	port := "443"
	if p.Scheme == "http" {
		port = "80"
	}
	wantErr := func(exit int, prefix string) error {
		if got.exit != exit || !strings.HasPrefix(got.errMsg, prefix) {
			return fmt.Errorf("want exit %d and %q", exit, prefix)
		}
		return nil
	}
	switch e.out {
	case reach:
		if got.exit != 0 || got.status != 200 || got.body != siteBody(u) {
			return fmt.Errorf("want 200 %q", siteBody(u))
		}
		return nil
	case refused:
		return wantErr(7, fmt.Sprintf("curl: (7) Failed to connect to %s port %s", p.Hostname(), port))
	case proxyDown:
		return wantErr(7, "curl: (7) Failed to connect to 127.0.0.1 port 15080")
	case nxdomain, noDNS:
		return wantErr(6, "curl: (6) Could not resolve host: "+p.Hostname())
	case forbidden:
		if p.Scheme == "https" {
			return wantErr(56, "curl: (56) CONNECT tunnel failed, response 403")
		}
		if got.exit != 0 || got.status != 403 || got.body != refusalBody(u, e) {
			return fmt.Errorf("want 403 %q", refusalBody(u, e))
		}
		return nil
	}
	return fmt.Errorf("no expectation")
}

func checkGo(r result, u string, e expect) error {
	p, _ := url.Parse(u)
	switch e.out {
	case reach:
		if !r.OK || r.Status != 200 || r.Body != siteBody(u) {
			return fmt.Errorf("want 200 %q", siteBody(u))
		}
	case refused:
		if r.Kind != "refused" || strings.Contains(r.Err, "proxyconnect") {
			return fmt.Errorf("want a refused connection to the site")
		}
	case proxyDown:
		if r.Kind != "refused" || !strings.Contains(r.Err, "proxyconnect tcp: dial tcp 127.0.0.1:15080") {
			return fmt.Errorf("want a refused connection to the proxy")
		}
	case nxdomain:
		if r.Kind != "nxdomain" {
			return fmt.Errorf("want NXDOMAIN")
		}
	case noDNS:
		if r.Kind != "dns" || !strings.Contains(r.Err, "write: operation not permitted") {
			return fmt.Errorf("want the DNS query refused by the kernel (EPERM)")
		}
	case forbidden:
		if p.Scheme == "https" {
			if r.Kind != "proxy_status" || r.Status != 403 || r.Reason != string(e.reason) {
				return fmt.Errorf("want CONNECT refused with 403 and %s", e.reason)
			}
			return nil
		}
		if !r.OK || r.Status != 403 || r.Reason != string(e.reason) || r.Body != refusalBody(u, e) {
			return fmt.Errorf("want 403 %q with %s", refusalBody(u, e), e.reason)
		}
	}
	return nil
}
