package runtime

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"flowgate/gate"
)

// AgentKind is one of the agents bench runs without a model.
type AgentKind string

// The agents this runtime knows.
const (
	AgentNop    AgentKind = "nop"    // does nothing
	AgentOracle AgentKind = "oracle" // runs the task's oracle/solve.sh
	AgentScript AgentKind = "script" // runs a script given on the command line
)

// AgentSpec says which agent works on the task.
type AgentSpec struct {
	Kind AgentKind
	// Script is the host path of the script, for AgentScript.
	Script string
}

// String returns the agent as -a spells it.
func (a AgentSpec) String() string {
	if a.Kind == AgentScript {
		return "script:" + a.Script
	}
	return string(a.Kind)
}

// ParseAgent reads -a: nop, oracle or script:PATH. A script must be a
// regular, executable file.
func ParseAgent(s string) (AgentSpec, error) {
	switch {
	case s == string(AgentNop), s == string(AgentOracle):
		return AgentSpec{Kind: AgentKind(s)}, nil
	case strings.HasPrefix(s, "script:"):
		p := strings.TrimPrefix(s, "script:")
		if p == "" {
			return AgentSpec{}, errors.New("agent script: give a path, as in -a script:./probe.sh")
		}
		st, err := os.Stat(p)
		if err != nil {
			return AgentSpec{}, fmt.Errorf("agent script %s: %w", p, err)
		}
		if !st.Mode().IsRegular() {
			return AgentSpec{}, fmt.Errorf("agent script %s: not a regular file", p)
		}
		if st.Mode().Perm()&0o111 == 0 {
			return AgentSpec{}, fmt.Errorf("agent script %s: not executable (chmod +x %s)", p, p)
		}
		if st.Size() > maxScriptSize {
			return AgentSpec{}, fmt.Errorf("agent script %s: larger than %d bytes", p, maxScriptSize)
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return AgentSpec{}, fmt.Errorf("agent script %s: %w", p, err)
		}
		return AgentSpec{Kind: AgentScript, Script: abs}, nil
	}
	return AgentSpec{}, fmt.Errorf("unknown agent %q; valid: nop, oracle, script:PATH", s)
}

const maxScriptSize = 16 << 20

// Command is one setup command of the task, run in phase 1.
type Command struct {
	Command string
	Dir     string
	Env     []string // NAME=VALUE, already resolved
	As      Owner
	Timeout time.Duration
}

// TrialSpec is everything a trial needs, checked by the caller (cmd/bench)
// before RunTrial creates anything.
type TrialSpec struct {
	// TaskDir is the task folder; TaskName its name for the trial folder
	// and config.json.
	TaskDir  string
	TaskName string
	// Prompt is the task's instruction, handed to the agent.
	Prompt string
	// Policy is the agent phase's effective policy.
	Policy *gate.Policy
	Agent  AgentSpec
	// Workdir is sandbox.workdir (default DefaultWorkdir).
	Workdir string
	// SandboxUser is the agent's user name (default DefaultAgentUser).
	SandboxUser string
	// Setup are the task's setup_commands, in order.
	Setup []Command
	// TaskEnv is sandbox.env, resolved; every phase gets it.
	TaskEnv []string
	// AgentEnv are --agent-env variables, for the agent phase only.
	AgentEnv []string
	// OracleEnv is the oracle section's env, for the oracle agent.
	OracleEnv []string
	// VerifierEnv is verifier.env, for the verifier.
	VerifierEnv []string
	// AgentTimeout and VerifierTimeout bound phases 2 and 3.
	AgentTimeout    time.Duration
	VerifierTimeout time.Duration
	// JobsDir and Job place the trial folder: JobsDir/Job/<task>__<8 hex>.
	JobsDir string
	Job     string
	// Hide are more host paths to mask inside the sandbox (the task
	// folder, the jobs dir, the invoking user's home are always masked).
	Hide []string
	// ExtraCA, when set, is added to the sandbox's system trust store (the
	// simulated internet's CA under bench run --simnet).
	ExtraCA []byte
	// Version is bench's version for config.json.
	Version string
	// Progress receives one line per phase; JSON makes it JSON events.
	Progress io.Writer
	JSON     bool
}

// Default phase bounds, when the task gives none.
const (
	DefaultSetupTimeout    = 10 * time.Minute
	DefaultAgentTimeout    = 30 * time.Minute
	DefaultVerifierTimeout = 10 * time.Minute
)

// Validate checks the spec and fills its defaults; it creates nothing.
// RunTrial calls it again, so a caller may check a spec before making what
// the trial needs (a simulated uplink) and refuse early.
func (t *TrialSpec) Validate() error {
	if t.Policy == nil {
		return errors.New("trial: no policy")
	}
	st, err := os.Stat(t.TaskDir)
	if err != nil {
		return fmt.Errorf("trial: task folder: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("trial: task folder %s is not a directory", t.TaskDir)
	}
	if t.TaskName == "" {
		t.TaskName = filepath.Base(t.TaskDir)
	}
	if t.Workdir == "" {
		t.Workdir = DefaultWorkdir
	}
	if t.SandboxUser == "" {
		t.SandboxUser = DefaultAgentUser
	}
	if t.AgentTimeout <= 0 {
		t.AgentTimeout = DefaultAgentTimeout
	}
	if t.VerifierTimeout <= 0 {
		t.VerifierTimeout = DefaultVerifierTimeout
	}
	if t.JobsDir == "" {
		t.JobsDir = "jobs"
	}
	// The trial's /logs is bind-mounted from under it: it must be absolute.
	abs, err := filepath.Abs(t.JobsDir)
	if err != nil {
		return fmt.Errorf("trial: jobs folder %s: %w", t.JobsDir, err)
	}
	t.JobsDir = abs
	if t.Job == "" {
		t.Job = time.Now().Format("2006-01-02__15-04-05")
	}
	if strings.ContainsAny(t.Job, "/\x00") || t.Job == "." || t.Job == ".." {
		return fmt.Errorf("trial: job name %q: must not contain '/'", t.Job)
	}
	if _, err := t.verifierDir(); err != nil {
		return err
	}
	if t.Agent.Kind == AgentOracle {
		if _, err := t.oracleDir(); err != nil {
			return err
		}
	}
	for i, c := range t.Setup {
		if strings.TrimSpace(c.Command) == "" {
			return fmt.Errorf("trial: setup command %d is empty", i)
		}
		if c.As != Root && c.As != Agent {
			return fmt.Errorf("trial: setup command %d: no user", i)
		}
	}
	return nil
}

// verifierDir finds the task's verifier folder: verifier/ (BenchFlow) or
// the legacy tests/, holding test.sh.
func (t *TrialSpec) verifierDir() (string, error) {
	for _, d := range []string{"verifier", "tests"} {
		p := filepath.Join(t.TaskDir, d)
		if st, err := os.Stat(filepath.Join(p, "test.sh")); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("trial: task %s has no verifier: want verifier/test.sh (or the legacy tests/test.sh)", t.TaskDir)
}

// oracleDir finds the task's reference solution: oracle/ or the legacy
// solution/, holding solve.sh.
func (t *TrialSpec) oracleDir() (string, error) {
	for _, d := range []string{"oracle", "solution"} {
		p := filepath.Join(t.TaskDir, d)
		if st, err := os.Stat(filepath.Join(p, "solve.sh")); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("trial: agent oracle: task %s has no oracle/solve.sh (or the legacy solution/solve.sh)", t.TaskDir)
}
