package runtime

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// TestCreateFailsHalfway makes Create fail after each step and checks that
// nothing it made is left.
func TestCreateFailsHalfway(t *testing.T) {
	e := newEnv(t)
	for _, step := range []string{"files", "netns", "link", "rules", "cgroup"} {
		t.Run(step, func(t *testing.T) {
			injected := errors.New("injected failure")
			testHookCreate = func(s string) error {
				if s == step {
					return injected
				}
				return nil
			}
			defer func() { testHookCreate = nil }()
			name := randName("rtf")
			sb, err := e.local.Create(context.Background(), Spec{Name: name, LogsDir: e.logsDir(t)})
			if sb != nil {
				sb.Close()
				t.Fatalf("Create succeeded despite the injected failure")
			}
			if !errors.Is(err, injected) {
				t.Fatalf("Create error = %v, want the injected failure", err)
			}
			e.assertGone(t, &state{Name: name})
			if e.tableInH(t) {
				t.Errorf("table inet %s left in H", HostTable)
			}
		})
	}
}

// TestBadInput: every bad spec is refused before anything is made.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	logs := e.logsDir(t)
	notDir := filepath.Join(logs, "file")
	os.WriteFile(notDir, nil, 0o644)
	cases := []struct {
		name string
		spec Spec
		loc  func(*Local)
		want string
	}{
		{"empty name", Spec{LogsDir: logs}, nil, "sandbox name is empty"},
		{"upper case", Spec{Name: "Trial-1", LogsDir: logs}, nil, "use only a-z"},
		{"slash", Spec{Name: "a/b", LogsDir: logs}, nil, "use only a-z"},
		{"leading dash", Spec{Name: "-a", LogsDir: logs}, nil, "starting and ending"},
		{"too long", Spec{Name: strings.Repeat("a", 21), LogsDir: logs}, nil, "the limit is 20"},
		{"root user", Spec{Name: randName("rtx"), LogsDir: logs, AgentUser: "root"}, nil, "may not be root"},
		{"bad user", Spec{Name: randName("rtx"), LogsDir: logs, AgentUser: "a:b"}, nil, "sandbox user"},
		{"relative workdir", Spec{Name: randName("rtx"), LogsDir: logs, Workdir: "app"}, nil, "clean absolute path"},
		{"workdir in tmp", Spec{Name: randName("rtx"), LogsDir: logs, Workdir: "/tmp/app"}, nil, "lies under /tmp"},
		{"workdir is usr", Spec{Name: randName("rtx"), LogsDir: logs, Workdir: "/usr"}, nil, "system directory"},
		{"workdir dotdot", Spec{Name: randName("rtx"), LogsDir: logs, Workdir: "/app/../etc"}, nil, "clean absolute path"},
		{"no logs", Spec{Name: randName("rtx")}, nil, "logs dir is empty"},
		{"missing logs", Spec{Name: randName("rtx"), LogsDir: filepath.Join(logs, "nope")}, nil, "no such file"},
		{"logs not a dir", Spec{Name: randName("rtx"), LogsDir: notDir}, nil, "not a directory"},
		{"loopback dns", Spec{Name: randName("rtx"), LogsDir: logs}, func(l *Local) { l.DNS = []netip.Addr{netip.MustParseAddr("127.0.0.53")} }, "--dns"},
		{"state dir with comma", Spec{Name: randName("rtx"), LogsDir: logs}, func(l *Local) { l.StateDir = "/tmp/a,b" }, "overlay mount options"},
		{"state dir is var", Spec{Name: randName("rtx"), LogsDir: logs}, func(l *Local) { l.StateDir = "/var" }, "system directory"},
		{"bad pool", Spec{Name: randName("rtx"), LogsDir: logs}, func(l *Local) { l.Pool = Pool{V4: netip.MustParsePrefix("10.0.0.1/24")} }, "host bits"},
		{"missing uplink", Spec{Name: randName("rtx"), LogsDir: logs}, func(l *Local) { l.Uplink = "/run/netns/fgrt-no-such-ns" }, "uplink netns"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := *e.local
			if c.loc != nil {
				c.loc(&l)
			}
			sb, err := l.Create(context.Background(), c.spec)
			if sb != nil {
				sb.Close()
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Create error = %v, want one containing %q", err, c.want)
			}
			if c.spec.Name != "" {
				e.assertGone(t, &state{Name: c.spec.Name})
			}
		})
	}
	if e.tableInH(t) {
		t.Errorf("table inet %s left in H", HostTable)
	}
}

// TestNameTakenAndPoolExhausted: a second sandbox of the same name, or
// one more than the pool holds, is refused and leaves the first intact.
func TestNameTakenAndPoolExhausted(t *testing.T) {
	e := newEnv(t)
	e.local.Pool = Pool{V4: netip.MustParsePrefix("10.209.200.0/30"), V6: netip.MustParsePrefix("fd66:6c67:77c8::/64")}
	sb := e.create(t, Spec{})
	_, err := e.local.Create(context.Background(), Spec{Name: sb.Name(), LogsDir: e.logsDir(t)})
	if err == nil || !strings.Contains(err.Error(), "the name is taken") {
		t.Fatalf("second Create of %s: %v", sb.Name(), err)
	}
	other := randName("rtp")
	_, err = e.local.Create(context.Background(), Spec{Name: other, LogsDir: e.logsDir(t)})
	if err == nil || !strings.Contains(err.Error(), "address pool exhausted") {
		t.Fatalf("Create beyond the pool: %v", err)
	}
	e.assertGone(t, &state{Name: other})
	if out := mustRun(t, sb, Agent, "curl", "-sS", "--max-time", "20", "http://example.com/still"); out != "simnet example.com /still\n" {
		t.Errorf("the first sandbox after the refusals: %q", out)
	}
}

// TestStateDirUnderVar puts the state directory where production has it,
// under an overlaid system directory, and checks that no phase sees it.
func TestStateDirUnderVar(t *testing.T) {
	e := newEnv(t)
	dir, err := os.MkdirTemp("/var/lib", "fgrt-state-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	hidden, err := os.MkdirTemp("/var/lib", "fgrt-hide-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(hidden) })
	os.WriteFile(filepath.Join(hidden, "answer"), []byte("42"), 0o644)
	e.local.StateDir = dir
	sb := e.create(t, Spec{Hide: []string{hidden}})
	for _, as := range []Owner{Root, Agent} {
		out := mustRun(t, sb, as, "sh", "-c", "ls -A "+dir+"; echo --; ls -A "+hidden+"; echo --; test -d /var/lib/dpkg && echo dpkg")
		if out != "--\n--\ndpkg\n" {
			t.Errorf("as %v the hidden dirs show:\n%s", as, out)
		}
	}
}

// TestCloseDuringRun: Close ends a running phase and removes the sandbox.
func TestCloseDuringRun(t *testing.T) {
	e := newEnv(t)
	sb, err := e.local.Create(context.Background(), Spec{Name: randName("rtc"), LogsDir: e.logsDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := sb.Run(context.Background(), Process{Argv: []string{"sleep", "1000"}, As: Agent})
		done <- err
	}()
	time.Sleep(500 * time.Millisecond)
	if _, err := sb.Run(context.Background(), Process{Argv: []string{"true"}, As: Agent}); err == nil || !strings.Contains(err.Error(), "one Run, WriteFile or CopyIn at a time") {
		t.Errorf("a second concurrent Run: %v", err)
	}
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "closed") {
			t.Errorf("Run ended by Close: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not end after Close")
	}
	if err := sb.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := sb.Run(context.Background(), Process{Argv: []string{"true"}, As: Agent}); err == nil {
		t.Errorf("Run after Close succeeded")
	}
	e.assertGone(t, sb.st)
	if sb.NetNS() != netns.None() {
		t.Errorf("the netns handle is still open after Close")
	}
}
