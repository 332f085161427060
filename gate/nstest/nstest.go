// Package nstest makes throw-away network namespaces for tests that use the
// real kernel as their test double: named namespaces with loopback up, veth
// links between them, and commands run inside them as a real non-root uid.
// Everything it makes is removed by t.Cleanup, also when the test fails.
package nstest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"

	"flowgate/gate/netnsx"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// AgentUID is the unprivileged uid tests run agent traffic as.
const AgentUID = 1000

// RequireRoot fails the test when not running as root, unless -short was
// given, in which case it skips: such tests need root and a kernel with
// nftables and network namespaces, and must never pass by skipping in CI.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if testing.Short() {
		t.Skip("needs root (network namespaces, nftables); skipped under -short")
	}
	t.Fatal("this test needs root: it creates network namespaces and nftables rules; run as root, or pass -short to skip it")
}

// NS is a named network namespace made for one test.
type NS struct {
	Name   string
	Path   string
	Handle netns.NsHandle
	link   *netlink.Handle
}

// New creates a namespace named prefix-<random>, brings lo up, and removes
// it when the test ends.
func New(t testing.TB, prefix string) *NS {
	t.Helper()
	RequireRoot(t)
	var b [4]byte
	rand.Read(b[:])
	name := fmt.Sprintf("%s-%s", prefix, hex.EncodeToString(b[:]))
	h, err := netnsx.NewNamed(name)
	if err != nil {
		t.Fatalf("creating netns %s: %v", name, err)
	}
	ns := &NS{Name: name, Path: "/run/netns/" + name, Handle: h}
	t.Cleanup(func() { ns.close(t) })
	lh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", name, err)
	}
	ns.link = lh
	lo, err := lh.LinkByName("lo")
	if err != nil {
		t.Fatalf("finding lo in %s: %v", name, err)
	}
	if err := lh.LinkSetUp(lo); err != nil {
		t.Fatalf("bringing lo up in %s: %v", name, err)
	}
	return ns
}

func (ns *NS) close(t testing.TB) {
	if ns.link != nil {
		ns.link.Close()
	}
	ns.Handle.Close()
	if err := netns.DeleteNamed(ns.Name); err != nil {
		t.Errorf("removing netns %s: %v", ns.Name, err)
	}
}

// Netlink returns a netlink handle inside the namespace.
func (ns *NS) Netlink() *netlink.Handle { return ns.link }

// Link joins namespaces a and b with a veth pair named aName (in a) and
// bName (in b), gives each side its addresses (IPv6 without DAD) and brings
// both up. The pair goes away with its namespaces.
func Link(t testing.TB, a *NS, aName string, aAddrs []netip.Prefix, b *NS, bName string, bAddrs []netip.Prefix) {
	t.Helper()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: aName, Namespace: netlink.NsFd(a.Handle)},
		PeerName:      bName,
		PeerNamespace: netlink.NsFd(b.Handle),
	}
	if err := a.link.LinkAdd(veth); err != nil {
		t.Fatalf("adding veth %s/%s: %v", aName, bName, err)
	}
	for _, side := range []struct {
		ns    *NS
		name  string
		addrs []netip.Prefix
	}{{a, aName, aAddrs}, {b, bName, bAddrs}} {
		l, err := side.ns.link.LinkByName(side.name)
		if err != nil {
			t.Fatalf("finding %s in %s: %v", side.name, side.ns.Name, err)
		}
		for _, p := range side.addrs {
			addr := &netlink.Addr{IPNet: prefixToIPNet(p)}
			if p.Addr().Is6() {
				addr.Flags = unix.IFA_F_NODAD
			}
			if err := side.ns.link.AddrAdd(l, addr); err != nil {
				t.Fatalf("adding %s to %s in %s: %v", p, side.name, side.ns.Name, err)
			}
		}
		if err := side.ns.link.LinkSetUp(l); err != nil {
			t.Fatalf("bringing %s up in %s: %v", side.name, side.ns.Name, err)
		}
	}
}

// DefaultRoutes points IPv4 and IPv6 default routes of ns at the given
// gateways (either may be invalid to skip it), through device dev.
func (ns *NS) DefaultRoutes(t testing.TB, dev string, gw4, gw6 netip.Addr) {
	t.Helper()
	l, err := ns.link.LinkByName(dev)
	if err != nil {
		t.Fatalf("finding %s in %s: %v", dev, ns.Name, err)
	}
	for _, gw := range []netip.Addr{gw4, gw6} {
		if !gw.IsValid() {
			continue
		}
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}
		if err := ns.link.RouteAdd(r); err != nil {
			t.Fatalf("adding default route via %s in %s: %v", gw, ns.Name, err)
		}
	}
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Command returns a command that runs inside ns as uid (gid the same), with
// no_new_privs and no supplementary groups. uid 0 runs as root. Start it
// with Start or Run on this package, not on the Cmd itself.
func (ns *NS) Command(uid uint32, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if uid != 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: uid, NoSetGroups: false, Groups: []uint32{}}
	}
	return cmd
}

// Start starts cmd with its process inside ns. The forking thread enters ns
// and sets no_new_privs, then exits without being unlocked so the runtime
// discards it: neither the namespace nor the flag leaks to other goroutines.
func (ns *NS) Start(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns.Handle); err != nil {
			errc <- fmt.Errorf("entering %s: %w", ns.Name, err)
			return
		}
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			errc <- fmt.Errorf("setting no_new_privs: %w", err)
			return
		}
		err := cmd.Start()
		errc <- err
		if err != nil {
			return
		}
		// Pdeathsig fires when the forking thread exits, and this thread
		// exits when the goroutine returns: hold it until the child has
		// exited, without reaping it (cmd.Wait does that).
		var info unix.Siginfo
		for unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
		}
	}()
	return <-errc
}

// Output runs cmd inside ns and returns its combined output.
func (ns *NS) Output(cmd *exec.Cmd) ([]byte, error) {
	var buf lockedBuffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	if err := ns.Start(cmd); err != nil {
		return nil, err
	}
	err := cmd.Wait()
	return buf.Bytes(), err
}
