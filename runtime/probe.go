package runtime

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"flowgate/gate/netnsx"
)

// Capabilities is what the local runtime can enforce on this host, as
// Probe found by trying it.
type Capabilities struct {
	// Root: running as uid 0.
	Root bool
	// NFTables: an inet table with chains and rules could be made.
	NFTables bool
	// OwnerMatch: a `meta skuid` reject rule stopped a real socket of a
	// non-root uid and no other.
	OwnerMatch bool
	// IPv6: IPv6 is enabled and the same rule stopped that uid over IPv6.
	IPv6 bool
	// CgroupMatch: a `socket cgroupv2` rule stopped a socket of a process
	// in a given cgroup v2 group.
	CgroupMatch bool
	// Missing explains each piece that is not there, one human sentence
	// each, starting with the piece's name.
	Missing []string
}

// probeUID is the uid Probe's test sockets belong to; it need not exist.
const probeUID = 60099

// Probe checks, in a scratch network namespace that disappears with it,
// what this host lets the runtime enforce. It changes nothing on the host
// but a scratch cgroup (removed before it returns; `bench gc` removes one
// a killed probe left). The running binary must call MaybeInit.
func (l *Local) Probe(ctx context.Context) Capabilities {
	var c Capabilities
	miss := func(format string, a ...any) { c.Missing = append(c.Missing, fmt.Sprintf(format, a...)) }
	c.Root = os.Geteuid() == 0
	if !c.Root {
		miss("root: bench runs as uid %d; network namespaces, nftables and mounts need root (run it with sudo)", os.Geteuid())
		return c
	}
	ns, err := netnsx.New()
	if err != nil {
		miss("network namespaces: cannot create one: %v", err)
		return c
	}
	defer ns.Close()
	if err := loUp(ns); err != nil {
		miss("network namespaces: %v", err)
		return c
	}
	_, v6err := os.Stat("/proc/net/if_inet6")
	haveV6 := v6err == nil

	// Listeners: P* are refused to probeUID by the owner rule, C4 to the
	// probe's cgroup, Q* to nobody.
	type lis struct {
		name, network, addr string
		l                   net.Listener
	}
	ls := []*lis{{name: "P4", network: "tcp4", addr: "127.0.0.1:0"}, {name: "Q4", network: "tcp4", addr: "127.0.0.1:0"}, {name: "C4", network: "tcp4", addr: "127.0.0.1:0"}}
	if haveV6 {
		ls = append(ls, &lis{name: "P6", network: "tcp6", addr: "[::1]:0"}, &lis{name: "Q6", network: "tcp6", addr: "[::1]:0"})
	}
	port := map[string]uint16{}
	addr := map[string]string{}
	for _, x := range ls {
		x.l, err = netnsx.Listen(ns, x.network, x.addr)
		if err != nil {
			if x.network == "tcp6" {
				haveV6 = false
				continue
			}
			miss("network namespaces: listening on loopback in a scratch netns: %v", err)
			return c
		}
		defer x.l.Close()
		a := x.l.Addr().(*net.TCPAddr)
		port[x.name], addr[x.name] = uint16(a.Port), a.String()
	}

	cg, cgLevel, cgID, cgErr := probeCgroup()
	if cg != "" {
		defer os.Remove(cg)
	}

	if err := probeRules(ns, port, haveV6, cgLevel, cgID, cgErr == nil); err != nil {
		miss("nftables: cannot apply a table in a scratch netns: %v", err)
		return c
	}
	c.NFTables = true

	dial := []string{addr["P4"], addr["Q4"], addr["C4"]}
	if haveV6 && addr["P6"] != "" && addr["Q6"] != "" {
		dial = append(dial, addr["P6"], addr["Q6"])
	}
	got, err := probeDial(ctx, ns, cg, dial)
	if err != nil {
		miss("owner match: could not run a probe process as uid %d: %v", probeUID, err)
		return c
	}
	// Root must pass where probeUID is refused: the rule matches the uid,
	// not everyone.
	d := netnsx.Dialer{NS: ns, Dialer: net.Dialer{Timeout: 3 * time.Second}}
	rootOK := false
	if conn, err := d.DialContext(ctx, "tcp4", addr["P4"]); err == nil {
		conn.Close()
		rootOK = true
	}
	switch {
	case got[0] != "refused":
		miss("owner match: a `meta skuid %d` reject rule did not stop that uid's connection (it got %q)", probeUID, got[0])
	case got[1] != "ok":
		miss("owner match: uid %d could not reach an unfiltered port (%q), so the probe proves nothing", probeUID, got[1])
	case !rootOK:
		miss("owner match: the rule for uid %d also stopped root", probeUID)
	default:
		c.OwnerMatch = true
	}
	switch {
	case !haveV6 || len(got) < 5:
		miss("ipv6: IPv6 is disabled on this host (no ::1 in a fresh netns)")
	case got[3] != "refused" || got[4] != "ok":
		miss("ipv6: the owner rule did not hold over IPv6 (filtered port: %q, open port: %q)", got[3], got[4])
	default:
		c.IPv6 = true
	}
	switch {
	case cgErr != nil:
		miss("cgroup match: %v", cgErr)
	case got[2] != "refused":
		miss("cgroup match: a `socket cgroupv2` reject rule did not stop a process in that cgroup (it got %q); on a hybrid cgroup host, net_cls or net_prio in use disables it", got[2])
	default:
		c.CgroupMatch = true
	}
	return c
}

func loUp(ns netns.NsHandle) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink handle: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("finding lo: %w", err)
	}
	return h.LinkSetUp(lo)
}

// probeCgroup makes a scratch cgroup and returns its path, level and id
// (the inode number, which is what `socket cgroupv2` compares).
func probeCgroup() (path string, level uint32, id uint64, err error) {
	m := cgroup2Mount()
	if m == "" {
		return "", 0, 0, errors.New("no cgroup v2 hierarchy is mounted")
	}
	if err := os.Mkdir(filepath.Join(m, cgroupRoot), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", 0, 0, fmt.Errorf("creating cgroup %s: %w", cgroupRoot, err)
	}
	me, _ := self()
	path = filepath.Join(m, cgroupRoot, fmt.Sprintf("probe-%d-%d", me.PID, time.Now().UnixNano()))
	if err := os.Mkdir(path, 0o755); err != nil {
		return "", 0, 0, fmt.Errorf("creating a probe cgroup: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return path, 0, 0, fmt.Errorf("reading the probe cgroup: %w", err)
	}
	return path, 2, st.Ino, nil
}

// probeRules applies, in ns: reject tcp to P4/P6 for probeUID, and to C4
// for sockets of the probe cgroup.
func probeRules(ns netns.NsHandle, port map[string]uint16, v6 bool, cgLevel uint32, cgID uint64, withCgroup bool) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Name: "flowgate_probe", Family: nftables.TableFamilyINet})
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	reject := &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH}
	uid := make([]byte, 4)
	binary.NativeEndian.PutUint32(uid, probeUID)
	ports := []string{"P4"}
	if v6 {
		ports = append(ports, "P6")
	}
	for _, p := range ports {
		if port[p] == 0 {
			continue
		}
		e := []expr.Any{&expr.Meta{Key: expr.MetaKeySKUID, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: uid}}
		e = append(e, l4proto(unix.IPPROTO_TCP)...)
		e = append(e, dport(port[p])...)
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(e, reject)})
	}
	if withCgroup {
		id := make([]byte, 8)
		binary.NativeEndian.PutUint64(id, cgID)
		e := []expr.Any{&expr.Socket{Key: expr.SocketKeyCgroupv2, Level: cgLevel, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: id}}
		e = append(e, l4proto(unix.IPPROTO_TCP)...)
		e = append(e, dport(port["C4"])...)
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(e, reject)})
	}
	return c.Flush()
}

// probeDial runs a probe process in ns (and cgroup cg, if set) that drops
// to probeUID with no_new_privs and dials each address; it returns one
// result per address.
func probeDial(ctx context.Context, ns netns.NsHandle, cg string, addrs []string) ([]string, error) {
	spec, err := json.Marshal(&initSpec{Op: opProbe, UID: probeUID, GID: probeUID, Dial: addrs, Env: []string{}})
	if err != nil {
		return nil, err
	}
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	statR, statW, err := os.Pipe()
	if err != nil {
		specR.Close()
		specW.Close()
		return nil, err
	}
	defer statR.Close()
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        []string{"flowgate-probe", initArg},
		Env:         []string{},
		ExtraFiles:  []*os.File{specR, statW},
		WaitDelay:   5 * time.Second,
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	}
	var cgFD *os.File
	if cg != "" {
		if cgFD, err = os.Open(cg); err == nil {
			cmd.SysProcAttr.UseCgroupFD = true
			cmd.SysProcAttr.CgroupFD = int(cgFD.Fd())
			defer cgFD.Close()
		}
	}
	err = startInNetNS(ns, cmd)
	specR.Close()
	statW.Close()
	if err != nil {
		specW.Close()
		return nil, err
	}
	go feedSpec(specW, spec)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-ctx.Done():
		cmd.Process.Kill()
		<-done
		return nil, ctx.Err()
	}
	b, _ := io.ReadAll(io.LimitReader(statR, 1<<20))
	var st initStatus
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("reading the probe's report %q: %w", b, err)
	}
	if st.Error != "" {
		return nil, errors.New(st.Error)
	}
	if len(st.Dial) != len(addrs) {
		return nil, fmt.Errorf("the probe answered %d of %d dials", len(st.Dial), len(addrs))
	}
	return st.Dial, nil
}

// initProbe is the probe process: it gives up root for sp.UID with
// no_new_privs, then dials each address.
func initProbe(sp *initSpec) initStatus {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return initStatus{Stage: "setup", Error: fmt.Sprintf("setting no_new_privs: %v", err)}
	}
	// syscall's Set* change every thread of the process.
	if err := syscall.Setgroups(nil); err != nil {
		return initStatus{Stage: "setup", Error: fmt.Sprintf("setgroups: %v", err)}
	}
	if err := syscall.Setgid(int(sp.GID)); err != nil {
		return initStatus{Stage: "setup", Error: fmt.Sprintf("setgid: %v", err)}
	}
	if err := syscall.Setuid(int(sp.UID)); err != nil {
		return initStatus{Stage: "setup", Error: fmt.Sprintf("setuid: %v", err)}
	}
	var st initStatus
	for _, a := range sp.Dial {
		conn, err := net.DialTimeout("tcp", a, 3*time.Second)
		switch {
		case err == nil:
			conn.Close()
			st.Dial = append(st.Dial, "ok")
		case errors.Is(err, syscall.ECONNREFUSED):
			st.Dial = append(st.Dial, "refused")
		default:
			st.Dial = append(st.Dial, strings.TrimSpace(err.Error()))
		}
	}
	return st
}

// probeCgroupPID returns the pid a probe cgroup's name carries.
func probeCgroupPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "probe-")
	if !ok {
		return 0, false
	}
	pid, _, _ := strings.Cut(rest, "-")
	n, err := strconv.Atoi(pid)
	return n, err == nil
}
