package runtime

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"flowgate/policyload"
)

// DefaultStateDir is where the local runtime keeps per-sandbox state when
// Local.StateDir is empty.
const DefaultStateDir = "/var/lib/flowgate"

// DefaultAgentUser is the agent's user name when Spec.AgentUser is empty.
const DefaultAgentUser = "agent"

// DefaultWorkdir is the agent's working directory when Spec.Workdir is
// empty.
const DefaultWorkdir = "/app"

// HostTable is the nftables table (family inet) the local runtime keeps in
// the uplink namespace for NAT and isolation. Nothing else of the host's
// ruleset is read or changed.
const HostTable = "flowgate_host"

// MaxNameLen is the longest sandbox name Spec.Name may have.
const MaxNameLen = 20

// Local is the local runtime: sandboxes on this host, made of a network
// namespace, a veth pair to the uplink namespace, NAT in HostTable there,
// and a private root filesystem built for each process it runs. The zero
// value is the production configuration. A Local is safe for concurrent
// use and may be copied; the sandboxes it creates keep what they need.
type Local struct {
	// StateDir holds per-sandbox state in StateDir/sandboxes/<name>/ and
	// the lock serialising changes to the uplink (StateDir/host.lock).
	// Default DefaultStateDir. Use one StateDir per uplink namespace.
	StateDir string
	// Pool gives each sandbox its addresses. The zero value is
	// DefaultPool().
	Pool Pool
	// Uplink is the path of the network namespace sandboxes are joined to
	// (veth host side, NAT table, forwarding). "" is the namespace this
	// process runs in, the host's own: production. Tests and `bench
	// doctor` pass a throw-away namespace.
	Uplink string
	// DNS lists the resolvers written into each sandbox's resolv.conf
	// (the --dns flag). When empty, the nameservers of the host's
	// /etc/resolv.conf are used, minus loopback stubs (127.0.0.0/8, ::1)
	// and link-local addresses, which a sandbox cannot reach; when only
	// systemd-resolved's stub is listed, its upstreams in
	// /run/systemd/resolve/resolv.conf are used. If none remain, Create
	// fails and says to pass --dns ADDR.
	DNS []netip.Addr
}

// Owner says who a process runs as or who owns a file in the sandbox.
// The zero value is invalid on purpose: forgetting to choose must not run
// anything as root.
type Owner int

const (
	// Root is uid 0 with every capability: the install phase and the
	// verifier, which are trusted task code and run unfiltered.
	Root Owner = iota + 1
	// Agent is the sandbox's agent user: its own uid and gid, no
	// supplementary groups, no_new_privs, no capabilities.
	Agent
)

// String returns "root" or "agent".
func (o Owner) String() string {
	switch o {
	case Root:
		return "root"
	case Agent:
		return "agent"
	}
	return fmt.Sprintf("Owner(%d)", int(o))
}

// Spec describes one sandbox.
type Spec struct {
	// Name is the trial id: [a-z0-9-], starting and ending with a letter
	// or digit, at most MaxNameLen characters, unique on the host. Every
	// resource is named after it: the netns fg-<name>, the host link
	// (fg-<name>, or fg-<prefix>-<hash> when the name is longer than 12),
	// the cgroup flowgate/<name>, the nft rules' comments, the state
	// directory.
	Name string
	// Workdir is the agent's working directory, an absolute path inside
	// the sandbox (default DefaultWorkdir). It is created empty, owned by
	// the agent, and persists across the sandbox's phases. It may not be /
	// or lie under /proc, /sys, /dev, /run, /tmp, /var/tmp, /home, /root
	// or /logs, and may not be a system directory itself (/usr, /etc, ...).
	Workdir string
	// LogsDir is a host directory bind-mounted read-write at /logs in the
	// sandbox; it keeps its contents after Close. Create makes it owned by
	// root with mode 0755 and makes LogsDir/agent (owned by the agent) and
	// LogsDir/verifier (owned by root, so the agent cannot write a
	// reward). Everything under LogsDir/agent was written by the agent:
	// read it without following symlinks.
	LogsDir string
	// AgentUser is the agent's user name (--sandbox-user, default
	// DefaultAgentUser). If the host has a non-root user of that name, its
	// uid and primary gid are used; otherwise the lowest uid from 60100 up
	// that the host's passwd and group files do not use.
	AgentUser string
	// Hide lists more host paths to mask with an empty read-only tmpfs in
	// the sandbox, for paths that lie under the system directories the
	// sandbox sees (/usr, /etc, /opt, /var): a task folder or jobs
	// directory kept there, for example. Paths outside those directories
	// are never visible and need not be listed. The state directory is
	// always hidden.
	Hide []string
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// validateName checks a sandbox name.
func validateName(name string) error {
	if name == "" {
		return errors.New("sandbox name is empty")
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("sandbox name %q is %d characters long; the limit is %d", name, len(name), MaxNameLen)
	}
	if !nameRE.MatchString(name) {
		return fmt.Errorf("sandbox name %q: use only a-z, 0-9 and '-', starting and ending with a letter or digit", name)
	}
	return nil
}

var userRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// validateUser checks the agent's user name.
func validateUser(name string) error {
	if name == "root" {
		return errors.New("sandbox user may not be root: the agent must run as its own unprivileged user")
	}
	if !userRE.MatchString(name) {
		return fmt.Errorf("sandbox user %q: use 1 to 32 characters of a-z, 0-9, '_' and '-', starting with a letter or '_'", name)
	}
	return nil
}

// systemDirs are the host directories the sandbox sees through overlays
// (or, for the merged-usr links, as symlinks).
var systemDirs = policyload.SystemDirs

// validateWorkdir checks Spec.Workdir (policyload.ValidateWorkdir, which
// task files are checked with too) and returns it cleaned, or the default.
func validateWorkdir(dir string) (string, error) {
	if dir == "" {
		return DefaultWorkdir, nil
	}
	if err := policyload.ValidateWorkdir(dir); err != nil {
		return "", fmt.Errorf("workdir %q: %w", dir, err)
	}
	return dir, nil
}

// validateStateDir checks that a state directory can be named in overlay
// mount options, which use ',' and ':' as separators.
func validateStateDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("state dir %q is not an absolute path", dir)
	}
	if strings.ContainsAny(dir, ",:\\\n\x00 \t") {
		return fmt.Errorf("state dir %q contains a character overlay mount options cannot carry (',', ':', '\\', space)", dir)
	}
	dir = filepath.Clean(dir)
	for _, s := range append([]string{"/"}, systemDirs...) {
		if dir == s || strings.HasPrefix(s, dir+"/") {
			return fmt.Errorf("state dir %q would hold or be a system directory; use a directory of its own such as %s", dir, DefaultStateDir)
		}
	}
	return nil
}

// validateLogsDir checks Spec.LogsDir: an existing directory, not a
// symlink.
func validateLogsDir(dir string) error {
	if dir == "" {
		return errors.New("logs dir is empty: give the trial's host folder to mount at /logs")
	}
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("logs dir %q is not an absolute path", dir)
	}
	if strings.ContainsAny(dir, "\x00\n") {
		return fmt.Errorf("logs dir %q contains a NUL or newline", dir)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("logs dir: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("logs dir %q is not a directory", dir)
	}
	return nil
}

func (l *Local) stateDir() string {
	if l.StateDir == "" {
		return DefaultStateDir
	}
	return l.StateDir
}

func (l *Local) sandboxesDir() string { return filepath.Join(l.stateDir(), "sandboxes") }

// netnsName is the name under /run/netns of a sandbox's namespace.
func netnsName(name string) string { return "fg-" + name }

// hostLinkName is the host side of a sandbox's veth pair: at most 15
// bytes, fg-<name> when it fits, else a prefix of the name and a hash.
func hostLinkName(name string) string {
	if len(name) <= 12 {
		return "fg-" + name
	}
	var h uint32 = 2166136261 // FNV-1a
	for i := 0; i < len(name); i++ {
		h ^= uint32(name[i])
		h *= 16777619
	}
	return fmt.Sprintf("fg-%s-%05x", strings.TrimRight(name[:6], "-"), h&0xfffff)
}
