package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"flowgate/gate"
	"flowgate/gate/gateway"
)

// TrialOutcome is what a finished trial reports to its caller.
type TrialOutcome struct {
	// Dir is the trial folder.
	Dir string
	// Reward is the verifier's reward, nil when there is none.
	Reward *float64
	// Err is why the trial failed, nil when it ran to the end (whatever
	// the reward).
	Err error
	// Compromised is set when someone else changed the agent's ruleset
	// while it worked.
	Compromised bool
}

// trial is one run of RunTrial.
type trial struct {
	spec   TrialSpec
	sb     Sandbox
	dir    *trialDir
	result trialResult
	prog   *progress
	log    *slog.Logger
}

// RunTrial runs a task in a new sandbox of rt (the local runtime by
// default): (1) setup and agent install
// as root with the internet, (2) the agent as its own uid under the policy,
// with the gateway attached and its ruleset audited before the agent
// starts, (3) the verifier as root, unfiltered. It writes the trial folder
// and removes the sandbox, also when a phase fails or ctx is cancelled.
//
// An error is returned only when the trial could not start (bad spec, the
// sandbox could not be created); then nothing is left behind. A trial that
// started and failed returns an outcome with Err set and a complete trial
// folder.
func RunTrial(ctx context.Context, rt Runtime, spec TrialSpec) (*TrialOutcome, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	dir, err := newTrialDir(spec.JobsDir, spec.Job, spec.TaskName)
	if err != nil {
		return nil, err
	}
	sb, err := rt.NewSandbox(ctx, Spec{
		Name:      "t-" + dir.id,
		Workdir:   spec.Workdir,
		LogsDir:   dir.file("logs"),
		AgentUser: spec.SandboxUser,
		Hide:      hiddenPaths(spec),
	})
	if err != nil {
		return nil, errors.Join(err, dir.remove())
	}
	t := &trial{spec: spec, sb: sb, dir: dir, prog: newProgress(spec.Progress, spec.JSON),
		log: slog.New(slog.DiscardHandler)}
	t.result.Started = time.Now().UTC()
	out := &TrialOutcome{Dir: dir.path}
	out.Err = t.run(ctx)
	out.Compromised = t.result.Compromised
	out.Reward = t.result.Reward
	if closeErr := sb.Close(); closeErr != nil {
		out.Err = errors.Join(out.Err, fmt.Errorf("removing sandbox: %w", closeErr))
	}
	dropped, settleErr := dir.settleLogs()
	t.result.Dropped = dropped
	if settleErr != nil {
		out.Err = errors.Join(out.Err, fmt.Errorf("collecting /logs: %w", settleErr))
	}
	if out.Err == nil && t.result.Reward == nil {
		out.Err = errors.New("the verifier wrote no reward to /logs/verifier/reward.txt or reward.json")
	}
	if out.Err != nil {
		msg := out.Err.Error()
		t.result.Error = &msg
	}
	t.result.Finished = time.Now().UTC()
	if err := dir.writeJSON("result.json", t.result); err != nil {
		out.Err = errors.Join(out.Err, err)
	}
	t.prog.finish(t.result, dir.path)
	return out, nil
}

func (t *trial) run(ctx context.Context) error {
	cfg := trialConfig{
		Task:    taskInfo{Name: t.spec.TaskName, Dir: t.spec.TaskDir},
		Agent:   agentInfo{Name: string(t.spec.Agent.Kind), Env: envNames(t.spec.AgentEnv)},
		Sandbox: sandboxInfo{Runtime: "local", Name: t.sb.Name(), User: t.sb.AgentUser(), UID: t.sb.AgentUID(), Workdir: t.sb.Workdir()},
		Policy:  describePolicy(t.spec.Policy),
		Version: t.spec.Version,
		Started: t.result.Started,
	}
	if t.spec.Agent.Kind == AgentScript {
		cfg.Agent.Script = filepath.Base(t.spec.Agent.Script)
	}
	if v4, v6 := t.sb.Addrs(); v4.IsValid() {
		cfg.Sandbox.IPv4 = v4.String()
		if v6.IsValid() {
			cfg.Sandbox.IPv6 = v6.String()
		}
	}
	if err := t.dir.writeJSON("config.json", cfg); err != nil {
		return err
	}
	t.prog.start(t.spec.TaskName, t.dir.path, t.spec.Policy.Mode)
	if err := t.setup(ctx); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	if err := t.agentPhase(ctx); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if err := t.verify(ctx); err != nil {
		return fmt.Errorf("verifier: %w", err)
	}
	return nil
}

const sandboxPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// rootEnv is the environment of root phases: nothing of bench's own.
func (t *trial) rootEnv(extra ...[]string) []string {
	env := []string{sandboxPath, "HOME=/root", "USER=root", "LOGNAME=root", "LANG=C.UTF-8"}
	env = append(env, t.spec.TaskEnv...)
	for _, e := range extra {
		env = append(env, e...)
	}
	return env
}

// agentEnv is the agent's fresh environment: PATH, HOME, LANG, the task's
// env, under denylist and allowlist the proxy variables pointing at
// flowgate's explicit proxy, then --agent-env.
func (t *trial) agentEnv(extra []string) []string {
	u := t.sb.AgentUser()
	env := []string{sandboxPath, "HOME=/home/" + u, "USER=" + u, "LOGNAME=" + u, "LANG=C.UTF-8",
		"BENCH_INSTRUCTION_FILE=" + instructionPath}
	env = append(env, t.spec.TaskEnv...)
	if t.spec.Policy.Mode.Proxied() {
		proxy := fmt.Sprintf("http://127.0.0.1:%d", gate.DefaultPorts.Proxy)
		noProxy := "localhost,127.0.0.1,::1"
		env = append(env, "HTTPS_PROXY="+proxy, "https_proxy="+proxy, "HTTP_PROXY="+proxy, "http_proxy="+proxy,
			"NO_PROXY="+noProxy, "no_proxy="+noProxy)
	}
	env = append(env, extra...)
	return append(env, t.spec.AgentEnv...)
}

// Where the install step puts the agent's files inside the sandbox.
const (
	agentDir        = "/installed-agent"
	instructionPath = agentDir + "/instruction.md"
	oraclePath      = "/oracle"
	testsPath       = "/tests"
	caBundle        = "/etc/ssl/certs/ca-certificates.crt"
	localCA         = "/usr/local/share/ca-certificates/flowgate-extra.crt"
)

// setup is phase 1: the task's setup commands, then the agent's install,
// as root (or the agent's user where a command asks) with the internet.
func (t *trial) setup(ctx context.Context) error {
	ph := t.prog.phase("setup")
	out, err := os.OpenFile(t.dir.file("setup.txt"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	// The extra CA goes in first: setup commands have the internet, and
	// under --simnet the internet's certificates chain to it.
	if err := t.installCA(); err != nil {
		t.endPhase(ph, nil)
		return err
	}
	exit := 0
	for i, c := range t.spec.Setup {
		env := t.rootEnv(c.Env)
		if c.As == Agent {
			env = t.agentEnv(c.Env)
		}
		timeout := c.Timeout
		if timeout <= 0 {
			timeout = DefaultSetupTimeout
		}
		fmt.Fprintf(out, "$ %s\n", c.Command)
		res, err := t.sb.Run(ctx, Process{Argv: []string{"/bin/sh", "-c", c.Command}, Env: env, Dir: c.Dir,
			As: c.As, Stdout: out, Stderr: out, Timeout: timeout})
		if err != nil {
			t.endPhase(ph, &res)
			return fmt.Errorf("setup command %d: %w", i, err)
		}
		if res.TimedOut || res.ExitCode != 0 {
			t.endPhase(ph, &res)
			return fmt.Errorf("setup command %d (%q) %s", i, c.Command, describeExit(res))
		}
		exit = res.ExitCode
	}
	if err := t.install(); err != nil {
		t.endPhase(ph, nil)
		return err
	}
	t.endPhase(ph, &Result{ExitCode: exit})
	return nil
}

// installCA adds ExtraCA to the sandbox's system trust store: appended to
// the bundle every phase reads, and as a local certificate, so a setup
// command that rebuilds the bundle (update-ca-certificates) keeps it.
func (t *trial) installCA() error {
	if len(t.spec.ExtraCA) == 0 {
		return nil
	}
	bundle, err := os.ReadFile(caBundle)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("reading the host's CA bundle: %w", err)
	}
	bundle = append(append(bundle, '\n'), t.spec.ExtraCA...)
	if err := t.sb.WriteFile(caBundle, bundle, 0o644, Root); err != nil {
		return fmt.Errorf("installing the extra CA: %w", err)
	}
	if err := t.sb.WriteFile(localCA, t.spec.ExtraCA, 0o644, Root); err != nil {
		return fmt.Errorf("installing the extra CA: %w", err)
	}
	return nil
}

// install puts the agent's files in place, root-owned: the script or the
// oracle, and the instruction.
func (t *trial) install() error {
	if err := t.sb.WriteFile(instructionPath, []byte(t.spec.Prompt), 0o644, Root); err != nil {
		return fmt.Errorf("installing the instruction: %w", err)
	}
	switch t.spec.Agent.Kind {
	case AgentScript:
		data, err := os.ReadFile(t.spec.Agent.Script)
		if err != nil {
			return fmt.Errorf("reading agent script: %w", err)
		}
		if err := t.sb.WriteFile(t.scriptPath(), data, 0o755, Root); err != nil {
			return fmt.Errorf("installing agent script: %w", err)
		}
	case AgentOracle:
		src, err := t.spec.oracleDir()
		if err != nil {
			return err
		}
		if err := t.sb.CopyIn(src, oraclePath, Root); err != nil {
			return fmt.Errorf("installing the oracle: %w", err)
		}
	}
	return nil
}

func (t *trial) scriptPath() string {
	return agentDir + "/" + filepath.Base(t.spec.Agent.Script)
}

func describeExit(r Result) string {
	switch {
	case r.TimedOut:
		return fmt.Sprintf("timed out after %s", r.Duration.Round(time.Millisecond))
	case r.Signaled:
		return fmt.Sprintf("was killed by signal %d", r.ExitCode-128)
	}
	return fmt.Sprintf("exited with status %d", r.ExitCode)
}

// MaxEgressLog bounds a trial's network/egress.jsonl: past it, decisions
// are counted by kind and summed up at the end of the agent phase (an
// agent can cause thousands a second).
const MaxEgressLog = 256 << 20

// agentPhase is phase 2: the gateway attached for the agent's uid, its live
// ruleset audited, then the agent as its own user; afterwards the data
// plane stops and the rules are removed.
func (t *trial) agentPhase(ctx context.Context) (err error) {
	ph := t.prog.phase("agent")
	egress, err := os.OpenFile(t.dir.file("network/egress.jsonl"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer egress.Close()
	egressLog := gateway.NewJSONLogLimit(egress, MaxEgressLog)
	gw, err := gateway.Attach(t.sb.NetNS(), t.sb.AgentUID(), t.spec.Policy, gateway.Options{
		Sandbox: t.sb.Name(), Cgroup: t.sb.Cgroup(), Resolvers: t.sb.Resolvers(),
		ResolvConf: t.sb.ResolvConf(), Record: egressLog, Logger: t.log,
	})
	if err != nil {
		t.endPhase(ph, nil)
		return err
	}
	defer func() {
		closeErr := gw.Close()
		if gw.Tampered() {
			t.result.Compromised = true
			err = errors.Join(err, errors.New("the agent's ruleset was changed by someone else while it worked: the run is compromised"))
		}
		err = errors.Join(err, closeErr, gateway.Detach(t.sb.NetNS()), egressLog.Close())
	}()
	if err := writeFileAtomic(t.dir.file("network/ruleset.nft"), []byte(gw.Ruleset().Text()), 0o644); err != nil {
		t.endPhase(ph, nil)
		return err
	}
	diffs, err := gw.Audit()
	if err != nil {
		t.endPhase(ph, nil)
		return err
	}
	if len(diffs) > 0 {
		t.endPhase(ph, nil)
		var lines []string
		for _, d := range diffs {
			lines = append(lines, d.String())
		}
		return fmt.Errorf("the live ruleset differs from the policy's, so the agent was not started:\n  %s", strings.Join(lines, "\n  "))
	}
	var p *Process
	switch t.spec.Agent.Kind {
	case AgentNop:
		t.endPhase(ph, &Result{})
		return nil
	case AgentScript:
		p = &Process{Argv: []string{t.scriptPath()}, Env: t.agentEnv(nil)}
	case AgentOracle:
		p = &Process{Argv: []string{"/bin/bash", oraclePath + "/solve.sh"}, Env: t.agentEnv(t.spec.OracleEnv)}
	}
	out, err := os.OpenFile(t.dir.file("agent/"+string(t.spec.Agent.Kind)+".txt"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.endPhase(ph, nil)
		return err
	}
	defer out.Close()
	p.As, p.Stdout, p.Stderr, p.Timeout = Agent, out, out, t.spec.AgentTimeout
	res, err := t.sb.Run(ctx, *p)
	t.endPhase(ph, &res)
	if err != nil {
		return err
	}
	if res.TimedOut {
		return fmt.Errorf("the agent %s", describeExit(res))
	}
	return nil
}

// verify is phase 3: every agent process has ended (its PID namespace died
// with it); the verifier's files are copied in only now, and it runs as
// root, unfiltered.
func (t *trial) verify(ctx context.Context) error {
	ph := t.prog.phase("verifier")
	src, err := t.spec.verifierDir()
	if err != nil {
		t.endPhase(ph, nil)
		return err
	}
	// Root must not write through a link the agent left.
	removed, err := t.sb.RemoveVerifierTraps()
	if len(removed) > 0 {
		t.log.Info("removed links and special files the agent left that could steer the verifier", "paths", removed)
	}
	if err != nil {
		t.endPhase(ph, nil)
		return err
	}
	if err := t.sb.CopyIn(src, testsPath, Root); err != nil {
		t.endPhase(ph, nil)
		return fmt.Errorf("installing the verifier: %w", err)
	}
	out, err := os.OpenFile(t.dir.file("verifier/test-stdout.txt"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.endPhase(ph, nil)
		return err
	}
	defer out.Close()
	res, err := t.sb.Run(ctx, Process{Argv: []string{"/bin/bash", testsPath + "/test.sh"}, Env: t.rootEnv(t.spec.VerifierEnv),
		As: Root, Stdout: out, Stderr: out, Timeout: t.spec.VerifierTimeout})
	t.endPhase(ph, &res)
	if err != nil {
		return err
	}
	if res.TimedOut {
		return fmt.Errorf("test.sh %s", describeExit(res))
	}
	reward, rewards, err := readReward(t.dir.file("logs/verifier"))
	if err != nil {
		return err
	}
	t.result.Reward, t.result.Rewards = reward, rewards
	t.prog.reward(reward)
	return nil
}

// endPhase records a phase's timing (and exit, when a process ran).
func (t *trial) endPhase(ph *phaseRun, res *Result) {
	info := phaseInfo{Name: ph.name, Started: ph.started.UTC(), DurationSec: time.Since(ph.started).Seconds()}
	if res != nil {
		code := res.ExitCode
		info.ExitCode = &code
		info.TimedOut = res.TimedOut
	}
	t.result.Phases = append(t.result.Phases, info)
	t.prog.end(ph, info)
}
