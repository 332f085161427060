package main

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"flowgate/gate/nstest"
)

// A plain task: nop and script agents, a verifier that writes reward 1.
const plainTaskMD = `---
sandbox:
  network_mode: public
---
Do nothing.
`

const rewardOne = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"

// plainTask writes a task folder with task.md and the files given
// (name -> content; a name ending in .sh is made executable).
func plainTask(t *testing.T, md string, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "plain")
	writeFile(t, filepath.Join(dir, "task.md"), md, 0o644)
	for name, content := range files {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		writeFile(t, filepath.Join(dir, name), content, mode)
	}
	return dir
}

// TestRunBadInput checks that input bench must refuse is refused with a
// clear error, and that nothing is left: no trial or job folder, no state,
// no namespace.
func TestRunBadInput(t *testing.T) {
	nstest.RequireRoot(t)
	scripts := t.TempDir()
	notExec := filepath.Join(scripts, "plain.sh")
	writeFile(t, notExec, "#!/bin/sh\n", 0o644)
	okScript := filepath.Join(scripts, "ok.sh")
	writeFile(t, okScript, "#!/bin/sh\n", 0o755)
	good := plainTask(t, plainTaskMD, map[string]string{"verifier/test.sh": rewardOne})
	tests := []struct {
		name    string
		task    func(t *testing.T) string
		args    []string
		code    int
		wantErr string
	}{
		{name: "missing task folder", task: func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope") },
			args: []string{"-a", "nop"}, code: 1, wantErr: "bench: loading task: stat "},
		{name: "bad network_mode", task: func(t *testing.T) string {
			return plainTask(t, "---\nsandbox:\n  network_mode: nope\n---\nx\n", map[string]string{"verifier/test.sh": rewardOne})
		}, args: []string{"-a", "nop"}, code: 1,
			wantErr: `task.md:3: sandbox.network_mode: "nope": unknown network_mode "nope"; valid: public, no-network, denylist, allowlist`},
		{name: "bad yaml", task: func(t *testing.T) string {
			return plainTask(t, "---\nsandbox: [\n---\nx\n", map[string]string{"verifier/test.sh": rewardOne})
		}, args: []string{"-a", "nop"}, code: 1, wantErr: "task.md"},
		{name: "unknown agent", args: []string{"-a", "robot"}, code: 1,
			wantErr: `bench: unknown agent "robot"; valid: nop, oracle, script:PATH`},
		{name: "no agent", args: nil, code: 2, wantErr: "bench: run: give the agent with -a (nop, oracle, script:PATH)"},
		{name: "script not executable", args: []string{"-a", "script:" + notExec}, code: 1,
			wantErr: "bench: agent script " + notExec + ": not executable (chmod +x " + notExec + ")"},
		{name: "script missing", args: []string{"-a", "script:" + filepath.Join(scripts, "missing.sh")}, code: 1,
			wantErr: "bench: agent script " + filepath.Join(scripts, "missing.sh") + ": stat "},
		{name: "oracle without solve.sh", args: []string{"-a", "oracle"}, code: 1,
			wantErr: "has no oracle/solve.sh (or the legacy solution/solve.sh)"},
		{name: "no verifier", task: func(t *testing.T) string { return plainTask(t, plainTaskMD, nil) },
			args: []string{"-a", "nop"}, code: 1, wantErr: "has no verifier: want verifier/test.sh (or the legacy tests/test.sh)"},
		{name: "host variable not allowed", task: func(t *testing.T) string {
			return plainTask(t, "---\nsandbox:\n  env:\n    TOKEN: ${BENCH_TEST_TASK_SECRET}\n---\nx\n", map[string]string{"verifier/test.sh": rewardOne})
		}, args: []string{"-a", "nop"}, code: 1,
			wantErr: "the task's env asks for host variables BENCH_TEST_TASK_SECRET; the host's environment does not enter the sandbox unless you pass --allow-task-env BENCH_TEST_TASK_SECRET"},
		{name: "another variable allowed", task: func(t *testing.T) string {
			return plainTask(t, "---\nsandbox:\n  env:\n    TOKEN: ${BENCH_TEST_TASK_SECRET}\n---\nx\n", map[string]string{"verifier/test.sh": rewardOne})
		}, args: []string{"-a", "nop", "--allow-task-env", "OTHER"}, code: 1,
			wantErr: "unless you pass --allow-task-env BENCH_TEST_TASK_SECRET"},
		{name: "bad --agent-env", args: []string{"-a", "nop", "--agent-env", "1BAD=x"}, code: 1,
			wantErr: `bench: --agent-env "1BAD=x": want NAME=VALUE with NAME of letters, digits and _`},
		{name: "--agent-env without value", args: []string{"-a", "nop", "--agent-env", "FOO"}, code: 1,
			wantErr: `bench: --agent-env "FOO": want NAME=VALUE`},
		{name: "job with slash", args: []string{"-a", "nop", "--job", "a/b"}, code: 1,
			wantErr: `bench: trial: job name "a/b": must not contain '/'`},
		{name: "setup as another user", task: func(t *testing.T) string {
			return plainTask(t, "---\nsandbox:\n  setup_commands:\n    - command: \"true\"\n      user: mallory\n---\nx\n",
				map[string]string{"verifier/test.sh": rewardOne})
		}, args: []string{"-a", "nop"}, code: 1,
			wantErr: `sandbox.setup_commands[0].user "mallory": the local runtime runs setup as root or as the agent's user (agent)`},
		{name: "simnet with dns", args: []string{"-a", "nop", "--dns", "192.0.2.53"}, code: 2,
			wantErr: "bench: run: --simnet brings its own uplink and resolver; drop --uplink-netns and --dns"},
		{name: "bad pool flag", args: []string{"-a", "nop", "--pool-v4", "10.0.0.1/33"}, code: 2,
			wantErr: "bench: run: --pool-v4/--pool-v6: address pool: IPv4 prefix: "},
		// The simulated uplink's own link is the first /30 of 100.64.0.0:
		// a pool of just that subnet has no free slot.
		{name: "busy address pool", args: []string{"-a", "nop", "--pool-v4", "100.64.0.0/30", "--pool-v6", "none"}, code: 1,
			wantErr: "address pool exhausted: all 1 subnets of 100.64.0.0/30"},
		{name: "root as sandbox user", args: []string{"-a", "nop", "--sandbox-user", "root"}, code: 1,
			wantErr: "sandbox user may not be root: the agent must run as its own unprivileged user"},
		{name: "bad sandbox user", args: []string{"-a", "nop", "--sandbox-user", "Agent;rm"}, code: 1,
			wantErr: `sandbox user "Agent;rm": use 1 to 32 characters`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state, base := t.TempDir(), t.TempDir()
			jobs := filepath.Join(base, "jobs")
			checkCleanAtEnd(t, state, jobs)
			task := good
			if tt.task != nil {
				task = tt.task(t)
			}
			args := append([]string{"run", "--simnet", "--state-dir", state, "--jobs-dir", jobs, task}, tt.args...)
			code, out, errs := runBench(t, args...)
			if code != tt.code || !strings.Contains(errs, tt.wantErr) || strings.Count(errs, "\n") != 1 {
				t.Errorf("bench %q: exit %d, stderr %q; want exit %d and one line containing %q", args, code, errs, tt.code, tt.wantErr)
			}
			if out != "" {
				t.Errorf("bench printed progress for a refused run: %q", out)
			}
			if ents, err := os.ReadDir(base); err != nil || len(ents) != 0 {
				t.Errorf("a refused run left %v in the jobs folder's parent (%v)", ents, err)
			}
			if ents, err := os.ReadDir(state); err != nil || len(ents) != 0 {
				t.Errorf("a refused run left %v in the state folder (%v)", ents, err)
			}
		})
	}
}

// TestRunUsage checks the argument count.
func TestRunUsage(t *testing.T) {
	for _, args := range [][]string{{"run", "-a", "nop"}, {"run", "a", "b", "-a", "nop"}} {
		code, _, errs := runBench(t, args...)
		if code != 2 || errs != "bench: run: give one task folder: bench run TASK -a AGENT\n" {
			t.Errorf("bench %q: exit %d, stderr %q", args, code, errs)
		}
	}
}

// TestRunFailedTrials checks trials that start and fail: exit 1, a
// message naming the trial folder, and a complete result.json saying why.
func TestRunFailedTrials(t *testing.T) {
	nstest.RequireRoot(t)
	scripts := t.TempDir()
	sleeper := filepath.Join(scripts, "sleeper.sh")
	writeFile(t, sleeper, "#!/bin/bash\necho sleeping\nexec sleep 987658\n", 0o755)
	tests := []struct {
		name   string
		md     string
		files  map[string]string
		agent  string
		err    string   // result.json error
		phases []string // "name exit" of each phase that ran
	}{
		{name: "no reward", md: plainTaskMD, files: map[string]string{"verifier/test.sh": "#!/bin/bash\necho checked\n"},
			agent: "nop", err: "the verifier wrote no reward to /logs/verifier/reward.txt or reward.json",
			phases: []string{"setup 0", "agent 0", "verifier 0"}},
		{name: "reward not a number", md: plainTaskMD,
			files: map[string]string{"verifier/test.sh": "#!/bin/bash\necho passed > /logs/verifier/reward.txt\n"},
			agent: "nop", err: `verifier: reward.txt: "passed" is not a number`,
			phases: []string{"setup 0", "agent 0", "verifier 0"}},
		{name: "legacy tests folder and failing verifier", md: plainTaskMD,
			files: map[string]string{"tests/test.sh": "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\nexit 7\n"},
			agent: "nop", err: "", phases: []string{"setup 0", "agent 0", "verifier 7"}},
		{name: "setup fails", md: "---\nsandbox:\n  setup_commands:\n    - command: echo preparing; exit 3\n---\nx\n",
			files: map[string]string{"verifier/test.sh": rewardOne}, agent: "nop",
			err:    `setup: setup command 0 ("echo preparing; exit 3") exited with status 3`,
			phases: []string{"setup 3"}},
		{name: "agent times out", md: "---\nagent:\n  timeout_sec: 1\n---\nx\n",
			files: map[string]string{"verifier/test.sh": rewardOne}, agent: "script:" + sleeper,
			err: "agent: the agent timed out after 1", phases: []string{"setup 0", "agent -1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state, jobs := t.TempDir(), t.TempDir()
			checkCleanAtEnd(t, state, jobs)
			task := plainTask(t, tt.md, tt.files)
			code, out, errs := runBench(t, "run", "--simnet", "--state-dir", state, "--jobs-dir", jobs, "--job", "j", task, "-a", tt.agent)
			dir := onlyTrial(t, filepath.Join(jobs, "j"), "plain")
			wantCode, wantErr := 1, "bench: trial "+dir+" failed (see result.json)\n"
			if tt.err == "" {
				wantCode, wantErr = 0, ""
			}
			if code != wantCode || errs != wantErr {
				t.Errorf("exit %d, stderr %q; want %d, %q", code, errs, wantCode, wantErr)
			}
			var res resultJSON
			readJSON(t, filepath.Join(dir, "result.json"), &res)
			gotErr := ""
			if res.Error != nil {
				gotErr = *res.Error
			}
			if tt.err == "" && gotErr != "" || !strings.HasPrefix(gotErr, tt.err) {
				t.Errorf("result.json error %q, want %q", gotErr, tt.err)
			}
			var phases []string
			for _, ph := range res.Phases {
				code := "none"
				if ph.ExitCode != nil {
					code = strconv.Itoa(*ph.ExitCode)
				}
				phases = append(phases, ph.Name+" "+code)
				if ph.Name == "agent" && tt.name == "agent times out" && !ph.TimedOut {
					t.Errorf("agent phase %+v not marked timed out", ph)
				}
			}
			if !slices.Equal(phases, tt.phases) {
				t.Errorf("phases %q, want %q", phases, tt.phases)
			}
			if tt.err != "" && !strings.Contains(out, "failed    "+tt.err) {
				t.Errorf("progress does not say why the trial failed:\n%s", out)
			}
		})
	}
}

// TestRunAgents runs the nop and oracle agents on the half-life example.
func TestRunAgents(t *testing.T) {
	nstest.RequireRoot(t)
	for _, tt := range []struct {
		agent, task string
		reward      float64
	}{
		{"nop", "../../examples/t-public/half-life", 0},
		{"oracle", "../../examples/t-denylist/half-life", 1},
	} {
		t.Run(tt.agent, func(t *testing.T) {
			state, jobs := t.TempDir(), t.TempDir()
			checkCleanAtEnd(t, state, jobs)
			code, _, errs := runBench(t, "run", "--simnet", "--state-dir", state, "--jobs-dir", jobs, "--job", "j", tt.task, "-a", tt.agent)
			if code != 0 || errs != "" {
				t.Fatalf("exit %d, stderr %q", code, errs)
			}
			dir := onlyTrial(t, filepath.Join(jobs, "j"), "half-life")
			var res resultJSON
			readJSON(t, filepath.Join(dir, "result.json"), &res)
			if res.Reward == nil || *res.Reward != tt.reward || res.Error != nil {
				t.Errorf("result.json reward %v error %v, want %v", res.Reward, res.Error, tt.reward)
			}
			var cfg configJSON
			readJSON(t, filepath.Join(dir, "config.json"), &cfg)
			if cfg.Agent.Name != tt.agent || cfg.Agent.Script != "" || cfg.Agent.Env == nil || len(cfg.Agent.Env) != 0 {
				t.Errorf("config.json agent %+v", cfg.Agent)
			}
			got := listTree(t, filepath.Join(dir, "agent"))
			want := []string(nil)
			if tt.agent == "oracle" {
				want = []string{"oracle.txt"}
			}
			if !slices.Equal(got, want) {
				t.Errorf("agent/ holds %q, want %q", got, want)
			}
		})
	}
}

// TestRunTaskEnv checks that a host variable named with --allow-task-env
// reaches the phases through the task's env, and that it was needed.
func TestRunTaskEnv(t *testing.T) {
	nstest.RequireRoot(t)
	t.Setenv("BENCH_TEST_TASK_SECRET", "task-secret-51f0")
	state, jobs := t.TempDir(), t.TempDir()
	checkCleanAtEnd(t, state, jobs)
	task := plainTask(t, "---\nsandbox:\n  env:\n    TOKEN: ${BENCH_TEST_TASK_SECRET}\n    PLAIN: $${NOT_A_REF}\n---\nx\n",
		map[string]string{"verifier/test.sh": "#!/bin/bash\necho \"TOKEN=$TOKEN PLAIN=$PLAIN\"\necho 1 > /logs/verifier/reward.txt\n"})
	code, _, errs := runBench(t, "run", "--simnet", "--state-dir", state, "--jobs-dir", jobs, "--job", "j", task, "-a", "nop",
		"--allow-task-env", "BENCH_TEST_TASK_SECRET")
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	dir := onlyTrial(t, filepath.Join(jobs, "j"), "plain")
	b, _ := os.ReadFile(filepath.Join(dir, "verifier", "test-stdout.txt"))
	if string(b) != "TOKEN=task-secret-51f0 PLAIN=${NOT_A_REF}\n" {
		t.Errorf("verifier saw %q", b)
	}
	for _, f := range []string{"config.json", "result.json"} {
		if b, _ := os.ReadFile(filepath.Join(dir, f)); strings.Contains(string(b), "task-secret-51f0") {
			t.Errorf("%s records the host variable's value", f)
		}
	}
}
