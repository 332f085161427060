package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"flowgate/gate/nstest"
)

// TestRunRelativePaths runs the README's first command as a person would,
// from the folder holding the jobs: a relative task, script and jobs
// folder (the default "jobs").
func TestRunRelativePaths(t *testing.T) {
	nstest.RequireRoot(t)
	examples, err := filepath.Abs("../../examples")
	if err != nil {
		t.Fatal(err)
	}
	dir, state := t.TempDir(), t.TempDir()
	if err := os.Symlink(examples, filepath.Join(dir, "examples")); err != nil {
		t.Fatal(err)
	}
	checkCleanAtEnd(t, state, filepath.Join(dir, "jobs"))
	t.Chdir(dir)
	code, out, errOut := runBench(t, "run", "--simnet", "--state-dir", state, "--job", "rel",
		"examples/t-denylist/half-life", "-a", "script:examples/net-probe.sh")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	trials, _ := filepath.Glob(filepath.Join(dir, "jobs", "rel", "half-life__*", "agent", "script.txt"))
	if len(trials) != 1 {
		t.Fatalf("want one trial under ./jobs/rel, found %v", trials)
	}
	b, _ := os.ReadFile(trials[0])
	if !strings.Contains(string(b), "https://example.com unreachable: URLError <urlopen error Tunnel connection failed: 403 Forbidden>") {
		t.Fatalf("agent/script.txt:\n%s", b)
	}
}
