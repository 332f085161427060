package policyload

import (
	"reflect"
	"strings"
	"testing"

	"flowgate/gate"
)

// fullMD sets every key of the schema, in task.md form.
const fullMD = `---
schema_version: "1.4"
task:
  name: physics/half-life
  version: 0.1.0
  description: Compute a half-life.
  keywords: [physics, decay]
  authors:
    - name: Ada
      email: ada@example.com
metadata:
  difficulty: easy
  tags: [a, b]
  points: 3
reward:
  type: binary
artifacts:
  - /app/answer.txt
  - source: /app/notes
    destination: notes
source: https://example.org/bench
agent:
  timeout_sec: 600
  user: agent
  prompt_prefix: "Be brief."
verifier:
  type: script
  timeout_sec: 60.5
  env:
    MODE: strict
  user: 0
  reward_range: [0, 1]
sandbox:
  network_mode: denylist
  blocked_urls:
    - https://Example.ORG/papers/./lattice-qcd-2026
  blocked_hosts:
    - mirror.example.net
    - 198.51.100.0/24
  docker_image: python:3.12-slim
  os: linux
  cpus: 2
  memory_mb: 4096
  storage_mb: 10240
  gpus: 1
  env:
    TOKEN: ${API_TOKEN}
    HOME: /home/agent
    LITERAL: $${NOT_A_REF}
  setup_commands:
    - command: pip install numpy
      timeout_sec: 120
      cwd: /app
      env:
        PIP_INDEX_URL: ${PIP_INDEX_URL:-https://pypi.org/simple}
      user: root
  workdir: /app
  build_timeout_sec: 600
  allow_internet: true
oracle:
  env:
    ANSWER: "12"
multi_step_reward_strategy: mean
steps:
  - name: first
    min_reward: 0.5
    agent:
      timeout_sec: 30
    verifier:
      timeout_sec: 10
      env:
        STEP_TOKEN: ${API_TOKEN}
    healthcheck:
      command: test -f /app/ready
      interval_sec: 1
      retries: 3
  - name: second
    min_reward: {safety: 1}
---
What is the half-life?
`

// fullTOML is fullMD as a legacy task.toml, with the older spellings.
const fullTOML = `version = "1.4"
artifacts = ["/app/answer.txt", { source = "/app/notes", destination = "notes" }]
source = "https://example.org/bench"
multi_step_reward_strategy = "mean"

[task]
name = "physics/half-life"
version = "0.1.0"
description = "Compute a half-life."
keywords = ["physics", "decay"]

[[task.authors]]
name = "Ada"
email = "ada@example.com"

[metadata]
difficulty = "easy"
tags = ["a", "b"]
points = 3

[reward]
type = "binary"

[agent]
timeout_sec = 600.0
user = "agent"
prompt_prefix = "Be brief."

[verifier]
type = "script"
timeout_sec = 60.5
env = { MODE = "strict" }
user = 0
reward_range = [0.0, 1.0]

[environment]
network_mode = "denylist"
blocked_urls = ["https://Example.ORG/papers/./lattice-qcd-2026"]
blocked_hosts = ["mirror.example.net", "198.51.100.0/24"]
image = "python:3.12-slim"
os = "linux"
cpus = 2
memory_mb = 4096
storage_mb = 10240
gpus = 1
workdir = "/app"
build_timeout_sec = 600
allow_internet = true

[environment.env]
TOKEN = "${API_TOKEN}"
HOME = "/home/agent"
LITERAL = "$${NOT_A_REF}"

[[environment.setup_commands]]
command = "pip install numpy"
timeout_sec = 120
cwd = "/app"
env = { PIP_INDEX_URL = "${PIP_INDEX_URL:-https://pypi.org/simple}" }
user = "root"

[solution]
env = { ANSWER = "12" }

[[steps]]
name = "first"
min_reward = 0.5
agent = { timeout_sec = 30 }
[steps.verifier]
timeout_sec = 10
env = { STEP_TOKEN = "${API_TOKEN}" }
[steps.healthcheck]
command = "test -f /app/ready"
interval_sec = 1
retries = 3

[[steps]]
name = "second"
min_reward = { safety = 1 }
`

func TestLoadTaskMDEveryField(t *testing.T) {
	task := mustLoad(t, map[string]string{"task.md": fullMD})
	c := task.Config
	half := 0.5
	want := Config{
		SchemaVersion: "1.4",
		Task: &TaskInfo{Name: "physics/half-life", Version: "0.1.0", Description: "Compute a half-life.",
			Keywords: []string{"physics", "decay"}, Authors: []Author{{Name: "Ada", Email: "ada@example.com"}}},
		Metadata:  map[string]any{"difficulty": "easy", "tags": []any{"a", "b"}, "points": int64(3)},
		Reward:    map[string]any{"type": "binary"},
		Artifacts: []Artifact{{Source: "/app/answer.txt"}, {Source: "/app/notes", Destination: "notes"}},
		Source:    "https://example.org/bench",
		Agent:     Agent{TimeoutSec: 600, User: "agent", PromptPrefix: "Be brief."},
		Verifier:  Verifier{Type: "script", TimeoutSec: 60.5, Env: map[string]string{"MODE": "strict"}, User: "0", RewardRange: []float64{0, 1}},
		Sandbox: Sandbox{NetworkMode: "denylist",
			BlockedURLs:  []string{"https://Example.ORG/papers/./lattice-qcd-2026"},
			BlockedHosts: []string{"mirror.example.net", "198.51.100.0/24"},
			DockerImage:  "python:3.12-slim", OS: "linux", CPUs: 2, MemoryMB: 4096, StorageMB: 10240, GPUs: 1,
			Env: map[string]string{"TOKEN": "${API_TOKEN}", "HOME": "/home/agent", "LITERAL": "$${NOT_A_REF}"},
			SetupCommands: []SetupCommand{{Command: "pip install numpy", TimeoutSec: 120, Cwd: "/app",
				Env: map[string]string{"PIP_INDEX_URL": "${PIP_INDEX_URL:-https://pypi.org/simple}"}, User: "root"}},
			Workdir: "/app", BuildTimeoutSec: 600, AllowInternet: ptr(true)},
		Oracle:                  Oracle{Env: map[string]string{"ANSWER": "12"}},
		MultiStepRewardStrategy: "mean",
		Steps: []Step{
			{Name: "first", MinReward: &MinReward{Value: &half}, Agent: StepAgent{TimeoutSec: 30},
				Verifier:    Verifier{TimeoutSec: 10, Env: map[string]string{"STEP_TOKEN": "${API_TOKEN}"}},
				Healthcheck: &Healthcheck{Command: "test -f /app/ready", IntervalSec: 1, Retries: 3}},
			{Name: "second", MinReward: &MinReward{Keys: map[string]float64{"safety": 1}}},
		},
	}
	if d := diffConfigs(&c, &want); d != nil {
		t.Fatalf("config differs at %s: got %s, want %s", d.path, d.a, d.b)
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("config:\n got %#v\nwant %#v", c, want)
	}
	if task.Name != "physics/half-life" || task.Prompt != "What is the half-life?\n" {
		t.Errorf("name %q prompt %q", task.Name, task.Prompt)
	}
	if want := []string{"API_TOKEN", "PIP_INDEX_URL"}; !reflect.DeepEqual(task.EnvRefs, want) {
		t.Errorf("EnvRefs = %q, want %q", task.EnvRefs, want)
	}
	if task.Policy.Mode != gate.Denylist || task.Spec.Mode != gate.Denylist {
		t.Fatalf("mode %v / %v", task.Policy.Mode, task.Spec.Mode)
	}
	var rules []string
	for _, r := range task.Policy.Rules {
		rules = append(rules, r.String())
	}
	wantRules := []string{"sandbox.blocked_hosts[0] mirror.example.net", "sandbox.blocked_hosts[1] 198.51.100.0/24",
		"sandbox.blocked_urls[0] https://example.org/papers/lattice-qcd-2026"}
	if !reflect.DeepEqual(rules, wantRules) {
		t.Errorf("rules = %q, want %q", rules, wantRules)
	}
}

func ptr[T any](v T) *T { return &v }

// The legacy layout: task.toml with [environment], instruction.md, and the
// older spellings version, image and solution. It loads to the same config,
// and its field paths use the spelling written.
func TestLoadTaskTOMLLegacy(t *testing.T) {
	tt := mustLoad(t, map[string]string{"task.toml": fullTOML, "instruction.md": "What is the half-life?\n"})
	mt := mustLoad(t, map[string]string{"task.md": fullMD})
	if d := diffConfigs(&tt.Config, &mt.Config); d != nil {
		t.Fatalf("task.toml and task.md load differently at %s: %s vs %s", d.path, d.a, d.b)
	}
	if tt.Prompt != mt.Prompt || !reflect.DeepEqual(tt.EnvRefs, mt.EnvRefs) {
		t.Errorf("prompt %q env %q, want %q %q", tt.Prompt, tt.EnvRefs, mt.Prompt, mt.EnvRefs)
	}
	if got := tt.Spec.BlockedHosts[1].Field; got != "environment.blocked_hosts[1]" {
		t.Errorf("field = %q, want environment.blocked_hosts[1]", got)
	}
	if got := tt.Spec.ModeField; got != "environment.network_mode" {
		t.Errorf("mode field = %q", got)
	}
}

func TestLoadTaskTOMLSandboxSpelling(t *testing.T) {
	task := mustLoad(t, map[string]string{
		"task.toml":      "schema_version = \"1.0\"\n[sandbox]\nnetwork_mode = \"allowlist\"\nallowed_hosts = [\"pypi.org\", \"*.pythonhosted.org\", \"db\"]\n",
		"instruction.md": "Do it.",
	})
	if task.Name != "my-task" {
		t.Errorf("name = %q, want the folder's", task.Name)
	}
	d, err := task.Policy.Target("files.pythonhosted.org")
	if err != nil || !d.Allow || d.Reason != gate.ReasonHostAllowed || d.Rule.Field != "sandbox.allowed_hosts[1]" {
		t.Errorf("files.pythonhosted.org: %+v %v", d, err)
	}
	if d, _ := task.Policy.Target("db"); d.Reason != gate.ReasonServiceAllowed {
		t.Errorf("db: %+v", d)
	}
	if d, _ := task.Policy.Target("example.com"); d.Allow || d.Reason != gate.ReasonNotAllowed {
		t.Errorf("example.com: %+v", d)
	}
}

func TestLoadTaskBothFiles(t *testing.T) {
	files := map[string]string{"task.md": fullMD, "task.toml": fullTOML}
	both := mustLoad(t, files)
	if both.Prompt != "What is the half-life?\n" {
		t.Errorf("prompt %q, want task.md's", both.Prompt)
	}
	files["instruction.md"] = "\nWhat is the half-life?\n\n"
	mustLoad(t, files) // the same prompt, up to surrounding space

	files["instruction.md"] = "Something else."
	_, err := LoadTask(writeTask(t, files))
	checkFieldErr(t, err, wantErr{file: "instruction.md", msg: "differs from the prompt in task.md", fix: "make them agree"})
}

func TestLoadTaskFilesDisagree(t *testing.T) {
	tests := []struct {
		name, md, toml string
		want           wantErr
	}{
		{"mode", md("sandbox:\n  network_mode: no-network\n"), "[environment]\nnetwork_mode = \"public\"\n",
			wantErr{file: "task.toml", line: 2, field: "environment.network_mode", msg: `task.md has "no-network", task.toml has "public"`, fix: "keep one of the two files"}},
		{"list entry", fullMD, strings.Replace(fullTOML, `"198.51.100.0/24"]`, `"198.51.100.0/25"]`, 1),
			wantErr{file: "task.toml", line: 39, field: "environment.blocked_hosts[1]", msg: `task.md has "198.51.100.0/24", task.toml has "198.51.100.0/25"`}},
		{"absent on one side", fullMD, strings.Replace(fullTOML, "allow_internet = true\n", "", 1),
			wantErr{file: "task.toml", field: "environment.allow_internet", msg: "task.md has true, task.toml has absent"}},
		{"env value", fullMD, strings.Replace(fullTOML, `ANSWER = "12"`, `ANSWER = "13"`, 1),
			wantErr{file: "task.toml", line: 63, field: "solution.env.ANSWER", msg: `task.md has "12", task.toml has "13"`}},
		{"metadata type", fullMD, strings.Replace(fullTOML, "points = 3", "points = 3.0", 1),
			wantErr{file: "task.toml", line: 19, field: "metadata.points", msg: "task.md has 3, task.toml has 3"}},
		{"prompt-only file", md("sandbox:\n  cpus: 1\n"), "[sandbox]\ncpus = 2\n",
			wantErr{file: "task.toml", line: 2, field: "sandbox.cpus", msg: "task.md has 1, task.toml has 2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.toml == fullTOML {
				t.Fatal("replacement did not apply")
			}
			_, err := LoadTask(writeTask(t, map[string]string{"task.md": tt.md, "task.toml": tt.toml}))
			checkFieldErr(t, err, tt.want)
		})
	}
}

func TestAliases(t *testing.T) {
	for _, files := range []map[string]string{
		{"task.md": md("version: 1.2\nsolution:\n  env: {A: b}\nenvironment:\n  image: alpine\n")},
		{"task.toml": "version = 1.2\n[solution]\nenv = { A = \"b\" }\n[environment]\nimage = \"alpine\"\n", "instruction.md": "x"},
	} {
		c := mustLoad(t, files).Config
		if c.SchemaVersion != "1.2" || c.Oracle.Env["A"] != "b" || c.Sandbox.DockerImage != "alpine" {
			t.Errorf("aliases not read: %+v", c)
		}
	}
}

func TestAllowInternet(t *testing.T) {
	tests := []struct {
		sandbox string
		want    gate.Mode
	}{
		{"allow_internet: false\n", gate.NoNetwork},
		{"allow_internet: true\n", gate.Public},
		{"allow_internet: false\n  network_mode: no-network\n", gate.NoNetwork},
		{"allow_internet: true\n  network_mode: denylist\n", gate.Denylist},
		{"cpus: 1\n", gate.Public},
	}
	for _, tt := range tests {
		task := mustLoad(t, map[string]string{"task.md": md("sandbox:\n  " + tt.sandbox)})
		if task.Policy.Mode != tt.want {
			t.Errorf("%q: mode %v, want %v", tt.sandbox, task.Policy.Mode, tt.want)
		}
	}
}

// The agent's keys override the sandbox's for the agent phase.
func TestAgentOverride(t *testing.T) {
	sandbox := "sandbox:\n  network_mode: denylist\n  blocked_hosts: [a.example.com]\n  blocked_urls: [https://b.example.com/x]\n"
	tests := []struct {
		name, agent string
		mode        gate.Mode
		modeField   string
		fields      []string
	}{
		{"none", "", gate.Denylist, "sandbox.network_mode", []string{"sandbox.blocked_hosts[0]", "sandbox.blocked_urls[0]"}},
		{"list alone replaces that list", "agent:\n  blocked_hosts: [c.example.com, d.example.com]\n", gate.Denylist, "sandbox.network_mode",
			[]string{"agent.blocked_hosts[0]", "agent.blocked_hosts[1]", "sandbox.blocked_urls[0]"}},
		{"empty list clears it", "agent:\n  blocked_urls: []\n", gate.Denylist, "sandbox.network_mode", []string{"sandbox.blocked_hosts[0]"}},
		{"mode replaces mode and lists", "agent:\n  network_mode: allowlist\n", gate.Allowlist, "agent.network_mode", nil},
		{"mode with its own lists", "agent:\n  network_mode: allowlist\n  allowed_hosts: [pypi.org]\n", gate.Allowlist, "agent.network_mode",
			[]string{"agent.allowed_hosts[0]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			task := mustLoad(t, map[string]string{"task.md": md(sandbox + tt.agent)})
			var fields []string
			for _, r := range task.Policy.Rules {
				fields = append(fields, r.Field)
			}
			if task.Policy.Mode != tt.mode || task.Spec.ModeField != tt.modeField || !reflect.DeepEqual(fields, tt.fields) {
				t.Errorf("mode %v (%s), rules %q; want %v (%s), %q", task.Policy.Mode, task.Spec.ModeField, fields, tt.mode, tt.modeField, tt.fields)
			}
		})
	}
	// An empty allowlist admits the model alone: no host.
	task := mustLoad(t, map[string]string{"task.md": md("sandbox:\n  network_mode: allowlist\n  allowed_hosts: []\n")})
	if d, _ := task.Policy.Target("pypi.org"); d.Allow || d.Reason != gate.ReasonNotAllowed {
		t.Errorf("empty allowlist: %+v", d)
	}
}

func TestFrontMatter(t *testing.T) {
	tests := []struct{ in, prompt string }{
		{"---\n---\nHello\n", "Hello\n"},
		{"\xef\xbb\xbf---\r\nsandbox: {}\r\n---\r\nHello", "Hello"},
		{"--- \nsandbox: {}\n---\t\n\nHello\n---\nmore\n", "\nHello\n---\nmore\n"},
	}
	for _, tt := range tests {
		task := mustLoad(t, map[string]string{"task.md": tt.in})
		if task.Prompt != tt.prompt {
			t.Errorf("%q: prompt %q, want %q", tt.in, task.Prompt, tt.prompt)
		}
	}
	// A multi-step task's prompts live in steps/<name>/; its own may be empty.
	mustLoad(t, map[string]string{"task.md": "---\nsteps:\n  - name: one\n---\n"})
}

// "key:" with no value, or null, reads as absent.
func TestNullIsAbsent(t *testing.T) {
	task := mustLoad(t, map[string]string{"task.md": md("sandbox:\n  network_mode:\n  allow_internet: null\n  blocked_hosts: ~\nagent:\n  network_mode: null\n")})
	if task.Policy.Mode != gate.Public || task.Spec.ModeField != "sandbox.network_mode" || task.Config.Sandbox.AllowInternet != nil {
		t.Errorf("mode %v (%s), allow_internet %v", task.Policy.Mode, task.Spec.ModeField, task.Config.Sandbox.AllowInternet)
	}
}
