package integration

import (
	"fmt"
	"os"
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
// the same servers, without flowgate. The two alternate within every
// iteration, so a busy machine slows both alike.
//
// Each benchmark reports both paths and their ratio; ns/op (the time of a
// whole iteration of both paths) is not meaningful and is not reported.
// bench.sh runs them several times and prints the medians.

// benchSandbox is a denylist sandbox with flowgate attached in-process.
func benchSandbox(b *testing.B) *sandbox {
	b.Helper()
	inet := startInternet(b)
	s := newSandbox(b, inet)
	s.attach(loadPolicy(b, denylistPolicy))
	agentBin.get(b)
	b.Logf("load average: %s", loadAverage())
	return s
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// paths are the two ways through the sandbox, in the order of iteration i.
func paths(i int) []int {
	if i%2 == 0 {
		return []int{nstest.AgentUID, directUID}
	}
	return []int{directUID, nstest.AgentUID}
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
// (SNI peek, then splice) and directly. Metrics are the median MB/s of
// each and the ratio flowgate/direct.
func BenchmarkTLSThroughput(b *testing.B) {
	s := benchSandbox(b)
	const size = 64 << 20
	url := fmt.Sprintf("https://pypi.org%s%d", simnet.BulkPath, size)
	mbps := map[int][]float64{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, uid := range paths(i) {
			for _, r := range s.samples(b, uid, "bulk", "-n", "2", "-warmup", "1", url) {
				if r.Bytes != size {
					b.Fatalf("uid %d got %d bytes, want %d", uid, r.Bytes, size)
				}
				mbps[uid] = append(mbps[uid], float64(r.Bytes)/float64(r.Us))
			}
		}
	}
	b.StopTimer()
	fg, direct := median(mbps[nstest.AgentUID]), median(mbps[directUID])
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(fg, "flowgate-MB/s")
	b.ReportMetric(direct, "direct-MB/s")
	b.ReportMetric(fg/direct, "ratio")
}

// latency runs a timing mode on both paths and reports the p50 of each,
// the p50 flowgate adds, and the ratio of the p50s.
func latency(b *testing.B, s *sandbox, mode string, args ...string) {
	b.Helper()
	us := map[int][]int64{}
	connect, hshake := map[int][]int64{}, map[int][]int64{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, uid := range paths(i) {
			for _, r := range s.samples(b, uid, mode, args...) {
				us[uid] = append(us[uid], r.Us)
				connect[uid] = append(connect[uid], r.Connect)
				hshake[uid] = append(hshake[uid], r.Hshake)
			}
		}
	}
	b.StopTimer()
	fg, direct := median(us[nstest.AgentUID]), median(us[directUID])
	if mode == "handshake" {
		for _, uid := range []int{nstest.AgentUID, directUID} {
			b.Logf("uid %d: p50 connected after %dus, handshake done after %dus, answer after %dus (%d tries)",
				uid, median(connect[uid]), median(hshake[uid]), median(us[uid]), len(us[uid]))
		}
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(fg), "flowgate-p50-us")
	b.ReportMetric(float64(direct), "direct-p50-us")
	b.ReportMetric(float64(fg-direct), "added-p50-us")
	b.ReportMetric(float64(fg)/float64(direct), "ratio")
}

// BenchmarkConnectHandshake times, per try, a TCP connect to pypi.org's
// address, a TLS handshake with SNI pypi.org, one small GET and its answer
// (the agent resolved pypi.org once before, untimed).
func BenchmarkConnectHandshake(b *testing.B) {
	s := benchSandbox(b)
	latency(b, s, "handshake", "-n", "200", "-warmup", "10", "-sni", "pypi.org", pypi4+":443")
}

// BenchmarkDNS times, per try, one A query for pypi.org over UDP to the
// sandbox's resolver (flowgate's proxy, which forwards it, on the
// agent's path; the resolver itself on the direct one).
func BenchmarkDNS(b *testing.B) {
	s := benchSandbox(b)
	latency(b, s, "dnsbench", "-n", "500", "-warmup", "20", "-server", resolver4, "pypi.org")
}
