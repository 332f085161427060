package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/vishvananda/netlink"

	"flowgate/gate/nstest"
	"flowgate/runtime"
)

// asBenchEnv makes the test binary run as bench itself (os.Args[1:] are
// bench's arguments): the tests that need a separate bench process (two
// runs at once, a killed run) re-execute the test binary this way instead
// of building bench.
const asBenchEnv = "FLOWGATE_BENCH_TEST_AS_BENCH"

func TestMain(m *testing.M) {
	runtime.MaybeInit() // sandbox phases re-execute this binary as their init
	if os.Getenv(asBenchEnv) == "1" {
		os.Exit(run(os.Args[1:]))
	}
	before := hostFlowgateTables()
	code := m.Run()
	for _, tbl := range hostFlowgateTables() {
		if !slices.Contains(before, tbl) {
			fmt.Fprintf(os.Stderr, "FAIL: the host namespace has nftables table %s after the tests and had none before\n", tbl)
			code = 1
		}
	}
	os.Exit(code)
}

// hostFlowgateTables lists flowgate's nftables tables in this process's
// own (the host's) namespace. It only reads: --simnet must never make
// one here.
func hostFlowgateTables() []string {
	if os.Geteuid() != 0 {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return nil
	}
	tables, err := c.ListTables()
	if err != nil {
		return nil
	}
	var out []string
	for _, t := range tables {
		if strings.HasPrefix(t.Name, "flowgate") {
			out = append(out, fmt.Sprintf("family %d %s", t.Family, t.Name))
		}
	}
	return out
}

// resetFlags puts every flag of every command back to its default, so
// in-process runs do not inherit the flags of the run before (cobra keeps
// flag values between Execute calls; repeatable flags would append).
func resetFlags(c *cobra.Command) {
	reset := func(f *pflag.Flag) {
		if s, ok := f.Value.(pflag.SliceValue); ok {
			s.Replace(nil)
		} else {
			f.Value.Set(f.DefValue)
		}
		f.Changed = false
	}
	c.Flags().VisitAll(reset)
	c.PersistentFlags().VisitAll(reset)
	for _, sub := range c.Commands() {
		resetFlags(sub)
	}
}

// benchProc is bench running as a separate process (the test binary
// re-executed as bench).
type benchProc struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	lines  chan string // stdout, line by line; closed at EOF
	out    []string    // what was read from lines so far
	done   chan struct{}
}

// startBench starts bench with args in its own process.
func startBench(t *testing.T, env []string, args ...string) *benchProc {
	t.Helper()
	p := &benchProc{lines: make(chan string, 100), done: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], args...)
	p.cmd.Env = append(append(os.Environ(), asBenchEnv+"=1"), env...)
	p.cmd.Stderr = &p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go readLines(stdout, p.lines)
	// A test that ends early stops bench as a user would (SIGTERM: it
	// removes its sandbox), so that the clean-up check sees its own
	// leftovers only.
	t.Cleanup(func() {
		if p.cmd.ProcessState != nil {
			return
		}
		p.cmd.Process.Signal(syscall.SIGTERM)
		exited := make(chan struct{})
		go func() {
			for range p.lines {
			}
			p.cmd.Wait()
			close(exited)
		}()
		select {
		case <-exited:
		case <-time.After(time.Minute):
			p.cmd.Process.Kill()
			<-exited
		}
	})
	return p
}

func readLines(r io.Reader, c chan<- string) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		c <- sc.Text()
	}
	close(c)
}

// waitLine reads stdout until a line containing want, or fails.
func (p *benchProc) waitLine(t *testing.T, want string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("bench ended without printing %q; stdout:\n%s\nstderr:\n%s", want, strings.Join(p.out, "\n"), p.stderr.String())
			}
			p.out = append(p.out, l)
			if strings.Contains(l, want) {
				return l
			}
		case <-deadline:
			t.Fatalf("bench printed no %q within %v; stdout so far:\n%s", want, timeout, strings.Join(p.out, "\n"))
		}
	}
}

// wait reads the rest of stdout and waits for the exit code.
func (p *benchProc) wait(t *testing.T) (int, string, string) {
	t.Helper()
	for l := range p.lines {
		p.out = append(p.out, l)
	}
	err := p.cmd.Wait()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("waiting for bench: %v", err)
		}
		code = ee.ExitCode()
	}
	return code, strings.Join(p.out, "\n") + "\n", p.stderr.String()
}

// netnsWith lists /run/netns entries with the prefix.
func netnsWith(prefix string) []string {
	ents, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// cgroupOf returns the path of a sandbox's cgroup, "" without cgroup v2.
func cgroupOf(name string) string {
	for _, m := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(m, "cgroup.controllers")); err == nil {
			return filepath.Join(m, "flowgate", name)
		}
	}
	return ""
}

// simnetBefore snapshots the simulated uplinks' namespaces, so that a
// test can tell which ones it left.
func simnetBefore() map[string]bool {
	m := map[string]bool{}
	for _, p := range []string{"fg-simh-", "fg-inet-"} {
		for _, n := range netnsWith(p) {
			m[n] = true
		}
	}
	return m
}

// assertClean checks that nothing of the given trials (sandbox names
// t-<id>) and of the simulated uplinks made since before is left: no
// netns, no host link, no cgroup, no state, no process of the markers.
func assertClean(t *testing.T, stateDir string, before map[string]bool, sandboxes ...string) {
	t.Helper()
	for _, name := range sandboxes {
		if netnsExists("fg-" + name) {
			t.Errorf("netns fg-%s is left", name)
		}
		if _, err := netlink.LinkByName("fg-" + name); err == nil {
			t.Errorf("link fg-%s is in the host namespace", name)
		}
		if cg := cgroupOf(name); cg != "" {
			if _, err := os.Stat(cg); !os.IsNotExist(err) {
				t.Errorf("cgroup %s is left (%v)", cg, err)
			}
		}
	}
	// A simulated uplink's record goes only once its namespaces went.
	for _, sub := range []string{"sandboxes", "simnet"} {
		if ents, _ := os.ReadDir(filepath.Join(stateDir, sub)); len(ents) > 0 {
			t.Errorf("state is left in %s: %v", filepath.Join(stateDir, sub), ents)
		}
	}
	// Namespaces of the uplinks this test made (another test binary's
	// bench --simnet could be running, so wait a little for strays).
	var left []string
	for range 50 {
		left = left[:0]
		for n := range simnetBefore() {
			if !before[n] {
				left = append(left, n)
			}
		}
		if len(left) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("simulated uplink namespaces are left: %v", left)
	}
	if ps := nstest.HostProcs("sleep 98765"); len(ps) > 0 {
		t.Errorf("sandbox processes are left on the host: %v", ps)
	}
}

// checkCleanAtEnd snapshots the simulated uplinks now and registers a
// cleanup (it runs also when the test fails) that calls assertClean for
// every trial folder found under jobs.
func checkCleanAtEnd(t *testing.T, state, jobs string) {
	t.Helper()
	before := simnetBefore()
	t.Cleanup(func() {
		trials, _ := filepath.Glob(filepath.Join(jobs, "*", "*__*"))
		var names []string
		for _, d := range trials {
			if i := strings.LastIndex(d, "__"); i >= 0 {
				names = append(names, "t-"+d[i+2:])
			}
		}
		assertClean(t, state, before, names...)
	})
}

func netnsExists(name string) bool {
	_, err := os.Lstat("/run/netns/" + name)
	return err == nil
}
