package runtime

import (
	"context"
	"testing"
)

// BenchmarkCreateClose measures a sandbox's whole life without phases:
// state, netns, veth, host rules, cgroups, and their removal.
func BenchmarkCreateClose(b *testing.B) {
	e := newEnv(b)
	logs := e.logsDir(b)
	for b.Loop() {
		sb, err := e.local.Create(context.Background(), Spec{Name: randName("rtb"), LogsDir: logs})
		if err != nil {
			b.Fatal(err)
		}
		if err := sb.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRun measures one phase: re-exec of the init, the sandbox root
// (overlays, /proc, /dev, binds, pivot_root), `true` as the agent, and the
// PID namespace's end.
func BenchmarkRun(b *testing.B) {
	e := newEnv(b)
	sb := e.create(b, Spec{})
	for b.Loop() {
		res, err := sb.Run(context.Background(), Process{Argv: []string{"/bin/true"}, As: Agent})
		if err != nil || res.ExitCode != 0 {
			b.Fatal(res, err)
		}
	}
}

// BenchmarkWriteFile measures copying a small file into the sandbox.
func BenchmarkWriteFile(b *testing.B) {
	e := newEnv(b)
	sb := e.create(b, Spec{})
	data := make([]byte, 4096)
	for b.Loop() {
		if err := sb.WriteFile("/app/agent.sh", data, 0o755, Agent); err != nil {
			b.Fatal(err)
		}
	}
}
