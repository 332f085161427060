package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"flowgate/gate"
	"flowgate/policyload"
	"flowgate/runtime"
)

// version is bench's version, recorded in each trial's config.json.
const version = "bench 0.1.0 (flowgate)"

// runFlags are bench run's options.
type runFlags struct {
	agent        string
	jobsDir      string
	job          string
	sandboxUser  string
	agentEnv     []string
	allowTaskEnv []string
	dns          []string
	json         bool
	stateDir     string
	uplink       string
	simnet       bool
	poolV4       string
	poolV6       string
}

func init() {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run TASK -a AGENT",
		Short: "Run a task in a local sandbox under its network policy",
		Long: `run executes a task folder in a fresh local sandbox, in three phases:
  setup     the task's setup_commands and the agent's install, as root, with the internet
  agent     the agent as its own unprivileged user, under the task's sandbox.network_mode
  verifier  verifier/test.sh as root, unfiltered; it writes /logs/verifier/reward.txt
and writes a trial folder <jobs-dir>/<job>/<task>__<8 hex>/.

Agents: nop (does nothing), oracle (the task's oracle/solve.sh), script:PATH
(that script, run as the agent). None of them gets any credential.

A task whose policy this host cannot enforce is refused before anything is
created. The host's environment never enters the sandbox: pass a variable on
purpose with --agent-env NAME=VALUE; a task that asks for a host variable
(${VAR}) is refused unless --allow-task-env VAR is given.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return &exitError{code: 2, err: errors.New("run: give one task folder: bench run TASK -a AGENT")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runTask(cmd, args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.agent, "agent", "a", "", "agent: nop, oracle, or script:PATH (required)")
	fl.StringVar(&f.jobsDir, "jobs-dir", "jobs", "folder for job folders")
	fl.StringVar(&f.job, "job", "", "job name (default: the start time)")
	fl.StringVar(&f.sandboxUser, "sandbox-user", "", "the agent's user inside the sandbox (default: the task's agent.user, else agent)")
	fl.StringArrayVar(&f.agentEnv, "agent-env", nil, "NAME=VALUE passed to the agent on purpose (repeatable)")
	fl.StringArrayVar(&f.allowTaskEnv, "allow-task-env", nil, "host variable a task's env may ask for with ${NAME} (repeatable)")
	fl.StringArrayVar(&f.dns, "dns", nil, "resolver for the sandbox (repeatable; default: the host's, minus loopback stubs)")
	fl.BoolVar(&f.json, "json", false, "print machine-readable progress events, one JSON object per line")
	fl.StringVar(&f.stateDir, "state-dir", runtime.DefaultStateDir, "where sandboxes keep their state")
	fl.BoolVar(&f.simnet, "simnet", false, "run against the built-in simulated internet instead of the host's network")
	fl.StringVar(&f.uplink, "uplink-netns", "", "netns path standing in for the host's network (tests)")
	fl.MarkHidden("uplink-netns")
	fl.StringVar(&f.poolV4, "pool-v4", "", "IPv4 prefix sandboxes take their /30 from (tests; default the runtime's)")
	fl.StringVar(&f.poolV6, "pool-v6", "", `IPv6 prefix for sandboxes, or "none" (tests; with --pool-v4)`)
	fl.MarkHidden("pool-v4")
	fl.MarkHidden("pool-v6")
	rootCmd.AddCommand(cmd)
}

// runTask checks everything it can before creating anything, then runs
// the trial. Exit status: 0 when the trial ran to a reward, 1 when it was
// refused or failed, 2 on bad usage.
func runTask(cmd *cobra.Command, taskDir string, f runFlags) error {
	if f.agent == "" {
		return &exitError{code: 2, err: errors.New("run: give the agent with -a (nop, oracle, script:PATH)")}
	}
	task, err := policyload.LoadTask(taskDir)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	spec, err := trialSpec(task, f)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	if err := spec.Validate(); err != nil {
		return &exitError{code: 1, err: err}
	}
	resolvers, err := parseAddrs(f.dns)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	var pool runtime.Pool
	if f.poolV4 != "" || f.poolV6 != "" {
		if pool, err = runtime.ParsePool(f.poolV4, f.poolV6); err != nil {
			return &exitError{code: 2, err: fmt.Errorf("run: --pool-v4/--pool-v6: %w", err)}
		}
	}
	local := &runtime.Local{StateDir: f.stateDir, Uplink: f.uplink, DNS: resolvers, Pool: pool}
	if f.simnet {
		if f.uplink != "" || len(f.dns) > 0 {
			return &exitError{code: 2, err: errors.New("run: --simnet brings its own uplink and resolver; drop --uplink-netns and --dns")}
		}
		sim, err := runtime.StartSimUplink(f.stateDir)
		if err != nil {
			return &exitError{code: 1, err: err}
		}
		defer func() {
			if err := sim.Close(); err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "bench: removing the simulated internet:", err)
			}
		}()
		local = sim.Local()
		local.Pool = pool
		spec.ExtraCA = sim.CAPEM()
	}
	if err := checkEnforceable(cmd.Context(), local, task.Policy); err != nil {
		return &exitError{code: 1, err: err}
	}
	spec.Progress, spec.JSON = cmd.OutOrStdout(), f.json
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out, err := runtime.RunTrial(ctx, local, spec)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	if out.Err != nil {
		return &exitError{code: 1, err: fmt.Errorf("trial %s failed (see result.json)", out.Dir)}
	}
	return nil
}

// checkEnforceable probes what this host's local runtime can enforce and
// refuses a policy it cannot, naming the mode and the missing piece.
func checkEnforceable(ctx context.Context, l *runtime.Local, p *gate.Policy) error {
	if ctx == nil {
		ctx = context.Background()
	}
	caps := l.Probe(ctx)
	c := policyload.Capabilities{Runtime: "local", IPv6: caps.IPv6, Modes: map[gate.Mode]bool{}, Reasons: map[gate.Mode]string{}}
	why := strings.Join(caps.Missing, "; ")
	for _, m := range []gate.Mode{gate.Public, gate.NoNetwork, gate.Denylist, gate.Allowlist} {
		ok := caps.Root && caps.NFTables && caps.OwnerMatch
		c.Modes[m] = ok
		if !ok {
			c.Reasons[m] = why
		}
	}
	return policyload.CheckCapabilities(p, c)
}

// trialSpec turns a loaded task and the flags into a trial spec, refusing
// what cannot run: multi-step tasks, an unknown agent, host variables not
// allowed with --allow-task-env, users the runtime does not have.
func trialSpec(task *policyload.Task, f runFlags) (runtime.TrialSpec, error) {
	cfg := task.Config
	if len(cfg.Steps) > 0 {
		return runtime.TrialSpec{}, fmt.Errorf("%s: multi-step tasks (steps) are not supported by bench run yet", task.Dir)
	}
	agent, err := runtime.ParseAgent(f.agent)
	if err != nil {
		return runtime.TrialSpec{}, err
	}
	agentEnv, err := parseAgentEnv(f.agentEnv)
	if err != nil {
		return runtime.TrialSpec{}, err
	}
	lookup, err := taskEnvLookup(task, f.allowTaskEnv)
	if err != nil {
		return runtime.TrialSpec{}, err
	}
	user := f.sandboxUser
	if user == "" {
		user = string(cfg.Agent.User)
	}
	if user == "" {
		user = runtime.DefaultAgentUser
	}
	spec := runtime.TrialSpec{
		TaskDir: task.Dir, TaskName: task.Name, Prompt: task.Prompt, Policy: task.Policy, Agent: agent,
		Workdir: cfg.Sandbox.Workdir, SandboxUser: user, AgentEnv: agentEnv,
		AgentTimeout: seconds(cfg.Agent.TimeoutSec), VerifierTimeout: seconds(cfg.Verifier.TimeoutSec),
		JobsDir: f.jobsDir, Job: f.job, Version: version,
	}
	if spec.TaskEnv, err = expandEnv("sandbox.env", cfg.Sandbox.Env, lookup); err != nil {
		return spec, err
	}
	if spec.VerifierEnv, err = expandEnv("verifier.env", cfg.Verifier.Env, lookup); err != nil {
		return spec, err
	}
	if spec.OracleEnv, err = expandEnv("oracle.env", cfg.Oracle.Env, lookup); err != nil {
		return spec, err
	}
	if u := string(cfg.Verifier.User); u != "" && u != "root" && u != "0" {
		return spec, fmt.Errorf("%s: verifier.user %q: the local runtime runs the verifier as root only", task.Dir, u)
	}
	for i, c := range cfg.Sandbox.SetupCommands {
		field := fmt.Sprintf("sandbox.setup_commands[%d]", i)
		env, err := expandEnv(field+".env", c.Env, lookup)
		if err != nil {
			return spec, err
		}
		as := runtime.Root
		switch u := string(c.User); u {
		case "", "root", "0":
		case user:
			as = runtime.Agent
		default:
			return spec, fmt.Errorf("%s: %s.user %q: the local runtime runs setup as root or as the agent's user (%s)", task.Dir, field, u, user)
		}
		spec.Setup = append(spec.Setup, runtime.Command{Command: c.Command, Dir: c.Cwd, Env: env, As: as,
			Timeout: seconds(c.TimeoutSec)})
	}
	return spec, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// parseAgentEnv reads --agent-env NAME=VALUE pairs.
func parseAgentEnv(pairs []string) ([]string, error) {
	var out []string
	for _, kv := range pairs {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || !policyload.ValidEnvName(name) {
			return nil, fmt.Errorf("--agent-env %q: want NAME=VALUE with NAME of letters, digits and _", kv)
		}
		out = append(out, kv)
	}
	return out, nil
}

// taskEnvLookup returns the lookup ${VAR} expansion may use: the host's
// value of a variable named with --allow-task-env, nothing else. A task
// that asks for a variable not allowed is refused here, before anything
// is created, with the flag that would let it through.
func taskEnvLookup(task *policyload.Task, allowed []string) (func(string) (string, bool), error) {
	allow := map[string]bool{}
	for _, n := range allowed {
		if !policyload.ValidEnvName(n) {
			return nil, fmt.Errorf("--allow-task-env %q: not a variable name", n)
		}
		allow[n] = true
	}
	var missing []string
	for _, ref := range task.EnvRefs {
		if !allow[ref] {
			missing = append(missing, ref)
		}
	}
	if len(missing) > 0 {
		flags := make([]string, len(missing))
		for i, m := range missing {
			flags[i] = "--allow-task-env " + m
		}
		return nil, fmt.Errorf("%s: the task's env asks for host variables %s; the host's environment does not enter the sandbox unless you pass %s",
			task.Dir, strings.Join(missing, ", "), strings.Join(flags, " "))
	}
	return func(name string) (string, bool) {
		if !allow[name] {
			return "", false
		}
		return os.LookupEnv(name)
	}, nil
}

// expandEnv resolves an env section into NAME=VALUE pairs, sorted by name.
func expandEnv(field string, env map[string]string, lookup func(string) (string, bool)) ([]string, error) {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(env)) {
		v, err := policyload.ExpandEnv(env[name], lookup)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", field, name, err)
		}
		out = append(out, name+"="+v)
	}
	return out, nil
}

// parseAddrs reads --dns addresses.
func parseAddrs(in []string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, s := range in {
		a, err := netip.ParseAddr(strings.Trim(s, "[]"))
		if err != nil {
			return nil, fmt.Errorf("--dns %q: want an IP address", s)
		}
		out = append(out, a)
	}
	return out, nil
}
