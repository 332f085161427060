package runtime

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"flowgate/gate"
)

// Unit tests of the trial pieces; they need no root.

func TestParseAgent(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "probe.sh")
	mustWrite(t, exe, "#!/bin/sh\necho hi\n")
	os.Chmod(exe, 0o755)
	plain := filepath.Join(dir, "plain.sh")
	mustWrite(t, plain, "#!/bin/sh\n")
	link := filepath.Join(dir, "link.sh")
	mustSymlink(t, exe, link)
	big := filepath.Join(dir, "big.sh")
	mustWrite(t, big, "")
	os.Chmod(big, 0o755)
	if err := os.Truncate(big, maxScriptSize+1); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	unix.Mkfifo(fifo, 0o755)

	t.Chdir(dir)

	tests := []struct {
		in      string
		want    AgentSpec
		wantErr string
	}{
		{in: "nop", want: AgentSpec{Kind: AgentNop}},
		{in: "oracle", want: AgentSpec{Kind: AgentOracle}},
		{in: "script:" + exe, want: AgentSpec{Kind: AgentScript, Script: exe}},
		{in: "script:probe.sh", want: AgentSpec{Kind: AgentScript, Script: exe}},
		{in: "script:./probe.sh", want: AgentSpec{Kind: AgentScript, Script: exe}},
		{in: "script:link.sh", want: AgentSpec{Kind: AgentScript, Script: link}},
		{in: "script:", wantErr: "agent script: give a path, as in -a script:./probe.sh"},
		{in: "script:missing.sh", wantErr: "agent script missing.sh: stat missing.sh: no such file or directory"},
		{in: "script:plain.sh", wantErr: "agent script plain.sh: not executable (chmod +x plain.sh)"},
		{in: "script:" + dir, wantErr: "agent script " + dir + ": not a regular file"},
		{in: "script:fifo", wantErr: "agent script fifo: not a regular file"},
		{in: "script:big.sh", wantErr: "agent script big.sh: larger than 16777216 bytes"},
		{in: "robot", wantErr: `unknown agent "robot"; valid: nop, oracle, script:PATH`},
		{in: "", wantErr: `unknown agent ""; valid: nop, oracle, script:PATH`},
		{in: "Oracle", wantErr: `unknown agent "Oracle"`},
		{in: "nop ", wantErr: `unknown agent "nop "`},
		{in: "script", wantErr: `unknown agent "script"`},
		{in: "Script:probe.sh", wantErr: `unknown agent "Script:probe.sh"`},
	}
	for _, tt := range tests {
		got, err := ParseAgent(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseAgent(%q) = %+v, %v; want error %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseAgent(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
		if got.String() != tt.in && !strings.HasPrefix(tt.in, "script:") {
			t.Errorf("%+v.String() = %q, want %q", got, got.String(), tt.in)
		}
	}
	if s := (AgentSpec{Kind: AgentScript, Script: exe}).String(); s != "script:"+exe {
		t.Errorf("String() = %q", s)
	}
}

func TestTrialSpecValidate(t *testing.T) {
	task := func(t *testing.T, files ...string) string {
		dir := t.TempDir()
		for _, f := range files {
			mustWrite(t, filepath.Join(dir, f), "#!/bin/bash\n")
		}
		return dir
	}
	pol := &gate.Policy{}
	t.Run("defaults", func(t *testing.T) {
		s := TrialSpec{TaskDir: task(t, "verifier/test.sh"), Policy: pol, Agent: AgentSpec{Kind: AgentNop}}
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		if s.TaskName != filepath.Base(s.TaskDir) || s.Workdir != DefaultWorkdir || s.SandboxUser != DefaultAgentUser ||
			s.AgentTimeout != DefaultAgentTimeout || s.VerifierTimeout != DefaultVerifierTimeout || !filepath.IsAbs(s.JobsDir) || filepath.Base(s.JobsDir) != "jobs" {
			t.Errorf("defaults not filled: %+v", s)
		}
		if _, err := time.Parse("2006-01-02__15-04-05", s.Job); err != nil {
			t.Errorf("default job name %q is not the start time: %v", s.Job, err)
		}
		job := s.Job
		if err := s.Validate(); err != nil || s.Job != job {
			t.Errorf("second Validate: %v, job %q -> %q", err, job, s.Job)
		}
	})
	t.Run("legacy folders", func(t *testing.T) {
		s := TrialSpec{TaskDir: task(t, "tests/test.sh", "solution/solve.sh"), Policy: pol, Agent: AgentSpec{Kind: AgentOracle}}
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		if v, _ := s.verifierDir(); v != filepath.Join(s.TaskDir, "tests") {
			t.Errorf("verifierDir = %s", v)
		}
		if o, _ := s.oracleDir(); o != filepath.Join(s.TaskDir, "solution") {
			t.Errorf("oracleDir = %s", o)
		}
	})
	t.Run("verifier wins over tests", func(t *testing.T) {
		s := TrialSpec{TaskDir: task(t, "tests/test.sh", "verifier/test.sh"), Policy: pol}
		if v, _ := s.verifierDir(); v != filepath.Join(s.TaskDir, "verifier") {
			t.Errorf("verifierDir = %s", v)
		}
	})
	bad := []struct {
		name    string
		spec    func(t *testing.T) TrialSpec
		wantErr string
	}{
		{"no policy", func(t *testing.T) TrialSpec { return TrialSpec{TaskDir: task(t, "verifier/test.sh")} }, "trial: no policy"},
		{"missing task", func(t *testing.T) TrialSpec {
			return TrialSpec{TaskDir: filepath.Join(t.TempDir(), "nope"), Policy: pol}
		}, "trial: task folder: stat "},
		{"task is a file", func(t *testing.T) TrialSpec {
			d := task(t, "f")
			return TrialSpec{TaskDir: filepath.Join(d, "f"), Policy: pol}
		}, "is not a directory"},
		{"no verifier", func(t *testing.T) TrialSpec { return TrialSpec{TaskDir: task(t, "oracle/solve.sh"), Policy: pol} },
			"has no verifier: want verifier/test.sh (or the legacy tests/test.sh)"},
		{"verifier is a folder", func(t *testing.T) TrialSpec {
			return TrialSpec{TaskDir: task(t, "verifier/test.sh/x"), Policy: pol}
		}, "has no verifier"},
		{"oracle without solve.sh", func(t *testing.T) TrialSpec {
			return TrialSpec{TaskDir: task(t, "verifier/test.sh"), Policy: pol, Agent: AgentSpec{Kind: AgentOracle}}
		}, "trial: agent oracle: task "},
		{"job with slash", func(t *testing.T) TrialSpec {
			return TrialSpec{TaskDir: task(t, "verifier/test.sh"), Policy: pol, Job: "a/b"}
		}, `trial: job name "a/b": must not contain '/'`},
		{"job dot-dot", func(t *testing.T) TrialSpec {
			return TrialSpec{TaskDir: task(t, "verifier/test.sh"), Policy: pol, Job: ".."}
		}, `trial: job name ".."`},
		{"empty setup command", func(t *testing.T) TrialSpec {
			return TrialSpec{TaskDir: task(t, "verifier/test.sh"), Policy: pol, Setup: []Command{{Command: " ", As: Root}}}
		}, "trial: setup command 0 is empty"},
		{"setup command without user", func(t *testing.T) TrialSpec {
			return TrialSpec{TaskDir: task(t, "verifier/test.sh"), Policy: pol, Setup: []Command{{Command: "true"}}}
		}, "trial: setup command 0: no user"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.spec(t)
			if err := s.Validate(); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Validate: %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestProgressJSON(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, true)
	p.start("half-life", "/jobs/j/half-life__0123abcd", gate.Denylist)
	ph := p.phase("setup")
	code := 0
	p.end(ph, phaseInfo{Name: "setup", DurationSec: 0.5, ExitCode: &code})
	ph = p.phase("agent")
	code2 := -1
	p.end(ph, phaseInfo{Name: "agent", DurationSec: 2, ExitCode: &code2, TimedOut: true})
	p.phase("verifier")
	p.reward(nil) // no event
	r := 0.5
	p.reward(&r)
	msg := "agent: the agent timed out after 2s"
	p.finish(trialResult{Reward: &r, Error: &msg}, "/jobs/j/half-life__0123abcd")

	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	var events []map[string]any
	for _, l := range lines {
		var e map[string]any
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("line %q is not JSON: %v", l, err)
		}
		ts, ok := e["time"].(string)
		if _, err := time.Parse(time.RFC3339Nano, ts); !ok || err != nil {
			t.Errorf("event %v: time %q is not RFC 3339", e, ts)
		}
		delete(e, "time")
		events = append(events, e)
	}
	want := []map[string]any{
		{"event": "trial_start", "task": "half-life", "trial": "/jobs/j/half-life__0123abcd", "network_mode": "denylist"},
		{"event": "phase_start", "phase": "setup"},
		{"event": "phase_end", "phase": "setup", "elapsed_sec": 0.5, "exit_code": 0.0},
		{"event": "phase_start", "phase": "agent"},
		{"event": "phase_end", "phase": "agent", "elapsed_sec": 2.0, "exit_code": -1.0, "timed_out": true},
		{"event": "phase_start", "phase": "verifier"},
		{"event": "reward", "reward": 0.5},
		{"event": "trial_end", "trial": "/jobs/j/half-life__0123abcd", "reward": 0.5, "error": msg},
	}
	if !reflect.DeepEqual(events, want) {
		t.Errorf("events:\n got %v\nwant %v", events, want)
	}
}

func TestProgressText(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, false)
	p.start("half-life", "/j/t", gate.Public)
	ph := p.phase("setup")
	zero, three := 0, 3
	p.end(ph, phaseInfo{Name: "setup", DurationSec: 1.25, ExitCode: &zero})
	p.end(p.phase("agent"), phaseInfo{Name: "agent", DurationSec: 12.34, ExitCode: &three})
	p.end(p.phase("verifier"), phaseInfo{Name: "verifier", DurationSec: 600, TimedOut: true})
	r := 1.0
	p.reward(&r)
	p.finish(trialResult{Reward: &r}, "/j/t")
	msg := "verifier: boom"
	p.finish(trialResult{Error: &msg}, "/j/t")
	want := "trial     half-life  (/j/t, network_mode public)\n" +
		"setup     done           1.2s\n" +
		"agent     exit 3        12.3s\n" +
		"verifier  timed out    600.0s\n" +
		"reward    1\n" +
		"result    /j/t\n" +
		"failed    verifier: boom\nresult    /j/t\n"
	if buf.String() != want {
		t.Errorf("progress text:\n%s\nwant:\n%s", buf.String(), want)
	}
	// No writer: nothing to do, no panic.
	q := newProgress(nil, true)
	q.start("x", "y", gate.NoNetwork)
	q.finish(trialResult{}, "y")
}

func TestConfigKeepsNoEnvValues(t *testing.T) {
	names := envNames([]string{"FOO=secretvalue", "EMPTY=", "EQ=a=b"})
	if !slices.Equal(names, []string{"FOO", "EMPTY", "EQ"}) {
		t.Errorf("envNames = %q", names)
	}
	if n := envNames(nil); n == nil || len(n) != 0 {
		t.Errorf("envNames(nil) = %#v, want an empty list (config.json shows [])", n)
	}
	b, _ := json.Marshal(trialConfig{Agent: agentInfo{Name: "script", Env: names}, Policy: describePolicy(&gate.Policy{})})
	if strings.Contains(string(b), "secretvalue") || !strings.Contains(string(b), `"model":null`) {
		t.Errorf("config.json: %s", b)
	}
}
