package policyload

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"flowgate/gate"
)

// parsed is one task file after decoding: its config and where each field
// was written.
type parsed struct {
	file string // the path errors name
	cfg  Config
	d    *decoder
}

// checked is what validation derives from a parsed file.
type checked struct {
	spec    gate.Spec
	policy  *gate.Policy
	envRefs []string
}

func (p *parsed) errAt(field, value, msg, fix string) error {
	return fieldErr(p.file, p.d.lineOf(field), field, value, msg, fix)
}

func (p *parsed) present(field string) bool {
	_, ok := p.d.lines[field]
	return ok
}

// spelled returns the key a section was written under: the name, or its
// older alias when the file used that.
func (p *parsed) spelled(name, alias string) string {
	if p.present(alias) {
		return alias
	}
	return name
}

var (
	versionRe  = regexp.MustCompile(`^([0-9]+)(\.[0-9]+){0,2}$`)
	orgNameRe  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$`)
	stepNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	userNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]{0,31}$`)
)

// validate checks every value and compiles the policy. The first error is
// returned.
func (p *parsed) validate() (*checked, error) {
	c := &p.cfg
	refs := make(map[string]bool)
	sb := p.spelled("sandbox", "environment")
	steps := []func() error{
		p.checkVersion,
		p.checkTaskInfo,
		p.checkArtifacts,
		func() error { return p.checkAgentCommon("agent", c.Agent.TimeoutSec, c.Agent.User) },
		func() error { return p.checkVerifier("verifier", &c.Verifier, refs) },
		func() error { return p.checkSandbox(sb, refs) },
		func() error { return p.checkEnv(p.spelled("oracle", "solution")+".env", c.Oracle.Env, refs) },
		func() error { return p.checkSteps(refs) },
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return nil, err
		}
	}
	spec, pol, err := p.network(sb)
	if err != nil {
		return nil, err
	}
	names := sortedKeys(refs)
	if len(names) == 0 {
		names = nil
	}
	return &checked{spec: spec, policy: pol, envRefs: names}, nil
}

func (p *parsed) checkVersion() error {
	v := string(p.cfg.SchemaVersion)
	f := p.spelled("schema_version", "version")
	if !p.present(f) {
		return nil
	}
	m := versionRe.FindStringSubmatch(v)
	if m == nil {
		return p.errAt(f, v, "not a schema version", `write a version such as "1.4"`)
	}
	if m[1] != "1" {
		return p.errAt(f, v, "schema version "+m[1]+" is not supported; bench reads schema 1.x", "")
	}
	return nil
}

func (p *parsed) checkTaskInfo() error {
	t := p.cfg.Task
	if t == nil {
		return nil
	}
	f := "task.name"
	if !p.present(f) {
		f = "task"
	}
	if !orgNameRe.MatchString(t.Name) || strings.Contains(t.Name, "..") {
		return p.errAt(f, t.Name, "a task name is org/name: letters, digits, '.', '_' and '-', no '..'",
			`write a name such as "physics/half-life"`)
	}
	for i, a := range t.Authors {
		if strings.TrimSpace(a.Name) == "" {
			return p.errAt(joinIndex("task.authors", i)+".name", "", "an author needs a name", "")
		}
	}
	for i, k := range t.Keywords {
		if strings.TrimSpace(k) == "" {
			return p.errAt(joinIndex("task.keywords", i), k, "empty keyword", "remove it")
		}
	}
	return nil
}

func (p *parsed) checkArtifacts() error {
	for i, a := range p.cfg.Artifacts {
		f := joinIndex("artifacts", i)
		if p.present(f + ".source") {
			f += ".source"
		}
		if !path.IsAbs(a.Source) {
			return p.errAt(f, a.Source, "an artifact is an absolute path in the sandbox", "write a path such as /app/answer.txt")
		}
		if a.Destination != "" {
			d := path.Clean(a.Destination)
			if path.IsAbs(a.Destination) || d == ".." || strings.HasPrefix(d, "../") || strings.ContainsRune(a.Destination, '\\') {
				return p.errAt(joinIndex("artifacts", i)+".destination", a.Destination,
					"a destination is a relative path inside the trial folder", "write a relative path such as artifacts/answer.txt")
			}
		}
	}
	return nil
}

// MaxTimeoutSec bounds every timeout a task sets: 30 days, far past any
// benchmark, and far below what a duration holds (a larger number would
// overflow into a negative one).
const MaxTimeoutSec = 30 * 24 * 3600

// timeout checks a timeout in seconds: not negative, at most MaxTimeoutSec.
func (p *parsed) timeout(field string, v float64) error {
	if err := p.nonNegative(field, v); err != nil {
		return err
	}
	if v > MaxTimeoutSec {
		return p.errAt(field, formatFloat(v), fmt.Sprintf("longer than %d seconds (30 days)", MaxTimeoutSec), "")
	}
	return nil
}

func (p *parsed) nonNegative(field string, v float64) error {
	if v < 0 {
		return p.errAt(field, formatFloat(v), "must not be negative", "")
	}
	return nil
}

func (p *parsed) checkUser(field string, u User) error {
	if !p.present(field) {
		return nil
	}
	s := string(u)
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		if n == 1<<32-1 {
			return p.errAt(field, s, "not a valid uid", "")
		}
		return nil
	}
	if !userNameRe.MatchString(s) {
		return p.errAt(field, s, "not a valid user name or uid", "")
	}
	return nil
}

func (p *parsed) checkAgentCommon(prefix string, timeout float64, u User) error {
	if err := p.timeout(prefix+".timeout_sec", timeout); err != nil {
		return err
	}
	if err := p.checkUser(prefix+".user", u); err != nil {
		return err
	}
	if u == "root" || u == "0" {
		// The agent's policy is enforced by matching its uid; root is
		// never matched, so the agent would run unfiltered.
		return p.errAt(prefix+".user", string(u), "not supported: the agent must run as an unprivileged user for its network policy to hold",
			"remove it, or name a non-root user")
	}
	if p.present(prefix+".user") && !agentUserRe.MatchString(string(u)) {
		return p.errAt(prefix+".user", string(u), "the agent runs as a user the sandbox creates: give a name, not a uid",
			"use 1 to 32 characters of a-z, 0-9, '_' and '-', starting with a letter or '_'")
	}
	return nil
}

// agentUserRe is what the runtime takes for the user it creates for the
// agent (runtime.validateUser).
var agentUserRe = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

func (p *parsed) checkVerifier(prefix string, v *Verifier, refs map[string]bool) error {
	if err := p.timeout(prefix+".timeout_sec", v.TimeoutSec); err != nil {
		return err
	}
	if err := p.checkUser(prefix+".user", v.User); err != nil {
		return err
	}
	if v.RewardRange != nil {
		f := prefix + ".reward_range"
		if len(v.RewardRange) != 2 || !(v.RewardRange[0] < v.RewardRange[1]) {
			return p.errAt(f, fmt.Sprint(v.RewardRange), "reward_range is [min, max] with min < max", "write [0, 1]")
		}
	}
	return p.checkEnv(prefix+".env", v.Env, refs)
}

func (p *parsed) checkSandbox(sb string, refs map[string]bool) error {
	s := &p.cfg.Sandbox
	img := p.spelled(sb+".docker_image", sb+".image")
	if p.present(img) && strings.TrimSpace(s.DockerImage) == "" {
		return p.errAt(img, s.DockerImage, "empty image name", "remove it, or name an image")
	}
	if s.OS != "" && s.OS != "linux" {
		return p.errAt(sb+".os", s.OS, "not supported: bench runs Linux sandboxes only", `remove it, or write "linux"`)
	}
	for _, n := range []struct {
		key string
		v   int
	}{{"cpus", s.CPUs}, {"memory_mb", s.MemoryMB}, {"storage_mb", s.StorageMB}, {"gpus", s.GPUs}} {
		if n.v < 0 {
			return p.errAt(sb+"."+n.key, strconv.Itoa(n.v), "must not be negative", "")
		}
	}
	if err := p.checkWorkdir(sb+".workdir", s.Workdir); err != nil {
		return err
	}
	if err := p.timeout(sb+".build_timeout_sec", s.BuildTimeoutSec); err != nil {
		return err
	}
	if err := p.checkEnv(sb+".env", s.Env, refs); err != nil {
		return err
	}
	for i, c := range s.SetupCommands {
		f := joinIndex(sb+".setup_commands", i)
		if strings.TrimSpace(c.Command) == "" {
			return p.errAt(f+".command", c.Command, "a setup command needs a command", "")
		}
		if err := p.timeout(f+".timeout_sec", c.TimeoutSec); err != nil {
			return err
		}
		if err := p.checkDir(f+".cwd", c.Cwd); err != nil {
			return err
		}
		if err := p.checkUser(f+".user", c.User); err != nil {
			return err
		}
		if err := p.checkEnv(f+".env", c.Env, refs); err != nil {
			return err
		}
	}
	return nil
}

func (p *parsed) checkDir(field, dir string) error {
	if p.present(field) && !path.IsAbs(dir) {
		return p.errAt(field, dir, "must be an absolute path in the sandbox", "write a path such as /app")
	}
	return nil
}

// reservedDirs are the sandbox paths the runtime mounts itself; a workdir
// may not lie under them.
var reservedDirs = []string{"/proc", "/sys", "/dev", "/run", "/tmp", "/var/tmp", "/home", "/root", "/logs"}

// SystemDirs are the host directories a sandbox sees through overlays (or,
// for the merged-usr links, as symlinks); a workdir may not be one.
var SystemDirs = []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/etc", "/opt", "/var"}

// ValidateWorkdir checks a sandbox work folder: a clean absolute path, not
// /, not under a folder the sandbox manages itself, not a system folder.
func ValidateWorkdir(dir string) error {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return errors.New("give a clean absolute path such as /app")
	}
	if dir == "/" {
		return errors.New("may not be /")
	}
	if strings.ContainsAny(dir, "\x00\n") {
		return errors.New("contains a NUL or newline")
	}
	for _, r := range reservedDirs {
		if dir == r || strings.HasPrefix(dir, r+"/") {
			return fmt.Errorf("lies under %s, which the sandbox manages itself; choose a path such as /app", r)
		}
	}
	if slices.Contains(SystemDirs, dir) {
		return errors.New("is a system directory; choose a path such as /app")
	}
	return nil
}

// checkWorkdir checks a task's workdir as the runtime will.
func (p *parsed) checkWorkdir(field, dir string) error {
	if !p.present(field) {
		return nil
	}
	if err := ValidateWorkdir(dir); err != nil {
		return p.errAt(field, dir, err.Error(), "write a path such as /app")
	}
	return nil
}

// checkEnv checks names and references, and collects the host variables
// the values ask for.
func (p *parsed) checkEnv(field string, env map[string]string, refs map[string]bool) error {
	for _, k := range sortedKeys(env) {
		f := joinKey(field, k)
		if !ValidEnvName(k) {
			return p.errAt(f, "", "not a valid variable name: letters, digits and _, not starting with a digit", "")
		}
		names, err := EnvRefs(env[k])
		if err != nil {
			return p.errAt(f, env[k], err.Error(), "")
		}
		for _, n := range names {
			refs[n] = true
		}
	}
	return nil
}

func (p *parsed) checkSteps(refs map[string]bool) error {
	if s := p.cfg.MultiStepRewardStrategy; p.present("multi_step_reward_strategy") && s != "mean" && s != "final" {
		return p.errAt("multi_step_reward_strategy", s, "unknown strategy; valid: mean, final", "")
	}
	seen := make(map[string]int)
	for i := range p.cfg.Steps {
		st := &p.cfg.Steps[i]
		f := joinIndex("steps", i)
		if !stepNameRe.MatchString(st.Name) || st.Name == "." || st.Name == ".." {
			return p.errAt(f+".name", st.Name, "a step needs a name of letters, digits, '.', '_' and '-' (it names the folder steps/<name>)", "")
		}
		if j, dup := seen[st.Name]; dup {
			return p.errAt(f+".name", st.Name, fmt.Sprintf("duplicate step name (also steps[%d])", j), "")
		}
		seen[st.Name] = i
		if err := p.checkAgentCommon(f+".agent", st.Agent.TimeoutSec, st.Agent.User); err != nil {
			return err
		}
		if err := p.checkVerifier(f+".verifier", &st.Verifier, refs); err != nil {
			return err
		}
		if h := st.Healthcheck; h != nil {
			hf := f + ".healthcheck"
			if strings.TrimSpace(h.Command) == "" {
				return p.errAt(hf+".command", h.Command, "a healthcheck needs a command", "")
			}
			for _, n := range []struct {
				key string
				v   float64
			}{{"interval_sec", h.IntervalSec}, {"timeout_sec", h.TimeoutSec}, {"start_period_sec", h.StartPeriodSec},
				{"start_interval_sec", h.StartIntervalSec}, {"retries", float64(h.Retries)}} {
				if err := p.nonNegative(hf+"."+n.key, n.v); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// entries turns a list into spec entries carrying their field paths.
func entries(field string, vals []string) []gate.Entry {
	out := make([]gate.Entry, len(vals))
	for i, v := range vals {
		out[i] = gate.Entry{Value: v, Field: joinIndex(field, i)}
	}
	return out
}

// parseMode reads a network_mode that was written (present).
func (p *parsed) parseMode(field, v string) (gate.Mode, error) {
	if v == "" {
		return 0, p.errAt(field, "", "empty network_mode; valid: "+strings.Join(gate.ModeNames(), ", "), "remove it for the default, public")
	}
	m, err := gate.ParseMode(v)
	if err != nil {
		return 0, p.errAt(field, v, err.Error(), "")
	}
	return m, nil
}

// network builds and compiles the sandbox's policy, then the agent phase's
// effective one: the agent's network_mode replaces the sandbox's mode and
// every list (an agent mode with no lists of its own admits none of the
// sandbox's); an agent list without an agent mode replaces that list only.
// Both are compiled, so a bad sandbox entry is reported even when the agent
// overrides it.
func (p *parsed) network(sb string) (gate.Spec, *gate.Policy, error) {
	s := &p.cfg.Sandbox
	base := gate.Spec{ModeField: sb + ".network_mode"}
	explicit := p.present(base.ModeField)
	if explicit {
		m, err := p.parseMode(base.ModeField, s.NetworkMode)
		if err != nil {
			return gate.Spec{}, nil, err
		}
		base.Mode = m
	}
	if ai := s.AllowInternet; ai != nil {
		f := sb + ".allow_internet"
		switch {
		case !*ai && !explicit:
			base.Mode = gate.NoNetwork
		case !*ai && base.Mode != gate.NoNetwork:
			return gate.Spec{}, nil, p.errAt(f, "false", "allow_internet = false contradicts network_mode "+base.Mode.String(),
				"remove allow_internet; it is deprecated and network_mode decides")
		case *ai && explicit && base.Mode == gate.NoNetwork:
			return gate.Spec{}, nil, p.errAt(f, "true", "allow_internet = true contradicts network_mode no-network",
				"remove allow_internet; it is deprecated and network_mode decides")
		}
	}
	base.AllowedHosts = entries(sb+".allowed_hosts", s.AllowedHosts)
	base.BlockedHosts = entries(sb+".blocked_hosts", s.BlockedHosts)
	base.BlockedURLs = entries(sb+".blocked_urls", s.BlockedURLs)
	pol, err := p.compile(base)
	if err != nil {
		return gate.Spec{}, nil, err
	}

	a := &p.cfg.Agent
	eff := base
	if p.present("agent.network_mode") {
		m, err := p.parseMode("agent.network_mode", a.NetworkMode)
		if err != nil {
			return gate.Spec{}, nil, err
		}
		eff = gate.Spec{Mode: m, ModeField: "agent.network_mode"}
	}
	overridden := p.present("agent.network_mode")
	if a.AllowedHosts != nil || overridden {
		eff.AllowedHosts = entries("agent.allowed_hosts", a.AllowedHosts)
	}
	if a.BlockedHosts != nil || overridden {
		eff.BlockedHosts = entries("agent.blocked_hosts", a.BlockedHosts)
	}
	if a.BlockedURLs != nil || overridden {
		eff.BlockedURLs = entries("agent.blocked_urls", a.BlockedURLs)
	}
	if overridden || a.AllowedHosts != nil || a.BlockedHosts != nil || a.BlockedURLs != nil {
		if pol, err = p.compile(eff); err != nil {
			return gate.Spec{}, nil, err
		}
	}
	return eff, pol, nil
}

// compile runs gate.Compile and places its error in the file.
func (p *parsed) compile(s gate.Spec) (*gate.Policy, error) {
	pol, err := gate.Compile(s)
	if err != nil {
		var fe *gate.FieldError
		if errors.As(err, &fe) {
			fe.File = p.file
			fe.Line = p.d.lineOf(fe.Field)
			return nil, fe
		}
		return nil, fmt.Errorf("%s: compiling policy: %w", p.file, err)
	}
	return pol, nil
}
