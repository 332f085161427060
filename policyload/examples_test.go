package policyload

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"flowgate/gate"
)

// TestExamples loads every task folder under examples/ and checks the three
// copies of the half-life task: their modes, what each lets the agent
// reach, and the scripts they ship.
func TestExamples(t *testing.T) {
	dirs, err := filepath.Glob("../examples/*/*/task.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 3 {
		t.Fatalf("found %d example tasks, want at least 3", len(dirs))
	}
	for _, f := range dirs {
		if _, err := LoadTask(filepath.Dir(f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}

	tests := []struct {
		dir     string
		mode    gate.Mode
		example gate.Reason // https://example.com
		pypi    gate.Reason // https://pypi.org/simple/
	}{
		{"t-public", gate.Public, gate.ReasonPublic, gate.ReasonPublic},
		{"t-no-network", gate.NoNetwork, gate.ReasonNoNetwork, gate.ReasonNoNetwork},
		{"t-denylist", gate.Denylist, gate.ReasonHostBlocked, gate.ReasonNotBlocked},
	}
	for _, tt := range tests {
		t.Run(tt.dir, func(t *testing.T) {
			dir := filepath.Join("..", "examples", tt.dir, "half-life")
			task, err := LoadTask(dir)
			if err != nil {
				t.Fatal(err)
			}
			if task.Name != "examples/half-life" || task.Policy.Mode != tt.mode || task.Config.Sandbox.Workdir != "/app" {
				t.Errorf("name %q mode %v workdir %q", task.Name, task.Policy.Mode, task.Config.Sandbox.Workdir)
			}
			if !strings.Contains(task.Prompt, "/app/answer.txt") {
				t.Errorf("prompt does not say where the answer goes: %q", task.Prompt)
			}
			for target, want := range map[string]gate.Reason{"https://example.com": tt.example, "https://pypi.org/simple/": tt.pypi} {
				d, err := task.Policy.Target(target)
				if err != nil || d.Reason != want {
					t.Errorf("%s: %+v %v, want reason %s", target, d, err, want)
				}
			}
			for _, script := range []string{"verifier/test.sh", "oracle/solve.sh"} {
				st, err := os.Stat(filepath.Join(dir, script))
				if err != nil || st.Mode()&0o111 == 0 {
					t.Errorf("%s: missing or not executable (%v)", script, err)
				}
			}
		})
	}
	probe, err := os.ReadFile("../examples/net-probe.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"#!/bin/bash\n", `"https://example.com", "https://pypi.org/simple/"`, "variables named like a key:"} {
		if !strings.Contains(string(probe), s) {
			t.Errorf("net-probe.sh lacks %q", s)
		}
	}
}
