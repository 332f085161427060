package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Process is a command to run in the sandbox.
type Process struct {
	// Argv is the command and its arguments; Argv[0] without a '/' is
	// looked up in the PATH of Env (or a standard PATH when Env has none),
	// inside the sandbox.
	Argv []string
	// Env is exactly the environment the command gets: nothing of bench's
	// own environment is inherited.
	Env []string
	// Dir is the working directory inside the sandbox; default the
	// sandbox's Workdir.
	Dir string
	// As is Root or Agent; there is no default.
	As Owner
	// Stdin is the command's standard input; nil is /dev/null.
	Stdin io.Reader
	// Stdout and Stderr receive the command's output; nil discards it.
	// They are written from other goroutines until Run returns.
	Stdout, Stderr io.Writer
	// Timeout, if positive, kills the phase (every process in it) that
	// long after the start; Result.TimedOut says so.
	Timeout time.Duration
}

// Result is how a Run ended.
type Result struct {
	// ExitCode is the command's exit status; 128+N when signal N ended it
	// (Signaled), and -1 when the phase was killed (TimedOut, or the
	// context was cancelled).
	ExitCode int
	Signaled bool
	TimedOut bool
	// Duration is how long the command ran (from its start to its exit,
	// or to the kill).
	Duration time.Duration
}

// activeRun is the init process of the Run in progress.
type activeRun struct {
	done chan struct{}
	mu   sync.Mutex
	cmd  *exec.Cmd
}

func (a *activeRun) kill() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd != nil && a.cmd.Process != nil {
		a.cmd.Process.Kill()
	}
}

// Run runs p in the sandbox and waits for it. Each Run is a phase: a fresh
// PID namespace whose init builds the sandbox's root (a private mount
// namespace), starts the command, and exits when the command exits; the
// kernel then kills every other process of the phase, and Run returns only
// when all are gone (a cgroup kill catches any that left the namespace).
// As Agent, the command has the agent's uid and gid, no supplementary
// groups, no_new_privs and no capabilities in any set.
//
// A non-zero exit, a signal or a timeout is reported in Result, not as an
// error; the error is for a phase that could not start (bad Process, a
// missing command, a sandbox that could not be built) or a cancelled ctx
// (Result then says how far it got); with an error, ExitCode is -1. Run
// refuses to start while another Run, WriteFile or CopyIn of the sandbox
// is in progress.
func (s *LocalSandbox) Run(ctx context.Context, p Process) (Result, error) {
	if len(p.Argv) == 0 || p.Argv[0] == "" {
		return Result{ExitCode: -1}, fmt.Errorf("running in sandbox %s: no command", s.st.Name)
	}
	if p.As != Root && p.As != Agent {
		return Result{ExitCode: -1}, fmt.Errorf("running %s in sandbox %s: Process.As is %v: say Root or Agent", p.Argv[0], s.st.Name, p.As)
	}
	dir := p.Dir
	if dir == "" {
		dir = s.st.Workdir
	}
	if !filepath.IsAbs(dir) {
		return Result{ExitCode: -1}, fmt.Errorf("running %s in sandbox %s: directory %q is not absolute", p.Argv[0], s.st.Name, dir)
	}
	sp := &initSpec{Op: opRun, Argv: p.Argv, Env: p.Env, Dir: dir}
	if sp.Env == nil {
		sp.Env = []string{}
	}
	if p.As == Agent {
		sp.Agent, sp.UID, sp.GID = true, s.st.AgentUID, s.st.AgentGID
	}
	start := time.Now()
	out, err := s.runInit(ctx, sp, p.As, p.Stdin, p.Stdout, p.Stderr, p.Timeout)
	res := Result{ExitCode: out.status.Exit, Duration: time.Duration(out.status.Duration)}
	if out.status.Signal != 0 {
		res.Signaled = true
	}
	if out.killed {
		res = Result{ExitCode: -1, Signaled: true, TimedOut: out.timedOut, Duration: time.Since(start)}
	}
	if err != nil {
		if !out.killed {
			res.ExitCode = -1
		}
		return res, fmt.Errorf("running %s in sandbox %s: %w", p.Argv[0], s.st.Name, err)
	}
	return res, nil
}

// initOutcome is what runInit learned.
type initOutcome struct {
	status   initStatus
	killed   bool // by timeout, ctx or Close
	timedOut bool
}

// runInit starts the sandbox init with sp, waits for it, and returns its
// report. Errors the init reports come back as errors.
func (s *LocalSandbox) runInit(ctx context.Context, sp *initSpec, as Owner, stdin io.Reader, stdout, stderr io.Writer, timeout time.Duration) (initOutcome, error) {
	act := &activeRun{done: make(chan struct{})}
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return initOutcome{}, errors.New("the sandbox is closed")
	case s.active != nil:
		s.mu.Unlock()
		return initOutcome{}, errors.New("another process of this sandbox is running (one Run, WriteFile or CopyIn at a time)")
	}
	s.active = act
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.active = nil
		s.mu.Unlock()
		close(act.done)
	}()

	var err error
	sp.Root = s.lay.root()
	sp.Hostname = s.st.Name
	if sp.Mounts, err = plan(s.st, s.lay, s.local.stateDir()); err != nil {
		return initOutcome{}, err
	}
	// Nothing of an earlier phase may still run (its PID namespace is
	// gone; this catches what left it).
	cg := ""
	if s.st.Cgroup != "" {
		kctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := errors.Join(killCgroup(kctx, filepath.Join(s.st.Cgroup, "agent")), killCgroup(kctx, filepath.Join(s.st.Cgroup, "root")))
		cancel()
		if err != nil {
			return initOutcome{}, err
		}
		cg = filepath.Join(s.st.Cgroup, "root")
		if as == Agent {
			cg = filepath.Join(s.st.Cgroup, "agent")
		}
	}

	spec, err := json.Marshal(sp)
	if err != nil {
		return initOutcome{}, fmt.Errorf("encoding init spec: %w", err)
	}
	specR, specW, err := os.Pipe()
	if err != nil {
		return initOutcome{}, fmt.Errorf("creating spec pipe: %w", err)
	}
	statR, statW, err := os.Pipe()
	if err != nil {
		specR.Close()
		specW.Close()
		return initOutcome{}, fmt.Errorf("creating status pipe: %w", err)
	}
	defer statR.Close()
	cmd := &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       []string{"flowgate-sandbox-init", initArg},
		Env:        []string{},
		Stdin:      stdin,
		Stdout:     stdout,
		Stderr:     stderr,
		ExtraFiles: []*os.File{specR, statW},
		WaitDelay:  5 * time.Second,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC,
			Setsid:     true,
			Pdeathsig:  syscall.SIGKILL,
		},
	}
	var cgFD *os.File
	if cg != "" {
		if cgFD, err = os.Open(cg); err != nil {
			specR.Close()
			specW.Close()
			statW.Close()
			return initOutcome{}, fmt.Errorf("opening cgroup: %w", err)
		}
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(cgFD.Fd())
	}
	act.mu.Lock()
	act.cmd = cmd
	err = startInNetNS(s.ns, cmd)
	act.mu.Unlock()
	specR.Close()
	statW.Close()
	if cgFD != nil {
		cgFD.Close()
	}
	if err != nil {
		specW.Close()
		return initOutcome{}, fmt.Errorf("starting sandbox init: %w", err)
	}
	go feedSpec(specW, spec)
	statusc := make(chan []byte, 1)
	go readStatus(statR, statusc)
	waitc := make(chan error, 1)
	go func() { waitc <- cmd.Wait() }()

	var out initOutcome
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	var waitErr error
	select {
	case waitErr = <-waitc:
	case <-timer:
		out.killed, out.timedOut = true, true
		cmd.Process.Kill()
		waitErr = <-waitc
	case <-ctx.Done():
		out.killed = true
		cmd.Process.Kill()
		waitErr = <-waitc
	}
	b := <-statusc
	if cg != "" {
		// Close's kill lands here too: whatever left the PID namespace.
		kctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := killCgroup(kctx, cg)
		cancel()
		if err != nil {
			return out, err
		}
	}
	if !out.killed {
		s.mu.Lock()
		out.killed = s.closed
		s.mu.Unlock()
	}
	if len(b) > 0 {
		if err := json.Unmarshal(b, &out.status); err != nil {
			return out, fmt.Errorf("reading the init's report: %w", err)
		}
	}
	switch {
	case out.status.Error != "":
		return out, errors.New(out.status.Error)
	case out.killed && ctx.Err() != nil:
		return out, ctx.Err()
	case out.killed && !out.timedOut:
		return out, errors.New("the sandbox was closed")
	case out.killed:
		return out, nil
	case len(b) == 0:
		return out, fmt.Errorf("the sandbox init ended without a report (%v)", waitErr)
	}
	return out, nil
}

func feedSpec(w *os.File, spec []byte) {
	w.Write(spec) // a failed write shows as the init's error
	w.Close()
}

func readStatus(r *os.File, c chan<- []byte) {
	b, _ := io.ReadAll(io.LimitReader(r, 1<<20))
	c <- b
}

// startInNetNS starts cmd with its process inside ns: the forking thread
// enters ns, starts the child, and goes back. The thread stays locked
// until the child has exited, because Pdeathsig fires when the forking
// thread ends, and an unlocked thread could be taken over and ended by
// another goroutine that locks it.
func startInNetNS(ns netns.NsHandle, cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go holdForkThread(ns, cmd, errc)
	return <-errc
}

func holdForkThread(ns netns.NsHandle, cmd *exec.Cmd, errc chan<- error) {
	goruntime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		goruntime.UnlockOSThread()
		errc <- fmt.Errorf("reading current netns: %w", err)
		return
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		goruntime.UnlockOSThread()
		errc <- fmt.Errorf("entering sandbox netns: %w", err)
		return
	}
	err = cmd.Start()
	back := netns.Set(orig)
	errc <- err
	if err == nil {
		var info unix.Siginfo
		for unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
		}
	}
	if back == nil {
		goruntime.UnlockOSThread()
	}
	// Otherwise the goroutine ends locked and the runtime discards the
	// thread, which is still in the sandbox's namespace.
}
