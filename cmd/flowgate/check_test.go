package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runFlowgate runs the command line in-process and returns its exit code
// and what it printed.
func runFlowgate(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	rootCmd.SetOut(&out)
	rootCmd.SetErr(&errb)
	t.Cleanup(func() { rootCmd.SetOut(nil); rootCmd.SetErr(nil) })
	code := run(args)
	return code, out.String(), errb.String()
}

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const denyPolicy = `network_mode: denylist
blocked_urls:
  - https://example.org/papers/x
blocked_hosts:
  - mirror.example.net
  - 198.51.100.0/24
`

func TestCheck(t *testing.T) {
	deny := writeFile(t, "deny.yaml", denyPolicy)
	allow := writeFile(t, "allow.yaml", "network_mode: allowlist\nallowed_hosts: [pypi.org, \"*.pythonhosted.org\", db, 10.0.0.0/8]\n")
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
	}{
		{"denylist", []string{"check", "--policy", deny,
			"https://example.org/papers/x/page.pdf", "https://example.org/papers/xy", "http://example.org/papers/xy", "HTTP://EXAMPLE.ORG/a/../papers/x",
			"cdn.mirror.example.net:443", "198.51.100.9", "169.254.169.254", "use-application-dns.net", "pypi.org"}, 1,
			`deny   https://example.org/papers/x/page.pdf  reason=url_blocked      rule=blocked_urls[0] https://example.org/papers/x
deny   https://example.org/papers/xy          reason=needs_intercept  rule=blocked_urls[0] https://example.org/papers/x
allow  http://example.org/papers/xy           reason=not_blocked      rule=default
deny   HTTP://EXAMPLE.ORG/a/../papers/x       reason=url_blocked      rule=blocked_urls[0] https://example.org/papers/x
deny   cdn.mirror.example.net:443             reason=host_blocked     rule=blocked_hosts[0] mirror.example.net
deny   198.51.100.9                           reason=cidr_blocked     rule=blocked_hosts[1] 198.51.100.0/24
deny   169.254.169.254                        reason=metadata         rule=builtin 169.254.0.0/16
deny   use-application-dns.net                reason=doh_canary       rule=default
allow  pypi.org                               reason=not_blocked      rule=default
`},
		{"all allowed", []string{"check", "--policy", allow, "files.pythonhosted.org", "db", "10.1.2.3", "https://pypi.org/simple/"}, 0,
			`allow  files.pythonhosted.org    reason=host_allowed     rule=allowed_hosts[1] *.pythonhosted.org
allow  db                        reason=service_allowed  rule=allowed_hosts[2] db
allow  10.1.2.3                  reason=cidr_allowed     rule=allowed_hosts[3] 10.0.0.0/8
allow  https://pypi.org/simple/  reason=host_allowed     rule=allowed_hosts[0] pypi.org
`},
		{"allowlist default", []string{"check", "--policy", allow, "example.com"}, 1,
			"deny   example.com  reason=not_allowed  rule=default\n"},
	}
	for _, tt := range tests {
		code, out, errOut := runFlowgate(t, tt.args...)
		if code != tt.code || out != tt.stdout || errOut != "" {
			t.Errorf("%s: exit %d (want %d)\nstdout:\n%s\nwant:\n%s\nstderr: %s", tt.name, code, tt.code, out, tt.stdout, errOut)
		}
	}
}

func TestCheckErrors(t *testing.T) {
	deny := writeFile(t, "deny.yaml", denyPolicy)
	bad := writeFile(t, "bad.yaml", "network_mode: denylist\nblocked_hosts: [\"https://x.com/\"]\n")
	tests := []struct {
		name           string
		args           []string
		stdout, stderr string
	}{
		{"bad policy", []string{"check", "--policy", bad, "example.com"}, "",
			"flowgate: " + bad + `:2: blocked_hosts[0]: "https://x.com/": a URL is not a host entry (write the host alone, or put the URL in blocked_urls)` + "\n"},
		{"missing policy file", []string{"check", "--policy", bad + ".missing", "example.com"}, "",
			"flowgate: " + bad + ".missing: no such file\n"},
		{"no --policy", []string{"check", "example.com"}, "", "flowgate: check: give the policy: --policy FILE\n"},
		{"no targets", []string{"check", "--policy", deny}, "", "flowgate: check: give at least one target (a host, host:port or URL)\n"},
		// Bad targets are reported; the good ones are still decided.
		{"bad targets", []string{"check", "--policy", deny, "pypi.org", "ftp://a.com/x", "bad_name.com", "a.com:99999"},
			"allow  pypi.org  reason=not_blocked  rule=default\n",
			`flowgate: check "ftp://a.com/x": target "ftp://a.com/x": scheme "ftp" is not http or https` + "\n" +
				`flowgate: check "bad_name.com": host "bad_name.com": not a valid host name: disallowed rune U+005F` + "\n" +
				`flowgate: check "a.com:99999": host "a.com:99999": bad port "99999" (want 1-65535)` + "\n"},
	}
	for _, tt := range tests {
		code, out, errOut := runFlowgate(t, tt.args...)
		if code != 2 || out != tt.stdout || errOut != tt.stderr {
			t.Errorf("%s: exit %d (want 2)\nstdout: %q\nwant:   %q\nstderr: %q\nwant:   %q", tt.name, code, out, tt.stdout, errOut, tt.stderr)
		}
	}
}

// TestAttachRefusesBadFlags: attach checks its flags before it opens a
// namespace or applies anything. (Flags keep their values between these
// in-process runs: each case sets all it relies on.)
func TestAttachRefusesBadFlags(t *testing.T) {
	pol := writeFile(t, "deny.yaml", denyPolicy)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--uid", "0", "--policy", pol}, "--uid 0"},
		{[]string{"--uid", "1000", "--policy", pol, "--log-max", "-1"}, "--log-max -1: want a size in bytes"},
	} {
		code, _, errs := runFlowgate(t, append([]string{"attach", "--netns", "/nonexistent/ns"}, c.args...)...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("attach %v: exit %d, stderr %q; want 2 and %q", c.args, code, errs, c.want)
		}
	}
}
