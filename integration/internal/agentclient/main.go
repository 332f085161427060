// Command agentclient is the agent of the integration tests and
// benchmarks. The tests run it as uid 1000 inside a sandbox namespace (ip
// netns exec, setpriv), so that its traffic is the agent's and flowgate's
// rules apply to it, and read what it prints: one JSON line per try (see
// result), and for the timing modes a last "summary" line.
//
// It connects only where its arguments say; the tests point it at the
// simulated internet. It trusts the CA named by SSL_CERT_FILE (Go's
// system pool reads it) and resolves through the namespace's resolv.conf.
//
//	agentclient get [-noproxy] URL...
//		GET each URL, through HTTPS_PROXY/HTTP_PROXY unless -noproxy
//	agentclient tls -sni NAME [-host H] [-connect T] [-prefix HEX] ADDR:PORT...
//		TLS with SNI NAME (-sni "" sends none), then GET / with Host H;
//		with -connect, ADDR:PORT is a proxy and T the CONNECT target;
//		-prefix writes those bytes first (another TLS record, say)
//	agentclient raw -data BYTES ADDR:PORT...
//		BYTES (Go escapes: \r\n) there, half a kilobyte of answer back
//	agentclient http -host H[,H...] ADDR:PORT
//		plain HTTP/1.1, one request per Host, on one connection
//	agentclient dns [-tcp] [-server ADDR:PORT] [-type T] NAME...
//		one query each, with miekg/dns
//	agentclient lookup NAME...
//		the Go resolver (resolv.conf)
//	agentclient echo [-udp] ADDR:PORT...
//		a line there and back
//	agentclient bulk -n N URL
//		timed GETs on fresh connections, bodies discarded (throughput)
//	agentclient handshake -n N -sni NAME [-path P] ADDR:PORT
//		timed: connect, TLS handshake, GET P, answer, close
//	agentclient dnsbench -n N [-tcp] [-server ADDR:PORT] NAME
//		timed A queries
//	agentclient roundtrip -n N ADDR:PORT
//		timed round trips of a line on one connection to an echo server
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

// timeout bounds every try.
const timeout = 10 * time.Second

// result is one try. Fields that do not apply are left out.
type result struct {
	Mode   string `json:"mode"`
	Target string `json:"target,omitempty"`
	OK     bool   `json:"ok"`
	// Status is the HTTP status (of the CONNECT when Kind is
	// "proxy_status").
	Status int `json:"status,omitempty"`
	// Reason is the X-Flowgate-Reason header of an answer.
	Reason string `json:"reason,omitempty"`
	Body   string `json:"body,omitempty"`
	// Addr is the X-Simnet-Addr header: which server address answered.
	Addr    string   `json:"addr,omitempty"`
	Rcode   string   `json:"rcode,omitempty"`
	Answers []string `json:"answers,omitempty"`
	EDE     string   `json:"ede,omitempty"`
	// Kind classifies a failure: refused, reset, eperm, unreachable,
	// nxdomain, dns, timeout, tls_access_denied, proxy_status, eof, error.
	Kind  string `json:"kind,omitempty"`
	Err   string `json:"err,omitempty"`
	Bytes int64  `json:"bytes,omitempty"`
	Us    int64  `json:"us"`
	// ConnectUs and HandshakeUs are when, from the start of a tls try, the
	// TCP connect and the TLS handshake were done.
	ConnectUs   int64 `json:"connect_us,omitempty"`
	HandshakeUs int64 `json:"handshake_us,omitempty"`
	// HelloUs and ReplyUs are when the ClientHello was written and the
	// server's first bytes arrived: the span between them is where a
	// proxy's decision and both its crossings show.
	HelloUs int64 `json:"hello_us,omitempty"`
	ReplyUs int64 `json:"reply_us,omitempty"`

	// Summary lines only.
	N    int     `json:"n,omitempty"`
	P50  int64   `json:"p50_us,omitempty"`
	P90  int64   `json:"p90_us,omitempty"`
	P99  int64   `json:"p99_us,omitempty"`
	MBps float64 `json:"mbps,omitempty"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: agentclient get|tls|http|dns|lookup|echo|bulk|handshake|dnsbench [flags] TARGET...")
		os.Exit(2)
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	noProxy := fs.Bool("noproxy", false, "get: ignore the proxy variables")
	sni := fs.String("sni", "", "tls, handshake: server name to send (empty: none, verify the address)")
	connect := fs.String("connect", "", "tls: CONNECT to this host:port through the proxy at the target address first")
	hosts := fs.String("host", "", "http: Host header of each request, comma-separated; tls: the request's Host")
	server := fs.String("server", "192.0.2.53:53", "dns: the server to ask")
	tcp := fs.Bool("tcp", false, "dns, dnsbench: over TCP")
	udp := fs.Bool("udp", false, "echo: over UDP")
	qtype := fs.String("type", "A", "dns: query type")
	n := fs.Int("n", 1, "bulk, handshake, dnsbench: timed tries")
	warm := fs.Int("warmup", 3, "bulk, handshake, dnsbench: untimed tries first")
	path := fs.String("path", "/", "handshake: request path")
	prefix := fs.String("prefix", "", "tls: hex bytes written before the ClientHello (another TLS record, say)")
	data := fs.String("data", "", "raw: bytes to send, Go-quoted escapes allowed (\\r\\n)")
	fs.Parse(os.Args[2:])
	args := fs.Args()
	out := json.NewEncoder(os.Stdout)
	emit := func(r result) {
		if r.Mode == "" {
			r.Mode = mode
		}
		if err := out.Encode(r); err != nil {
			os.Exit(3)
		}
	}
	switch mode {
	case "get":
		cl := httpClient(!*noProxy, false)
		for _, u := range args {
			emit(timed(func() result { return get(cl, u) }))
		}
	case "tls":
		for _, a := range args {
			emit(timed(func() result { return tlsGet(a, *sni, *hosts, "/", *connect, *prefix) }))
		}
	case "http":
		for _, a := range args {
			for _, r := range plainHTTP(a, strings.Split(*hosts, ",")) {
				emit(r)
			}
		}
	case "dns":
		for _, name := range args {
			emit(timed(func() result { return query(*server, *tcp, name, *qtype) }))
		}
	case "lookup":
		for _, name := range args {
			emit(timed(func() result { return lookup(name) }))
		}
	case "raw":
		payload, err := strconv.Unquote(`"` + *data + `"`)
		if err != nil {
			fmt.Fprintln(os.Stderr, "raw: -data:", err)
			os.Exit(2)
		}
		for _, a := range args {
			emit(timed(func() result { return rawTry(a, payload) }))
		}
	case "echo":
		for _, a := range args {
			emit(timed(func() result { return echo(a, *udp) }))
		}
	case "bulk", "handshake", "dnsbench", "roundtrip":
		if len(args) != 1 {
			fmt.Fprintf(os.Stderr, "%s takes one target\n", mode)
			os.Exit(2)
		}
		try := benchTry(mode, args[0], *sni, *path, *server, *tcp)
		for range *warm {
			try()
		}
		var rs []result
		for range *n {
			r := timed(try)
			emit(r)
			rs = append(rs, r)
		}
		emit(summarise(rs))
	default:
		fmt.Fprintf(os.Stderr, "unknown mode %q\n", mode)
		os.Exit(2)
	}
}

// timed runs one try and stamps its duration.
func timed(try func() result) result {
	start := time.Now()
	r := try()
	r.Us = time.Since(start).Microseconds()
	return r
}

// fail fills a failed try.
func fail(r result, err error) result {
	r.OK = false
	r.Kind = kind(err)
	r.Err = err.Error()
	return r
}

// kind classifies an error by what the client saw.
func kind(err error) string {
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		if dnsErr.IsNotFound {
			return "nxdomain"
		}
		if dnsErr.IsTimeout {
			return "timeout"
		}
		return "dns"
	}
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return "eperm"
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return "unreachable"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case strings.Contains(err.Error(), "tls: access denied"):
		return "tls_access_denied"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	}
	return "error"
}

// connectAnswer is what the proxy answered to the last CONNECT, kept by
// OnProxyConnectResponse: net/http reports a refused CONNECT only by its
// status text.
type connectAnswer struct {
	status int
	reason string
}

var lastConnect connectAnswer

func httpClient(proxy, http1 bool) *http.Client {
	tr := &http.Transport{
		DialContext:       (&net.Dialer{Timeout: timeout}).DialContext,
		ForceAttemptHTTP2: !http1,
		DisableKeepAlives: true,
		OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
			lastConnect = connectAnswer{resp.StatusCode, resp.Header.Get("X-Flowgate-Reason")}
			return nil
		},
	}
	if http1 {
		tr.TLSClientConfig = &tls.Config{NextProtos: []string{"http/1.1"}}
	}
	if proxy {
		tr.Proxy = http.ProxyFromEnvironment
	}
	return &http.Client{Transport: tr, Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(cl *http.Client, u string) result {
	r := result{Target: u}
	lastConnect = connectAnswer{}
	resp, err := cl.Get(u)
	if err != nil {
		r = fail(r, err)
		if lastConnect.status != 0 && lastConnect.status != http.StatusOK {
			r.Kind, r.Status, r.Reason = "proxy_status", lastConnect.status, lastConnect.reason
		}
		return r
	}
	defer resp.Body.Close()
	return readResponse(r, resp)
}

// readResponse fills r from an answer; a body is kept up to 512 bytes.
func readResponse(r result, resp *http.Response) result {
	r.Status = resp.StatusCode
	r.Reason = resp.Header.Get("X-Flowgate-Reason")
	r.Addr = resp.Header.Get("X-Simnet-Addr")
	body, err := io.ReadAll(io.LimitReader(resp.Body, 512))
	r.Body = string(body)
	if err != nil {
		return fail(r, err)
	}
	r.OK = true
	return r
}

// prefixConn writes prefix before its first write.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Write(b []byte) (int, error) {
	if c.prefix != nil {
		p := c.prefix
		c.prefix = nil
		if _, err := c.Conn.Write(p); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(b)
}

// tlsGet opens TLS to addr with server name sni (none when empty: the
// address is then verified against the certificate's IP addresses) and
// sends one GET, with Host hostHeader if given. With connect, addr is an
// HTTP proxy, and the TLS runs in a tunnel to connect. prefixHex, when
// set, is written before the ClientHello.
func tlsGet(addr, sni, hostHeader, path, connect, prefixHex string) result {
	r := result{Target: addr}
	target := addr
	if connect != "" {
		r.Target = connect + " via " + addr
		target = connect
	}
	ap, err := netip.ParseAddrPort(target)
	if sni == "" && err != nil {
		return fail(r, fmt.Errorf("no SNI needs an IP target: %w", err))
	}
	conf := &tls.Config{ServerName: sni, NextProtos: []string{"http/1.1"}}
	host := sni
	if sni == "" {
		// Go sends no SNI for an IP literal and verifies the IP instead.
		conf.ServerName = ap.Addr().String()
		host = ap.Addr().String()
	}
	start := time.Now()
	raw, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return fail(r, err)
	}
	r.ConnectUs = time.Since(start).Microseconds()
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(timeout))
	var tunnel net.Conn = raw
	if connect != "" {
		if tunnel, err = connectTunnel(raw, connect, &r); err != nil {
			r = fail(r, err)
			if r.Status != 0 {
				r.Kind = "proxy_status"
			}
			return r
		}
	}
	if prefixHex != "" {
		p, err := hex.DecodeString(prefixHex)
		if err != nil {
			return fail(r, err)
		}
		tunnel = &prefixConn{Conn: tunnel, prefix: p}
	}
	sc := &stampConn{Conn: tunnel, start: start}
	c := tls.Client(sc, conf)
	if err := c.Handshake(); err != nil {
		return fail(r, err)
	}
	r.HandshakeUs = time.Since(start).Microseconds()
	r.HelloUs, r.ReplyUs = sc.wrote, sc.read
	if hostHeader != "" {
		host = hostHeader
	}
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return fail(r, err)
	}
	defer resp.Body.Close()
	return readResponse(r, resp)
}

// connectTunnel asks the proxy on raw for a tunnel to target. On a refusal
// r gets the status and reason, and the error says so.
func connectTunnel(raw net.Conn, target string, r *result) (net.Conn, error) {
	fmt.Fprintf(raw, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(raw)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		r.Status, r.Reason = resp.StatusCode, resp.Header.Get("X-Flowgate-Reason")
		return nil, fmt.Errorf("proxy answered %s", resp.Status)
	}
	if br.Buffered() > 0 {
		return nil, errors.New("proxy sent bytes after its answer")
	}
	return raw, nil
}

// plainHTTP sends one request per host on one connection to addr, each
// after the previous answer, and returns one result per request.
func plainHTTP(addr string, hosts []string) []result {
	var out []result
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return []result{fail(result{Target: addr}, err)}
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	br := bufio.NewReader(c)
	for _, h := range hosts {
		r := result{Target: h + "@" + addr}
		if _, err := fmt.Fprintf(c, "GET /hello HTTP/1.1\r\nHost: %s\r\n\r\n", h); err != nil {
			out = append(out, fail(r, err))
			break
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			out = append(out, fail(r, err))
			break
		}
		r = readResponse(r, resp)
		resp.Body.Close()
		r.Us = time.Since(start).Microseconds()
		out = append(out, r)
		if !r.OK || resp.Close {
			break
		}
	}
	return out
}

// query asks server for name directly with miekg/dns.
func query(server string, tcp bool, name, qtype string) result {
	r := result{Target: name + " " + qtype}
	t, ok := dns.StringToType[strings.ToUpper(qtype)]
	if !ok {
		return fail(r, fmt.Errorf("unknown query type %q", qtype))
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), t)
	m.SetEdns0(1232, false)
	cl := &dns.Client{Timeout: timeout}
	if tcp {
		cl.Net = "tcp"
	}
	resp, _, err := cl.Exchange(m, server)
	if err != nil {
		return fail(r, err)
	}
	r.OK = true
	r.Rcode = dns.RcodeToString[resp.Rcode]
	for _, rr := range resp.Answer {
		switch v := rr.(type) {
		case *dns.A:
			r.Answers = append(r.Answers, v.A.String())
		case *dns.AAAA:
			r.Answers = append(r.Answers, v.AAAA.String())
		case *dns.CNAME:
			r.Answers = append(r.Answers, "CNAME "+strings.TrimSuffix(v.Target, "."))
		}
	}
	if opt := resp.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok {
				r.EDE = fmt.Sprintf("%d %s", e.InfoCode, e.ExtraText)
			}
		}
	}
	return r
}

// lookup resolves name through resolv.conf, as an ordinary program would.
func lookup(name string) result {
	r := result{Target: name}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", name)
	if err != nil {
		return fail(r, err)
	}
	for _, a := range addrs {
		r.Answers = append(r.Answers, a.Unmap().String())
	}
	slices.Sort(r.Answers)
	r.OK = true
	return r
}

// rawTry sends payload to addr, half-closes, and returns what came back
// (up to 512 bytes) as Body.
func rawTry(addr, payload string) result {
	r := result{Target: addr}
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return fail(r, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, payload); err != nil {
		return fail(r, err)
	}
	b, err := io.ReadAll(io.LimitReader(c, 512))
	r.Body = string(b)
	if err != nil && len(b) == 0 {
		return fail(r, err)
	}
	r.OK = len(b) > 0
	return r
}

// echo sends a line to addr and reads it back.
func echo(addr string, udp bool) result {
	r := result{Target: addr}
	network := "tcp"
	if udp {
		network = "udp"
	}
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return fail(r, err)
	}
	defer c.Close()
	// A UDP refusal shows as an error of the write or the read; give the
	// read a shorter wait, since a lost datagram is never answered.
	c.SetDeadline(time.Now().Add(3 * time.Second))
	const line = "flowgate agent echo\n"
	if _, err := io.WriteString(c, line); err != nil {
		return fail(r, err)
	}
	buf := make([]byte, len(line))
	if _, err := io.ReadFull(c, buf); err != nil {
		return fail(r, err)
	}
	r.Body = string(buf)
	r.OK = r.Body == line
	if !r.OK {
		r.Kind, r.Err = "error", "echo mismatch"
	}
	return r
}

// stampConn notes, in µs from start, when its first write returned and
// when its first read returned data.
type stampConn struct {
	net.Conn
	start       time.Time
	wrote, read int64
}

func (c *stampConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if c.wrote == 0 {
		c.wrote = time.Since(c.start).Microseconds()
	}
	return n, err
}

func (c *stampConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.read == 0 && n > 0 {
		c.read = time.Since(c.start).Microseconds()
	}
	return n, err
}
