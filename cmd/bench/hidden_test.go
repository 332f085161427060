package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"flowgate/gate/nstest"
)

// hiddenAnswer is what a task's verifier and oracle hold; the agent must
// never see it.
const hiddenAnswer = "ANSWER-7f3e-91c2"

// leakAgent looks for the answer wherever the sandbox shows host files:
// plain files under the overlaid system folders, and the loose objects of
// any git object store there (zlib-compressed, so grep alone misses them).
const leakAgent = `#!/bin/bash
grep -rIl "` + hiddenAnswer + `" /opt /var /etc /usr/local 2>/dev/null | sed 's/^/plain: /'
python3 - <<'PY'
import os, zlib
for top in ["/opt", "/var", "/usr/local"]:
    for root, dirs, files in os.walk(top):
        if "/objects/" not in root + "/":
            continue
        for f in files:
            try:
                data = zlib.decompress(open(os.path.join(root, f), "rb").read())
            except Exception:
                continue
            if b"` + hiddenAnswer + `" in data:
                print("git object:", os.path.join(root, f))
PY
echo agent-done
`

// secretTask writes a task whose verifier and oracle hold hiddenAnswer.
func secretTask(t *testing.T, dir string) {
	t.Helper()
	writeFile(t, filepath.Join(dir, "task.md"), "---\nagent:\n  timeout_sec: 120\nverifier:\n  timeout_sec: 60\n"+
		"sandbox:\n  network_mode: no-network\n  workdir: /app\n---\nFind the answer.\n", 0o644)
	writeFile(t, filepath.Join(dir, "verifier", "test.sh"), "#!/bin/bash\necho expected "+hiddenAnswer+"\necho 0 > /logs/verifier/reward.txt\n", 0o755)
	writeFile(t, filepath.Join(dir, "oracle", "solve.sh"), "#!/bin/bash\necho "+hiddenAnswer+" > /app/answer.txt\n", 0o755)
}

// optFolder makes a folder under /opt, one of the host folders every
// sandbox sees through an overlay, removed at the end.
func optFolder(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("/opt", "flowgate-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// leak runs leakAgent on a task and returns what it printed.
func leak(t *testing.T, state, jobs, taskArg string) string {
	t.Helper()
	script := filepath.Join(t.TempDir(), "leak.sh")
	writeFile(t, script, leakAgent, 0o755)
	code, out, errs := runBench(t, "run", "--simnet", "--state-dir", state, "--jobs-dir", jobs, "--job", "j", taskArg, "-a", "script:"+script)
	if code != 0 {
		t.Fatalf("bench run: exit %d %q\n%s", code, errs, out)
	}
	ents, _ := filepath.Glob(filepath.Join(jobs, "j", "secret-task__*", "agent", "script.txt"))
	var all strings.Builder
	for _, e := range ents {
		b, err := os.ReadFile(e)
		if err != nil || !strings.Contains(string(b), "agent-done") {
			t.Fatalf("the agent did not run to the end: %s %v", b, err)
		}
		all.Write(b)
	}
	return all.String()
}

// TestTaskFolderHiddenWhereverItResolves: a task folder under an overlaid
// host folder is hidden by its real path when it is named through a
// symlink (absolute, or relative to a working directory reached through
// one), and so are the objects of the git repository it lies in.
func TestTaskFolderHiddenWhereverItResolves(t *testing.T) {
	nstest.RequireRoot(t)
	repo := optFolder(t)
	secretTask(t, filepath.Join(repo, "tasks", "secret-task"))
	for _, args := range [][]string{{"init", "-q"}, {"add", "."}, {"-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-qm", "tasks"}} {
		if out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	link := filepath.Join(t.TempDir(), "bench")
	if err := os.Symlink(repo, link); err != nil {
		t.Fatal(err)
	}
	for name, arg := range map[string]string{
		"real path":         filepath.Join(repo, "tasks", "secret-task"),
		"through a symlink": filepath.Join(link, "tasks", "secret-task"),
		"relative":          "tasks/secret-task",
	} {
		t.Run(name, func(t *testing.T) {
			if name == "relative" {
				t.Chdir(link) // sets $PWD too, as a shell does after cd ~/bench
			}
			state, jobs := t.TempDir(), t.TempDir()
			checkCleanAtEnd(t, state, jobs)
			if out := leak(t, state, jobs, arg); strings.Contains(out, "plain: ") || strings.Contains(out, "git object: ") {
				t.Errorf("the agent found the answer:\n%s", out)
			}
		})
	}
}

// TestJobsFolderHiddenThroughSymlink: with --jobs-dir naming a folder under
// /opt through a symlink, a later trial of the job cannot read what an
// earlier trial's verifier printed.
func TestJobsFolderHiddenThroughSymlink(t *testing.T) {
	nstest.RequireRoot(t)
	real := optFolder(t)
	link := filepath.Join(t.TempDir(), "jobs")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	checkCleanAtEnd(t, state, link)
	task := filepath.Join(t.TempDir(), "secret-task")
	secretTask(t, task)
	leak(t, state, link, task)
	if out := leak(t, state, link, task); strings.Contains(out, "plain: ") {
		t.Errorf("a trial read an earlier trial's verifier output:\n%s", out)
	}
}

// TestTaskFolderHiddenWithGitFile: when the repository around the task
// keeps its objects elsewhere (.git is a file: --separate-git-dir, or a
// worktree of another checkout; or its objects borrow another store: a
// clone made with --shared), those are hidden too.
func TestTaskFolderHiddenWithGitFile(t *testing.T) {
	nstest.RequireRoot(t)
	git := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	commit := func(repo string) {
		git("-C", repo, "add", ".")
		git("-C", repo, "-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-qm", "tasks")
	}
	for _, c := range []struct {
		name string
		// make builds the repository and returns the task folder to run.
		make func(t *testing.T) string
	}{
		{"separate git dir", func(t *testing.T) string {
			repo, store := optFolder(t), optFolder(t)
			secretTask(t, filepath.Join(repo, "tasks", "secret-task"))
			git("init", "-q", "--separate-git-dir", filepath.Join(store, "gitdir"), repo)
			commit(repo)
			return filepath.Join(repo, "tasks", "secret-task")
		}},
		{"alternates", func(t *testing.T) string {
			source, clone := optFolder(t), optFolder(t)
			secretTask(t, filepath.Join(source, "tasks", "secret-task"))
			git("init", "-q", source)
			commit(source)
			git("clone", "-q", "--shared", source, filepath.Join(clone, "tree"))
			return filepath.Join(clone, "tree", "tasks", "secret-task")
		}},
		{"clone of a local mirror", func(t *testing.T) string {
			source, mirror, clone := optFolder(t), optFolder(t), optFolder(t)
			secretTask(t, filepath.Join(source, "tasks", "secret-task"))
			git("init", "-q", source)
			commit(source)
			git("clone", "-q", "--bare", source, filepath.Join(mirror, "tasks.git"))
			os.RemoveAll(source) // only the mirror and the clone stay
			git("clone", "-q", "--no-local", filepath.Join(mirror, "tasks.git"), filepath.Join(clone, "tree"))
			return filepath.Join(clone, "tree", "tasks", "secret-task")
		}},
		{"worktree", func(t *testing.T) string {
			main, wt := optFolder(t), optFolder(t)
			secretTask(t, filepath.Join(main, "tasks", "secret-task"))
			git("init", "-q", main)
			commit(main)
			git("-C", main, "worktree", "add", "-q", filepath.Join(wt, "tree"))
			return filepath.Join(wt, "tree", "tasks", "secret-task")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			task := c.make(t)
			state, jobs := t.TempDir(), t.TempDir()
			checkCleanAtEnd(t, state, jobs)
			// The other checkout's own copy of the task (alternates,
			// worktree) is another folder, not hidden; its objects are.
			if out := leak(t, state, jobs, task); strings.Contains(out, "git object: ") {
				t.Errorf("the agent found the answer in git objects the task's repository uses:\n%s", out)
			}
		})
	}
}
