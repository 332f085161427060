package gate

import (
	"strings"
	"testing"
)

func TestCanonicalPath(t *testing.T) {
	tests := []struct {
		in, want, wantErr string
	}{
		{in: "", want: "/"},
		{in: "/", want: "/"},
		{in: "/papers/x", want: "/papers/x"},
		{in: "/papers/x/", want: "/papers/x/"},
		{in: "//papers///x", want: "/papers/x"},
		{in: "/papers/./x", want: "/papers/x"},
		{in: "/a/b/../../papers/x", want: "/papers/x"},
		{in: "/../../papers/x", want: "/papers/x"},
		{in: "/papers/x/..", want: "/papers/"},
		{in: "/papers/x/.", want: "/papers/x/"},
		{in: "/%2e%2e/papers/x", want: "/papers/x"},
		{in: "/other/%2E%2E/papers/x", want: "/papers/x"},
		{in: "/papers%2Fx", want: "/papers/x"},
		{in: "/papers%2fx", want: "/papers/x"},
		{in: "/papers\\x", want: "/papers/x"},
		{in: "/papers%5Cx", want: "/papers/x"},
		{in: "/p%61pers/x", want: "/papers/x"},
		{in: "/papers/x;jsessionid=1", want: "/papers/x;jsessionid=1"},
		{in: "/a b", wantErr: ""}, // a space is encoded on the way out
		{in: "/caf%c3%a9", want: "/caf%C3%A9"},
		{in: "/café", want: "/caf%C3%A9"},
		{in: "/%25", want: "/%25"},
		{in: "/%252e%252e/x", want: "/%252e%252e/x"}, // decoded once only
		{in: "/~user/a-b_c.d", want: "/~user/a-b_c.d"},
		{in: "/a:b@c!$&'()*+,;=", want: "/a:b@c!$&'()*+,;="},
		{in: "/a?b", want: "/a%3Fb"}, // a path never holds a query; an encoded one stays encoded

		{in: "papers/x", wantErr: "does not start with /"},
		{in: "/%zz", wantErr: "malformed percent escape"},
		{in: "/%2", wantErr: "malformed percent escape"},
		{in: "/a%00b", wantErr: "control character"},
		{in: "/a\nb", wantErr: "control character"},
		{in: "/" + strings.Repeat("a", MaxPathLen), wantErr: "longer than"},
	}
	for _, tt := range tests {
		got, err := CanonicalPath(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("CanonicalPath(%q) = %q, %v; want error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if tt.want == "" {
			if err != nil {
				t.Errorf("CanonicalPath(%q): %v", tt.in, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("CanonicalPath(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestURLRulePaths(t *testing.T) {
	p := mustCompile(t, Spec{Mode: Denylist, BlockedURLs: []Entry{
		{Value: "https://example.org/papers/lattice-qcd-2026", Field: "sandbox.blocked_urls[0]"},
		{Value: "http://Example.NET/Docs/", Field: "sandbox.blocked_urls[1]"},
	}})
	tests := []struct {
		host, path string
		blocked    bool
	}{
		{"example.org", "/papers/lattice-qcd-2026", true},
		{"example.org", "/papers/lattice-qcd-2026/", true},
		{"example.org", "/papers/lattice-qcd-2026/fig1.png", true},
		{"example.org", "/papers/lattice-qcd-2026;v=2", true},
		{"example.org", "/PAPERS/Lattice-QCD-2026", true},
		{"example.org", "//papers//lattice-qcd-2026", true},
		{"example.org", "/x/%2e%2e/papers/lattice-qcd-2026", true},
		{"example.org", "/papers%2Flattice-qcd-2026", true},
		{"example.org", "/papers;x/lattice-qcd-2026", true},
		{"www.example.org", "/papers/lattice-qcd-2026", true},
		{"example.org", "/papers/lattice-qcd-2026x", false},
		{"example.org", "/papers/lattice-qcd-202", false},
		{"example.org", "/papers/", false},
		{"example.org", "/", false},
		{"badexample.org", "/papers/lattice-qcd-2026", false},
		{"example.org.evil.net", "/papers/lattice-qcd-2026", false},
		{"example.net", "/docs", true},
		{"example.net", "/docs/a", true},
		{"example.net", "/docsx", false},
	}
	for _, tt := range tests {
		cp, err := CanonicalPath(tt.path)
		if err != nil {
			t.Fatalf("CanonicalPath(%q): %v", tt.path, err)
		}
		h, _ := CanonicalHost(tt.host)
		d := p.Request(h, cp)
		if tt.blocked {
			if d.Allow || d.Reason != ReasonURLBlocked || d.Rule == nil {
				t.Errorf("%s%s: got %s/%s, want deny/url_blocked", tt.host, tt.path, d.Verdict(), d.Reason)
			}
		} else if !d.Allow || d.Reason != ReasonNotBlocked {
			t.Errorf("%s%s: got %s/%s by %s, want allow/not_blocked", tt.host, tt.path, d.Verdict(), d.Reason, d.RuleText())
		}
	}
	if got := len(p.HTTPSRules()); got != 1 {
		t.Errorf("HTTPSRules: %d rules, want 1", got)
	}
	if !p.NeedsIntercept(Host{Name: "www.example.org"}) || p.NeedsIntercept(Host{Name: "example.com"}) {
		t.Errorf("NeedsIntercept wrong for www.example.org / example.com")
	}
}

func FuzzCanonicalPath(f *testing.F) {
	for _, s := range []string{"/", "/papers/x", "//a/../b", "/%2e%2e/x", "/a%2Fb", "/a\\b", "/%zz", "/caf%c3%a9;p=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := CanonicalPath(s)
		if err != nil {
			return
		}
		if !strings.HasPrefix(c, "/") || strings.Contains(c, "//") {
			t.Fatalf("CanonicalPath(%q) = %q: not canonical", s, c)
		}
		for _, seg := range strings.Split(c, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("CanonicalPath(%q) = %q: dot segment left", s, c)
			}
		}
		// What is sent upstream must canonicalise to itself, or a server
		// decoding once could see another path than the one checked.
		again, err := CanonicalPath(c)
		if err != nil || again != c {
			t.Fatalf("CanonicalPath(%q) = %q, but CanonicalPath(%q) = %q, %v", s, c, c, again, err)
		}
	})
}
