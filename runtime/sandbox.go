package runtime

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
)

// Runtime makes sandboxes. Local, the embedded default, is the one this
// package has; a trial (RunTrial) needs nothing else of a runtime.
type Runtime interface {
	// Probe reports what the runtime can enforce on this host.
	Probe(ctx context.Context) Capabilities
	// NewSandbox creates a sandbox; on error nothing of it is left.
	NewSandbox(ctx context.Context, spec Spec) (Sandbox, error)
}

// Sandbox is one trial's sandbox, as a trial uses it: a network namespace
// the gateway attaches to for the agent's uid, processes run in three
// phases as root or as the agent, files put in, and removal.
type Sandbox interface {
	Name() string
	// NetNS is the sandbox's network namespace; the sandbox owns it.
	NetNS() netns.NsHandle
	NetNSPath() string
	// ResolvConf is the host path of the sandbox's resolv.conf, and
	// Resolvers the servers it names.
	ResolvConf() string
	Resolvers() []netip.AddrPort
	AgentUser() string
	AgentUID() uint32
	AgentGID() uint32
	Workdir() string
	// Cgroup is the agent phase's cgroup v2 path, "" when there is none.
	Cgroup() string
	Addrs() (v4, v6 netip.Prefix)
	IPv6() bool
	Run(ctx context.Context, p Process) (Result, error)
	WriteFile(path string, data []byte, mode os.FileMode, owner Owner) error
	CopyIn(hostPath, sandboxPath string, owner Owner) error
	// RemoveVerifierTraps removes, before the verifier runs, the links
	// and special files the agent left that could steer root's writes,
	// and returns their paths.
	RemoveVerifierTraps() ([]string, error)
	// Close ends every process and removes everything the sandbox made.
	Close() error
}

var (
	_ Runtime = (*Local)(nil)
	_ Sandbox = (*LocalSandbox)(nil)
)

// NewSandbox is Create behind the Runtime interface.
func (l *Local) NewSandbox(ctx context.Context, spec Spec) (Sandbox, error) {
	sb, err := l.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

// LocalSandbox is one trial's sandbox from the local runtime. Its methods
// are safe for concurrent use, but it runs one process (Run, WriteFile or
// CopyIn) at a time. Close removes it.
type LocalSandbox struct {
	local Local // the creating Local's configuration
	st    *state
	lay   sandboxLayout
	ns    netns.NsHandle

	mu     sync.Mutex
	active *activeRun // the running init, if any
	closed bool

	closeOnce sync.Once
	closeErr  error
}

// Name returns the sandbox's name (Spec.Name).
func (s *LocalSandbox) Name() string { return s.st.Name }

// NetNS returns the sandbox's network namespace, for gateway.Attach. The
// sandbox owns the handle: the caller must not close it, and must be done
// with it (detach the gateway) before Close.
func (s *LocalSandbox) NetNS() netns.NsHandle { return s.ns }

// NetNSPath returns the path of the sandbox's network namespace,
// /run/netns/fg-<name>.
func (s *LocalSandbox) NetNSPath() string { return "/run/netns/" + s.st.NetNS }

// ResolvConf returns the host path of the sandbox's resolv.conf (what
// gateway.Options.ResolvConf reads); it is bind-mounted at
// /etc/resolv.conf in the sandbox.
func (s *LocalSandbox) ResolvConf() string { return s.lay.file("resolv.conf") }

// Resolvers returns the sandbox's upstream resolvers (port 53), the
// nameservers of its resolv.conf.
func (s *LocalSandbox) Resolvers() []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(s.st.DNS))
	for _, a := range s.st.DNS {
		out = append(out, netip.AddrPortFrom(a, 53))
	}
	return out
}

// AgentUser returns the agent's user name inside the sandbox.
func (s *LocalSandbox) AgentUser() string { return s.st.AgentUser }

// AgentUID returns the uid agent processes run as: the uid the gateway's
// owner match filters.
func (s *LocalSandbox) AgentUID() uint32 { return s.st.AgentUID }

// AgentGID returns the agent's primary (and only) gid.
func (s *LocalSandbox) AgentGID() uint32 { return s.st.AgentGID }

// Workdir returns the agent's working directory inside the sandbox.
func (s *LocalSandbox) Workdir() string { return s.st.Workdir }

// Cgroup returns the cgroup v2 path (relative to the cgroup2 mount) that
// every agent-phase process runs in, for gateway.Options.Cgroup; "" when
// the host has no cgroup v2. Root phases run in a sibling cgroup, so a
// cgroup match never filters the verifier.
func (s *LocalSandbox) Cgroup() string {
	if s.st.Cgroup == "" {
		return ""
	}
	return cgroupRoot + "/" + s.st.Name + "/agent"
}

// Addrs returns the sandbox's own addresses on eth0, with their prefixes;
// v6 is invalid when the sandbox has no IPv6 (see IPv6).
func (s *LocalSandbox) Addrs() (v4, v6 netip.Prefix) {
	v4 = peerAddr(s.st.Net4)
	if s.st.IPv6 {
		v6 = peerAddr(s.st.Net6)
	}
	return v4, v6
}

// IPv6 reports whether the sandbox has IPv6 connectivity: the pool has an
// IPv6 prefix and the uplink could forward IPv6 without changing how the
// host handles router advertisements (see forwarding.go).
func (s *LocalSandbox) IPv6() bool { return s.st.IPv6 }

// HostLink returns the name of the host side of the sandbox's veth pair,
// in the uplink namespace.
func (s *LocalSandbox) HostLink() string { return s.st.HostLink }

// Close ends every process of the sandbox, then removes its cgroups, its
// rules in the host table (and the table when no other sandbox has rules
// there), its veth pair, its network namespace and its state directory
// (overlay upper dirs, home, workdir); LogsDir stays. It keeps going past
// failures and returns them joined; a sandbox whose removal failed keeps
// its state, so `bench gc` can finish the job once this process has
// exited. Calling it again returns the first result.
func (s *LocalSandbox) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		act := s.active
		s.mu.Unlock()
		if act != nil {
			act.kill()
			<-act.done
		}
		s.ns.Close()
		s.closeErr = s.local.teardown(s.st, s.lay.dir, nil)
		if s.closeErr != nil {
			s.closeErr = fmt.Errorf("removing sandbox %s: %w", s.st.Name, s.closeErr)
		}
	})
	return s.closeErr
}

// teardown removes what st records, in reverse order of creation; what is
// already gone is skipped. note, if set, hears one line per removed
// thing. The state directory goes last, and only when everything else
// went, so that a failed removal can be retried from the record.
func (l *Local) teardown(st *state, dir string, note func(string)) error {
	if note == nil {
		note = func(string) {}
	}
	var errs []error
	if st.Cgroup != "" {
		ok, err := removeCgroups(st.Cgroup)
		errs = append(errs, err)
		if ok && err == nil {
			note("cgroup " + strings.TrimPrefix(st.Cgroup, cgroup2Mount()+"/"))
		}
	}
	if st.Rules || st.HostLink != "" {
		errs = append(errs, l.teardownUplink(st, note))
	}
	if st.NetNS != "" {
		ok, err := deleteNetNS(st.NetNS)
		errs = append(errs, err)
		if ok {
			note("netns " + st.NetNS)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing state dir: %w", err)
	}
	note("state " + dir)
	return nil
}

// teardownUplink removes the sandbox's host rules (under the host lock)
// and its host link. An uplink namespace that no longer exists took both
// with it.
func (l *Local) teardownUplink(st *state, note func(string)) error {
	uplink, err := openUplink(st.Uplink)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer uplink.Close()
	var errs []error
	if st.Rules {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		lk, err := l.lockHost(ctx)
		cancel()
		if err != nil {
			errs = append(errs, err)
		} else {
			n, dropped, err := removeHostRules(uplink, st.Name)
			errs = append(errs, err)
			if n > 0 {
				note(fmt.Sprintf("nft rules of %s in inet %s (%d)", st.Name, HostTable, n))
			}
			if dropped {
				note("nft table inet " + HostTable)
				links, err := l.revertForwarding(uplink, st.Uplink)
				errs = append(errs, err)
				for _, ln := range links {
					note("force_forwarding on " + ln)
				}
			}
			lk.unlock()
		}
	}
	if st.HostLink != "" {
		ok, err := deleteLink(uplink, st.HostLink)
		errs = append(errs, err)
		if ok {
			note("link " + st.HostLink)
		}
	}
	return errors.Join(errs...)
}

// newLayout returns the layout of a sandbox's state directory.
func (l *Local) layout(name string) sandboxLayout {
	return sandboxLayout{dir: filepath.Join(l.sandboxesDir(), name)}
}
