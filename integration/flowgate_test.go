package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"flowgate/gate"
	"flowgate/gate/nstest"
	"flowgate/integration/simnet"
)

// flowgateProc is a running `flowgate attach`.
type flowgateProc struct {
	cmd      *exec.Cmd
	stderr   lockedLines
	attached chan struct{}
	done     chan struct{}
	waitErr  error
}

// lockedLines collects a process's output lines.
type lockedLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *lockedLines) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
}

func (l *lockedLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// startFlowgate runs `flowgate attach` on the sandbox in the host's
// namespaces, as an operator would, and waits for its "attached" line. The
// process is killed when the test ends if it still runs.
func startFlowgate(t testing.TB, s *sandbox, policy, logPath string) *flowgateProc {
	t.Helper()
	cmd := exec.Command(flowgateBin.get(t), "attach", "--netns", s.ns.Path, "--uid", fmt.Sprint(nstest.AgentUID),
		"--policy", policy, "--dns", simnet.Resolver.Addr().String(), "--log", logPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &flowgateProc{cmd: cmd, attached: make(chan struct{}), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting flowgate attach: %v", err)
	}
	go p.readStderr(r)
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			cmd.Process.Kill()
			<-p.done
		}
	})
	select {
	case <-p.attached:
	case <-p.done:
		t.Fatalf("flowgate attach exited before attaching: %v\n%s", p.waitErr, &p.stderr)
	case <-time.After(60 * time.Second):
		t.Fatalf("flowgate attach did not attach within a minute:\n%s", &p.stderr)
	}
	return p
}

// readStderr collects the process's log lines, signals the "attached"
// line, and reaps the process once its stderr closes.
func (p *flowgateProc) readStderr(r io.Reader) {
	sc := bufio.NewScanner(r)
	seen := false
	for sc.Scan() {
		p.stderr.add(sc.Text())
		if !seen && strings.Contains(sc.Text(), "msg=attached ") {
			seen = true
			close(p.attached)
		}
	}
	io.Copy(io.Discard, r)
	p.waitErr = p.cmd.Wait()
	close(p.done)
}

// stop sends sig and waits for the process to end.
func (p *flowgateProc) stop(t testing.TB, sig syscall.Signal) error {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signalling flowgate: %v", err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("flowgate still runs 30s after %v:\n%s", sig, &p.stderr)
	}
	return p.waitErr
}

// flowgateCmd runs a short flowgate subcommand and returns its output and
// exit code.
func flowgateCmd(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(flowgateBin.get(t), args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("running flowgate %q: %v", args, err)
	return "", -1
}

// TestFlowgateCommand runs `flowgate attach` as a separate process and
// ends it: killed, it leaves its rules and the agent with no egress at
// all; detach restores the plain network. Stopped with SIGTERM, it exits
// cleanly and also leaves its rules.
func TestFlowgateCommand(t *testing.T) {
	inet := startInternet(t)
	s := newSandbox(t, inet)
	policy := policyFile(t, denylistPolicy)
	logPath := filepath.Join(t.TempDir(), "egress.jsonl")
	env := s.env(false)
	audit := func(t *testing.T) (string, int) {
		return flowgateCmd(t, "audit", "--netns", s.ns.Path, "--policy", policy, "--uid", fmt.Sprint(nstest.AgentUID))
	}
	detach := func(t *testing.T) {
		if out, code := flowgateCmd(t, "detach", "--netns", s.ns.Path); code != 0 {
			t.Fatalf("flowgate detach: exit %d\n%s", code, out)
		}
	}
	// A failed test must not leave the table behind with the namespace
	// still in use by later clean-ups: detach at the end in any case.
	t.Cleanup(func() { flowgateCmd(t, "detach", "--netns", s.ns.Path) })

	// filtered checks that the agent is under the policy: pypi.org
	// reachable, example.com refused by name.
	filtered := func(t *testing.T) {
		t.Helper()
		got := s.python(env, exampleURL, pypiURL)
		if want := wantPython(pypiURL, expect{out: reach}); got[pypiURL] != want {
			t.Errorf("python %s: %s, want %s", pypiURL, got[pypiURL], want)
		}
		if want := wantPython(exampleURL, expect{out: nxdomain}); got[exampleURL] != want {
			t.Errorf("python %s: %s, want %s", exampleURL, got[exampleURL], want)
		}
	}
	// noEgress checks that the agent reaches nothing and fails fast: DNS
	// to a port with no listener is refused, TCP to one is reset.
	noEgress := func(t *testing.T) {
		t.Helper()
		hits, queries := inet.Hits("pypi.org"), inet.Queries("pypi.org")
		defer func() {
			if inet.Hits("pypi.org") != hits || inet.Queries("pypi.org") != queries {
				t.Errorf("pypi.org was reached while flowgate was down")
			}
		}()
		if r := s.goOne(env, "dns", "pypi.org"); r.Kind != "refused" {
			t.Errorf("DNS over UDP: %+v, want refused at once", r)
		}
		if r := s.goOne(env, "dns", "-tcp", "pypi.org"); r.Kind != "refused" {
			t.Errorf("DNS over TCP: %+v, want refused", r)
		}
		for _, a := range []string{pypi4 + ":443", "[" + pypi6 + "]:443", echo4} {
			if r := s.goOne(env, "tls", "-sni", "pypi.org", a); r.Kind != "refused" {
				t.Errorf("TCP to %s: %+v, want refused", a, r)
			}
		}
		got := s.python(env, pypiURL)
		if want := wantPython(pypiURL, expect{out: noDNS}); got[pypiURL] != want {
			t.Errorf("python %s: %s, want %s", pypiURL, got[pypiURL], want)
		}
		if got := s.curl(env, pypiURL, "--resolve", "pypi.org:443:"+pypi4); got.exit != 7 {
			t.Errorf("curl by address: %+v, want exit 7 (connection refused)", got)
		}
	}
	rulesStay := func(t *testing.T) {
		t.Helper()
		if out, code := audit(t); code != 0 || out != "table inet flowgate matches the policy\n" {
			t.Errorf("flowgate audit: exit %d\n%s\nwant 0: the rules must stay", code, out)
		}
	}

	t.Run("SIGKILL", func(t *testing.T) {
		p := startFlowgate(t, s, policy, logPath)
		filtered(t)
		err := p.stop(t, syscall.SIGKILL)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("flowgate attach ended with %v, want killed", err)
		}
		noEgress(t)
		rulesStay(t)
		detach(t)
		if got := s.curl(env, exampleURL); got.exit != 0 || got.status != 200 {
			t.Errorf("after detach, curl %s: %+v, want 200 (no policy left)", exampleURL, got)
		}
		if got := s.curl(env, pypiURL); got.exit != 0 || got.status != 200 {
			t.Errorf("after detach, curl %s: %+v, want 200", pypiURL, got)
		}
		if out, code := audit(t); code != 1 {
			t.Errorf("flowgate audit after detach: exit %d\n%s\nwant 1 (no table)", code, out)
		}
	})

	t.Run("SIGTERM", func(t *testing.T) {
		p := startFlowgate(t, s, policy, logPath)
		filtered(t)
		if err := p.stop(t, syscall.SIGTERM); err != nil {
			t.Errorf("flowgate attach after SIGTERM: %v, want exit 0\n%s", err, &p.stderr)
		}
		if !strings.Contains(p.stderr.String(), "stopped; rules stay until 'flowgate detach'") {
			t.Errorf("flowgate attach did not say it stopped:\n%s", &p.stderr)
		}
		rulesStay(t)
		noEgress(t)
		// Attaching again over the rules left behind restores service.
		p = startFlowgate(t, s, policy, logPath)
		filtered(t)
		if err := p.stop(t, syscall.SIGTERM); err != nil {
			t.Errorf("second flowgate attach after SIGTERM: %v\n%s", err, &p.stderr)
		}
		rulesStay(t)
		detach(t)
		if got := s.curl(env, pypiURL); got.exit != 0 || got.status != 200 {
			t.Errorf("after detach, curl %s: %+v, want 200", pypiURL, got)
		}
	})

	t.Run("egress log", func(t *testing.T) {
		b, err := os.ReadFile(logPath)
		if err != nil {
			t.Fatal(err)
		}
		var tlsAllow, dnsDeny int
		for i, line := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
			var r gate.Record
			dec := json.NewDecoder(bytes.NewReader(line))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&r); err != nil {
				t.Fatalf("line %d of the egress log is not a record: %q: %v", i+1, line, err)
			}
			if r.Sandbox != "flowgate" || r.UID != nstest.AgentUID {
				t.Errorf("line %d: sandbox %q uid %d, want flowgate 1000", i+1, r.Sandbox, r.UID)
			}
			switch {
			case r.Proto == gate.ProtoTLS && r.Name == "pypi.org" && r.Verdict == gate.VerdictAllow && r.Reason == gate.ReasonNotBlocked:
				tlsAllow++
			case r.Proto == gate.ProtoDNS && r.Name == "example.com" && r.Verdict == gate.VerdictDeny &&
				r.Reason == gate.ReasonHostBlocked && r.Rule == ruleBlockExample:
				dnsDeny++
			}
		}
		// Three attaches, each checked once with Python: A and AAAA for
		// example.com (glibc sends both at once and, now and then, one of
		// them again), one TLS connection to pypi.org.
		if tlsAllow != 3 || dnsDeny < 6 {
			t.Errorf("egress log: %d TLS allows for pypi.org and %d DNS denials for example.com, want 3 and at least 6:\n%s", tlsAllow, dnsDeny, b)
		}
	})
}
