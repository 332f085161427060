package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"flowgate/gate/nstest"
	"flowgate/integration/simnet"
)

func TestMain(m *testing.M) {
	MaybeInit()
	if os.Getenv(ownerHelperEnv) != "" {
		os.Exit(ownerHelper())
	}
	had := hostHasTable()
	code := m.Run()
	if inet != nil {
		if err := inet.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "closing the simulated internet:", err)
			code = 1
		}
	}
	if !had && hostHasTable() {
		fmt.Fprintf(os.Stderr, "FAIL: the host namespace has table inet %s after the tests and had none before\n", HostTable)
		code = 1
	}
	os.Exit(code)
}

// hostHasTable reports whether this process's own (the host's) namespace
// has the host table. It only reads.
func hostHasTable() bool {
	if os.Geteuid() != 0 {
		return false
	}
	c, err := nftables.New()
	if err != nil {
		return false
	}
	ok, _ := hostTableExists(c)
	return ok
}

// The simulated internet, shared by every test of the package.
var (
	inetOnce sync.Once
	inet     *simnet.Internet
	inetErr  error
)

func internet(t testing.TB) *simnet.Internet {
	t.Helper()
	inetOnce.Do(func() { inet, inetErr = simnet.Start(simnet.Options{Prefix: "fgrt-inet"}) })
	if inetErr != nil {
		t.Fatalf("starting the simulated internet: %v", inetErr)
	}
	return inet
}

// env is one test's world: a throw-away "host" namespace H joined to the
// simulated internet, and a Local whose uplink is H.
type env struct {
	h     *nstest.NS
	up    *simnet.Uplink // H's link into the simulated internet
	local *Local
	logs  string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	nstest.RequireRoot(t)
	in := internet(t)
	h := nstest.New(t, "fgrt-h")
	up, err := in.Attach(h.Handle, simnet.AttachOptions{})
	if err != nil {
		t.Fatalf("attaching H to the simulated internet: %v", err)
	}
	t.Cleanup(func() { up.Close() })
	base := t.TempDir()
	e := &env{
		h:     h,
		up:    up,
		local: &Local{Uplink: h.Path, StateDir: filepath.Join(base, "state"), DNS: []netip.Addr{simnet.Resolver.Addr()}},
		logs:  base,
	}
	return e
}

// randName returns a sandbox name unique on this machine.
func randName(prefix string) string {
	var b [4]byte
	rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// logsDir makes a fresh trial logs folder.
func (e *env) logsDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp(e.logs, "logs-")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// create makes a sandbox and closes it at the end of the test, checking
// that Close left nothing behind.
func (e *env) create(t testing.TB, spec Spec) *LocalSandbox {
	t.Helper()
	if spec.Name == "" {
		spec.Name = randName("rt")
	}
	if spec.LogsDir == "" {
		spec.LogsDir = e.logsDir(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := e.local.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		e.assertGone(t, sb.st)
	})
	return sb
}

// assertGone checks that nothing of the sandbox st records is left.
func (e *env) assertGone(t testing.TB, st *state) {
	t.Helper()
	name := st.Name
	if netnsExists(netnsName(name)) {
		t.Errorf("netns %s is left", netnsName(name))
	}
	nl := e.h.Netlink()
	if ok, err := linkExists(nl, hostLinkName(name)); err != nil || ok {
		t.Errorf("link %s is left in H (err %v)", hostLinkName(name), err)
	}
	if _, err := os.Lstat(filepath.Join(e.local.sandboxesDir(), name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state dir of %s is left (%v)", name, err)
	}
	if m := cgroup2Mount(); m != "" {
		if _, err := os.Stat(filepath.Join(m, cgroupRoot, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup of %s is left (%v)", name, err)
		}
	}
	if n := e.rulesOf(t, name); n != 0 {
		t.Errorf("%d host rules of %s are left", n, name)
	}
}

// rulesOf counts the host-table rules in H naming the sandbox.
func (e *env) rulesOf(t testing.TB, name string) int {
	t.Helper()
	c, err := nftConn(e.h.Handle)
	if err != nil {
		t.Fatal(err)
	}
	by, _, err := hostRulesByOwner(c)
	if err != nil {
		t.Fatal(err)
	}
	return len(by[name])
}

// tableInH reports whether H has the host table.
func (e *env) tableInH(t testing.TB) bool {
	t.Helper()
	c, err := nftConn(e.h.Handle)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := hostTableExists(c)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// run runs a command in the sandbox and returns its combined output.
func run(t *testing.T, sb *LocalSandbox, as Owner, argv ...string) (string, Result) {
	t.Helper()
	var out syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := sb.Run(ctx, Process{Argv: argv, Env: stdEnv(sb, as), As: as, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatalf("Run %q as %v: %v (output %q)", argv, as, err, out.String())
	}
	return out.String(), res
}

// mustRun is run, failing the test unless the command exits 0.
func mustRun(t *testing.T, sb *LocalSandbox, as Owner, argv ...string) string {
	t.Helper()
	out, res := run(t, sb, as, argv...)
	if res.ExitCode != 0 || res.Signaled || res.TimedOut {
		t.Fatalf("%q as %v: %+v, output:\n%s", argv, as, res, out)
	}
	return out
}

func stdEnv(sb *LocalSandbox, as Owner) []string {
	home := "/root"
	if as == Agent {
		home = "/home/" + sb.AgentUser()
	}
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + home, "LANG=C"}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// linkAddrs lists the addresses on a link in H.
func linkAddrs(t *testing.T, nl *netlink.Handle, name string) []netip.Prefix {
	t.Helper()
	l, err := nl.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	as, err := nl.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Prefix
	for _, a := range as {
		if p, ok := ipnetPrefix(a.IPNet); ok && !p.Addr().IsLinkLocalUnicast() {
			out = append(out, p)
		}
	}
	return out
}

// ownerHelperEnv makes the test binary a sandbox owner that the GC test
// kills (see gc_test.go).
const ownerHelperEnv = "FLOWGATE_RUNTIME_TEST_OWNER"

func ownerHelper() int { return runOwnerHelper() }
