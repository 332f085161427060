package runtime

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"flowgate/gate/netnsx"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// testHookCreate, when set by a test, runs after each step of Create with
// the step's name; an error from it makes Create fail there.
var testHookCreate func(step string) error

func createStep(step string) error {
	if testHookCreate != nil {
		return testHookCreate(step)
	}
	return nil
}

// Create makes a sandbox for spec: checks everything it can first (name,
// paths, user, resolvers, that the name and an address slot are free),
// then records and makes the state directory, the network namespace, the
// veth pair with addresses and routes, forwarding and the host table's
// rules, and the cgroups. Bad input is an error before anything is made.
// A Create that fails halfway removes what it made and returns the first
// error joined with any clean-up errors. The caller closes the Sandbox.
func (l *Local) Create(ctx context.Context, spec Spec) (_ *LocalSandbox, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("creating sandbox: bench needs root for network namespaces, nftables and mounts; run it with sudo")
	}
	st, err := l.checkSpec(spec)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.Name, err)
	}
	passwd, group, err := hostUsers()
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.Name, err)
	}
	if st.AgentUID, st.AgentGID, err = agentIDs(st.AgentUser, passwd, group); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.Name, err)
	}
	users := renderUsers(st.AgentUser, st.AgentUID, st.AgentGID, agentShell(), passwd, group)
	if st.Owner, err = self(); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: identifying this process: %w", spec.Name, err)
	}
	uplink, err := openUplink(l.Uplink)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.Name, err)
	}
	defer uplink.Close()
	up, err := netlink.NewHandleAt(uplink)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: netlink handle in uplink: %w", spec.Name, err)
	}
	defer up.Close()
	pool := l.Pool.orDefault()
	st.IPv6 = pool.V6.IsValid() && ipv6Forwardable(uplink)

	lk, err := l.lockHost(ctx)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.Name, err)
	}
	dir, err := l.reserve(st, pool, up)
	lk.unlock()
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.Name, err)
	}

	sb := &LocalSandbox{local: *l, st: st, lay: sandboxLayout{dir: dir}, ns: netns.None()}
	defer func() {
		if err != nil {
			sb.ns.Close()
			if cerr := l.teardown(st, dir, nil); cerr != nil {
				err = errors.Join(err, fmt.Errorf("cleaning up: %w", cerr))
			}
			sb = nil
		}
	}()
	wrap := func(e error) error { return fmt.Errorf("creating sandbox %s: %w", st.Name, e) }
	save := func() error { return writeState(dir, st) }

	if err := l.makeFiles(st, sb.lay, users); err != nil {
		return nil, wrap(err)
	}
	if err := createStep("files"); err != nil {
		return nil, wrap(err)
	}

	st.NetNS = netnsName(st.Name)
	if err := save(); err != nil {
		return nil, wrap(err)
	}
	if sb.ns, err = netnsx.NewNamed(st.NetNS); err != nil {
		sb.ns = netns.None()
		return nil, wrap(fmt.Errorf("creating netns %s: %w", st.NetNS, err))
	}
	if err := createStep("netns"); err != nil {
		return nil, wrap(err)
	}

	st.HostLink = hostLinkName(st.Name)
	if err := save(); err != nil {
		return nil, wrap(err)
	}
	if err := plumb(st, uplink, sb.ns); err != nil {
		return nil, wrap(err)
	}
	if err := createStep("link"); err != nil {
		return nil, wrap(err)
	}

	localDNS, err := localAddrs(up, st.DNS)
	if err != nil {
		return nil, wrap(err)
	}
	st.Rules = true
	if err := save(); err != nil {
		return nil, wrap(err)
	}
	if lk, err = l.lockHost(ctx); err != nil {
		return nil, wrap(err)
	}
	err = l.enableForwarding(uplink, st)
	if err == nil {
		err = addHostRules(uplink, st, localDNS)
	}
	lk.unlock()
	if err != nil {
		return nil, wrap(err)
	}
	if err := createStep("rules"); err != nil {
		return nil, wrap(err)
	}

	if m := cgroup2Mount(); m != "" {
		st.Cgroup = filepath.Join(m, cgroupRoot, st.Name)
		if err := save(); err != nil {
			return nil, wrap(err)
		}
		if err := makeCgroups(st.Cgroup); err != nil {
			return nil, wrap(err)
		}
	}
	if err := createStep("cgroup"); err != nil {
		return nil, wrap(err)
	}
	return sb, nil
}

// checkSpec validates spec and the Local, and returns the state to record.
func (l *Local) checkSpec(spec Spec) (*state, error) {
	if err := validateName(spec.Name); err != nil {
		return nil, err
	}
	user := spec.AgentUser
	if user == "" {
		user = DefaultAgentUser
	}
	if err := validateUser(user); err != nil {
		return nil, err
	}
	wd, err := validateWorkdir(spec.Workdir)
	if err != nil {
		return nil, err
	}
	if err := validateLogsDir(spec.LogsDir); err != nil {
		return nil, err
	}
	if err := validateStateDir(l.stateDir()); err != nil {
		return nil, err
	}
	for _, h := range spec.Hide {
		if !filepath.IsAbs(h) {
			return nil, fmt.Errorf("hide: %q is not an absolute path", h)
		}
	}
	if err := l.Pool.orDefault().validate(); err != nil {
		return nil, err
	}
	dns, err := l.resolvers()
	if err != nil {
		return nil, err
	}
	return &state{
		Version:   stateVersion,
		Name:      spec.Name,
		Created:   time.Now().UTC(),
		Uplink:    l.Uplink,
		AgentUser: user,
		Workdir:   wd,
		LogsDir:   filepath.Clean(spec.LogsDir),
		Hide:      spec.Hide,
		DNS:       dns,
	}, nil
}

// reserve checks that the sandbox's name is free (state directory, netns,
// host link) and takes an address slot, then records both by writing the
// state into a fresh directory renamed into place. The caller holds the
// host lock.
func (l *Local) reserve(st *state, pool Pool, up *netlink.Handle) (string, error) {
	dir := filepath.Join(l.sandboxesDir(), st.Name)
	if _, err := os.Lstat(dir); err == nil {
		return "", fmt.Errorf("the name is taken: %s exists (a sandbox of that name runs, or a killed run left it: run `bench gc`)", dir)
	}
	if netnsExists(netnsName(st.Name)) {
		return "", fmt.Errorf("the name is taken: netns %s exists", netnsName(st.Name))
	}
	if ok, err := linkExists(up, hostLinkName(st.Name)); err != nil {
		return "", err
	} else if ok {
		return "", fmt.Errorf("the name is taken: link %s exists in the uplink namespace", hostLinkName(st.Name))
	}
	used, err := usedPrefixes(up)
	if err != nil {
		return "", err
	}
	others, _ := l.listStates() // an unreadable record's addresses still show in the uplink
	for _, o := range others {
		used = append(used, o.Net4)
		if o.Net6.IsValid() {
			used = append(used, o.Net6)
		}
	}
	slot, n4, n6, err := pool.pick(used)
	if err != nil {
		return "", err
	}
	st.Slot, st.Net4 = slot, n4
	if st.IPv6 {
		st.Net6 = n6
	}
	if err := os.MkdirAll(l.sandboxesDir(), 0o700); err != nil {
		return "", fmt.Errorf("creating %s: %w", l.sandboxesDir(), err)
	}
	tmp, err := os.MkdirTemp(l.sandboxesDir(), ".new-"+st.Name+"-")
	if err != nil {
		return "", fmt.Errorf("creating state dir: %w", err)
	}
	if err := writeState(tmp, st); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("creating state dir: %w", err)
	}
	return dir, nil
}

// makeFiles creates the sandbox's persistent directories and files below
// its state directory, and its folders in LogsDir.
func (l *Local) makeFiles(st *state, lay sandboxLayout, users userFiles) error {
	uid, gid := int(st.AgentUID), int(st.AgentGID)
	dirs := []struct {
		path     string
		mode     os.FileMode
		uid, gid int
	}{
		{lay.root(), 0o755, 0, 0},
		{lay.tmp(), os.ModeSticky | 0o777, 0, 0},
		{lay.varTmp(), os.ModeSticky | 0o777, 0, 0},
		{lay.home(), 0o750, uid, gid},
		{lay.rootHome(), 0o700, 0, 0},
		{lay.workdir(), 0o755, uid, gid},
		{filepath.Dir(lay.file("x")), 0o755, 0, 0},
		{filepath.Dir(lay.upper("/etc")), 0o755, 0, 0},
		{filepath.Dir(lay.work("/etc")), 0o700, 0, 0},
	}
	for _, d := range dirs {
		if err := mkdirOwned(d.path, d.mode, d.uid, d.gid); err != nil {
			return err
		}
	}
	// The upper directory of each overlay carries the merged directory's
	// own mode and owner: copy the host's.
	for _, sd := range systemDirs {
		fi, err := os.Lstat(sd)
		if err != nil || !fi.IsDir() {
			continue
		}
		sys := fi.Sys().(*syscall.Stat_t)
		if err := mkdirOwned(lay.upper(sd), fi.Mode().Perm()|fi.Mode()&(os.ModeSticky|os.ModeSetgid), int(sys.Uid), int(sys.Gid)); err != nil {
			return err
		}
		if err := mkdirOwned(lay.work(sd), 0o700, 0, 0); err != nil {
			return err
		}
	}
	files := []struct {
		path string
		data []byte
		like string // host file whose mode and owner to copy
	}{
		{lay.file("resolv.conf"), resolvConf(st.DNS), ""},
		{lay.file("hosts"), hostsFile(st.Name), ""},
		{lay.file("hostname"), []byte(st.Name + "\n"), ""},
		{filepath.Join(lay.upper("/etc"), "passwd"), users.passwd, "/etc/passwd"},
		{filepath.Join(lay.upper("/etc"), "group"), users.group, "/etc/group"},
		{filepath.Join(lay.upper("/etc"), "shadow"), users.shadow, "/etc/shadow"},
		{filepath.Join(lay.upper("/etc"), "gshadow"), users.gshadow, "/etc/gshadow"},
	}
	for _, f := range files {
		mode, fuid, fgid := os.FileMode(0o644), 0, 0
		if f.like != "" {
			fi, err := os.Stat(f.like)
			if err != nil {
				continue // the host has none: neither has the sandbox
			}
			sys := fi.Sys().(*syscall.Stat_t)
			mode, fuid, fgid = fi.Mode().Perm(), int(sys.Uid), int(sys.Gid)
		}
		if err := os.WriteFile(f.path, f.data, mode); err != nil {
			return fmt.Errorf("writing %s: %w", f.path, err)
		}
		if err := errors.Join(os.Chown(f.path, fuid, fgid), os.Chmod(f.path, mode)); err != nil {
			return fmt.Errorf("setting owner of %s: %w", f.path, err)
		}
	}
	// LogsDir: root's, so the agent can only write below /logs/agent.
	if err := errors.Join(os.Chown(st.LogsDir, 0, 0), os.Chmod(st.LogsDir, 0o755)); err != nil {
		return fmt.Errorf("preparing logs dir: %w", err)
	}
	for _, d := range []struct {
		name     string
		uid, gid int
	}{{"agent", uid, gid}, {"verifier", 0, 0}} {
		p := filepath.Join(st.LogsDir, d.name)
		if fi, err := os.Lstat(p); err == nil && !fi.IsDir() {
			return fmt.Errorf("logs dir: %s exists and is not a directory", p)
		}
		if err := mkdirOwned(p, 0o755, d.uid, d.gid); err != nil {
			return fmt.Errorf("logs dir: %w", err)
		}
	}
	return nil
}

// mkdirOwned creates dir (and missing parents) and sets its mode and owner.
func mkdirOwned(dir string, mode os.FileMode, uid, gid int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	if err := errors.Join(os.Lchown(dir, uid, gid), os.Chmod(dir, mode)); err != nil {
		return fmt.Errorf("setting owner of %s: %w", dir, err)
	}
	return nil
}

// localAddrs returns those of addrs that are addresses of the uplink
// namespace itself.
func localAddrs(up *netlink.Handle, addrs []netip.Addr) ([]netip.Addr, error) {
	list, err := up.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing uplink addresses: %w", err)
	}
	var have []netip.Addr
	for _, a := range list {
		if p, ok := ipnetPrefix(a.IPNet); ok {
			have = append(have, p.Addr())
		}
	}
	var out []netip.Addr
	for _, a := range addrs {
		if slices.Contains(have, a) {
			out = append(out, a)
		}
	}
	return out, nil
}
