package runtime

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"flowgate/gate"
	"flowgate/gate/gateway"
	"flowgate/gate/netnsx"
	"flowgate/modelproxy"
)

// DoctorTargets are the columns of bench doctor's table, in order.
var DoctorTargets = []string{"example.com", "pypi.org", "metadata", "model"}

// ModeCheck is what an agent reached under one mode on the simulated
// internet: for each of DoctorTargets, whether it got an answer.
type ModeCheck struct {
	Mode gate.Mode
	// Reached and Detail are indexed like DoctorTargets.
	Reached []bool
	Detail  []string
	// Err is set when the check itself could not run.
	Err error
}

// Expected reports what each mode must reach, indexed like
// DoctorTargets.
func Expected(m gate.Mode) []bool {
	switch m {
	case gate.Public:
		return []bool{true, true, false, true}
	case gate.NoNetwork:
		return []bool{false, false, false, true}
	default: // denylist blocks example.com; allowlist admits pypi.org only
		return []bool{false, true, false, true}
	}
}

// doctorPolicy is the policy each mode is checked with.
func doctorPolicy(m gate.Mode) (*gate.Policy, error) {
	s := gate.Spec{Mode: m}
	switch m {
	case gate.Denylist:
		s.BlockedHosts = []gate.Entry{{Value: "example.com", Field: "blocked_hosts[0]"}}
	case gate.Allowlist:
		s.AllowedHosts = []gate.Entry{{Value: "pypi.org", Field: "allowed_hosts[0]"}}
	}
	return gate.Compile(s)
}

// doctorModelPort is where the doctor's model proxy listens in a sandbox.
const doctorModelPort = 15090

// probeScript runs as the agent: curl to each target, one line each:
// NAME EXIT HTTPCODE ERROR.
const probeScript = `probe() {
  name=$1; shift
  code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 8 "$@" 2>/tmp/probe.err)
  echo "$name $? $code $(head -c 120 /tmp/probe.err | tr '\n' ' ')"
}
probe example.com https://example.com/
probe pypi.org https://pypi.org/simple/
probe metadata --noproxy '*' http://169.254.169.254/latest/meta-data/
probe model --noproxy '*' -H "x-api-key: $MODEL_KEY" http://127.0.0.1:15090/v1/models
`

// CheckModes runs one sandbox per network mode on the simulated internet,
// with the gateway attached and a model proxy on loopback, and reports
// what an agent reached with curl.
func CheckModes(ctx context.Context, sim *SimUplink) []ModeCheck {
	var out []ModeCheck
	for _, m := range []gate.Mode{gate.Public, gate.NoNetwork, gate.Denylist, gate.Allowlist} {
		mc := ModeCheck{Mode: m}
		mc.Reached, mc.Detail, mc.Err = checkMode(ctx, sim, m)
		out = append(out, mc)
	}
	return out
}

func checkMode(ctx context.Context, sim *SimUplink, m gate.Mode) (reached []bool, detail []string, err error) {
	if _, err := os.Stat("/usr/bin/curl"); err != nil {
		return nil, nil, errors.New("curl is needed in the sandbox for the check: apt-get install curl")
	}
	p, err := doctorPolicy(m)
	if err != nil {
		return nil, nil, err
	}
	logs, err := os.MkdirTemp("", "bench-doctor-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(logs)
	var id [3]byte
	rand.Read(id[:])
	name := fmt.Sprintf("doc-%x-%s", id, strings.ReplaceAll(m.String(), "-", ""))
	sb, err := sim.Local().Create(ctx, Spec{Name: name, LogsDir: logs})
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = errors.Join(err, sb.Close()) }()
	bundle, _ := os.ReadFile(caBundle)
	if err := sb.WriteFile(caBundle, append(append(bundle, '\n'), sim.CAPEM()...), 0o644, Root); err != nil {
		return nil, nil, err
	}
	key, stop, err := startDoctorModelProxy(sim, sb)
	if err != nil {
		return nil, nil, err
	}
	defer stop()
	gw, err := gateway.Attach(sb.NetNS(), sb.AgentUID(), p, gateway.Options{Sandbox: sb.Name(), Cgroup: sb.Cgroup(), Resolvers: sb.Resolvers()})
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = errors.Join(err, gw.Close(), gateway.Detach(sb.NetNS())) }()
	env := []string{sandboxPath, "HOME=/home/" + sb.AgentUser(), "LANG=C.UTF-8", "MODEL_KEY=" + key}
	if m.Proxied() {
		proxy := fmt.Sprintf("http://127.0.0.1:%d", gate.DefaultPorts.Proxy)
		env = append(env, "https_proxy="+proxy, "HTTPS_PROXY="+proxy, "no_proxy=localhost,127.0.0.1,::1")
	}
	var stdout, stderr bytes.Buffer
	res, err := sb.Run(ctx, Process{Argv: []string{"/bin/sh", "-c", probeScript}, Env: env, As: Agent,
		Stdout: &stdout, Stderr: &stderr, Timeout: time.Minute})
	if err != nil {
		return nil, nil, err
	}
	if res.ExitCode != 0 {
		return nil, nil, fmt.Errorf("probe %s: %s", describeExit(res), strings.TrimSpace(stderr.String()))
	}
	return parseProbe(stdout.String())
}

// parseProbe reads the probe's lines into DoctorTargets order.
func parseProbe(s string) ([]bool, []string, error) {
	reached := make([]bool, len(DoctorTargets))
	detail := make([]string, len(DoctorTargets))
	seen := 0
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 4)
		if len(f) < 3 {
			continue
		}
		i := indexOf(DoctorTargets, f[0])
		if i < 0 {
			continue
		}
		seen++
		exit, _ := strconv.Atoi(f[1])
		code := f[2]
		if n, _ := strconv.Atoi(code); exit == 0 && n >= 200 && n < 500 {
			reached[i], detail[i] = true, "HTTP "+code
			continue
		}
		if exit == 0 {
			detail[i] = "refused: HTTP " + code
			continue
		}
		msg := ""
		if len(f) == 4 {
			msg = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(f[3]), "curl: "))
		}
		detail[i] = "refused: " + shortCurlError(exit, msg)
	}
	if seen != len(DoctorTargets) {
		return nil, nil, fmt.Errorf("probe printed %d of %d results: %q", seen, len(DoctorTargets), s)
	}
	return reached, detail, nil
}

// shortCurlError names a curl failure the way a person reads it.
func shortCurlError(exit int, msg string) string {
	switch exit {
	case 6:
		return "name not resolved"
	case 7:
		return "connection refused"
	case 28:
		return "timed out"
	case 35:
		return "TLS refused"
	case 56:
		if strings.Contains(msg, "403") {
			return "proxy 403"
		}
		return "connection reset"
	}
	if msg == "" {
		return "curl exit " + strconv.Itoa(exit)
	}
	return msg
}

func indexOf(l []string, s string) int {
	for i, v := range l {
		if v == s {
			return i
		}
	}
	return -1
}

// startDoctorModelProxy serves the simulated model API (api.example.com on
// the simulated internet) on loopback inside the sandbox, dialling from
// the stand-in host as the real proxy dials from the host.
func startDoctorModelProxy(sim *SimUplink, sb *LocalSandbox) (key string, stop func(), err error) {
	key, err = modelproxy.NewAgentKey()
	if err != nil {
		return "", nil, err
	}
	up, _ := url.Parse("https://api.example.com")
	p, err := modelproxy.New(modelproxy.Config{Upstream: up, RealKey: "doctor-real-key", AgentKey: key,
		Dial: sim.dial,
		TLS:  &tls.Config{RootCAs: sim.inet.CertPool()}})
	if err != nil {
		return "", nil, err
	}
	l, err := netnsx.Listen(sb.NetNS(), "tcp4", fmt.Sprintf("127.0.0.1:%d", doctorModelPort))
	if err != nil {
		return "", nil, fmt.Errorf("model proxy: %w", err)
	}
	go p.Serve(l)
	return key, func() { p.Close() }, nil
}
