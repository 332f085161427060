package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"

	"flowgate/gate/nstest"
	"flowgate/policyload"
	"flowgate/runtime"
)

// Tests that run bench as separate processes (the test binary re-executed
// as bench): two runs at once, and a killed run that bench gc cleans up.

// TestRunTwoAtOnce runs two trials with opposite policies at the same
// time, sharing the state and jobs folders and the job name: each gets its
// own trial folder and result, and each agent sees only its own policy.
func TestRunTwoAtOnce(t *testing.T) {
	nstest.RequireRoot(t)
	state, jobs := t.TempDir(), t.TempDir()
	checkCleanAtEnd(t, state, jobs)
	// The agents wait before probing, so that their phases overlap.
	const wait = "sleep 3\n"
	type side struct {
		name, mode, policy, example, pypi, task, script string
		p                                               *benchProc
	}
	sides := []*side{
		{name: "deny-example", mode: "denylist", policy: "  blocked_hosts:\n    - example.com\n", example: refused403, pypi: reachable},
		{name: "allow-example", mode: "allowlist", policy: "  allowed_hosts:\n    - example.com\n", example: reachable, pypi: refused403},
	}
	for _, s := range sides {
		s.task, s.script = writeProbeTask(t, s.name, s.mode, s.policy, false, "#!/bin/bash\n"+wait)
	}
	for _, s := range sides {
		s.p = startBench(t, nil, "run", "--simnet", "--json", "--state-dir", state, "--jobs-dir", jobs, "--job", "both",
			s.task, "-a", "script:"+s.script, "--agent-env", "FOO="+agentEnvValue)
	}
	type span struct{ from, to time.Time }
	var agentSpans []span
	for _, s := range sides {
		code, out, errs := s.p.wait(t)
		if code != 0 || errs != "" {
			t.Fatalf("%s: exit %d, stderr %q, stdout:\n%s", s.name, code, errs, out)
		}
		dir := trialOf(t, filepath.Join(jobs, "both"), s.name)
		lines, _, _ := agentLines(t, dir)
		want := []string{exampleURL + " " + s.example, pypiURL + " " + s.pypi}
		if len(lines) < 2 || lines[0] != want[0] || lines[1] != want[1] {
			t.Errorf("%s: agent/script.txt starts %q, want %q", s.name, lines[:min(2, len(lines))], want)
		}
		var cfg configJSON
		readJSON(t, filepath.Join(dir, "config.json"), &cfg)
		if cfg.Policy.NetworkMode != s.mode || len(cfg.Policy.Rules) != 1 || cfg.Policy.Rules[0]["rule"] != "example.com" {
			t.Errorf("%s: config.json policy %+v", s.name, cfg.Policy)
		}
		sandbox := "t-" + dir[len(dir)-8:]
		if cfg.Sandbox.Name != sandbox {
			t.Errorf("%s: config.json sandbox %q, want %q", s.name, cfg.Sandbox.Name, sandbox)
		}
		var wantEgress []egressKey
		if s.mode == "denylist" {
			wantEgress = []egressKey{{"connect", "example.com", "deny", "host_blocked", "sandbox.blocked_hosts[0] example.com"},
				{"connect", "pypi.org", "allow", "not_blocked", "default"}}
		} else {
			wantEgress = []egressKey{{"connect", "example.com", "allow", "host_allowed", "sandbox.allowed_hosts[0] example.com"},
				{"connect", "pypi.org", "deny", "not_allowed", "default"}}
		}
		checkEgress(t, dir, sandbox, int(cfg.Sandbox.UID), wantEgress)
		checkRuleset(t, dir, sandbox, int(cfg.Sandbox.UID))
		res := checkResult(t, dir, false)
		for _, ph := range res.Phases {
			if ph.Name == "agent" {
				agentSpans = append(agentSpans, span{ph.Started, ph.Started.Add(time.Duration(ph.Duration * float64(time.Second)))})
			}
		}
	}
	// The test means something only if the agents did run at once.
	if len(agentSpans) == 2 && (agentSpans[0].to.Before(agentSpans[1].from) || agentSpans[1].to.Before(agentSpans[0].from)) {
		t.Errorf("the two agent phases did not overlap: %v", agentSpans)
	}
	if ents, _ := os.ReadDir(filepath.Join(jobs, "both")); len(ents) != 2 {
		t.Errorf("job folder holds %v, want the two trials", ents)
	}
}

// TestRunTwoAtOnceSharedUplink runs two trials at once in one process on
// one simulated uplink, as two runs on one host share it: the pool, the
// host table and its lock. Each trial gets its own subnet and result, and
// the last one out removes the host table.
func TestRunTwoAtOnceSharedUplink(t *testing.T) {
	nstest.RequireRoot(t)
	state, jobs := t.TempDir(), t.TempDir()
	checkCleanAtEnd(t, state, jobs)
	sim, err := runtime.StartSimUplink(state)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sim.Close(); err != nil {
			t.Errorf("closing the simulated uplink: %v", err)
		}
	})
	local := sim.Local()
	type side struct {
		name, mode, policy, example, pypi string
		out                               *runtime.TrialOutcome
		err                               error
	}
	sides := []*side{
		{name: "deny-example", mode: "denylist", policy: "  blocked_hosts:\n    - example.com\n", example: refused403, pypi: reachable},
		{name: "allow-example", mode: "allowlist", policy: "  allowed_hosts:\n    - example.com\n", example: reachable, pypi: refused403},
	}
	var wg sync.WaitGroup
	for _, s := range sides {
		taskDir, script := writeProbeTask(t, s.name, s.mode, s.policy, false, "#!/bin/bash\nsleep 2\n")
		task, err := policyload.LoadTask(taskDir)
		if err != nil {
			t.Fatal(err)
		}
		spec, err := trialSpec(task, runFlags{agent: "script:" + script, jobsDir: jobs, job: "shared"})
		if err != nil {
			t.Fatal(err)
		}
		spec.ExtraCA = sim.CAPEM()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.out, s.err = runtime.RunTrial(context.Background(), local, spec)
		}()
	}
	wg.Wait()
	var subnets []string
	for _, s := range sides {
		if s.err != nil || s.out.Err != nil {
			t.Fatalf("%s: %v, %v", s.name, s.err, s.out.Err)
		}
		lines, _, _ := agentLines(t, s.out.Dir)
		if len(lines) < 2 || lines[0] != exampleURL+" "+s.example || lines[1] != pypiURL+" "+s.pypi {
			t.Errorf("%s: agent/script.txt starts %q", s.name, lines[:min(2, len(lines))])
		}
		var cfg configJSON
		readJSON(t, filepath.Join(s.out.Dir, "config.json"), &cfg)
		subnets = append(subnets, cfg.Sandbox.IPv4)
		checkResult(t, s.out.Dir, false)
	}
	if subnets[0] == subnets[1] {
		t.Errorf("both sandboxes got %s", subnets[0])
	}
	ns, err := netns.GetFromPath(local.Uplink)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, tbl := range tables {
		t.Errorf("the stand-in host keeps table %s after both trials", tbl.Name)
	}
}

// TestRunInterrupted stops bench with SIGTERM while its agent works: the
// trial ends with an error in a whole result.json, and bench removes its
// sandbox and simulated uplink itself.
func TestRunInterrupted(t *testing.T) {
	nstest.RequireRoot(t)
	state, jobs := t.TempDir(), t.TempDir()
	checkCleanAtEnd(t, state, jobs)
	task, _ := writeProbeTask(t, "stopped", "allowlist", "  allowed_hosts:\n    - pypi.org\n", false, "")
	script := filepath.Join(t.TempDir(), "sleeper.sh")
	writeFile(t, script, "#!/bin/bash\necho agent running\nexec sleep 987657\n", 0o755)
	p, trial := startTrial(t, state, jobs, "s", task, script)
	waitAgent(t, trial)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, out, errs := p.wait(t)
	if code != 1 || errs != "bench: trial "+trial+" failed (see result.json)\n" {
		t.Errorf("bench after SIGTERM: exit %d, stderr %q", code, errs)
	}
	if !strings.Contains(out, `"event":"trial_end"`) {
		t.Errorf("no trial_end event:\n%s", out)
	}
	var res resultJSON
	readJSON(t, filepath.Join(trial, "result.json"), &res)
	if res.Error == nil || !strings.HasPrefix(*res.Error, "agent: ") || !strings.Contains(*res.Error, "context canceled") || res.Reward != nil {
		t.Errorf("result.json error %v, reward %v", res.Error, res.Reward)
	}
	if len(res.Phases) != 2 || res.Phases[1].Name != "agent" || res.Phases[1].ExitCode == nil || *res.Phases[1].ExitCode != -1 {
		t.Errorf("result.json phases %+v", res.Phases)
	}
	if ents, err := os.ReadDir(state); err != nil || len(ents) != 0 {
		t.Errorf("state folder holds %v after an interrupted run (%v)", ents, err)
	}
}

// TestRunTampered changes the agent's ruleset from outside while the
// agent works (as root in the sandbox's namespace, which only someone
// with the host's privileges can do): the trial is marked compromised and
// fails.
func TestRunTampered(t *testing.T) {
	nstest.RequireRoot(t)
	state, jobs := t.TempDir(), t.TempDir()
	checkCleanAtEnd(t, state, jobs)
	task, _ := writeProbeTask(t, "tampered", "denylist", "  blocked_hosts:\n    - example.com\n", false, "")
	script := filepath.Join(t.TempDir(), "waiter.sh")
	writeFile(t, script, "#!/bin/bash\necho agent running\nsleep 2\n", 0o755)
	p, trial := startTrial(t, state, jobs, "x", task, script)
	waitAgent(t, trial)
	ns, err := netns.GetFromName("fg-t-" + trial[len(trial)-8:])
	if err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		ns.Close()
		t.Fatal(err)
	}
	c.AddChain(&nftables.Chain{Name: "intruder", Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: "flowgate"}})
	err = c.Flush()
	ns.Close()
	if err != nil {
		t.Fatalf("adding a chain to the sandbox's table: %v", err)
	}
	code, _, errs := p.wait(t)
	if code != 1 || errs != "bench: trial "+trial+" failed (see result.json)\n" {
		t.Errorf("bench: exit %d, stderr %q", code, errs)
	}
	var res resultJSON
	readJSON(t, filepath.Join(trial, "result.json"), &res)
	const want = "agent: the agent's ruleset was changed by someone else while it worked: the run is compromised"
	if !res.Compromised || res.Error == nil || *res.Error != want {
		t.Errorf("result.json compromised %v, error %v; want %q", res.Compromised, res.Error, want)
	}
}

// waitAgent waits until the sleeper agent has printed that it runs.
func waitAgent(t *testing.T, trial string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		b, _ := os.ReadFile(filepath.Join(trial, "agent", "script.txt"))
		if string(b) == "agent running\n" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not start; agent/script.txt %q", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestGCAfterKilledRun kills bench -9 while its agent works, checks what
// it left, and checks that bench gc removes all of it (the sandbox, the
// simulated uplink) and keeps the trial folder; also when the stand-in
// host namespace is gone already (taking the sandbox's host link and
// rules with it), which must not make gc forget the sandbox.
func TestGCAfterKilledRun(t *testing.T) {
	nstest.RequireRoot(t)
	t.Run("whole", func(t *testing.T) { testGCAfterKilledRun(t, false) })
	t.Run("stand-in host gone", func(t *testing.T) { testGCAfterKilledRun(t, true) })
}

func testGCAfterKilledRun(t *testing.T, dropHost bool) {
	state, jobs := t.TempDir(), t.TempDir()
	checkCleanAtEnd(t, state, jobs)
	before := simnetBefore()
	task, _ := writeProbeTask(t, "killed", "denylist", "  blocked_hosts:\n    - example.com\n", false, "")
	script := filepath.Join(t.TempDir(), "sleeper.sh")
	writeFile(t, script, "#!/bin/bash\necho agent running\nexec sleep 987659\n", 0o755)

	p, trial := startTrial(t, state, jobs, "k", task, script)
	p.waitLine(t, `"phase":"agent"`, time.Minute)
	waitAgent(t, trial)
	sandbox := "t-" + trial[len(trial)-8:]
	sims, _ := filepath.Glob(filepath.Join(state, "simnet", "*", "record.json"))
	if len(sims) != 1 {
		t.Fatalf("simulated uplink records: %v", sims)
	}
	simID := filepath.Base(filepath.Dir(sims[0]))
	leftNS := []string{"fg-" + sandbox, "fg-simh-" + simID}
	for _, n := range leftNS {
		if !netnsExists(n) {
			t.Fatalf("netns %s does not exist while the agent runs", n)
		}
	}

	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	code, _, _ := p.wait(t) // reaps it: a zombie would still count as a live owner
	if code != -1 {
		t.Fatalf("killed bench exited %d", code)
	}
	// What the kill left: the namespaces, the sandbox's state, its cgroup.
	for _, n := range leftNS {
		if !netnsExists(n) {
			t.Errorf("netns %s is gone after the kill: nothing left to test", n)
		}
	}
	sbState := filepath.Join(state, "simnet", simID, "state", "sandboxes", sandbox)
	if _, err := os.Stat(filepath.Join(sbState, "state.json")); err != nil {
		t.Errorf("sandbox state after the kill: %v", err)
	}
	// The sandbox's processes die with bench (their init's parent-death
	// signal ends each phase's PID namespace).
	for i := 0; len(nstest.HostProcs("sleep 987659")) > 0; i++ {
		if i == 100 {
			t.Fatalf("the agent outlived the killed bench: %v", nstest.HostProcs("sleep 987659"))
		}
		time.Sleep(50 * time.Millisecond)
	}

	if dropHost {
		if err := netns.DeleteNamed("fg-simh-" + simID); err != nil {
			t.Fatal(err)
		}
	}

	h := nstest.New(t, "fgbgk") // gc's uplink: never this host's namespace
	code, out, errs := runBench(t, "gc", "--state-dir", state, "--uplink-netns", h.Path)
	if code != 0 || errs != "" {
		t.Fatalf("bench gc: exit %d, stderr %q, stdout:\n%s", code, errs, out)
	}
	want := []string{
		"removed netns fg-" + sandbox + "\n",
		"removed state " + sbState + "\n",
		"removed netns fg-inet-" + simID + "-",
		"removed state " + filepath.Join(state, "simnet", simID) + "\n",
	}
	if !dropHost {
		want = append(want,
			"removed nft rules of "+sandbox+" in inet flowgate_host (",
			"removed nft table inet flowgate_host\n",
			"removed link fg-"+sandbox+"\n",
			"removed netns fg-simh-"+simID+"\n")
	}
	if cg := cgroupOf(sandbox); cg != "" {
		want = append(want, "removed cgroup flowgate/"+sandbox+"\n")
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("bench gc output lacks %q:\n%s", w, out)
		}
	}
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if !strings.HasPrefix(l, "removed ") {
			t.Errorf("bench gc printed %q", l)
		}
	}
	assertClean(t, state, before, sandbox)
	if _, err := os.Stat(filepath.Join(state, "simnet")); !os.IsNotExist(err) {
		t.Errorf("%s is left: %v", filepath.Join(state, "simnet"), err)
	}
	if code, out, errs := runBench(t, "gc", "--state-dir", state, "--uplink-netns", h.Path); code != 0 || out != "" || errs != "" {
		t.Errorf("second bench gc: exit %d, out %q, err %q", code, out, errs)
	}

	// The trial folder stays, with whole files only.
	var cfg configJSON
	readJSON(t, filepath.Join(trial, "config.json"), &cfg)
	if cfg.Sandbox.Name != sandbox {
		t.Errorf("config.json of the killed trial: %+v", cfg.Sandbox)
	}
	if _, err := os.Stat(filepath.Join(trial, "result.json")); !os.IsNotExist(err) {
		t.Errorf("a killed trial has a result.json: %v", err)
	}
	rs, _ := os.ReadFile(filepath.Join(trial, "network", "ruleset.nft"))
	if !strings.HasPrefix(string(rs), "table inet flowgate {\n") || !strings.HasSuffix(string(rs), "}\n") {
		t.Errorf("ruleset.nft of the killed trial is not whole:\n%s", rs)
	}
	filepath.WalkDir(trial, func(p string, e os.DirEntry, err error) error {
		if err == nil && strings.Contains(e.Name(), ".tmp") {
			t.Errorf("temp file %s is left", p)
		}
		return nil
	})
}

// startTrial runs bench run --simnet --json on task with the script agent
// and returns the process and the trial folder its trial_start event names.
func startTrial(t *testing.T, state, jobs, job, task, script string) (*benchProc, string) {
	t.Helper()
	p := startBench(t, nil, "run", "--simnet", "--json", "--state-dir", state, "--jobs-dir", jobs, "--job", job,
		task, "-a", "script:"+script)
	var start struct {
		Trial string `json:"trial"`
	}
	if err := json.Unmarshal([]byte(p.waitLine(t, `"trial_start"`, time.Minute)), &start); err != nil || start.Trial == "" {
		t.Fatalf("trial_start event: %v", err)
	}
	return p, start.Trial
}
