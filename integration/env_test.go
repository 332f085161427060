package integration

// The one place where tests make their world: the simulated internet, the
// sandbox namespace joined to it, flowgate attached in-process, and the
// agent's processes run as uid 1000 inside the sandbox. Every test reads
// the same through these helpers.

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"flowgate/gate"
	"flowgate/gate/gateway"
	"flowgate/gate/nstest"
	"flowgate/integration/simnet"
	"flowgate/policyload"
)

// Addresses and URLs of the simulated internet the tests use.
const (
	exampleURL  = "https://example.com/"
	pypiURL     = "https://pypi.org/simple/"
	metaIPURL   = "http://169.254.169.254/latest/meta-data/"
	metaNameURL = "http://metadata.google.internal/latest/meta-data/"

	example4   = "192.0.2.10"
	pypi4      = "198.51.100.40"
	pypi6      = "2001:db8:1::40"
	shared4    = "203.0.113.50"
	resolver4  = "192.0.2.53:53"
	resolver6  = "[2001:db8::53]:53"
	echo4      = "203.0.113.7:7"
	echo6      = "[2001:db8:2::7]:7"
	proxyAddr  = "127.0.0.1:15080"
	proxyURL   = "http://" + proxyAddr
	sandboxTag = "it"
)

// directUID is a uid no rule matches: the benchmarks' direct path, and
// the check that flowgate's rules leave other users alone.
const directUID = 1001

// procTimeout bounds every process a test runs.
const procTimeout = 90 * time.Second

var (
	testDirOnce sync.Once
	testDirPath string
	testDirErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if testDirPath != "" {
		os.RemoveAll(testDirPath)
	}
	os.Exit(code)
}

// testDir is a directory every uid can read, for the binaries the agent
// runs; TestMain removes it.
func testDir(t testing.TB) string {
	t.Helper()
	testDirOnce.Do(func() {
		testDirPath, testDirErr = os.MkdirTemp("", "flowgate-integration-")
		if testDirErr == nil {
			testDirErr = os.Chmod(testDirPath, 0o755)
		}
	})
	if testDirErr != nil {
		t.Fatalf("making the test directory: %v", testDirErr)
	}
	return testDirPath
}

// binary is a program built once per test binary.
type binary struct {
	once      sync.Once
	name, pkg string
	env       []string
	path      string
	err       error
}

var (
	agentBin    = &binary{name: "agentclient", pkg: "flowgate/integration/internal/agentclient", env: []string{"CGO_ENABLED=0"}}
	flowgateBin = &binary{name: "flowgate", pkg: "flowgate/cmd/flowgate"}
)

func (b *binary) get(t testing.TB) string {
	t.Helper()
	dir := testDir(t)
	b.once.Do(func() {
		out := filepath.Join(dir, b.name)
		cmd := exec.Command("go", "build", "-o", out, b.pkg)
		cmd.Env = append(os.Environ(), b.env...)
		if msg, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("building %s: %v\n%s", b.pkg, err, msg)
			return
		}
		b.path = out
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// startInternet starts the simulated internet for one test.
func startInternet(t testing.TB) *simnet.Internet {
	t.Helper()
	nstest.RequireRoot(t)
	in, err := simnet.Start(simnet.Options{Prefix: "fgi-inet"})
	if err != nil {
		t.Fatalf("starting the simulated internet: %v", err)
	}
	t.Cleanup(func() {
		if err := in.Close(); err != nil {
			t.Errorf("closing the simulated internet: %v", err)
		}
	})
	return in
}

// sandbox is the agent's namespace, joined to the simulated internet.
type sandbox struct {
	t    testing.TB
	inet *simnet.Internet
	ns   *nstest.NS
	log  *recorder
}

// newSandbox makes a namespace with a default route into inet and a
// resolv.conf naming the simulated resolver.
func newSandbox(t testing.TB, inet *simnet.Internet) *sandbox {
	t.Helper()
	ns := nstest.New(t, "fgi")
	up, err := inet.Attach(ns.Handle, simnet.AttachOptions{})
	if err != nil {
		t.Fatalf("joining %s to the simulated internet: %v", ns.Name, err)
	}
	t.Cleanup(func() {
		if err := up.Close(); err != nil {
			t.Errorf("removing the uplink of %s: %v", ns.Name, err)
		}
	})
	s := &sandbox{t: t, inet: inet, ns: ns, log: &recorder{}}
	s.resolvConf("nameserver " + simnet.Resolver.Addr().String())
	return s
}

// resolvConf writes /etc/netns/NAME/resolv.conf, which `ip netns exec`
// puts over /etc/resolv.conf for the agent's processes. It is removed when
// the test ends, and /etc/netns with it if this test made it and it is
// empty by then.
func (s *sandbox) resolvConf(nameservers ...string) {
	s.t.Helper()
	dir := filepath.Join("/etc/netns", s.ns.Name)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if _, err := os.Stat("/etc/netns"); errors.Is(err, os.ErrNotExist) {
			s.t.Cleanup(func() { os.Remove("/etc/netns") }) // fails while not empty: fine
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			s.t.Fatalf("making %s: %v", dir, err)
		}
		s.t.Cleanup(func() {
			if err := os.RemoveAll(dir); err != nil {
				s.t.Errorf("removing %s: %v", dir, err)
			}
		})
	}
	var b strings.Builder
	for _, n := range nameservers {
		fmt.Fprintf(&b, "%s\n", n)
	}
	b.WriteString("options timeout:2 attempts:1\n")
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(b.String()), 0o644); err != nil {
		s.t.Fatalf("writing resolv.conf: %v", err)
	}
}

// attach enforces p for uid 1000 with flowgate in-process, recording into
// s.log; the gateway is closed and its table removed when the test ends.
func (s *sandbox) attach(p *gate.Policy) *gateway.Handle {
	s.t.Helper()
	h, err := gateway.Attach(s.ns.Handle, nstest.AgentUID, p, gateway.Options{
		Sandbox:   sandboxTag,
		Resolvers: []netip.AddrPort{simnet.Resolver},
		Record:    s.log,
	})
	if err != nil {
		s.t.Fatalf("attaching flowgate: %v", err)
	}
	s.t.Cleanup(func() {
		if err := errors.Join(h.Close(), gateway.Detach(s.ns.Handle)); err != nil {
			s.t.Errorf("detaching flowgate: %v", err)
		}
	})
	return h
}

// policyFile writes a policy file for this test and returns its path.
func policyFile(t testing.TB, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// loadPolicy compiles a policy file's text the way flowgate attach does.
func loadPolicy(t testing.TB, yaml string) *gate.Policy {
	t.Helper()
	p, err := policyload.LoadPolicyFile(policyFile(t, yaml))
	if err != nil {
		t.Fatalf("loading policy %q: %v", yaml, err)
	}
	return p
}

// The policies of issue 4.
const (
	publicPolicy    = "network_mode: public\n"
	noNetworkPolicy = "network_mode: no-network\n"
	denylistPolicy  = "network_mode: denylist\nblocked_hosts:\n  - example.com\n"
	allowlistPolicy = "network_mode: allowlist\nallowed_hosts:\n  - pypi.org\n  - files.pythonhosted.org\n"
)
