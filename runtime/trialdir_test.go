package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"flowgate/gate/nstest"

	"golang.org/x/sys/unix"
)

// TestSettleLogs plants what an agent could leave in /logs. It needs no
// root; as root it also checks that everything ends up owned by root.
func TestSettleLogs(t *testing.T) {
	jobs := t.TempDir()
	d, err := newTrialDir(jobs, "job", "some/task name")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`/job/task-name__[0-9a-f]{8}$`).MatchString(d.path) || !strings.HasSuffix(d.path, d.id) {
		t.Fatalf("trial folder %s (id %s)", d.path, d.id)
	}
	secret := filepath.Join(t.TempDir(), "host-secret")
	mustWrite(t, secret, "host secret")
	// What bench wrote itself.
	mustWrite(t, d.file("agent/script.txt"), "bench's capture")
	mustWrite(t, d.file("verifier/test-stdout.txt"), "bench's verifier capture")
	// What the sandbox wrote.
	mustWrite(t, d.file("logs/agent/notes.txt"), "agent notes")
	mustWrite(t, d.file("logs/agent/script.txt"), "agent's own script.txt")
	mustWrite(t, d.file("logs/agent/sandbox-script.txt"), "agent's sandbox-script.txt")
	mustWrite(t, d.file("logs/agent/deep/er/file.txt"), "deep")
	mustSymlink(t, secret, d.file("logs/agent/link"))
	mustSymlink(t, "/", d.file("logs/agent/deep/root"))
	mustSymlink(t, "../../../..", d.file("logs/agent/deep/er/up"))
	mustSymlink(t, "/nonexistent", d.file("logs/agent/dangling"))
	mustSymlink(t, filepath.Dir(secret), d.file("logs/agent/dirlink"))
	if err := unix.Mkfifo(d.file("logs/agent/deep/fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, d.file("logs/verifier/reward.txt"), "1\n")
	mustWrite(t, d.file("logs/verifier/test-stdout.txt"), "verifier's own file of that name")
	mustSymlink(t, secret, d.file("logs/verifier/reward.json"))
	if os.Geteuid() == 0 {
		if err := os.Lchown(d.file("logs/agent/deep/er/file.txt"), 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	// Modes the agent chose: world-writable, setgid, sticky.
	if err := os.Chmod(d.file("logs/agent/notes.txt"), 0o777|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d.file("logs/agent/deep/er"), 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}

	dropped, err := d.settleLogs()
	if err != nil {
		t.Fatalf("settleLogs: %v", err)
	}
	slices.Sort(dropped)
	wantDropped := []string{"logs/agent/dangling", "logs/agent/deep/er/up", "logs/agent/deep/fifo", "logs/agent/deep/root",
		"logs/agent/dirlink", "logs/agent/link", "logs/verifier/reward.json"}
	if !slices.Equal(dropped, wantDropped) {
		t.Errorf("dropped %q, want %q", dropped, wantDropped)
	}
	wantFiles := map[string]string{
		"agent/script.txt":                 "bench's capture",
		"agent/sandbox-script.txt":         "agent's sandbox-script.txt",
		"agent/sandbox-2-script.txt":       "agent's own script.txt",
		"agent/notes.txt":                  "agent notes",
		"agent/deep/er/file.txt":           "deep",
		"verifier/reward.txt":              "1\n",
		"verifier/test-stdout.txt":         "bench's verifier capture",
		"verifier/sandbox-test-stdout.txt": "verifier's own file of that name",
	}
	got := map[string]string{}
	err = filepath.WalkDir(d.path, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(d.path, p)
		if !e.Type().IsRegular() && !e.IsDir() {
			t.Errorf("%s is left in the trial folder (type %v)", rel, e.Type())
		}
		if strings.HasPrefix(rel, "agent/") || strings.HasPrefix(rel, "verifier/") {
			if fi, err := os.Lstat(p); err != nil || fi.Mode()&(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky)&^0o755 != 0 {
				t.Errorf("%s has mode %v, want no bit beyond 0755", rel, fi.Mode())
			}
		}
		if e.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			got[rel] = string(b)
			if os.Geteuid() == 0 {
				var st unix.Stat_t
				if err := unix.Lstat(p, &st); err != nil || st.Uid != 0 || st.Gid != 0 {
					t.Errorf("%s is owned by %d:%d (err %v), want root", rel, st.Uid, st.Gid, err)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, wantFiles) {
		t.Errorf("trial folder files:\n got %q\nwant %q", got, wantFiles)
	}
	if _, err := os.Lstat(d.file("logs")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("logs/ is left: %v", err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "host secret" {
		t.Errorf("the symlink target was changed: %q", b)
	}
}

func TestSettleLogsMissing(t *testing.T) {
	d, err := newTrialDir(t.TempDir(), "job", "task")
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox never made logs/agent or logs/verifier.
	dropped, err := d.settleLogs()
	if err != nil || len(dropped) != 0 {
		t.Errorf("settleLogs on empty logs: %v, %v", dropped, err)
	}
	for _, sub := range []string{"agent", "verifier", "trajectory", "network"} {
		if st, err := os.Stat(d.file(sub)); err != nil || !st.IsDir() {
			t.Errorf("%s: %v", sub, err)
		}
	}
}

func TestNewTrialDirNames(t *testing.T) {
	jobs := t.TempDir()
	for task, want := range map[string]string{
		"half-life":        "half-life",
		"examples/a b":     "a-b",
		"..":               "task",
		"/":                "-",
		"":                 "task",
		"naïve/task.v2":    "task.v2",
		"x/\x00y":          "-y",
		"tab\tand;semi|pp": "tab-and-semi-pp",
	} {
		d, err := newTrialDir(jobs, "j", task)
		if err != nil {
			t.Errorf("newTrialDir(%q): %v", task, err)
			continue
		}
		if got := filepath.Base(d.path); got != want+"__"+d.id {
			t.Errorf("newTrialDir(%q) = %s, want %s__%s", task, got, want, d.id)
		}
		if err := d.remove(); err != nil {
			t.Error(err)
		}
	}
	// remove took the job folder with the last trial.
	if _, err := os.Stat(filepath.Join(jobs, "j")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("job folder is left after removing its only trials: %v", err)
	}
	// Two trials of one task get different folders; removing one keeps the job.
	a, _ := newTrialDir(jobs, "j", "t")
	b, _ := newTrialDir(jobs, "j", "t")
	if a == nil || b == nil || a.path == b.path {
		t.Fatalf("two trials share a folder")
	}
	a.remove()
	if _, err := os.Stat(b.path); err != nil {
		t.Errorf("removing one trial removed another: %v", err)
	}
	// Folders it created for the trial go with it, folders that were there stay.
	base := t.TempDir()
	c, err := newTrialDir(filepath.Join(base, "new", "jobs"), "j", "t")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.remove(); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(base); err != nil || len(ents) != 0 {
		t.Errorf("after remove, %s holds %v (%v)", base, ents, err)
	}
}

func TestWriteJSONWhole(t *testing.T) {
	d, err := newTrialDir(t.TempDir(), "job", "task")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := d.writeJSON("result.json", map[string]int{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(d.file("result.json"))
	if err != nil || string(b) != "{\n  \"n\": 2\n}\n" {
		t.Errorf("result.json = %q, %v", b, err)
	}
	ents, _ := os.ReadDir(d.path)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temp file %s is left", e.Name())
		}
	}
	if err := d.writeJSON("result.json", func() {}); err == nil || !strings.Contains(err.Error(), "encoding result.json") {
		t.Errorf("writing an unencodable value: %v", err)
	}
	if err := writeFileAtomic(filepath.Join(d.path, "missing", "x"), nil, 0o644); err == nil {
		t.Error("writing into a missing folder succeeded")
	}
}

func mustWrite(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustSymlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// TestTrialDirRefusesFoldersOthersControl: a job folder that is a symlink,
// belongs to another user or is writable by others is refused, and what
// newTrialDir made is gone; a --jobs-dir given as a symlink is resolved.
func TestTrialDirRefusesFoldersOthersControl(t *testing.T) {
	nstest.RequireRoot(t) // chown to another uid
	jobs := t.TempDir()
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(jobs, "linked")); err != nil {
		t.Fatal(err)
	}
	if _, err := newTrialDir(jobs, "linked", "task"); err == nil || !strings.Contains(err.Error(), "is a symlink") {
		t.Errorf("a job folder that is a symlink: %v", err)
	}
	other := filepath.Join(jobs, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(other, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if _, err := newTrialDir(jobs, "other", "task"); err == nil || !strings.Contains(err.Error(), "belongs to uid 1000") {
		t.Errorf("a job folder of another user: %v", err)
	}
	open := filepath.Join(jobs, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777)
	if _, err := newTrialDir(jobs, "open", "task"); err == nil || !strings.Contains(err.Error(), "writable by others") {
		t.Errorf("a world-writable job folder: %v", err)
	}
	// Sticky and world-writable (as /tmp) is fine: no one else can rename
	// what bench made there.
	sticky := filepath.Join(jobs, "sticky")
	if err := os.Mkdir(sticky, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(sticky, 0o777|os.ModeSticky)
	if _, err := newTrialDir(sticky, "j", "task"); err != nil {
		t.Errorf("a sticky jobs folder: %v", err)
	}
	if ents, _ := os.ReadDir(elsewhere); len(ents) != 0 {
		t.Errorf("bench wrote through the symlink: %v", ents)
	}
	// A fresh jobs folder that is refused leaves nothing.
	fresh := filepath.Join(t.TempDir(), "jobs")
	if _, err := newTrialDir(fresh, strings.Repeat("j", 300), "task"); err == nil {
		t.Fatal("a 300-byte job name was accepted")
	}
	if _, err := os.Lstat(fresh); !os.IsNotExist(err) {
		t.Errorf("a refused run left %s behind", fresh)
	}
	// A jobs folder given through a symlink works.
	link := filepath.Join(t.TempDir(), "jobs-link")
	if err := os.Symlink(jobs, link); err != nil {
		t.Fatal(err)
	}
	d, err := newTrialDir(link, "fine", "task")
	if err != nil {
		t.Fatalf("a --jobs-dir given as a symlink: %v", err)
	}
	if !strings.HasPrefix(d.path, jobs+"/fine/") {
		t.Errorf("trial folder %s, want it under the resolved %s", d.path, jobs)
	}
}

// TestGroupHasOthers: a user-private group counts only when no one else
// can be in it, as a listed member or by primary group; a group the files
// do not list counts as shared.
func TestGroupHasOthers(t *testing.T) {
	group := []byte("root:x:0:\nana:x:1001:\nteam:x:1002:bo\nbo:x:1003:\n")
	passwd := []byte("root:x:0:0::/root:/bin/sh\nana:x:1001:1001::/home/ana:/bin/sh\nbo:x:1003:1003::/home/bo:/bin/sh\ncy:x:1004:1003::/home/cy:/bin/sh\n")
	for _, c := range []struct {
		name, gid, owner string
		want             bool
	}{
		{"ana", "1001", "ana", false},
		{"team", "1002", "ana", true}, // a listed member
		{"bo", "1003", "bo", true},    // cy's primary group
		{"ldap", "5000", "ana", true}, // not in /etc/group
	} {
		if got := groupHasOthersIn(group, passwd, c.name, c.gid, c.owner); got != c.want {
			t.Errorf("groupHasOthersIn(%s, %s, %s) = %v, want %v", c.name, c.gid, c.owner, got, c.want)
		}
	}
}

// TestLocalRemotes: a checkout's remotes named by a local path, in the
// forms git reads as local, are found; remote hosts are not.
func TestLocalRemotes(t *testing.T) {
	g := filepath.Join(t.TempDir(), "tree", ".git")
	if err := os.MkdirAll(g, 0o755); err != nil {
		t.Fatal(err)
	}
	config := "[remote \"a\"]\n\turl = /opt/mirror\n[remote \"b\"]\n\tURL = /opt/upper\n[remote \"c\"]\n\turl = file://localhost/opt/lh\n" +
		"[remote \"d\"]\n\turl = file:///opt/three\n[remote \"e\"]\n\turl = /opt/mirrors/pkg@2\n[remote \"f\"]\n\turl = ../sibling\n" +
		"[remote \"g\"]\n\turl = https://example.org/x.git\n[remote \"h\"]\n\turl = git@example.org:x.git\n[remote \"i\"]\n\turl = example.org:x.git\n"
	if err := os.WriteFile(filepath.Join(g, "config"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	got := localRemotes([]string{g})
	want := []string{"/opt/mirror", "/opt/upper", "/opt/lh", "/opt/three", "/opt/mirrors/pkg@2", filepath.Join(filepath.Dir(filepath.Dir(g)), "sibling")}
	if !slices.Equal(got, want) {
		t.Errorf("localRemotes = %q, want %q", got, want)
	}
}
