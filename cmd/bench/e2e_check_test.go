package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// What the end-to-end tests check in a trial folder and in bench's output.

// checkProgress checks the terminal lines or the --json events.
func checkProgress(t *testing.T, out string, asJSON bool, task, dir, mode string) {
	t.Helper()
	if !asJSON {
		re := regexp.MustCompile(`^trial     ` + regexp.QuoteMeta(task) + `  \(` + regexp.QuoteMeta(dir) + `, network_mode ` + mode + `\)\n` +
			`setup     done +\d+\.\ds\n` +
			`agent     done +\d+\.\ds\n` +
			`verifier  done +\d+\.\ds\n` +
			`reward    1\n` +
			`result    ` + regexp.QuoteMeta(dir) + `\n$`)
		if !re.MatchString(out) {
			t.Errorf("progress lines:\n%s", out)
		}
		return
	}
	var kinds []string
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("--json line %q: %v", l, err)
		}
		if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(e["time"])); err != nil {
			t.Errorf("event %v: bad time: %v", e, err)
		}
		k := fmt.Sprint(e["event"])
		if p, ok := e["phase"]; ok {
			k += " " + fmt.Sprint(p)
		}
		switch e["event"] {
		case "trial_start":
			if e["task"] != task || e["trial"] != dir || e["network_mode"] != mode {
				t.Errorf("trial_start %v", e)
			}
		case "phase_end":
			if e["exit_code"] != 0.0 || e["timed_out"] != nil {
				t.Errorf("phase_end %v", e)
			}
			if s, ok := e["elapsed_sec"].(float64); !ok || s < 0 || s > 600 {
				t.Errorf("phase_end %v: elapsed_sec", e)
			}
		case "reward":
			if e["reward"] != 1.0 {
				t.Errorf("reward event %v", e)
			}
		case "trial_end":
			if e["reward"] != 1.0 || e["error"] != nil || e["trial"] != dir {
				t.Errorf("trial_end %v", e)
			}
		}
		kinds = append(kinds, k)
	}
	want := []string{"trial_start", "phase_start setup", "phase_end setup", "phase_start agent", "phase_end agent",
		"phase_start verifier", "phase_end verifier", "reward", "trial_end"}
	if !slices.Equal(kinds, want) {
		t.Errorf("events %q, want %q", kinds, want)
	}
}

// checkTrialFiles checks the trial folder holds exactly what it should.
func checkTrialFiles(t *testing.T, dir string, rewardJSON bool, agentKind string) {
	t.Helper()
	want := []string{"agent/", "agent/" + agentKind + ".txt", "config.json", "network/", "network/egress.jsonl",
		"network/ruleset.nft", "result.json", "setup.txt", "trajectory/", "verifier/", "verifier/test-stdout.txt"}
	if rewardJSON {
		want = append(want, "verifier/reward.json")
	} else {
		want = append(want, "verifier/reward.txt")
	}
	slices.Sort(want)
	if got := listTree(t, dir); !slices.Equal(got, want) {
		t.Errorf("trial folder holds\n %q\nwant\n %q", got, want)
	}
}

// listTree lists a folder's entries, folders with a trailing slash, and
// fails on anything that is neither a file nor a folder.
func listTree(t *testing.T, dir string) []string {
	t.Helper()
	var got []string
	filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			t.Error(err)
			return err
		}
		if p == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case e.IsDir():
			rel += "/"
		case !e.Type().IsRegular():
			t.Errorf("%s in the trial folder is a %v", rel, e.Type())
		}
		got = append(got, rel)
		return nil
	})
	slices.Sort(got)
	return got
}

type configJSON struct {
	Task struct {
		Name string `json:"name"`
		Dir  string `json:"dir"`
	} `json:"task"`
	Agent struct {
		Name   string   `json:"name"`
		Script string   `json:"script"`
		Env    []string `json:"env"`
	} `json:"agent"`
	Model   *string `json:"model"`
	Sandbox struct {
		Runtime string `json:"runtime"`
		Name    string `json:"name"`
		User    string `json:"user"`
		UID     uint32 `json:"uid"`
		Workdir string `json:"workdir"`
		IPv4    string `json:"ipv4"`
	} `json:"sandbox"`
	Policy struct {
		NetworkMode string           `json:"network_mode"`
		Rules       []map[string]any `json:"rules"`
	} `json:"policy"`
	Version string    `json:"version"`
	Started time.Time `json:"started_at"`
}

func readJSON(t *testing.T, p string, v any) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v\n%s", p, err, b)
	}
}

func checkConfig(t *testing.T, dir, task, sandbox string, mc modeCase) configJSON {
	t.Helper()
	var cfg configJSON
	readJSON(t, filepath.Join(dir, "config.json"), &cfg)
	var raw map[string]any
	readJSON(t, filepath.Join(dir, "config.json"), &raw)
	if v, ok := raw["model"]; !ok || v != nil {
		t.Errorf("config.json model = %v (present %v), want null", v, ok)
	}
	if cfg.Task.Name != filepath.Base(task) || cfg.Task.Dir != task {
		t.Errorf("config.json task = %+v", cfg.Task)
	}
	if cfg.Agent.Name != "script" || cfg.Agent.Script != "probe.sh" || !slices.Equal(cfg.Agent.Env, []string{"FOO"}) {
		t.Errorf("config.json agent = %+v, want script probe.sh with env [FOO] (names only)", cfg.Agent)
	}
	s := cfg.Sandbox
	if s.Runtime != "local" || s.Name != sandbox || s.User != "agent" || s.UID == 0 || s.Workdir != "/app" ||
		!regexp.MustCompile(`^10\.209\.\d+\.\d+/30$`).MatchString(s.IPv4) {
		t.Errorf("config.json sandbox = %+v", s)
	}
	if cfg.Policy.NetworkMode != mc.mode || fmt.Sprint(cfg.Policy.Rules) != fmt.Sprint(mc.rules) {
		t.Errorf("config.json policy = %+v, want %s %v", cfg.Policy, mc.mode, mc.rules)
	}
	if cfg.Version != version || time.Since(cfg.Started) > 10*time.Minute {
		t.Errorf("config.json version %q, started %v", cfg.Version, cfg.Started)
	}
	return cfg
}

type resultJSON struct {
	Reward      *float64           `json:"reward"`
	Rewards     map[string]float64 `json:"rewards"`
	Error       *string            `json:"error"`
	Compromised bool               `json:"compromised"`
	Phases      []struct {
		Name     string    `json:"name"`
		Started  time.Time `json:"started_at"`
		Duration float64   `json:"duration_sec"`
		ExitCode *int      `json:"exit_code"`
		TimedOut bool      `json:"timed_out"`
	} `json:"phases"`
	Dropped  []string  `json:"dropped_files"`
	Started  time.Time `json:"started_at"`
	Finished time.Time `json:"finished_at"`
}

func checkResult(t *testing.T, dir string, rewardJSON bool) resultJSON {
	t.Helper()
	var res resultJSON
	readJSON(t, filepath.Join(dir, "result.json"), &res)
	if res.Reward == nil || *res.Reward != 1 || res.Error != nil || res.Compromised || len(res.Dropped) > 0 {
		t.Errorf("result.json: reward %v, error %v, compromised %v, dropped %v", res.Reward, res.Error, res.Compromised, res.Dropped)
	}
	if rewardJSON != (res.Rewards != nil) || (rewardJSON && fmt.Sprint(res.Rewards) != "map[reward:1 sites:2]") {
		t.Errorf("result.json rewards = %v", res.Rewards)
	}
	var names []string
	last := res.Started
	for _, ph := range res.Phases {
		names = append(names, ph.Name)
		if ph.ExitCode == nil || *ph.ExitCode != 0 || ph.TimedOut || ph.Duration < 0 || ph.Started.Before(last) {
			t.Errorf("result.json phase %+v", ph)
		}
		last = ph.Started.Add(time.Duration(ph.Duration * float64(time.Second)))
	}
	if !slices.Equal(names, []string{"setup", "agent", "verifier"}) {
		t.Errorf("result.json phases %q", names)
	}
	if res.Finished.Before(last) || res.Finished.Sub(res.Started) > 5*time.Minute {
		t.Errorf("result.json started %v, finished %v, last phase ended %v", res.Started, res.Finished, last)
	}
	return res
}

// agentLines reads agent/script.txt into its probe lines and a map of
// "key: value" lines.
func agentLines(t *testing.T, dir string) ([]string, map[string]string, []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "agent", "script.txt"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	kv := map[string]string{}
	var env []string
	for _, l := range lines {
		if e, ok := strings.CutPrefix(l, "env: "); ok {
			env = append(env, e)
			continue
		}
		if k, v, ok := strings.Cut(l, ": "); ok {
			kv[k] = v
		} else if k, v, ok := strings.Cut(l, ":"); ok {
			kv[k] = v
		}
	}
	return lines, kv, env
}

func checkAgentOutput(t *testing.T, dir string, mc modeCase, uid int) {
	t.Helper()
	lines, kv, env := agentLines(t, dir)
	want := []string{exampleURL + " " + mc.example, pypiURL + " " + mc.pypi, "variables named like a key: "}
	if len(lines) < 3 || !slices.Equal(lines[:3], want) {
		t.Errorf("agent/script.txt starts\n %q\nwant\n %q\n(all: %q)", lines[:min(3, len(lines))], want, lines)
	}
	if id := fmt.Sprintf("%d %d groups=%d agent", uid, uid, uid); kv["id"] != id {
		t.Errorf("agent id %q, want %q", kv["id"], id)
	}
	for k, v := range map[string]string{"NoNewPrivs": "1", "CapInh": "0000000000000000", "CapPrm": "0000000000000000",
		"CapEff": "0000000000000000", "CapBnd": "0000000000000000", "CapAmb": "0000000000000000",
		"setup sleepers": "gone", "home entries": "0", "home writable": "/home/agent", "task folder": "hidden"} {
		if got, ok := kv[k]; !ok || got != v {
			t.Errorf("agent %s = %q (present %v), want %q", k, got, ok, v)
		}
	}
	if lines[len(lines)-1] != "agent done" {
		t.Errorf("agent/script.txt ends with %q", lines[len(lines)-1])
	}
	wantEnv := []string{"BENCH_INSTRUCTION_FILE=/installed-agent/instruction.md", "FOO=" + agentEnvValue, "HOME=/home/agent",
		"LANG=C.UTF-8", "LOGNAME=agent", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"TASK_GREETING=hello", "USER=agent"}
	if mc.mode == "denylist" || mc.mode == "allowlist" {
		wantEnv = append(wantEnv, "HTTPS_PROXY="+proxyURL, "HTTP_PROXY="+proxyURL, "NO_PROXY=localhost,127.0.0.1,::1",
			"http_proxy="+proxyURL, "https_proxy="+proxyURL, "no_proxy=localhost,127.0.0.1,::1")
	}
	slices.Sort(wantEnv)
	var gotEnv []string
	for _, e := range env {
		// Set by bash and env themselves.
		if !strings.HasPrefix(e, "PWD=") && !strings.HasPrefix(e, "SHLVL=") && !strings.HasPrefix(e, "_=") {
			gotEnv = append(gotEnv, e)
		}
	}
	if !slices.Equal(gotEnv, wantEnv) {
		t.Errorf("agent environment\n %q\nwant\n %q", gotEnv, wantEnv)
	}
}

// checkSetupAndVerifier checks that setup and the verifier, as root,
// reached both sites whatever the agent could reach, and that nothing of
// the agent ran on into the verifier.
func checkSetupAndVerifier(t *testing.T, dir string) {
	t.Helper()
	setup, _ := os.ReadFile(filepath.Join(dir, "setup.txt"))
	ver, _ := os.ReadFile(filepath.Join(dir, "verifier", "test-stdout.txt"))
	for _, want := range []string{"setup reached " + exampleURL + " 200\n", "setup reached " + pypiURL + " 200\n",
		"setup env: TASK_GREETING=hello\n", "setup env: HOME=/root\n"} {
		if !strings.Contains(string(setup), want) {
			t.Errorf("setup.txt lacks %q:\n%s", want, setup)
		}
	}
	for _, want := range []string{"verifier reached " + exampleURL + " 200\n", "verifier reached " + pypiURL + " 200\n",
		"verifier uid: 0\n", "verifier sees sleepers: no\n", "verifier env: TASK_GREETING=hello\n"} {
		if !strings.Contains(string(ver), want) {
			t.Errorf("verifier/test-stdout.txt lacks %q:\n%s", want, ver)
		}
	}
	for _, out := range []string{string(setup), string(ver)} {
		if strings.Contains(out, "FOO=") || strings.Contains(out, "PROXY=") || strings.Contains(out, "proxy=") {
			t.Errorf("a root phase got the agent's variables:\n%s", out)
		}
	}
}

type egressRecord struct {
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox"`
	UID     int       `json:"uid"`
	egressKey
}

func (r *egressRecord) UnmarshalJSON(b []byte) error {
	var m struct {
		Time    time.Time `json:"time"`
		Sandbox string    `json:"sandbox"`
		UID     int       `json:"uid"`
		Proto   string    `json:"proto"`
		Name    string    `json:"name"`
		Verdict string    `json:"verdict"`
		Reason  string    `json:"reason"`
		Rule    string    `json:"rule"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*r = egressRecord{m.Time, m.Sandbox, m.UID, egressKey{m.Proto, m.Name, m.Verdict, m.Reason, m.Rule}}
	return nil
}

// checkEgress checks network/egress.jsonl: one record per decision, all
// of this sandbox and the agent's uid, with exactly the expected distinct
// decisions (none in public and no-network, where the kernel refuses
// without a gateway decision).
func checkEgress(t *testing.T, dir, sandbox string, uid int, want []egressKey) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "network", "egress.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var got []egressKey
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if l == "" {
			continue
		}
		var r egressRecord
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("egress line %q: %v", l, err)
		}
		if r.Sandbox != sandbox || r.UID != uid || r.Time.IsZero() {
			t.Errorf("egress record of another sandbox or uid: %q", l)
		}
		if !slices.Contains(got, r.egressKey) {
			got = append(got, r.egressKey)
		}
	}
	slices.SortFunc(got, func(a, b egressKey) int { return strings.Compare(a.Name, b.Name) })
	if !slices.Equal(got, want) {
		t.Errorf("egress decisions\n %+v\nwant\n %+v", got, want)
	}
}

func checkRuleset(t *testing.T, dir, sandbox string, uid int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "network", "ruleset.nft"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if !strings.HasPrefix(s, "table inet flowgate {\n") || !strings.HasSuffix(s, "}\n") ||
		!strings.Contains(s, fmt.Sprintf("meta skuid %d ", uid)) || !strings.Contains(s, `comment "flowgate `+sandbox+`: `) {
		t.Errorf("network/ruleset.nft:\n%s", s)
	}
}

// checkSecrets checks that the --agent-env value is only where the agent
// printed it, and that bench's own environment reached nothing.
func checkSecrets(t *testing.T, dir string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, _ := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		if strings.Contains(string(b), hostSecret) {
			t.Errorf("%s holds bench's own SECRET_KEY", rel)
		}
		if strings.Contains(string(b), agentEnvValue) && rel != "agent/script.txt" {
			t.Errorf("%s holds the --agent-env value", rel)
		}
		return nil
	})
}
