package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// stateVersion is the layout version of state.json.
const stateVersion = 1

// stateFile is the name of a sandbox's record inside its state directory.
const stateFile = "state.json"

// state is a sandbox's record. Each resource field is set and written
// before the resource is made, so Close and GC can remove exactly what
// exists, also after a crash at any point.
type state struct {
	Version int       `json:"version"`
	Name    string    `json:"name"`
	Owner   owner     `json:"owner"`
	Created time.Time `json:"created"`
	// Uplink is Local.Uplink ("" = the host's namespace).
	Uplink string       `json:"uplink"`
	Slot   int          `json:"slot"`
	Net4   netip.Prefix `json:"net4"`
	Net6   netip.Prefix `json:"net6,omitzero"`

	AgentUser string       `json:"agent_user"`
	AgentUID  uint32       `json:"agent_uid"`
	AgentGID  uint32       `json:"agent_gid"`
	Workdir   string       `json:"workdir"`
	LogsDir   string       `json:"logs_dir"`
	Hide      []string     `json:"hide,omitempty"`
	DNS       []netip.Addr `json:"dns"`

	// Resources, recorded before they are made.
	NetNS    string `json:"netns,omitempty"`     // name under /run/netns
	HostLink string `json:"host_link,omitempty"` // in the uplink namespace
	Rules    bool   `json:"rules,omitempty"`     // rules in inet flowgate_host named after the sandbox
	Cgroup   string `json:"cgroup,omitempty"`    // absolute path of the sandbox's cgroup directory
	// IPv6 says whether the sandbox got IPv6 (a V6 pool and forwarding
	// that could be enabled without changing the host's router
	// advertisement handling).
	IPv6 bool `json:"ipv6"`
}

// owner identifies a process across pid reuse: its pid and its start time
// in clock ticks since boot (field 22 of /proc/PID/stat).
type owner struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// self returns the calling process's identity.
func self() (owner, error) {
	pid := os.Getpid()
	st, err := procStart(pid)
	if err != nil {
		return owner{}, err
	}
	return owner{PID: pid, Start: st}, nil
}

// alive reports whether the process o names still runs.
func (o owner) alive() bool {
	if o.PID <= 0 {
		return false
	}
	st, err := procStart(o.PID)
	return err == nil && st == o.Start
}

// procStart reads a process's start time from /proc/PID/stat.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parseStatStart(b)
}

// parseStatStart returns field 22 (starttime) of a /proc/PID/stat line.
// The command name (field 2) may hold spaces and parentheses, so fields
// are counted after its last ')'.
func parseStatStart(b []byte) (uint64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("reading process start time: malformed stat line")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); starttime is field 22.
	if len(f) < 20 {
		return 0, errors.New("reading process start time: short stat line")
	}
	if f[0] == "Z" || f[0] == "X" {
		// A zombie (killed, not yet reaped) owns nothing any more.
		return 0, errors.New("process has exited")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// writeState writes st to dir/state.json atomically (temp file, rename).
func writeState(dir string, st *state) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding sandbox state: %w", err)
	}
	tmp := filepath.Join(dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("writing sandbox state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, stateFile)); err != nil {
		return fmt.Errorf("writing sandbox state: %w", err)
	}
	return nil
}

// readState reads dir/state.json.
func readState(dir string) (*state, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("reading %s: %w", filepath.Join(dir, stateFile), err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("reading %s: layout version %d, this bench reads %d", filepath.Join(dir, stateFile), st.Version, stateVersion)
	}
	if err := validateName(st.Name); err != nil {
		return nil, fmt.Errorf("reading %s: %w", filepath.Join(dir, stateFile), err)
	}
	return &st, nil
}

// hostLock is an exclusive flock on StateDir/host.lock, serialising
// changes to the uplink namespace (address allocation, the NAT table,
// forwarding) across bench processes.
type hostLock struct{ f *os.File }

// lockHost takes the lock, waiting until ctx is done.
func (l *Local) lockHost(ctx context.Context) (*hostLock, error) {
	dir := l.stateDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "host.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening host lock: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return &hostLock{f: f}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for %s: %w", f.Name(), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// unlock releases the lock; closing the file drops the flock.
func (h *hostLock) unlock() { h.f.Close() }

// listStates reads the state of every sandbox under StateDir, including
// half-made ones (".new-*" directories). Unreadable records are returned
// as errors alongside the rest.
func (l *Local) listStates() (map[string]*state, error) {
	ents, err := os.ReadDir(l.sandboxesDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	out := make(map[string]*state)
	var errs []error
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(l.sandboxesDir(), e.Name())
		st, err := readState(dir)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		out[dir] = st
	}
	return out, errors.Join(errs...)
}
