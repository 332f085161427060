package policyload

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeLargePolicy writes a denylist policy file with n blocked_hosts.
func writeLargePolicy(tb testing.TB, n int) string {
	tb.Helper()
	var b strings.Builder
	b.WriteString("network_mode: denylist\nblocked_hosts:\n")
	for i := range n {
		if i%10 == 0 {
			fmt.Fprintf(&b, "  - \"*.site%d.example%d.com\"\n", i, i%97)
		} else {
			fmt.Fprintf(&b, "  - site%d.example%d.com\n", i, i%97)
		}
	}
	p := filepath.Join(tb.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		tb.Fatal(err)
	}
	return p
}

// BenchmarkLoadPolicy100k measures loading a policy file of 100,000
// blocked_hosts rules: reading, YAML, validation and compiling. The README
// quotes it.
func BenchmarkLoadPolicy100k(b *testing.B) {
	p := writeLargePolicy(b, 100_000)
	for b.Loop() {
		if _, err := LoadPolicyFile(p); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLoadLargePolicy checks that a 100,000-rule policy loads and matches,
// within a generous bound (the benchmark gives the figure).
func TestLoadLargePolicy(t *testing.T) {
	p := writeLargePolicy(t, 100_000)
	start := time.Now()
	pol, err := LoadPolicyFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("loading 100k rules took %v", d)
	}
	if got := pol.Hosts.Len(); got != 100_000 {
		t.Errorf("%d host rules, want 100000", got)
	}
	if d := pol.Name("www.site99999.example89.com"); d.Allow {
		t.Errorf("last rule does not match: %s", d.Reason)
	}
}
