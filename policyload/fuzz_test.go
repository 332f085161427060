package policyload

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"flowgate/gate"
)

// Task files are written by task authors and downloaded with benchmarks:
// the loader must never panic on them, must name the file in every error,
// and must load the same bytes to the same task every time.

func FuzzLoadTaskMD(f *testing.F) {
	f.Add([]byte(fullMD))
	f.Add([]byte(md("sandbox:\n  network_mode: denylist\n  blocked_hosts: [example.com]\n")))
	f.Add([]byte(md("a: &x [1]\nb: *x\n")))
	f.Add([]byte("---\n---\n"))
	fuzzLoad(f, TaskMD, nil)
}

func FuzzLoadTaskTOML(f *testing.F) {
	f.Add([]byte(fullTOML))
	f.Add([]byte("[environment]\nnetwork_mode = \"allowlist\"\nallowed_hosts = [\"db\", \"10.0.0.0/8\"]\n"))
	f.Add([]byte("[[steps]]\nname = \"a\"\n[[steps]]\nname = \"b\"\n[steps.verifier]\nenv = { A = \"${B}\" }\n"))
	fuzzLoad(f, TaskTOML, map[string]string{InstructionMD: "Solve it.\n"})
}

func fuzzLoad(f *testing.F, name string, extra map[string]string) {
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 64<<10 {
			return // the size bound has its own test; keep iterations fast
		}
		dir := t.TempDir()
		for n, body := range extra {
			if err := os.WriteFile(filepath.Join(dir, n), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		task, err := LoadTask(dir)
		if err != nil {
			var fe *gate.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %T is not a *gate.FieldError: %v", err, err)
			}
			if !strings.Contains(err.Error(), dir) {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		out := RenderPolicy(task.Policy)
		if !strings.HasPrefix(out, "network_mode  ") {
			t.Fatalf("RenderPolicy: %q", out)
		}
		again, err := LoadTask(dir)
		if err != nil {
			t.Fatalf("loads once, then fails: %v", err)
		}
		if d := diffConfigs(&task.Config, &again.Config); d != nil {
			t.Fatalf("reload differs at %s: %s vs %s", d.path, d.a, d.b)
		}
		if RenderPolicy(again.Policy) != out || again.Prompt != task.Prompt || again.Name != task.Name ||
			!reflect.DeepEqual(again.EnvRefs, task.EnvRefs) || !reflect.DeepEqual(again.Spec, task.Spec) {
			t.Fatal("reload is not stable")
		}
		// Every rule names where it was written.
		for _, r := range task.Policy.Rules {
			if r.Field == "" || r.Canonical == "" {
				t.Fatalf("rule without field or canonical form: %+v", r)
			}
		}
	})
}
