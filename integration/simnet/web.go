package simnet

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Response headers the sites add, so that a test can see where a request
// really landed.
const (
	// HeaderAddr is the server address that took the connection.
	HeaderAddr = "X-Simnet-Addr"
	// HeaderRequestURI is the request target exactly as received.
	HeaderRequestURI = "X-Simnet-Request-Uri"
)

// web serves every site over HTTP and HTTPS and counts requests per name.
type web struct {
	certs map[*site]*tls.Certificate

	mu   sync.Mutex
	hits map[string]int
}

func (w *web) hit(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.hits[name]++
}

func (w *web) hitCount(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hits[name]
}

func localAddr(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// getCertificate picks the certificate by SNI, or by the address dialled
// when there is no SNI or it names no site. Any site's name is served on
// any address, as a CDN would: refusing fronting is flowgate's job, and a
// test must be able to see it happen if flowgate let it through.
func (w *web) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if s := siteOfName(normName(hello.ServerName)); s != nil {
		return w.certs[s], nil
	}
	if s := siteOfAddr(localAddr(hello.Conn.LocalAddr())); s != nil {
		return w.certs[s], nil
	}
	return nil, fmt.Errorf("simnet: no certificate for %q", hello.ServerName)
}

// ServeHTTP answers 200 with "simnet NAME PATH" for any path of a known
// site. NAME comes from the Host header, or from the address dialled when
// the Host is an address. The metadata addresses answer like IMDS. Every
// other site answers BulkPath+N with N bytes (see BulkPath).
func (w *web) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	local := netip.Addr{}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		local = localAddr(a)
	}
	rw.Header().Set(HeaderAddr, local.String())
	rw.Header().Set(HeaderRequestURI, r.RequestURI)
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = normName(strings.Trim(host, "[]"))
	s := siteOfName(host)
	if s == nil {
		if _, err := netip.ParseAddr(host); err == nil || host == "" {
			s = siteOfAddr(local)
			if s != nil {
				host = s.names[0]
			}
		}
	}
	if s == nil {
		http.Error(rw, fmt.Sprintf("simnet: no site %q", host), http.StatusNotFound)
		return
	}
	w.hit(host)
	if s.imds {
		serveIMDS(rw, r)
		return
	}
	if n, ok, err := bulkSize(r.URL.Path); ok {
		if err != nil {
			http.Error(rw, "simnet: "+err.Error(), http.StatusBadRequest)
			return
		}
		serveBulk(rw, n)
		return
	}
	rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(rw, "simnet %s %s\n", host, r.URL.EscapedPath())
}

// BulkPath is the path prefix of bulk downloads: BulkPath+"N" answers N
// bytes (decimal, at most MaxBulk) of application/octet-stream, for
// throughput benchmarks.
const BulkPath = "/bulk/"

// MaxBulk bounds a bulk download.
const MaxBulk = 1 << 30

// bulkSize reads the size of a bulk path: ok says the path is one, err
// that its size is not a decimal number from 0 to MaxBulk.
func bulkSize(path string) (n int64, ok bool, err error) {
	s, ok := strings.CutPrefix(path, BulkPath)
	if !ok {
		return 0, false, nil
	}
	n, err = strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > MaxBulk || strings.HasPrefix(s, "+") {
		return 0, true, fmt.Errorf("bulk size %.40q is not a number of bytes from 0 to %d", s, MaxBulk)
	}
	return n, true, nil
}

// bulkChunk is what a bulk answer is written from.
var bulkChunk = bytes.Repeat([]byte("simnet-bulk-0123456789abcdef\n"), 64<<10/29+1)[:64<<10]

// serveBulk writes n bytes from memory.
func serveBulk(rw http.ResponseWriter, n int64) {
	rw.Header().Set("Content-Type", "application/octet-stream")
	rw.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	for n > 0 {
		k := min(n, int64(len(bulkChunk)))
		if _, err := rw.Write(bulkChunk[:k]); err != nil {
			return
		}
		n -= k
	}
}

// serveIMDS answers a few AWS instance metadata paths. Its answers are
// recognisable ("simnet metadata ...") so a test can tell a leak.
func serveIMDS(rw http.ResponseWriter, r *http.Request) {
	rw.Header().Set("Content-Type", "text/plain")
	switch p := r.URL.Path; {
	case r.Method == http.MethodPut && p == "/latest/api/token":
		fmt.Fprint(rw, "simnet-metadata-token")
	case p == "/latest/meta-data/":
		fmt.Fprint(rw, "ami-id\ninstance-id\niam/\n")
	case p == "/latest/meta-data/instance-id":
		fmt.Fprint(rw, "i-0simnet")
	case strings.HasPrefix(p, "/latest/meta-data/iam/security-credentials/"):
		fmt.Fprint(rw, `{"Code":"Success","AccessKeyId":"ASIASIMNETLEAK","SecretAccessKey":"simnet metadata secret","Token":"simnet"}`)
	default:
		fmt.Fprintf(rw, "simnet metadata %s\n", r.URL.EscapedPath())
	}
}

// echoTCP echoes each connection back until EOF or a minute of silence.
// Closing l ends it; open connections are closed by the caller through
// conns.
func echoTCP(l net.Listener, conns *connSet) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		if !conns.add(c) {
			c.Close()
			return
		}
		go echoConn(c, conns)
	}
}

func echoConn(c net.Conn, conns *connSet) {
	defer conns.remove(c)
	defer c.Close()
	buf := make([]byte, 16<<10)
	for {
		c.SetDeadline(time.Now().Add(time.Minute))
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if tc, ok := c.(*net.TCPConn); ok {
					tc.CloseWrite()
				}
			}
			return
		}
	}
}

// echoUDP sends every datagram back to its sender until pc is closed.
func echoUDP(pc net.PacketConn) {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		pc.WriteTo(buf[:n], from)
	}
}

// connSet tracks open connections so Close can end them.
type connSet struct {
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func (s *connSet) add(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.conns == nil {
		s.conns = make(map[net.Conn]struct{})
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *connSet) remove(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.conns[c]; ok {
		delete(s.conns, c)
		s.wg.Done()
	}
}

// closeAll closes every tracked connection and waits for their handlers.
func (s *connSet) closeAll() {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}
