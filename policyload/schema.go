package policyload

// The task schema: BenchFlow's task.md front matter and task.toml, schema
// version 1.x. Field tags name the key as written ("key:"name"") and its
// older spelling ("alias=old"); both spellings in one section are an error.
// A zero value means the key was absent, except where a pointer or a nil
// slice is used to tell "absent" from "written empty".
//
// Fields bench does not act on yet are parsed, checked and kept, so a task
// folder written for BenchFlow loads unchanged. Keys that would change
// enforcement and that bench does not support are listed in refusedKeys and
// refused with a message saying so.

// Config is a whole task file as parsed.
type Config struct {
	// SchemaVersion is "1" or "1.x" (alias "version"); only major 1 is read.
	SchemaVersion Version `key:"schema_version,alias=version"`
	// Task names the task package: "org/name", written as a string or as a
	// table with name and details.
	Task *TaskInfo `key:"task"`
	// Metadata is free-form: difficulty, category, tags, ...
	Metadata map[string]any `key:"metadata"`
	// Reward is free-form reward configuration, kept for the verifier.
	Reward map[string]any `key:"reward"`
	// Artifacts are sandbox paths copied into the trial folder.
	Artifacts []Artifact `key:"artifacts"`
	// Source says where the task came from (a URL or a benchmark name).
	Source   string   `key:"source"`
	Agent    Agent    `key:"agent"`
	Verifier Verifier `key:"verifier"`
	// Sandbox is the [sandbox] section, or the legacy [environment].
	Sandbox Sandbox `key:"sandbox,alias=environment"`
	// Oracle is the reference solution's section (legacy alias "solution").
	Oracle Oracle `key:"oracle,alias=solution"`
	// MultiStepRewardStrategy combines step rewards: "mean" or "final".
	MultiStepRewardStrategy string `key:"multi_step_reward_strategy"`
	Steps                   []Step `key:"steps"`
}

// Version is a schema version as written, a number normalised to its
// shortest decimal form ("1.0" written as a number reads "1").
type Version string

// TaskInfo is the [task] section.
type TaskInfo struct {
	Name        string   `key:"name"` // "org/name"
	Version     string   `key:"version"`
	Description string   `key:"description"`
	Keywords    []string `key:"keywords"`
	Authors     []Author `key:"authors"`
}

// Author is one entry of task.authors.
type Author struct {
	Name  string `key:"name"`
	Email string `key:"email"`
}

// Artifact is a sandbox path to keep: a string, or a table with a source
// and a destination inside the trial folder.
type Artifact struct {
	Source      string `key:"source"`
	Destination string `key:"destination"`
}

// User is a user name or a numeric uid as written ("agent", "1000").
type User string

// Agent is the [agent] section. Its network keys, when set, override the
// sandbox's for the agent phase: network_mode replaces the sandbox's mode
// and all its lists; a list alone replaces that list only.
type Agent struct {
	TimeoutSec   float64  `key:"timeout_sec"`
	User         User     `key:"user"`
	PromptPrefix string   `key:"prompt_prefix"`
	NetworkMode  string   `key:"network_mode"`
	AllowedHosts []string `key:"allowed_hosts"`
	BlockedURLs  []string `key:"blocked_urls"`
	BlockedHosts []string `key:"blocked_hosts"`
}

// Verifier is the [verifier] section. The verifier runs as root after the
// agent stops and is not filtered, so network keys here are refused.
type Verifier struct {
	Type        string            `key:"type"`
	TimeoutSec  float64           `key:"timeout_sec"`
	Env         map[string]string `key:"env"`
	User        User              `key:"user"`
	RewardRange []float64         `key:"reward_range"` // [min, max]
}

// Sandbox is the [sandbox] section (legacy [environment]).
type Sandbox struct {
	// NetworkMode is public, no-network, denylist or allowlist; empty
	// means public, or no-network when AllowInternet is false.
	NetworkMode string `key:"network_mode"`
	// AllowedHosts is nil when absent and empty when written as [].
	AllowedHosts    []string          `key:"allowed_hosts"`
	BlockedURLs     []string          `key:"blocked_urls"`
	BlockedHosts    []string          `key:"blocked_hosts"`
	DockerImage     string            `key:"docker_image,alias=image"`
	OS              string            `key:"os"` // "linux" or empty
	CPUs            int               `key:"cpus"`
	MemoryMB        int               `key:"memory_mb"`
	StorageMB       int               `key:"storage_mb"`
	GPUs            int               `key:"gpus"`
	Env             map[string]string `key:"env"`
	SetupCommands   []SetupCommand    `key:"setup_commands"`
	Workdir         string            `key:"workdir"`
	BuildTimeoutSec float64           `key:"build_timeout_sec"`
	// AllowInternet is deprecated: false with no network_mode means
	// no-network. Nil when absent.
	AllowInternet *bool `key:"allow_internet"`
}

// SetupCommand is one entry of sandbox.setup_commands, run as root before
// the agent is installed.
type SetupCommand struct {
	Command    string            `key:"command"`
	TimeoutSec float64           `key:"timeout_sec"`
	Cwd        string            `key:"cwd"`
	Env        map[string]string `key:"env"`
	User       User              `key:"user"`
}

// Oracle is the [oracle] section (legacy [solution]).
type Oracle struct {
	Env map[string]string `key:"env"`
}

// Step is one entry of steps, for multi-step tasks; its prompt lives in
// steps/<name>/instruction.md.
type Step struct {
	Name        string       `key:"name"`
	MinReward   *MinReward   `key:"min_reward"`
	Agent       StepAgent    `key:"agent"`
	Verifier    Verifier     `key:"verifier"`
	Healthcheck *Healthcheck `key:"healthcheck"`
}

// MinReward is a step's pass threshold: one number, or a number per reward
// key ({safety = 1}).
type MinReward struct {
	Value *float64
	Keys  map[string]float64
}

// StepAgent is a step's agent settings. Per-step network policies are not
// supported and refused.
type StepAgent struct {
	TimeoutSec   float64 `key:"timeout_sec"`
	User         User    `key:"user"`
	PromptPrefix string  `key:"prompt_prefix"`
}

// Healthcheck is a readiness check run before a step starts, after Docker
// HEALTHCHECK.
type Healthcheck struct {
	Command          string  `key:"command"`
	IntervalSec      float64 `key:"interval_sec"`
	TimeoutSec       float64 `key:"timeout_sec"`
	StartPeriodSec   float64 `key:"start_period_sec"`
	StartIntervalSec float64 `key:"start_interval_sec"`
	Retries          int     `key:"retries"`
}

// networkKeys are the policy keys of a sandbox section.
var networkKeys = []string{"network_mode", "allowed_hosts", "blocked_urls", "blocked_hosts"}

// refusal explains a key that bench reads but does not support, because
// accepting it would silently change what is enforced.
type refusal struct {
	msg, fix string
}

func refusedKeys(typeName string) map[string]refusal {
	switch typeName {
	case "Verifier":
		r := refusal{"not supported: the verifier runs as root after the agent stops and is never filtered",
			"remove it; the agent's policy is set in sandbox or agent"}
		return keysRefused(r, networkKeys...)
	case "Step":
		r := refusal{"not supported: per-step network policies are not enforced by bench",
			"remove it and set the policy in sandbox or agent, which apply to every step"}
		return keysRefused(r, append([]string{"sandbox", "environment", "allow_internet"}, networkKeys...)...)
	case "StepAgent":
		r := refusal{"not supported: per-step network policies are not enforced by bench",
			"remove it and set the policy in agent, which applies to every step"}
		return keysRefused(r, networkKeys...)
	}
	return nil
}

func keysRefused(r refusal, keys ...string) map[string]refusal {
	m := make(map[string]refusal, len(keys))
	for _, k := range keys {
		m[k] = r
	}
	return m
}
