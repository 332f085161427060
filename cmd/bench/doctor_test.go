package main

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"flowgate/gate"
	"flowgate/gate/nstest"
	"flowgate/runtime"
)

// TestDoctor runs bench doctor on this host: every host check passes and
// each mode's row shows exactly what that mode lets an agent reach on the
// simulated internet; nothing of it is left afterwards.
func TestDoctor(t *testing.T) {
	nstest.RequireRoot(t)
	state := t.TempDir()
	before := simnetBefore()
	code, out, errOut := runBench(t, "doctor", "--state-dir", state)
	if code != 0 {
		t.Fatalf("bench doctor exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, check := range []string{"root", "nftables", `owner match \(meta skuid\)`, "IPv6 filtering", "cgroup v2 socket match"} {
		if !regexp.MustCompile(`(?m)^  ` + check + ` +ok$`).MatchString(out) {
			t.Errorf("host check %q not ok:\n%s", check, out)
		}
	}
	rows := map[string][]string{
		"public":     {"HTTP 200", "HTTP 200", "refused: connection refused", "HTTP 200"},
		"no-network": {"refused: name not resolved", "refused: name not resolved", "refused: connection refused", "HTTP 200"},
		"denylist":   {"refused: proxy 403", "HTTP 200", "refused: connection refused", "HTTP 200"},
		"allowlist":  {"refused: proxy 403", "HTTP 200", "refused: connection refused", "HTTP 200"},
	}
	for mode, cells := range rows {
		re := regexp.MustCompile(`(?m)^  ` + mode + ` +` + strings.Join(quoteAll(cells), ` +`) + ` *$`)
		if !re.MatchString(out) {
			t.Errorf("mode %s: want row %q in:\n%s", mode, cells, out)
		}
	}
	if strings.Contains(out, "WRONG") || !strings.Contains(out, "all modes hold on this host") {
		t.Errorf("doctor did not conclude that all modes hold:\n%s", out)
	}
	assertClean(t, state, before)
}

func quoteAll(l []string) []string {
	out := make([]string, len(l))
	for i, s := range l {
		out[i] = regexp.QuoteMeta(s)
	}
	return out
}

// TestDoctorReportsWrongCells feeds the table a mode that let the agent
// reach what it must not: the cell is marked and the check fails.
func TestDoctorReportsWrongCells(t *testing.T) {
	var b strings.Builder
	checks := []runtime.ModeCheck{
		{Mode: gate.Denylist, Reached: []bool{true, true, false, true}, Detail: []string{"HTTP 200", "HTTP 200", "refused: x", "HTTP 200"}},
		{Mode: gate.NoNetwork, Err: errors.New("sandbox failed")},
	}
	if printModes(&b, checks) {
		t.Fatal("printModes passed a mode that reached a blocked host")
	}
	for _, want := range []string{"HTTP 200 (WRONG)", "denylist: example.com should be refused", "no-network: sandbox failed"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
}
