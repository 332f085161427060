package policyload

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"flowgate/gate"
)

// writeTask makes a task folder holding files (name -> content).
func writeTask(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "my-task")
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// md wraps front matter into a task.md with a prompt.
func md(front string) string { return "---\n" + front + "---\nSolve it.\n" }

// mustLoad loads a task folder and fails the test on error.
func mustLoad(t *testing.T, files map[string]string) *Task {
	t.Helper()
	task, err := LoadTask(writeTask(t, files))
	if err != nil {
		t.Fatalf("LoadTask: %v", err)
	}
	return task
}

// wantFieldErr checks that err is a *gate.FieldError with these parts. An
// empty want string is not checked, except field, which must match
// exactly; msg and fix are substrings.
type wantErr struct {
	file  string // base name of File
	line  int
	field string
	value string
	msg   string
	fix   string
}

func checkFieldErr(t *testing.T, err error, w wantErr) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %+v", w)
	}
	var fe *gate.FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("error %T %q is not a *gate.FieldError", err, err)
	}
	if w.file != "" && filepath.Base(fe.File) != w.file {
		t.Errorf("File = %q, want base %q (error %q)", fe.File, w.file, err)
	}
	if w.line != 0 && fe.Line != w.line {
		t.Errorf("Line = %d, want %d (error %q)", fe.Line, w.line, err)
	}
	if fe.Field != w.field {
		t.Errorf("Field = %q, want %q (error %q)", fe.Field, w.field, err)
	}
	if w.value != "" && fe.Value != w.value {
		t.Errorf("Value = %q, want %q (error %q)", fe.Value, w.value, err)
	}
	if !strings.Contains(fe.Msg, w.msg) {
		t.Errorf("Msg = %q, want it to contain %q", fe.Msg, w.msg)
	}
	if !strings.Contains(fe.Fix, w.fix) {
		t.Errorf("Fix = %q, want it to contain %q", fe.Fix, w.fix)
	}
	// The text a person reads names all of it.
	s := err.Error()
	for _, part := range []string{w.file, w.field, w.value, w.fix} {
		if !strings.Contains(s, part) {
			t.Errorf("error text %q does not name %q", s, part)
		}
	}
}
