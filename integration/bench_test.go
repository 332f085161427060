package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"flowgate/gate/nstest"
	"flowgate/integration/simnet"
)

// The benchmarks measure what an agent sees: the Go agent client runs as
// uid 1000 inside the sandbox (denylist, so TCP goes through flowgate's
// transparent port and DNS through its proxy), times its own tries and
// prints them. The direct path is the same client, in the same namespace
// and the same run, as uid 1001, which no rule matches: the same route to
// the same servers, without flowgate. The paths take turns within every
// iteration, so a busy machine slows them alike.
//
// Each benchmark runs flowgate two ways, as sub-benchmarks:
//
//   - process: `flowgate attach` in a process of its own, as it is
//     deployed (bench run's gateway likewise shares its process with
//     nothing busy). These are the figures that count.
//   - inprocess: the gateway in the test process, which also runs the
//     simulated internet's servers. Flowgate then shares a Go runtime whose
//     threads the servers keep awake, so a wakeup costs it less than it
//     would alone; the figures flatter it and are kept to show how much of
//     the added latency is waking a sleeping process.
//
// A third path is the floor: the same client as relayUID, whose TCP and DNS
// nftables sends to barerelay (internal/barerelay), a relay in a process of
// its own that decides nothing. What it adds is what any userspace proxy
// adds here; flowgate's own cost is the difference.
//
// Each reports the paths and their ratios; ns/op (the time of a whole
// iteration of all paths) is not meaningful and is not reported. bench.sh
// runs them several times and prints the medians.

// attachModes are the two ways the benchmarks run flowgate.
var attachModes = []string{"process", "inprocess"}

// benchSandbox is a denylist sandbox with flowgate attached as mode says.
func benchSandbox(b *testing.B, mode string) *sandbox {
	b.Helper()
	inet := startInternet(b)
	s := newSandbox(b, inet)
	switch mode {
	case "process":
		startFlowgate(b, s, policyFile(b, denylistPolicy), filepath.Join(b.TempDir(), "flowgate.jsonl"))
	case "inprocess":
		s.attach(loadPolicy(b, denylistPolicy))
	default:
		b.Fatalf("unknown attach mode %q", mode)
	}
	agentBin.get(b)
	s.startRelay(b)
	b.Logf("load average: %s", loadAverage())
	return s
}

// relayUID is the benchmarks' floor path: its TCP and DNS go to barerelay.
const relayUID = 1002

// Where barerelay listens inside the sandbox.
const (
	relayTCPPort = 15101
	relayUDPPort = 15102
)

var relayBin = &binary{name: "barerelay", pkg: "flowgate/integration/internal/barerelay", env: []string{"CGO_ENABLED=0"}}

// relayRuleset sends relayUID's TCP and DNS to barerelay. It is a table
// of its own; flowgate's rules match uid 1000 only.
var relayRuleset = fmt.Sprintf(`table ip fgbench_relay {
	chain out {
		type nat hook output priority -100; policy accept;
		meta skuid %d udp dport 53 redirect to :%d
		meta skuid %d meta l4proto tcp redirect to :%d
	}
}
`, relayUID, relayUDPPort, relayUID, relayTCPPort)

// startRelay runs barerelay as root in the sandbox and applies its rules;
// both go when the benchmark ends.
func (s *sandbox) startRelay(b *testing.B) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := s.command(ctx, 0, nil, relayBin.get(b), "-tcp", fmt.Sprintf("127.0.0.1:%d", relayTCPPort),
		"-udp", fmt.Sprintf("127.0.0.1:%d", relayUDPPort), "-resolver", resolver4)
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Fatalf("starting barerelay: %v", err)
	}
	b.Cleanup(func() {
		cancel()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		b.Fatalf("barerelay did not start: %q, %v\n%s", line, err, stderr.String())
	}
	nft := exec.Command("ip", "netns", "exec", s.ns.Name, "nft", "-f", "-")
	nft.Stdin = strings.NewReader(relayRuleset)
	if msg, err := nft.CombinedOutput(); err != nil {
		b.Fatalf("applying the relay's rules: %v\n%s", err, msg)
	}
	b.Cleanup(func() {
		if msg, err := exec.Command("ip", "netns", "exec", s.ns.Name, "nft", "delete", "table", "ip", "fgbench_relay").CombinedOutput(); err != nil {
			b.Errorf("removing the relay's rules: %v\n%s", err, msg)
		}
	})
}

// eachMode runs bench once per attach mode, as a sub-benchmark.
func eachMode(b *testing.B, bench func(b *testing.B, s *sandbox)) {
	for _, mode := range attachModes {
		b.Run(mode, func(b *testing.B) { bench(b, benchSandbox(b, mode)) })
	}
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// paths are the three ways through the sandbox, in the order of iteration
// i: each comes first, second and third in turn.
func paths(i int) []int {
	p := []int{nstest.AgentUID, directUID, relayUID}
	k := i % len(p)
	return append(p[k:], p[:k]...)
}

// samples runs one timing mode of the client as uid and returns its tries,
// failing the benchmark on any failed try.
func (s *sandbox) samples(b *testing.B, uid int, mode string, args ...string) []result {
	b.Helper()
	var out []result
	for _, r := range s.goClientAs(uid, s.env(false), mode, args...) {
		if r.Mode == "summary" {
			continue
		}
		if !r.OK {
			b.Fatalf("%s as uid %d: %+v", mode, uid, r)
		}
		out = append(out, r)
	}
	return out
}

func median[T int64 | float64](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkTLSThroughput downloads 64 MiB over HTTPS (HTTP/1.1, a fresh
// connection each) from pypi.org: through flowgate's transparent path
// (SNI peek, then splice), directly and through the relay. Metrics are the
// median MB/s of flowgate and direct, the ratio flowgate/direct and the
// ratio relay/direct.
func BenchmarkTLSThroughput(b *testing.B) { eachMode(b, tlsThroughput) }

func tlsThroughput(b *testing.B, s *sandbox) {
	const size = 64 << 20
	url := fmt.Sprintf("https://pypi.org%s%d", simnet.BulkPath, size)
	mbps := map[int][]float64{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, uid := range paths(i) {
			for _, r := range s.samples(b, uid, "bulk", "-n", "4", "-warmup", "1", url) {
				if r.Bytes != size {
					b.Fatalf("uid %d got %d bytes, want %d", uid, r.Bytes, size)
				}
				mbps[uid] = append(mbps[uid], float64(r.Bytes)/float64(r.Us))
			}
		}
	}
	b.StopTimer()
	fg, direct, relay := median(mbps[nstest.AgentUID]), median(mbps[directUID]), median(mbps[relayUID])
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(fg, "flowgate-MB/s")
	b.ReportMetric(direct, "direct-MB/s")
	b.ReportMetric(fg/direct, "ratio")
	b.ReportMetric(relay/direct, "relay-ratio")
}

// latency runs a timing mode on the three paths and reports the p50 of
// flowgate and direct, the p50 flowgate adds, the ratio of the p50s and
// the p50 the relay adds. For handshake the
// timed span is connect plus TLS handshake (what the issue names), and
// answer-added-p50-us is what flowgate adds to the whole try, one small
// GET and its answer included.
func latency(b *testing.B, s *sandbox, mode string, args ...string) {
	b.Helper()
	us := map[int][]int64{}
	connect, hshake := map[int][]int64{}, map[int][]int64{}
	hello, reply := map[int][]int64{}, map[int][]int64{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, uid := range paths(i) {
			for _, r := range s.samples(b, uid, mode, args...) {
				us[uid] = append(us[uid], r.Us)
				connect[uid] = append(connect[uid], r.Connect)
				hshake[uid] = append(hshake[uid], r.Hshake)
				hello[uid] = append(hello[uid], r.HelloUs)
				reply[uid] = append(reply[uid], r.ReplyUs)
			}
		}
	}
	b.StopTimer()
	timed := us
	if mode == "handshake" {
		for _, uid := range []int{nstest.AgentUID, directUID, relayUID} {
			b.Logf("uid %d: p50 (µs from the start) connected %d, ClientHello written %d, server's first bytes %d, "+
				"handshake done %d, answer %d (%d tries)", uid, median(connect[uid]), median(hello[uid]),
				median(reply[uid]), median(hshake[uid]), median(us[uid]), len(us[uid]))
		}
		timed = hshake
		b.ReportMetric(float64(median(us[nstest.AgentUID])-median(us[directUID])), "answer-added-p50-us")
	}
	fg, direct, relay := median(timed[nstest.AgentUID]), median(timed[directUID]), median(timed[relayUID])
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(fg), "flowgate-p50-us")
	b.ReportMetric(float64(direct), "direct-p50-us")
	b.ReportMetric(float64(fg-direct), "added-p50-us")
	b.ReportMetric(float64(fg)/float64(direct), "ratio")
	b.ReportMetric(float64(relay-direct), "relay-added-p50-us")
}

// BenchmarkConnectHandshake times, per try, a TCP connect to pypi.org's
// address and a TLS handshake with SNI pypi.org, then one small GET and its
// answer (the agent resolved pypi.org once before, untimed).
func BenchmarkConnectHandshake(b *testing.B) {
	eachMode(b, func(b *testing.B, s *sandbox) {
		latency(b, s, "handshake", "-n", "200", "-warmup", "10", "-sni", "pypi.org", pypi4+":443")
	})
}

// BenchmarkRoundTrip times, per try, one round trip of a short line on an
// established TCP connection to the echo server (plain TCP, spliced on
// flowgate's path): what crossing flowgate costs once a stream is routed,
// one wakeup of flowgate each way.
func BenchmarkRoundTrip(b *testing.B) {
	eachMode(b, func(b *testing.B, s *sandbox) {
		latency(b, s, "roundtrip", "-n", "500", "-warmup", "20", simnet.Echo.String())
	})
}

// BenchmarkDNS times, per try, one A query for pypi.org over UDP to the
// sandbox's resolver (flowgate's proxy, which forwards it, on the
// agent's path; the resolver itself on the direct one).
func BenchmarkDNS(b *testing.B) {
	eachMode(b, func(b *testing.B, s *sandbox) {
		latency(b, s, "dnsbench", "-n", "500", "-warmup", "20", "-server", resolver4, "pypi.org")
	})
}
