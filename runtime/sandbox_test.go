package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"flowgate/gate/nstest"

	"golang.org/x/sys/unix"
)

// TestSandboxPhases walks one sandbox through what a trial does: install
// as root with the internet, the agent as its own user, the verifier as
// root, checking the boundary the gateway relies on at each step.
func TestSandboxPhases(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, Spec{})
	in := internet(t)
	uid := strconv.Itoa(int(sb.AgentUID()))

	t.Run("internet as root", func(t *testing.T) {
		if err := sb.WriteFile("/usr/local/share/simnet-ca.pem", in.CAPEM(), 0o644, Root); err != nil {
			t.Fatal(err)
		}
		out := mustRun(t, sb, Root, "curl", "-sS", "--max-time", "20", "--cacert", "/usr/local/share/simnet-ca.pem", "https://example.com/hello")
		if out != "simnet example.com /hello\n" {
			t.Errorf("curl https://example.com/hello = %q", out)
		}
		if sb.IPv6() {
			out := mustRun(t, sb, Root, "curl", "-6", "-sS", "--max-time", "20", "--cacert", "/usr/local/share/simnet-ca.pem", "https://example.com/six")
			if out != "simnet example.com /six\n" {
				t.Errorf("curl -6 = %q", out)
			}
		} else {
			t.Errorf("the sandbox has no IPv6 although H can forward it")
		}
	})

	t.Run("install persists in the sandbox only", func(t *testing.T) {
		mustRun(t, sb, Root, "sh", "-c", `printf '#!/bin/sh\necho tool-ok\n' > /usr/local/bin/fgrt-tool && chmod 755 /usr/local/bin/fgrt-tool && mkdir -p /data && echo d > /data/x`)
		if out := mustRun(t, sb, Agent, "fgrt-tool"); out != "tool-ok\n" {
			t.Errorf("fgrt-tool as agent = %q", out)
		}
		if out := mustRun(t, sb, Agent, "cat", "/data/x"); out != "d\n" {
			t.Errorf("/data/x as agent = %q", out)
		}
		if _, err := os.Stat("/usr/local/bin/fgrt-tool"); err == nil {
			t.Errorf("the install phase changed the host's /usr/local/bin")
		}
	})

	t.Run("no install process survives", func(t *testing.T) {
		marker := "1" + strconv.Itoa(int(time.Now().UnixNano()%1e6))
		mustRun(t, sb, Root, "sh", "-c", "setsid sleep "+marker+" </dev/null >/dev/null 2>&1 & nohup sleep "+marker+" >/dev/null 2>&1 & echo started")
		if pids := nstest.HostProcs("sleep " + marker); len(pids) > 0 {
			t.Errorf("install-phase processes still run on the host after Run returned: %v", pids)
		}
		out := mustRun(t, sb, Agent, "sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done")
		if strings.Contains(out, "sleep "+marker) {
			t.Errorf("the agent phase sees the install phase's processes:\n%s", out)
		}
	})

	t.Run("agent has no privileges", func(t *testing.T) {
		out := mustRun(t, sb, Agent, "cat", "/proc/self/status")
		want := map[string]string{
			"Uid":        uid + "\t" + uid + "\t" + uid + "\t" + uid,
			"Gid":        strconv.Itoa(int(sb.AgentGID())) + "\t" + strconv.Itoa(int(sb.AgentGID())) + "\t" + strconv.Itoa(int(sb.AgentGID())) + "\t" + strconv.Itoa(int(sb.AgentGID())),
			"Groups":     "",
			"CapInh":     "0000000000000000",
			"CapPrm":     "0000000000000000",
			"CapEff":     "0000000000000000",
			"CapBnd":     "0000000000000000",
			"CapAmb":     "0000000000000000",
			"NoNewPrivs": "1",
		}
		// A descriptor bench inherited without close-on-exec (as from a
		// job runner) must not reach the agent. ls's own directory
		// descriptor is 3.
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		defer w.Close()
		if _, err := unix.FcntlInt(w.Fd(), unix.F_SETFD, 0); err != nil {
			t.Fatal(err)
		}
		if fds := mustRun(t, sb, Agent, "sh", "-c", "exec ls /proc/self/fd"); fds != "0\n1\n2\n3\n" {
			t.Errorf("the agent inherits descriptors beyond stdio: %q", fds)
		}
		// A fork bomb stops at the uid's process limit.
		if n := mustRun(t, sb, Agent, "bash", "-c", "ulimit -Hu; ulimit -Su"); n != fmt.Sprintf("%d\n%d\n", AgentMaxProcs, AgentMaxProcs) {
			t.Errorf("the agent's process limit (hard, soft): %q, want %d", n, AgentMaxProcs)
		}
		got := statusFields(out)
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s = %q, want %q", k, got[k], v)
			}
		}
	})

	t.Run("setuid root does not help the agent", func(t *testing.T) {
		mustRun(t, sb, Root, "sh", "-c", "cp /usr/bin/id /usr/local/bin/fgrt-suid-id && chmod 4755 /usr/local/bin/fgrt-suid-id")
		// The bit works for a process without no_new_privs: the root
		// phase's check that the test is meaningful.
		if out := mustRun(t, sb, Root, "stat", "-c", "%a %U", "/usr/local/bin/fgrt-suid-id"); out != "4755 root\n" {
			t.Fatalf("setuid copy = %q", out)
		}
		if out := mustRun(t, sb, Agent, "/usr/local/bin/fgrt-suid-id", "-u"); out != uid+"\n" {
			t.Errorf("setuid-root id as agent printed euid %q, want %s", out, uid)
		}
		out, res := run(t, sb, Agent, "su", "-c", "id -u", "root")
		if res.ExitCode == 0 || strings.Contains(out, "\n0\n") || strings.HasPrefix(out, "0\n") {
			t.Errorf("su as agent: %+v, output %q", res, out)
		}
	})

	t.Run("agent sees only the sandbox", func(t *testing.T) {
		wd, _ := os.Getwd()
		hidden := []string{wd, "/home/cloudsdk", e.local.stateDir(), filepath.Dir(in.CAFile()), "/root/.pyenv", "/work"}
		for _, p := range hidden {
			if _, res := run(t, sb, Agent, "test", "-e", p); res.ExitCode == 0 {
				t.Errorf("agent sees %s", p)
			}
			if _, res := run(t, sb, Root, "test", "-e", p); res.ExitCode == 0 {
				t.Errorf("root phase sees %s", p)
			}
		}
		if out, res := run(t, sb, Agent, "ls", "/root"); res.ExitCode == 0 {
			t.Errorf("agent can list /root: %q", out)
		}
		if out, res := run(t, sb, Agent, "cat", "/etc/shadow"); res.ExitCode == 0 {
			t.Errorf("agent can read /etc/shadow: %q", out)
		}
		if out := mustRun(t, sb, Root, "sh", "-c", "cut -d: -f2 /etc/shadow | sort -u"); out != "*\n" {
			t.Errorf("password fields in the sandbox's shadow = %q, want only *", out)
		}
	})

	t.Run("workdir and logs", func(t *testing.T) {
		out := mustRun(t, sb, Agent, "sh", "-c", "pwd; stat -c '%n %u %a' /app /logs /logs/agent /logs/verifier /home/agent; echo $HOME; id -un")
		want := fmt.Sprintf("/app\n/app %s 755\n/logs 0 755\n/logs/agent %s 755\n/logs/verifier 0 755\n/home/agent %s 750\n/home/agent\nagent\n", uid, uid, uid)
		if out != want {
			t.Errorf("workdir and logs:\n%s\nwant:\n%s", out, want)
		}
		mustRun(t, sb, Agent, "sh", "-c", "echo hi > /logs/agent/note && echo w > /app/work")
		if _, res := run(t, sb, Agent, "sh", "-c", "echo 1 > /logs/verifier/reward.txt"); res.ExitCode == 0 {
			t.Errorf("the agent wrote /logs/verifier/reward.txt")
		}
		mustRun(t, sb, Root, "sh", "-c", "echo 1 > /logs/verifier/reward.txt")
		b, err := os.ReadFile(filepath.Join(sb.st.LogsDir, "verifier", "reward.txt"))
		if err != nil || string(b) != "1\n" {
			t.Errorf("reward on the host: %q, %v", b, err)
		}
		if b, _ := os.ReadFile(filepath.Join(sb.st.LogsDir, "agent", "note")); string(b) != "hi\n" {
			t.Errorf("agent note on the host: %q", b)
		}
	})

	t.Run("environment, exit status, hostname, resolver", func(t *testing.T) {
		var out syncBuffer
		res, err := sb.Run(context.Background(), Process{Argv: []string{"/usr/bin/env"}, Env: []string{"ONLY=this"}, As: Agent, Stdout: &out})
		if err != nil || res.ExitCode != 0 || out.String() != "ONLY=this\n" {
			t.Errorf("env: %q, %+v, %v", out.String(), res, err)
		}
		if _, res := run(t, sb, Agent, "sh", "-c", "exit 7"); res.ExitCode != 7 || res.Signaled {
			t.Errorf("exit 7: %+v", res)
		}
		if _, res := run(t, sb, Agent, "sh", "-c", "kill -9 $$"); res.ExitCode != 128+9 || !res.Signaled {
			t.Errorf("kill -9: %+v", res)
		}
		if out := mustRun(t, sb, Agent, "hostname"); out != sb.Name()+"\n" {
			t.Errorf("hostname = %q", out)
		}
		if out := mustRun(t, sb, Agent, "grep", "^nameserver", "/etc/resolv.conf"); out != "nameserver 192.0.2.53\n" {
			t.Errorf("resolv.conf nameservers = %q", out)
		}
		if out := mustRun(t, sb, Agent, "getent", "hosts", "example.com"); !strings.HasPrefix(out, "2001:db8::10") && !strings.HasPrefix(out, "192.0.2.10") {
			t.Errorf("getent hosts example.com = %q", out)
		}
	})

	t.Run("timeout kills the whole phase", func(t *testing.T) {
		marker := "2" + strconv.Itoa(int(time.Now().UnixNano()%1e6))
		start := time.Now()
		res, err := sb.Run(context.Background(), Process{
			Argv: []string{"sh", "-c", "sleep " + marker + " & setsid sleep " + marker + " & sleep " + marker},
			Env:  stdEnv(sb, Agent), As: Agent, Timeout: time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		if !res.TimedOut || !res.Signaled || res.ExitCode != -1 {
			t.Errorf("result %+v, want a timeout", res)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("timeout of 1s took %v", d)
		}
		if pids := nstest.HostProcs("sleep " + marker); len(pids) > 0 {
			t.Errorf("processes of the timed-out phase still run: %v", pids)
		}
	})

	t.Run("cancel kills the phase", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(500*time.Millisecond, cancel)
		res, err := sb.Run(ctx, Process{Argv: []string{"sleep", "1000"}, Env: stdEnv(sb, Agent), As: Agent})
		if err == nil || res.ExitCode != -1 || res.TimedOut {
			t.Errorf("cancelled run: %+v, %v", res, err)
		}
	})

	t.Run("bad processes", func(t *testing.T) {
		if _, err := sb.Run(context.Background(), Process{Argv: []string{"true"}}); err == nil || !strings.Contains(err.Error(), "Root or Agent") {
			t.Errorf("Run without As: %v", err)
		}
		if _, err := sb.Run(context.Background(), Process{Argv: []string{"no-such-command-fgrt"}, As: Agent}); err == nil || !strings.Contains(err.Error(), "not found") {
			t.Errorf("Run of a missing command: %v", err)
		}
		mustRun(t, sb, Root, "sh", "-c", "echo 'echo x' > /app/noexec.sh && chmod 644 /app/noexec.sh")
		if _, err := sb.Run(context.Background(), Process{Argv: []string{"/app/noexec.sh"}, As: Agent}); err == nil || !strings.Contains(err.Error(), "not executable") {
			t.Errorf("Run of a non-executable script: %v", err)
		}
		if err := sb.WriteFile("relative", nil, 0o644, Root); err == nil {
			t.Errorf("WriteFile of a relative path succeeded")
		}
	})

	t.Run("write file as agent", func(t *testing.T) {
		if err := sb.WriteFile("/app/agent.sh", []byte("#!/bin/sh\necho agent-script $(id -u)\n"), 0o755, Agent); err != nil {
			t.Fatal(err)
		}
		if out := mustRun(t, sb, Agent, "/app/agent.sh"); out != "agent-script "+uid+"\n" {
			t.Errorf("agent.sh = %q", out)
		}
		if err := sb.WriteFile("/app/new/dir/notes.txt", []byte("n"), 0o600, Agent); err != nil {
			t.Fatal(err)
		}
		if out := mustRun(t, sb, Agent, "sh", "-c", "stat -c '%n %u %a' /app/new /app/new/dir /app/new/dir/notes.txt; echo more >> /app/new/dir/more"); out != "/app/new "+uid+" 755\n/app/new/dir "+uid+" 755\n/app/new/dir/notes.txt "+uid+" 600\n" {
			t.Errorf("agent file and its new parents:\n%s", out)
		}
		// Symlinks the agent planted are not followed, as the file or as a
		// parent.
		mustRun(t, sb, Agent, "sh", "-c", "ln -s /etc/passwd /app/link && ln -s /etc /app/dirlink")
		if err := sb.WriteFile("/app/link", []byte("x"), 0o644, Root); err == nil {
			t.Errorf("WriteFile followed a symlink")
		}
		if err := sb.WriteFile("/app/dirlink/fgrt-planted", []byte("x"), 0o644, Root); err == nil || !strings.Contains(err.Error(), "not a directory") {
			t.Errorf("WriteFile through a symlinked parent: %v", err)
		}
		if _, res := run(t, sb, Root, "test", "-e", "/etc/fgrt-planted"); res.ExitCode == 0 {
			t.Errorf("WriteFile wrote through the agent's symlink")
		}
	})

	t.Run("copy a tree in", func(t *testing.T) {
		src := t.TempDir()
		os.MkdirAll(filepath.Join(src, "sub", "deep"), 0o750)
		os.WriteFile(filepath.Join(src, "test.sh"), []byte("#!/bin/sh\necho tests-ran\n"), 0o755)
		os.WriteFile(filepath.Join(src, "sub", "deep", "data"), []byte("d"), 0o640)
		os.WriteFile(filepath.Join(src, "suid"), []byte("s"), 0o755|os.ModeSetuid)
		os.Chmod(filepath.Join(src, "suid"), 0o755|os.ModeSetuid)
		os.Symlink("sub/deep/data", filepath.Join(src, "link"))
		if err := sb.CopyIn(src, "/tests", Root); err != nil {
			t.Fatal(err)
		}
		out := mustRun(t, sb, Root, "sh", "-c", "cd /tests && find . | sort | xargs stat -c '%n %U %a %F' && readlink link && ./test.sh")
		want := ". root 755 directory\n./link root 777 symbolic link\n./sub root 750 directory\n./sub/deep root 750 directory\n./sub/deep/data root 640 regular file\n./suid root 755 regular file\n./test.sh root 755 regular file\nsub/deep/data\ntests-ran\n"
		if out != want {
			t.Errorf("copied tree:\n%s\nwant:\n%s", out, want)
		}
		// The agent cannot change what root copied to a new top-level
		// directory.
		if _, res := run(t, sb, Agent, "sh", "-c", "echo x > /tests/test.sh || echo x > /tests/new"); res.ExitCode == 0 {
			t.Errorf("the agent wrote into /tests")
		}
		if err := sb.CopyIn(filepath.Join(src, "sub"), "/app/sub", Agent); err != nil {
			t.Fatal(err)
		}
		if out := mustRun(t, sb, Agent, "stat", "-c", "%n %u", "/app/sub", "/app/sub/deep/data"); out != "/app/sub "+uid+"\n/app/sub/deep/data "+uid+"\n" {
			t.Errorf("copied as agent:\n%s", out)
		}
		if err := sb.CopyIn("/dev/null", "/app/x", Root); err == nil || !strings.Contains(err.Error(), "not a file, directory or symlink") {
			t.Errorf("copying a device: %v", err)
		}
	})
}

// statusFields parses /proc/self/status.
func statusFields(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}
