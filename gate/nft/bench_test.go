package nft

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"flowgate/gate"
	"flowgate/gate/netnsx"
	"flowgate/gate/nstest"
)

// reportQuantiles reports the median and 90th percentile of ds in ms.
func reportQuantiles(b *testing.B, ds []time.Duration) {
	slices.Sort(ds)
	q := func(f float64) float64 { return float64(ds[int(f*float64(len(ds)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.9), "p90-ms")
}

// BenchmarkCompileApply compiles a denylist policy and applies it into a
// fresh namespace (Apply reads the table back and compares); making and
// dropping the namespace is not timed.
func BenchmarkCompileApply(b *testing.B) {
	nstest.RequireRoot(b)
	p, err := gate.Compile(specs["denylist"])
	if err != nil {
		b.Fatal(err)
	}
	ds := make([]time.Duration, 0, b.N)
	for range b.N {
		b.StopTimer()
		ns := newAnonNS(b)
		b.StartTimer()
		start := time.Now()
		r, err := Compile(p, Params{Sandbox: "bench", UID: 1000})
		if err != nil {
			b.Fatal(err)
		}
		if err := Apply(ns, r); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
		b.StopTimer()
		ns.Close()
		b.StartTimer()
	}
	reportQuantiles(b, ds)
}

// BenchmarkLearnedAdd1000 adds 1,000 learned addresses (500 IPv4, 500
// IPv6) with timeouts in one update.
func BenchmarkLearnedAdd1000(b *testing.B) {
	nstest.RequireRoot(b)
	ns := newAnonNS(b)
	defer ns.Close()
	if err := Apply(ns, compile(b, specs["allowlist"], Params{Sandbox: "bench", UID: 1000})); err != nil {
		b.Fatal(err)
	}
	l, err := NewLearner(ns)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	// 16 batches of addresses, reused round robin: re-adding refreshes.
	batches := make([][]netip.Addr, 16)
	for i := range batches {
		for j := range 500 {
			n := i*500 + j
			batches[i] = append(batches[i],
				netip.AddrFrom4([4]byte{198, 18, byte(n >> 8), byte(n)}),
				netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(n >> 8), 15: byte(n)}))
		}
	}
	ds := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := l.Add(batches[i%len(batches)], time.Minute); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	reportQuantiles(b, ds)
}

// newAnonNS makes an unnamed network namespace; it goes away when the
// handle is closed.
func newAnonNS(tb testing.TB) netns.NsHandle {
	tb.Helper()
	h, err := netnsx.New()
	if err != nil {
		tb.Fatalf("making a netns: %v", err)
	}
	return h
}
