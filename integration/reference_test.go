package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestReferenceProbe runs examples/net-probe.sh itself as the agent under
// the three policies of the reference page ("Network and secrets": the
// probe's output for t-public, t-no-network and t-denylist) and compares
// its output with the page's, line for line. As bench run does, the proxy
// variables are set under denylist only.
func TestReferenceProbe(t *testing.T) {
	const keys = "variables named like a key:"
	cases := []struct {
		name, policy string
		proxy        bool
		want         []string
	}{
		{"public", publicPolicy, false, []string{
			"https://example.com reachable (HTTP 200)",
			"https://pypi.org/simple/ reachable (HTTP 200)",
			keys,
		}},
		{"no-network", noNetworkPolicy, false, []string{
			"https://example.com unreachable: URLError <urlopen error [Errno -3] Temporary failure in name resolution>",
			"https://pypi.org/simple/ unreachable: URLError <urlopen error [Errno -3] Temporary failure in name resolution>",
			keys,
		}},
		{"denylist, blocking example.com", denylistPolicy, true, []string{
			"https://example.com unreachable: URLError <urlopen error Tunnel connection failed: 403 Forbidden>",
			"https://pypi.org/simple/ reachable (HTTP 200)",
			keys,
		}},
	}
	script := copyProbe(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			inet := startInternet(t)
			s := newSandbox(t, inet)
			s.attach(loadPolicy(t, c.policy))
			p := s.agent(s.env(c.proxy), "/bin/bash", script)
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(p.stdout), "\n") {
				got = append(got, strings.TrimRight(l, " "))
			}
			if p.code != 0 || !slices.Equal(got, c.want) {
				t.Errorf("net-probe.sh: %s\nwant:\n%s", p, strings.Join(c.want, "\n"))
			}
		})
	}
}

// copyProbe copies examples/net-probe.sh where the agent can read it.
func copyProbe(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../examples/net-probe.sh")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(testDir(t), "net-probe.sh")
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}
