package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runBench runs the command line in-process and returns its exit code and
// what it printed.
func runBench(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	resetFlags(rootCmd)
	rootCmd.SetOut(&out)
	rootCmd.SetErr(&errb)
	t.Cleanup(func() { rootCmd.SetOut(nil); rootCmd.SetErr(nil) })
	code := run(args)
	return code, out.String(), errb.String()
}

func TestTaskCheckExamples(t *testing.T) {
	tests := []struct {
		dir  string
		want string
	}{
		{"t-public", `task  examples/half-life  (../../examples/t-public/half-life)
network_mode  public    the internet, except cloud metadata addresses
deny          metadata  cloud metadata services  builtin (8 address ranges, 4 names)
env refs: none
`},
		{"t-no-network", `task  examples/half-life  (../../examples/t-no-network/half-life)
network_mode  no-network  only the model, through the model proxy
deny          metadata    cloud metadata services  builtin (8 address ranges, 4 names)
env refs: none
`},
		{"t-denylist", `task  examples/half-life  (../../examples/t-denylist/half-life)
network_mode  denylist  the internet, minus the rules below
deny          host      example.com              sandbox.blocked_hosts[0]
deny          metadata  cloud metadata services  builtin (8 address ranges, 4 names)
env refs: none
`},
	}
	for _, tt := range tests {
		code, out, errOut := runBench(t, "task", "check", filepath.Join("..", "..", "examples", tt.dir, "half-life"))
		if code != 0 || out != tt.want || errOut != "" {
			t.Errorf("%s: exit %d\nstdout:\n%s\nwant:\n%s\nstderr: %s", tt.dir, code, out, tt.want, errOut)
		}
	}
}

func TestTaskCheckEnvRefs(t *testing.T) {
	dir := t.TempDir()
	body := "---\nsandbox:\n  env:\n    A: ${TOKEN}\n    B: ${HOME:-/root}\n    C: $${LITERAL}\n---\nGo.\n"
	if err := os.WriteFile(filepath.Join(dir, "task.md"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runBench(t, "task", "check", dir)
	want := "env refs: HOME, TOKEN (passed to the sandbox only with --allow-task-env NAME)\n"
	if code != 0 || !strings.HasSuffix(out, want) {
		t.Errorf("exit %d, stdout:\n%s\nwant it to end with %q", code, out, want)
	}
}

func TestTaskCheckErrors(t *testing.T) {
	bad := t.TempDir()
	body := "---\nschema_version: \"1.4\"\nsandbox:\n  network_mode: deny\n---\nGo.\n"
	if err := os.WriteFile(filepath.Join(bad, "task.md"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		stderr string
	}{
		{"bad task", []string{"task", "check", bad},
			"bench: " + filepath.Join(bad, "task.md") + `:4: sandbox.network_mode: "deny": unknown network_mode "deny"; valid: public, no-network, denylist, allowlist` + "\n"},
		{"missing path", []string{"task", "check"}, "bench: task check: give one task folder: bench task check PATH\n"},
		{"two paths", []string{"task", "check", bad, bad}, "bench: task check: give one task folder: bench task check PATH\n"},
		{"not a directory", []string{"task", "check", file}, "bench: " + file + ": not a directory (give the task's folder, the one holding task.md or task.toml)\n"},
		{"no such folder", []string{"task", "check", filepath.Join(bad, "nope")}, "bench: loading task: stat " + filepath.Join(bad, "nope") + ": no such file or directory\n"},
	}
	for _, tt := range tests {
		code, out, errOut := runBench(t, tt.args...)
		if code != 1 || out != "" || errOut != tt.stderr {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want 1, nothing, %q", tt.name, code, out, errOut, tt.stderr)
		}
	}
}
