package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// initArg is argv[1] of a re-execution that is a sandbox init. It is not a
// command: a user who types it gets an error about the missing spec pipe.
const initArg = "__flowgate-sandbox-init__"

// The init's inherited descriptors.
const (
	specFD   = 3 // read: the initSpec, JSON, then EOF
	statusFD = 4 // write: one initStatus, JSON
)

// Init operations.
const (
	opRun   = "run"   // build the root, run a command, report its status
	opFiles = "files" // build the root, write files
	opProbe = "probe" // connect to addresses as a uid (Probe's owner-match check)
)

// initSpec is what the parent hands the init on specFD.
type initSpec struct {
	Op       string      `json:"op"`
	Root     string      `json:"root,omitempty"` // host path of the new root
	Mounts   []mountStep `json:"mounts,omitempty"`
	Hostname string      `json:"hostname,omitempty"`

	// run
	Argv  []string `json:"argv,omitempty"`
	Env   []string `json:"env"`
	Dir   string   `json:"dir,omitempty"`
	Agent bool     `json:"agent,omitempty"` // drop to UID/GID, no_new_privs, no capabilities
	UID   uint32   `json:"uid,omitempty"`
	GID   uint32   `json:"gid,omitempty"`

	// files (UID/GID own them)
	Files []fileEntry `json:"files,omitempty"`

	// probe (as UID/GID)
	Dial []string `json:"dial,omitempty"`
}

// initStatus is what the init reports on statusFD before it exits.
type initStatus struct {
	// Error is set when the init could not build the sandbox or start the
	// command; Stage says which ("setup", "exec").
	Error    string `json:"error,omitempty"`
	Stage    string `json:"stage,omitempty"`
	Exit     int    `json:"exit"`
	Signal   int    `json:"signal,omitempty"`
	Duration int64  `json:"duration_ns,omitempty"`
	// Dial holds a probe's results, one per address: "ok", "refused" or
	// an error text.
	Dial []string `json:"dial,omitempty"`
}

// MaybeInit runs the sandbox init and exits if this process is one (the
// local runtime re-executes the current binary for every phase); otherwise
// it returns at once. Call it first thing in main, and in TestMain of any
// test binary that runs sandboxes, before anything else starts goroutines
// or reads flags.
func MaybeInit() {
	if len(os.Args) < 2 || os.Args[1] != initArg {
		return
	}
	os.Exit(initMain())
}

// initMain is the init: it reads its spec, does its operation, reports.
// It runs as pid 1 of the phase's PID namespace; when it exits, the kernel
// kills every process left in that namespace.
func initMain() int {
	// Capabilities and no_new_privs are per thread, and the command is
	// forked from this one.
	goruntime.LockOSThread()
	status := os.NewFile(statusFD, "status")
	if status == nil {
		fmt.Fprintln(os.Stderr, "flowgate sandbox init: no status pipe; this is not a command")
		return 2
	}
	// Descriptors bench itself inherited without close-on-exec (from a
	// terminal, a job runner) would otherwise pass through exec into the
	// command.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		cloexecAll()
	}
	// pid 1 of a namespace ignores signals it has no handler for only when
	// they come from inside; catch the usual ones so a process of the
	// phase cannot end the init early, without making them ignored (an
	// ignored disposition would be inherited by the command).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)

	st := initDo()
	b, _ := json.Marshal(st)
	status.Write(b)
	status.Close()
	if st.Error != "" {
		return 1
	}
	return 0
}

// cloexecAll marks every descriptor above stderr close-on-exec, for
// kernels without close_range (before 5.11).
func cloexecAll() {
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
}

func initDo() initStatus {
	sp, err := readSpec()
	if err != nil {
		return initStatus{Stage: "setup", Error: err.Error()}
	}
	switch sp.Op {
	case opRun:
		if err := enterRoot(sp); err != nil {
			return initStatus{Stage: "setup", Error: err.Error()}
		}
		return initRun(sp)
	case opFiles:
		if err := enterRoot(sp); err != nil {
			return initStatus{Stage: "setup", Error: err.Error()}
		}
		if err := initFiles(sp); err != nil {
			return initStatus{Stage: "exec", Error: err.Error()}
		}
		return initStatus{}
	case opProbe:
		return initProbe(sp)
	}
	return initStatus{Stage: "setup", Error: fmt.Sprintf("unknown init operation %q", sp.Op)}
}

func readSpec() (*initSpec, error) {
	f := os.NewFile(specFD, "spec")
	if f == nil {
		return nil, errors.New("no spec pipe")
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<30))
	if err != nil {
		return nil, fmt.Errorf("reading init spec: %w", err)
	}
	var sp initSpec
	if err := json.Unmarshal(b, &sp); err != nil {
		return nil, fmt.Errorf("decoding init spec: %w", err)
	}
	return &sp, nil
}

// initRun starts the command, reaps every child until the command exits,
// and reports its status.
func initRun(sp *initSpec) initStatus {
	if len(sp.Argv) == 0 {
		return initStatus{Stage: "exec", Error: "no command"}
	}
	path, err := lookPath(sp.Argv[0], sp.Env)
	if err != nil {
		return initStatus{Stage: "exec", Error: err.Error()}
	}
	attr := &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if sp.Agent {
		if err := dropPrivileges(); err != nil {
			return initStatus{Stage: "exec", Error: err.Error()}
		}
		lim := unix.Rlimit{Cur: AgentMaxProcs, Max: AgentMaxProcs}
		if err := unix.Setrlimit(unix.RLIMIT_NPROC, &lim); err != nil {
			return initStatus{Stage: "exec", Error: fmt.Sprintf("limiting the agent's processes: %v", err)}
		}
		attr.Credential = &syscall.Credential{Uid: sp.UID, Gid: sp.GID, Groups: []uint32{}}
	}
	env := sp.Env
	if env == nil {
		env = []string{}
	}
	start := time.Now()
	proc, err := os.StartProcess(path, sp.Argv, &os.ProcAttr{
		Dir:   sp.Dir,
		Env:   env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys:   attr,
	})
	if err != nil {
		return initStatus{Stage: "exec", Error: fmt.Sprintf("starting %s: %v", sp.Argv[0], err)}
	}
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return initStatus{Stage: "exec", Error: fmt.Sprintf("waiting for %s: %v", sp.Argv[0], err)}
		}
		if pid != proc.Pid {
			continue // an orphan reparented to us
		}
		st := initStatus{Duration: int64(time.Since(start))}
		switch {
		case ws.Exited():
			st.Exit = ws.ExitStatus()
		case ws.Signaled():
			st.Signal = int(ws.Signal())
			st.Exit = 128 + st.Signal
		}
		return st
	}
}

// AgentMaxProcs bounds the processes and threads of the agent's uid
// (RLIMIT_NPROC): a fork bomb in the agent stops there instead of taking
// the host, bench and the gateway with it. The host's cgroup v2 may have
// no pids controller (a hybrid hierarchy), so the limit is the uid's.
const AgentMaxProcs = 4096

// dropPrivileges prepares this thread so that what it forks, once it has
// changed to a non-root uid, has no capability it could ever regain:
// no_new_privs (setuid bits and file capabilities are ignored by exec), an
// empty bounding set, and empty inheritable and ambient sets. The uid
// change itself clears the permitted and effective sets.
func dropPrivileges() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	last := 63
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading capabilities: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clearing inheritable capabilities: %w", err)
	}
	return nil
}

// lookPath finds a command the way a shell would, using the command's own
// PATH (not the init's, which is empty).
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		if err := executable(name); err != nil {
			return "", fmt.Errorf("command %s: %w", name, err)
		}
		return name, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q not found in PATH %s", name, path)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return errors.New("is a directory")
	}
	if fi.Mode()&0o111 == 0 {
		return errors.New("not executable")
	}
	return nil
}
