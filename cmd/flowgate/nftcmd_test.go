package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"flowgate/gate/nft"
	"flowgate/gate/nstest"
	"flowgate/policyload"
)

// nftCLI runs flowgate in-process and returns its exit code, standard
// output and standard error.
func nftCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	rootCmd.SetOut(&out)
	rootCmd.SetErr(&errb)
	defer func() {
		rootCmd.SetOut(nil)
		rootCmd.SetErr(nil)
	}()
	code := run(args)
	return code, out.String(), errb.String()
}

const nftDenyPolicy = `network_mode: denylist
blocked_hosts:
  - mirror.example.net
  - 198.51.100.0/24
  - 2001:db8:bad::/48
`

func nftWritePolicy(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// nftExpected is what the rules command must print: the library's
// ruleset for the same inputs.
func nftExpected(t *testing.T, policyPath string, params nft.Params) *nft.Ruleset {
	t.Helper()
	p, err := policyload.LoadPolicyFile(policyPath)
	if err != nil {
		t.Fatal(err)
	}
	r, err := nft.Compile(p, params)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRulesCommand(t *testing.T) {
	path := nftWritePolicy(t, nftDenyPolicy)
	code, out, errs := nftCLI(t, "rules", "--policy", path, "--uid", "1000", "--sandbox", "bf-1a2b", "--model-port", "4000")
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	if want := nftExpected(t, path, nft.Params{Sandbox: "bf-1a2b", UID: 1000, ModelPort: 4000}).Text(); out != want {
		t.Errorf("output:\n%s\nwant\n%s", out, want)
	}
	for _, w := range []string{
		"elements = { 198.51.100.0/24 }",
		`meta skuid 1000 counter packets 0 bytes 0 jump agent comment "flowgate bf-1a2b: filter the agent's uid"`,
		"udp dport 53 counter packets 0 bytes 0 redirect to :15353",
		"model proxy :4000",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
	// Flags do not stick between runs: the default sandbox name is back.
	code, out, _ = nftCLI(t, "rules", "--policy", path, "--uid", "1000")
	if code != 0 || !strings.Contains(out, `comment "flowgate flowgate: filter the agent's uid"`) || strings.Contains(out, "model proxy") {
		t.Errorf("second run: exit %d\n%s", code, out)
	}
}

func TestRulesCommandBadInput(t *testing.T) {
	path := nftWritePolicy(t, nftDenyPolicy)
	bad := nftWritePolicy(t, "network_mode: blocklist\n")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"rules", "--uid", "1000"}, "give the policy: --policy FILE"},
		{[]string{"rules", "--policy", path}, "--uid 0: give the agent's uid"},
		{[]string{"rules", "--policy", path, "--uid", "-5"}, "--uid -5: give the agent's uid"},
		{[]string{"rules", "--policy", path, "--uid", "4294967295"}, "--uid 4294967295"},
		{[]string{"rules", "--policy", path, "--uid", "1000", "--sandbox", "Bad_Name"}, `sandbox name "Bad_Name" has character 'B'`},
		{[]string{"rules", "--policy", path, "--uid", "1000", "--cgroup", "/"}, "names the root cgroup"},
		{[]string{"rules", "--policy", filepath.Join(t.TempDir(), "missing.yaml"), "--uid", "1000"}, "no such file"},
		{[]string{"rules", "--policy", bad, "--uid", "1000"}, "blocklist"},
		{[]string{"rules", "--policy", path, "--uid", "1000", "extra"}, `rules takes no arguments, got ["extra"]`},
	}
	for _, tc := range cases {
		code, out, errs := nftCLI(t, tc.args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", tc.args, code, errs)
		}
		if out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: stdout %q, stderr %q; want stderr with %q", tc.args, out, errs, tc.want)
		}
	}
}

func TestAuditCommand(t *testing.T) {
	nstest.RequireRoot(t)
	ns := nstest.New(t, "fgaudcmd")
	path := nftWritePolicy(t, nftDenyPolicy)
	audit := []string{"audit", "--netns", ns.Path, "--policy", path, "--uid", "1000", "--sandbox", "bf-1a2b"}

	// No table yet: a difference.
	code, out, errs := nftCLI(t, audit...)
	if code != 1 || out != "missing in table inet flowgate: table inet flowgate\n" || !strings.Contains(errs, "differs from the policy in 1 places") {
		t.Fatalf("before apply: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	r := nftExpected(t, path, nft.Params{Sandbox: "bf-1a2b", UID: 1000})
	if err := nft.Apply(ns.Handle, r); err != nil {
		t.Fatal(err)
	}
	code, out, errs = nftCLI(t, audit...)
	if code != 0 || out != "table inet flowgate matches the policy\n" || errs != "" {
		t.Fatalf("after apply: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	// Another uid's policy differs.
	other := append(append([]string(nil), audit[:len(audit)-4]...), "--uid", "1001", "--sandbox", "bf-1a2b")
	if code, out, _ := nftCLI(t, other...); code != 1 || !strings.Contains(out, "meta skuid 1001") {
		t.Errorf("uid 1001: exit %d\n%s", code, out)
	}
	// A rule deleted by hand with the nft command.
	comment := "flowgate bf-1a2b: refuse cloud metadata (IPv4)"
	list, err := exec.Command("ip", "netns", "exec", ns.Name, "nft", "-a", "list", "chain", "inet", "flowgate", "agent").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, list)
	}
	handle := ""
	sc := bufio.NewScanner(bytes.NewReader(list))
	for sc.Scan() {
		if line := sc.Text(); strings.Contains(line, `"`+comment+`"`) {
			handle = line[strings.LastIndex(line, " ")+1:]
		}
	}
	if handle == "" {
		t.Fatalf("no rule %q:\n%s", comment, list)
	}
	if b, err := exec.Command("ip", "netns", "exec", ns.Name, "nft", "delete", "rule", "inet", "flowgate", "agent", "handle", handle).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	code, out, errs = nftCLI(t, audit...)
	want := `missing in chain agent: ip daddr @meta4 counter packets 0 bytes 0 jump refuse comment "` + comment + "\"\n"
	if code != 1 || out != want || !strings.Contains(errs, "flowgate: audit: table inet flowgate differs from the policy in 1 places") {
		t.Errorf("after deleting a rule: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if err := nft.Remove(ns.Handle); err != nil {
		t.Fatal(err)
	}
	// Bad input.
	for _, args := range [][]string{
		{"audit", "--policy", path, "--uid", "1000"},
		{"audit", "--netns", filepath.Join(t.TempDir(), "none"), "--policy", path, "--uid", "1000"},
		{"audit", "--netns", ns.Path, "--pid", "1", "--policy", path, "--uid", "1000"},
		{"audit", "--netns", ns.Path, "--uid", "1000"},
	} {
		if code, out, errs := nftCLI(t, args...); code != 2 || out != "" || errs == "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 with an error", args, code, out, errs)
		}
	}
}
