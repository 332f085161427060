package sni

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"flowgate/gate"
	"flowgate/gate/netnsx"
)

// The benchmarks compare flowgate with a direct connection in the same run,
// over the namespace fixture: a client in S (root, in process) connects to
// 198.51.100.10 on port 443, which the fixture's nftables rule redirects to
// flowgate (spliced), or on port 8443, which goes straight to the same TLS
// server in P (direct).

const benchBytes = 32 << 20

type benchFixture struct {
	*nsFixture
	dial *netnsx.Dialer
	cfg  *tls.Config
}

func newBenchFixture(b *testing.B) *benchFixture {
	f := newNSFixture(b, spec(gate.Denylist, []string{"blocked.example.net"}))
	return &benchFixture{nsFixture: f, dial: &netnsx.Dialer{NS: f.S.Handle},
		cfg: &tls.Config{ServerName: "example.com", RootCAs: f.ca.Pool}}
}

// connect opens TCP and completes a TLS handshake, spliced or direct.
func (f *benchFixture) connect(spliced bool) (*tls.Conn, error) {
	if spliced {
		return f.connectTo("198.51.100.10:443")
	}
	return f.connectTo("198.51.100.10:8443")
}

// connectTo opens TCP to addr from inside S and completes a TLS handshake.
func (f *benchFixture) connectTo(addr string) (*tls.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := f.dial.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(c, f.cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// download fetches n bytes over a fresh TLS connection and returns the time
// the body took.
func (f *benchFixture) download(spliced bool, n int) (time.Duration, error) {
	tc, err := f.connect(spliced)
	if err != nil {
		return 0, err
	}
	defer tc.Close()
	tc.SetDeadline(time.Now().Add(60 * time.Second))
	fmt.Fprintf(tc, "GET /bulk?n=%d HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n", n)
	resp, err := http.ReadResponse(bufio.NewReaderSize(tc, 64<<10), nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	start := time.Now()
	got, err := io.Copy(io.Discard, resp.Body)
	el := time.Since(start)
	if err == nil && got != int64(n) {
		err = fmt.Errorf("got %d bytes, want %d", got, n)
	}
	return el, err
}

func mbps(n int, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e6 }

// BenchmarkDirectThroughput downloads over TLS straight from the server.
func BenchmarkDirectThroughput(b *testing.B) {
	f := newBenchFixture(b)
	b.SetBytes(benchBytes)
	b.ResetTimer()
	for range b.N {
		if _, err := f.download(false, benchBytes); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSpliceThroughput downloads over TLS through flowgate's
// transparent port, alternating with direct downloads in the same run, and
// reports the median rate of each and their ratio (target: spliced >= 90%
// of direct). Medians, because the machine is shared: one stalled sample
// must not decide the ratio.
func BenchmarkSpliceThroughput(b *testing.B) {
	f := newBenchFixture(b)
	var spliced, direct []float64
	b.ResetTimer()
	for range b.N {
		for _, sp := range []bool{true, false} {
			d, err := f.download(sp, benchBytes)
			if err != nil {
				b.Fatal(err)
			}
			if sp {
				spliced = append(spliced, mbps(benchBytes, d))
			} else {
				direct = append(direct, mbps(benchBytes, d))
			}
		}
	}
	b.StopTimer()
	f.checkDirect(b)
	f.rec.wait(b, "spliced tls record", func(r gate.Record) bool {
		return r.Proto == gate.ProtoTLS && r.Dest == "198.51.100.10:443" && r.Reason == gate.ReasonNotBlocked
	})
	s, d := median(spliced), median(direct)
	b.ReportMetric(s, "spliced-MB/s")
	b.ReportMetric(d, "direct-MB/s")
	b.ReportMetric(s/d, "ratio")
}

// BenchmarkConnectHandshake measures TCP connect plus TLS handshake
// through flowgate, direct, and through a bare splicing proxy (accept,
// original destination, dial, forward the first read, splice: no peek, no
// decision), alternating, and reports the p50 of each and the p50 added by
// flowgate (target: under 200 µs). The bare proxy's added p50 is the floor
// any splicing proxy pays on this machine; the difference is flowgate's own.
func BenchmarkConnectHandshake(b *testing.B) {
	f := newBenchFixture(b)
	f.startBareProxy(b)
	paths := []string{"198.51.100.10:443", "198.51.100.10:8443", "198.51.100.10:9443"}
	for range 20 { // warm up every path
		for _, p := range paths {
			if c, err := f.connectTo(p); err == nil {
				c.Close()
			}
		}
	}
	times := make([][]time.Duration, len(paths))
	b.ResetTimer()
	for range b.N {
		for i, p := range paths {
			start := time.Now()
			c, err := f.connectTo(p)
			el := time.Since(start)
			if err != nil {
				b.Fatal(err)
			}
			c.Close()
			times[i] = append(times[i], el)
		}
	}
	b.StopTimer()
	f.checkDirect(b)
	ps, pd, pb := p50(times[0]), p50(times[1]), p50(times[2])
	b.ReportMetric(float64(ps.Microseconds()), "spliced-p50-µs")
	b.ReportMetric(float64(pd.Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64((ps - pd).Microseconds()), "added-p50-µs")
	b.ReportMetric(float64((pb - pd).Microseconds()), "bare-proxy-added-p50-µs")
}

// bareProxyRuleset sends root's port-9443 connections to the bare proxy.
const bareProxyRuleset = `table inet sni_bench {
	chain out {
		type nat hook output priority -101; policy accept;
		meta mark != 0x1f1 ip daddr 198.51.100.0/24 tcp dport 9443 redirect to :15002
	}
}
`

// startBareProxy runs the reference proxy on 127.0.0.1:15002 in S. It
// dials the TLS server's direct port (8443) as soon as it accepts, like
// flowgate's early dial, and splices after forwarding the first read.
func (f *benchFixture) startBareProxy(b *testing.B) {
	nftIn(b, f.S, bareProxyRuleset)
	l, err := netnsx.Listen(f.S.Handle, "tcp4", "127.0.0.1:15002")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	d := &netnsx.Dialer{NS: f.S.Handle, Dialer: net.Dialer{Control: markSocket}}
	go bareProxyAccept(l, d)
}

func bareProxyAccept(l net.Listener, d *netnsx.Dialer) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go bareProxyConn(c.(*net.TCPConn), d)
	}
}

func bareProxyConn(c *net.TCPConn, d *netnsx.Dialer) {
	defer c.Close()
	if _, err := OriginalDst(c); err != nil {
		return
	}
	type res struct {
		c   net.Conn
		err error
	}
	upc := make(chan res, 1)
	go func() {
		up, err := d.DialContext(context.Background(), "tcp", "198.51.100.10:8443")
		upc <- res{up, err}
	}()
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	r := <-upc
	if r.err != nil {
		return
	}
	defer r.c.Close()
	if err != nil {
		return
	}
	r.c.Write(buf[:n])
	go io.Copy(r.c, c)
	io.Copy(c, r.c)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func p50(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// checkDirect fails the benchmark if the direct path went through flowgate,
// which would void the comparison.
func (f *benchFixture) checkDirect(b *testing.B) {
	for _, r := range f.rec.all() {
		if r.Dest == "198.51.100.10:8443" {
			b.Fatalf("the direct path was redirected: %+v", r)
		}
	}
}
