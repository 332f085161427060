package dns

import (
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"flowgate/gate"

	"github.com/miekg/dns"
)

// The benchmarks ask the same question (example.com A, forwarded) from a
// client inside the sandbox namespace: once straight to simnet's resolver
// through the uplink, once through the proxy on 127.0.0.1, which forwards
// to the same resolver. Each reports ns/op and the p50 and p99 of single
// round trips; BenchmarkDNSAddedLatency interleaves both in one loop and
// reports the difference of the medians, the proxy's added latency.

// latencyClient is a connected UDP socket inside S that asks one question.
type latencyClient struct {
	c    net.Conn
	m    *dns.Msg
	buf  []byte
	id   uint16
	lats []time.Duration
}

func newLatencyClient(b *testing.B, e *env, addr string) *latencyClient {
	c := e.dial(b, "udp", addr)
	b.Cleanup(func() { c.Close() })
	m := new(dns.Msg)
	m.SetQuestion("example.com.", dns.TypeA)
	return &latencyClient{c: c, m: m, buf: make([]byte, 4096)}
}

// ask does one round trip and records its latency.
func (l *latencyClient) ask(b *testing.B) {
	l.id++
	l.m.Id = l.id
	raw, err := l.m.Pack()
	if err != nil {
		b.Fatal(err)
	}
	l.c.SetDeadline(time.Now().Add(3 * time.Second))
	start := time.Now()
	if _, err := l.c.Write(raw); err != nil {
		b.Fatal(err)
	}
	for {
		n, err := l.c.Read(l.buf)
		if err != nil {
			b.Fatalf("reading answer: %v", err)
		}
		if n >= 2 && uint16(l.buf[0])<<8|uint16(l.buf[1]) == l.id {
			if n < 12 || l.buf[3]&0xf != dns.RcodeSuccess {
				b.Fatalf("answer %x is not NOERROR", l.buf[:n])
			}
			break
		}
	}
	l.lats = append(l.lats, time.Since(start))
}

func percentile(lats []time.Duration, p float64) time.Duration {
	if len(lats) == 0 {
		return 0
	}
	s := slices.Clone(lats)
	slices.Sort(s)
	return s[min(int(float64(len(s))*p), len(s)-1)]
}

// benchEnv is newEnv with a recorder and push hook that cost nothing.
func benchEnv(b *testing.B, p *gate.Policy) *env {
	e := newEnv(b, p, func(c *Config) {
		c.Record = gate.RecorderFunc(func(gate.Record) {})
		c.Names = gate.NewNames(func([]netip.Addr, time.Duration) error { return nil })
	})
	return e
}

func warm(b *testing.B, l *latencyClient) {
	for range 200 {
		l.ask(b)
	}
	l.lats = l.lats[:0]
}

func BenchmarkDNSDirect(b *testing.B) {
	e := benchEnv(b, policy(b, gate.Denylist))
	l := newLatencyClient(b, e, e.up.Resolver.String())
	warm(b, l)
	b.ResetTimer()
	for range b.N {
		l.ask(b)
	}
	b.StopTimer()
	b.ReportMetric(float64(percentile(l.lats, 0.5).Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(percentile(l.lats, 0.99).Nanoseconds()), "p99-ns")
}

func BenchmarkDNSProxy(b *testing.B) {
	for _, c := range []struct {
		name string
		p    *gate.Policy
	}{
		{"denylist", policy(b, gate.Denylist, "mirror.example.net")},
		{"allowlist", policy(b, gate.Allowlist, "example.com")},
	} {
		b.Run(c.name, func(b *testing.B) {
			e := benchEnv(b, c.p)
			l := newLatencyClient(b, e, e.udp4)
			warm(b, l)
			b.ResetTimer()
			for range b.N {
				l.ask(b)
			}
			b.StopTimer()
			b.ReportMetric(float64(percentile(l.lats, 0.5).Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(percentile(l.lats, 0.99).Nanoseconds()), "p99-ns")
		})
	}
}

func BenchmarkDNSAddedLatency(b *testing.B) {
	e := benchEnv(b, policy(b, gate.Allowlist, "example.com"))
	direct := newLatencyClient(b, e, e.up.Resolver.String())
	proxied := newLatencyClient(b, e, e.udp4)
	warm(b, direct)
	warm(b, proxied)
	b.ResetTimer()
	for range b.N {
		direct.ask(b)
		proxied.ask(b)
	}
	b.StopTimer()
	d50, p50 := percentile(direct.lats, 0.5), percentile(proxied.lats, 0.5)
	b.ReportMetric(float64(d50.Nanoseconds()), "direct-p50-ns")
	b.ReportMetric(float64(p50.Nanoseconds()), "proxy-p50-ns")
	b.ReportMetric(float64((p50 - d50).Nanoseconds()), "added-p50-ns")
}
