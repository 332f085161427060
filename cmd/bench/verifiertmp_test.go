package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"flowgate/gate/nstest"
)

// TestVerifierTmpLinksRemoved: a symlink the agent leaves does not steer
// the root verifier's writes. The agent points /tmp/failed_count and
// /app/out.txt at the verifier's reward.txt and leaves a FIFO the verifier
// would block on; they are gone before the verifier runs, the agent's
// regular files and its project links (a virtualenv in /tmp, /app/lib)
// stay, and the wrong answer earns the reward the verifier meant: 0.
func TestVerifierTmpLinksRemoved(t *testing.T) {
	nstest.RequireRoot(t)
	state, jobs := t.TempDir(), t.TempDir()
	checkCleanAtEnd(t, state, jobs)
	base := t.TempDir()
	task := filepath.Join(base, "tmp-task")
	writeFile(t, filepath.Join(task, "task.md"), "---\nagent:\n  timeout_sec: 120\nverifier:\n  timeout_sec: 60\n"+
		"sandbox:\n  network_mode: no-network\n  workdir: /app\n---\nWrite 42 to /app/answer.txt.\n", 0o644)
	writeFile(t, filepath.Join(task, "verifier", "test.sh"), `#!/bin/bash
ls -l /tmp /var/tmp
cat /tmp/notes.txt
[ -p /tmp/fifo ] && cat /tmp/fifo
[ -L /app/lib ] && echo "lib link kept"
echo 0 > /tmp/count
[ -p /app/answer.fifo ] && echo "fifo in app"
/tmp/venv/bin/python3 -c 'print("venv link kept")'
[ -e /tmp/failed_count ] || echo "failed_count link gone"
echo 1 > /app/out.txt
echo 1 > /app/sub/rel.txt
failed=0
[ "$(cat /app/answer.txt 2>/dev/null)" = 42 ] || failed=1
echo "$failed" > /tmp/failed_count
if [ "$failed" = 0 ]; then r=1; else r=0; fi
echo "{\"reward\": $r, \"failed\": $failed}" > /logs/verifier/reward.json
`, 0o755)
	script := filepath.Join(base, "agent.sh")
	writeFile(t, script, "#!/bin/bash\necho 41 > /app/answer.txt\necho kept > /tmp/notes.txt\n"+
		"ln -s /logs/verifier/reward.txt /tmp/failed_count\nmkfifo /tmp/fifo\nmkdir -p /tmp/venv/bin\nln -s /usr/bin/python3 /tmp/venv/bin/python3\n"+
		"mkfifo ~/f\nln -s ~/f /tmp/count\nmkfifo /app/answer.fifo\n"+
		"ln -s /logs/verifier/reward.txt /app/out.txt\nmkdir /app/sub\nln -s ../../logs/verifier/reward.txt /app/sub/rel.txt\n"+
		"ln -s /proc/self/root/logs/verifier/reward.txt /app/p.txt\nln -s /usr/lib /app/lib\n", 0o755)
	if code, out, errs := runBench(t, "run", "--simnet", "--state-dir", state, "--jobs-dir", jobs, "--job", "j", task, "-a", "script:"+script); code != 0 {
		t.Fatalf("bench run: exit %d\n%s\n%s", code, out, errs)
	}
	dir := onlyTrial(t, filepath.Join(jobs, "j"), "tmp-task")
	var res resultJSON
	readJSON(t, filepath.Join(dir, "result.json"), &res)
	if res.Reward == nil || *res.Reward != 0 {
		t.Errorf("reward %v, want 0: the verifier's own reward.json for a wrong answer", res.Reward)
	}
	if _, err := os.Lstat(filepath.Join(dir, "verifier", "reward.txt")); err == nil {
		t.Error("reward.txt exists: root wrote through the agent's symlink")
	}
	b, err := os.ReadFile(filepath.Join(dir, "verifier", "test-stdout.txt"))
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	for _, want := range []string{"kept\n", "lib link kept", "venv link kept", "failed_count link gone"} {
		if !strings.Contains(out, want) {
			t.Errorf("the verifier did not print %q: want the agent's files and project links kept, links to /logs gone:\n%s", want, out)
		}
	}
	if strings.Contains(out, "fifo") || strings.Contains(out, "logs/verifier") {
		t.Errorf("the verifier saw the agent's FIFO or a link to its logs:\n%s", out)
	}
}
