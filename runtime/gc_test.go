package runtime

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"flowgate/gate/nstest"
	"flowgate/integration/simnet"
)

// TestGCAfterKilledOwner: a bench process that is SIGKILLed with a
// sandbox (and a running phase) leaves it behind; GC removes all of it,
// and leaves the sandboxes of live owners alone.
func TestGCAfterKilledOwner(t *testing.T) {
	e := newEnv(t)
	live := e.create(t, Spec{Name: randName("rtl")})

	name := randName("rtk")
	marker := fmt.Sprintf("3%06d", time.Now().UnixNano()%1e6)
	cmd := exec.Command("/proc/self/exe", "-test.run=^$")
	cmd.Env = append(os.Environ(),
		ownerHelperEnv+"=1",
		"FGRT_STATE="+e.local.StateDir, "FGRT_UPLINK="+e.h.Path, "FGRT_NAME="+name,
		"FGRT_LOGS="+e.logsDir(t), "FGRT_MARKER="+marker)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("owner helper said %q, %v", line, err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()

	// What the killed run left.
	if !netnsExists(netnsName(name)) {
		t.Fatalf("the killed owner left no netns: nothing to test")
	}
	if ok, _ := linkExists(e.h.Netlink(), hostLinkName(name)); !ok {
		t.Errorf("the killed owner left no link")
	}
	if e.rulesOf(t, name) == 0 {
		t.Errorf("the killed owner left no host rules")
	}
	// Its running phase died with it (Pdeathsig, then the PID namespace).
	deadline := time.Now().Add(10 * time.Second)
	for len(nstest.HostProcs("sleep "+marker)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if pids := nstest.HostProcs("sleep " + marker); len(pids) > 0 {
		t.Errorf("the killed owner's phase still runs: %v", pids)
	}

	removed, err := GC(context.Background(), e.local)
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	got := strings.Join(removed, "\n")
	for _, want := range []string{
		"cgroup " + cgroupRoot + "/" + name,
		"nft rules of " + name + " in inet " + HostTable,
		"link " + hostLinkName(name),
		"netns " + netnsName(name),
		"state " + filepath.Join(e.local.sandboxesDir(), name),
	} {
		if !strings.Contains(got, want) {
			t.Errorf("GC's report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, live.Name()) {
		t.Errorf("GC removed parts of the live sandbox %s:\n%s", live.Name(), got)
	}
	e.assertGone(t, &state{Name: name})
	// The live sandbox still works.
	if out := mustRun(t, live, Agent, "curl", "-sS", "--max-time", "20", "http://example.com/alive"); out != "simnet example.com /alive\n" {
		t.Errorf("live sandbox after GC: %q", out)
	}
	// Nothing more to do.
	if removed, err := GC(context.Background(), e.local); err != nil || len(removed) != 0 {
		t.Errorf("second GC: %v, %v", removed, err)
	}
}

// TestGCOrphanRules: rules naming a sandbox that has no state, and then
// the empty table, are removed; rules of a recorded sandbox stay.
func TestGCOrphanRules(t *testing.T) {
	e := newEnv(t)
	n4, n6 := DefaultPool().subnets(9)
	orphan := &state{Name: randName("rto"), HostLink: "fg-orphan", Net4: n4, Net6: n6, IPv6: true}
	if err := addHostRules(e.h.Handle, orphan, nil); err != nil {
		t.Fatal(err)
	}
	live := e.create(t, Spec{Name: randName("rtl")})
	removed, err := GC(context.Background(), e.local)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || !strings.HasPrefix(removed[0], "nft rules of "+orphan.Name+" in inet "+HostTable) {
		t.Errorf("GC removed %q, want only the orphan's rules", removed)
	}
	if e.rulesOf(t, orphan.Name) != 0 || e.rulesOf(t, live.Name()) == 0 {
		t.Errorf("after GC: orphan has %d rules, live has %d", e.rulesOf(t, orphan.Name), e.rulesOf(t, live.Name()))
	}
	// With no sandbox left, the orphan's rules take the table with them.
	if err := live.Close(); err != nil {
		t.Fatal(err)
	}
	if err := addHostRules(e.h.Handle, orphan, nil); err != nil {
		t.Fatal(err)
	}
	removed, err = GC(context.Background(), e.local)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(removed, "\n"); !strings.Contains(got, "nft table inet "+HostTable) {
		t.Errorf("GC did not remove the table:\n%s", got)
	}
	if e.tableInH(t) {
		t.Errorf("table left in H")
	}
}

// runOwnerHelper is the test binary as a sandbox owner: it creates a
// sandbox, starts a phase, says "ready" and waits to be killed.
func runOwnerHelper() int {
	l := &Local{StateDir: os.Getenv("FGRT_STATE"), Uplink: os.Getenv("FGRT_UPLINK"), DNS: []netip.Addr{simnet.Resolver.Addr()}}
	sb, err := l.Create(context.Background(), Spec{Name: os.Getenv("FGRT_NAME"), LogsDir: os.Getenv("FGRT_LOGS")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "owner helper:", err)
		return 1
	}
	marker := os.Getenv("FGRT_MARKER")
	go sb.Run(context.Background(), Process{Argv: []string{"sleep", marker}, As: Agent})
	deadline := time.Now().Add(20 * time.Second)
	for len(nstest.HostProcs("sleep "+marker)) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
	return 0
}
