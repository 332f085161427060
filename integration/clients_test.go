package integration

// How the agent's processes run inside the sandbox (as uid 1000, through
// ip netns exec and setpriv) and how each client's output is read: curl,
// the Python of examples/net-probe.sh, and the Go agent client.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"flowgate/gate/nstest"
)

// proc is what a finished process left.
type proc struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

func (p proc) String() string {
	return fmt.Sprintf("exit %d after %v\nstdout: %s\nstderr: %s", p.code, p.took.Round(time.Millisecond), p.stdout, p.stderr)
}

// baseEnv is an agent's whole environment: nothing of the test's own,
// and the simulated CA for Python and Go.
func (s *sandbox) baseEnv() []string {
	return []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "LANG=C.UTF-8", "SSL_CERT_FILE=" + s.inet.CAFile()}
}

// proxyEnv points every proxy variable at flowgate's explicit proxy, as
// bench run does under denylist and allowlist.
var proxyEnv = []string{
	"HTTPS_PROXY=" + proxyURL, "https_proxy=" + proxyURL, "HTTP_PROXY=" + proxyURL, "http_proxy=" + proxyURL,
	"NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1",
}

// env is the agent's environment, with the proxy variables when proxy.
func (s *sandbox) env(proxy bool) []string {
	env := s.baseEnv()
	if proxy {
		env = append(env, proxyEnv...)
	}
	return env
}

// run runs argv inside the sandbox as uid with no_new_privs and no groups,
// through `ip netns exec` (which puts the sandbox's resolv.conf in place)
// and setpriv. The process and its children are killed if the test ends
// first or procTimeout passes.
func (s *sandbox) run(uid int, env []string, argv ...string) proc {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), procTimeout)
	defer cancel()
	cmd := s.command(ctx, uid, env, argv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	p := proc{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.Exited():
		p.code = ee.ExitCode()
	default:
		s.t.Fatalf("running %q in %s: %v\n%s", argv, s.ns.Name, err, p)
	}
	return p
}

// command is the exec.Cmd run uses; a caller that starts it owns it.
func (s *sandbox) command(ctx context.Context, uid int, env []string, argv ...string) *exec.Cmd {
	args := []string{"netns", "exec", s.ns.Name, "setpriv",
		fmt.Sprintf("--reuid=%d", uid), fmt.Sprintf("--regid=%d", uid), "--clear-groups", "--no-new-privs", "--"}
	cmd := exec.CommandContext(ctx, "ip", append(args, argv...)...)
	cmd.Env = env
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// agent runs argv as the agent's uid 1000.
func (s *sandbox) agent(env []string, argv ...string) proc {
	s.t.Helper()
	return s.run(nstest.AgentUID, env, argv...)
}

// result is one line of the Go agent client (internal/agentclient).
type result struct {
	Mode    string   `json:"mode"`
	Target  string   `json:"target"`
	OK      bool     `json:"ok"`
	Status  int      `json:"status"`
	Reason  string   `json:"reason"`
	Body    string   `json:"body"`
	Addr    string   `json:"addr"`
	Rcode   string   `json:"rcode"`
	Answers []string `json:"answers"`
	EDE     string   `json:"ede"`
	Kind    string   `json:"kind"`
	Err     string   `json:"err"`
	Bytes   int64    `json:"bytes"`
	Us      int64    `json:"us"`
	Connect int64    `json:"connect_us"`
	Hshake  int64    `json:"handshake_us"`
	HelloUs int64    `json:"hello_us"`
	ReplyUs int64    `json:"reply_us"`
	N       int      `json:"n"`
	P50     int64    `json:"p50_us"`
	P90     int64    `json:"p90_us"`
	P99     int64    `json:"p99_us"`
	MBps    float64  `json:"mbps"`
}

// goClientAs runs the Go agent client as uid and returns its lines.
func (s *sandbox) goClientAs(uid int, env []string, mode string, args ...string) []result {
	s.t.Helper()
	p := s.run(uid, env, append([]string{agentBin.get(s.t), mode}, args...)...)
	if p.code != 0 {
		s.t.Fatalf("agentclient %s %q: %s", mode, args, p)
	}
	var out []result
	for _, line := range strings.Split(strings.TrimSpace(p.stdout), "\n") {
		var r result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			s.t.Fatalf("agentclient %s printed %q: %v", mode, line, err)
		}
		out = append(out, r)
	}
	return out
}

// goClient runs the Go agent client as the agent.
func (s *sandbox) goClient(env []string, mode string, args ...string) []result {
	s.t.Helper()
	return s.goClientAs(nstest.AgentUID, env, mode, args...)
}

// goOne runs the Go agent client for one try and returns its line.
func (s *sandbox) goOne(env []string, mode string, args ...string) result {
	s.t.Helper()
	rs := s.goClient(env, mode, args...)
	if len(rs) != 1 {
		s.t.Fatalf("agentclient %s %q: %d lines, want 1: %+v", mode, args, len(rs), rs)
	}
	return rs[0]
}

// curlResult is what curl did: its exit code, the status and body it got,
// and its error message.
type curlResult struct {
	exit   int
	status int
	body   string
	errMsg string
}

// curl fetches url as the agent with the simulated CA; extra flags go
// before the URL.
func (s *sandbox) curl(env []string, url string, extra ...string) curlResult {
	s.t.Helper()
	argv := []string{"curl", "-sS", "--max-time", "20", "--cacert", s.inet.CAFile(), "-w", "\n%{http_code}"}
	argv = append(append(argv, extra...), url)
	p := s.agent(env, argv...)
	r := curlResult{exit: p.code, errMsg: strings.TrimSpace(p.stderr)}
	body, code, _ := cutLast(p.stdout, "\n")
	fmt.Sscanf(code, "%d", &r.status)
	r.body = body
	return r
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return "", s, false
	}
	return s[:i], s[i+len(sep):], true
}

var (
	probeOnce sync.Once
	probeCode string
	probeErr  error
)

// probeScript is the Python part of examples/net-probe.sh, with its URL
// list taken from the command line instead: the same urllib calls and the
// same printed lines as the reference page.
func probeScript(t testing.TB) string {
	t.Helper()
	probeOnce.Do(func() {
		b, err := os.ReadFile("../examples/net-probe.sh")
		if err != nil {
			probeErr = err
			return
		}
		_, rest, ok1 := strings.Cut(string(b), "<<'PY'\n")
		code, _, ok2 := strings.Cut(rest, "\nPY\n")
		const list = `for url in ["https://example.com", "https://pypi.org/simple/"]:`
		if !ok1 || !ok2 || strings.Count(code, list) != 1 {
			probeErr = fmt.Errorf("examples/net-probe.sh changed: no python block with %q", list)
			return
		}
		probeCode = "import sys\n" + strings.Replace(code, list, "for url in sys.argv[1:]:", 1)
	})
	if probeErr != nil {
		t.Fatal(probeErr)
	}
	return probeCode
}

// python runs the net-probe urllib loop as the agent over urls and returns
// the line it printed for each.
func (s *sandbox) python(env []string, urls ...string) map[string]string {
	s.t.Helper()
	p := s.agent(env, append([]string{"/usr/bin/python3", "-c", probeScript(s.t)}, urls...)...)
	if p.code != 0 {
		s.t.Fatalf("python probe: %s", p)
	}
	out := make(map[string]string)
	for _, line := range strings.Split(strings.TrimSpace(p.stdout), "\n") {
		url, rest, _ := strings.Cut(line, " ")
		out[url] = rest
	}
	if len(out) != len(urls) {
		s.t.Fatalf("python probe printed %d lines for %d URLs: %s", len(out), len(urls), p)
	}
	return out
}
