package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"flowgate/gate/nstest"
)

// End-to-end tests of bench run: the whole command, in process, against
// the built-in simulated internet (--simnet), with temporary state and
// jobs folders. They send nothing outside namespaces bench makes.

const (
	exampleURL = "https://example.com"
	pypiURL    = "https://pypi.org/simple/"
	reachable  = "reachable (HTTP 200)"
	noDNS      = "unreachable: URLError <urlopen error [Errno -3] Temporary failure in name resolution>"
	refused403 = "unreachable: URLError <urlopen error Tunnel connection failed: 403 Forbidden>"
	proxyURL   = "http://127.0.0.1:15080"
	// agentEnvValue is passed with --agent-env; it may appear only where
	// the agent printed it itself.
	agentEnvValue = "secretvalue-4d1c"
	// hostSecret is exported in bench's own environment; it must reach no
	// phase.
	hostSecret = "host-secret-9e27"
)

// probeTaskMD is a task whose setup (root, with the internet) and verifier
// (root, unfiltered) probe both sites and must reach them, and whose setup
// leaves processes behind that must not survive into the agent phase.
const probeTaskMD = `---
agent:
  timeout_sec: 120
verifier:
  timeout_sec: 120
sandbox:
  network_mode: %s
%s  env:
    TASK_GREETING: hello
  setup_commands:
    - command: |
        python3 - <<'PY'
        import urllib.request
        for url in ["https://example.com", "https://pypi.org/simple/"]:
            print("setup reached", url, urllib.request.urlopen(url, timeout=10).status)
        PY
    - command: |
        env | sort | sed 's/^/setup env: /'
    - command: |
        setsid sleep 987651 </dev/null >/dev/null 2>&1 &
        sleep 987650 &
---
Probe the network.
`

// probeVerifier must reach both sites as root after the agent; the reward
// file is reward.txt or reward.json (%s).
const probeVerifier = `#!/bin/bash
set -e
python3 - <<'PY'
import urllib.request
for url in ["https://example.com", "https://pypi.org/simple/"]:
    print("verifier reached", url, urllib.request.urlopen(url, timeout=10).status)
PY
echo "verifier uid: $(id -u)"
if pgrep -f 'sleep 98765' >/dev/null; then echo "verifier sees sleepers: yes"; else echo "verifier sees sleepers: no"; fi
env | sort | sed 's/^/verifier env: /'
%s
`

// probeExtra is appended to examples/net-probe.sh: who the agent is, its
// privileges, its environment, what of setup survived, and two processes
// it leaves behind.
const probeExtra = `
echo "id: $(id -u) $(id -g) groups=$(id -G) $(id -un)"
grep -E '^(NoNewPrivs|CapInh|CapPrm|CapEff|CapBnd|CapAmb):' /proc/self/status | tr -d '\t'
env | sort | sed 's/^/env: /'
if pgrep -f 'sleep 98765' >/dev/null; then echo "setup sleepers: running"; else echo "setup sleepers: gone"; fi
echo "home entries: $(ls -A "$HOME" | wc -l)"
touch "$HOME/probe" && echo "home writable: $HOME"
if [ -e %q ]; then echo "task folder: visible"; else echo "task folder: hidden"; fi
setsid sleep 987652 </dev/null >/dev/null 2>&1 &
sleep 987653 &
echo "agent done"
`

type modeCase struct {
	mode       string
	policy     string // YAML lines under sandbox:
	example    string // the agent's line for example.com
	pypi       string
	rules      []map[string]any
	egress     []egressKey // distinct gateway decisions
	rewardJSON bool
	jsonOut    bool
}

// egressKey is what a test checks of an egress record.
type egressKey struct{ Proto, Name, Verdict, Reason, Rule string }

var modeCases = []modeCase{
	{mode: "public", example: reachable, pypi: reachable, rules: []map[string]any{}},
	{mode: "no-network", example: noDNS, pypi: noDNS, rules: []map[string]any{}, jsonOut: true},
	{mode: "denylist", policy: "  blocked_hosts:\n    - example.com\n",
		example: refused403, pypi: reachable,
		rules: []map[string]any{{"kind": "host", "field": "sandbox.blocked_hosts[0]", "rule": "example.com"}},
		egress: []egressKey{
			{"connect", "example.com", "deny", "host_blocked", "sandbox.blocked_hosts[0] example.com"},
			{"connect", "pypi.org", "allow", "not_blocked", "default"},
		}, rewardJSON: true, jsonOut: true},
	{mode: "allowlist", policy: "  allowed_hosts:\n    - pypi.org\n",
		example: refused403, pypi: reachable,
		rules: []map[string]any{{"kind": "host", "field": "sandbox.allowed_hosts[0]", "rule": "pypi.org"}},
		egress: []egressKey{
			{"connect", "example.com", "deny", "not_allowed", "default"},
			{"connect", "pypi.org", "allow", "host_allowed", "sandbox.allowed_hosts[0] pypi.org"},
		}, jsonOut: true},
}

// writeProbeTask makes a task folder for a mode and the agent script, and
// returns both paths.
func writeProbeTask(t *testing.T, name, mode, policy string, rewardJSON bool, agentPrefix string) (task, script string) {
	t.Helper()
	base := t.TempDir()
	task = filepath.Join(base, name)
	writeFile(t, filepath.Join(task, "task.md"), fmt.Sprintf(probeTaskMD, mode, policy), 0o644)
	reward := "echo 1 > /logs/verifier/reward.txt"
	if rewardJSON {
		reward = `echo '{"reward": 1, "sites": 2}' > /logs/verifier/reward.json`
	}
	writeFile(t, filepath.Join(task, "verifier", "test.sh"), fmt.Sprintf(probeVerifier, reward), 0o755)
	probe, err := os.ReadFile("../../examples/net-probe.sh")
	if err != nil {
		t.Fatal(err)
	}
	script = filepath.Join(base, "probe.sh")
	writeFile(t, script, agentPrefix+string(probe)+fmt.Sprintf(probeExtra, task), 0o755)
	return task, script
}

func writeFile(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// TestRunModes runs examples/net-probe.sh (plus checks of identity,
// privileges, environment and processes) as the agent in each mode. What
// the agent reaches matches the reference page's table (allowlist: the
// proxy's 403 refusal); setup and verifier, as root, reach both sites in
// every mode. It checks the whole trial folder: config.json (agent env
// names only), result.json, the egress log's reason codes, the applied
// ruleset, and that the --agent-env value appears only in what the agent
// printed (agent/script.txt) and bench's own environment nowhere.
func TestRunModes(t *testing.T) {
	nstest.RequireRoot(t)
	t.Setenv("SECRET_KEY", hostSecret) // bench's own environment
	for _, mc := range modeCases {
		t.Run(mc.mode, func(t *testing.T) {
			state, jobs := t.TempDir(), t.TempDir()
			checkCleanAtEnd(t, state, jobs)
			task, script := writeProbeTask(t, "probe-"+mc.mode, mc.mode, mc.policy, mc.rewardJSON, "")
			args := []string{"run", "--simnet", "--state-dir", state, "--jobs-dir", jobs, "--job", "j-" + mc.mode,
				task, "-a", "script:" + script, "--agent-env", "FOO=" + agentEnvValue}
			if mc.jsonOut {
				args = append(args, "--json")
			}
			code, out, errs := runBench(t, args...)
			if code != 0 || errs != "" {
				t.Fatalf("bench run: exit %d, stderr %q, stdout:\n%s", code, errs, out)
			}
			dir := onlyTrial(t, filepath.Join(jobs, "j-"+mc.mode), "probe-"+mc.mode)
			id := dir[len(dir)-8:]
			sandbox := "t-" + id
			checkProgress(t, out, mc.jsonOut, "probe-"+mc.mode, dir, mc.mode)
			checkTrialFiles(t, dir, mc.rewardJSON, "script")
			cfg := checkConfig(t, dir, task, sandbox, mc)
			uid := int(cfg.Sandbox.UID)
			checkResult(t, dir, mc.rewardJSON)
			checkAgentOutput(t, dir, mc, uid)
			checkSetupAndVerifier(t, dir)
			checkEgress(t, dir, sandbox, uid, mc.egress)
			checkRuleset(t, dir, sandbox, uid)
			checkSecrets(t, dir)
		})
	}
}

// onlyTrial returns the one trial folder in a job folder.
func onlyTrial(t *testing.T, jobDir, task string) string {
	t.Helper()
	ents, err := os.ReadDir(jobDir)
	if err != nil || len(ents) != 1 {
		t.Fatalf("job folder %s: %v, %v; want one trial folder", jobDir, ents, err)
	}
	return trialOf(t, jobDir, task)
}

// trialOf returns the one trial folder of task in a job folder,
// <task>__<8 hex>.
func trialOf(t *testing.T, jobDir, task string) string {
	t.Helper()
	ents, err := os.ReadDir(jobDir)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(task) + `__[0-9a-f]{8}$`)
	var found []string
	for _, e := range ents {
		if re.MatchString(e.Name()) && e.IsDir() {
			found = append(found, filepath.Join(jobDir, e.Name()))
		}
	}
	if len(found) != 1 {
		t.Fatalf("job folder %s holds %v; want one folder %s__<8 hex>", jobDir, ents, task)
	}
	return found[0]
}
