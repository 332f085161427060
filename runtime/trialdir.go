package runtime

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"flowgate/gate"
)

// trialDir is a trial's folder on the host:
//
//	<jobs>/<job>/<task>__<8 hex>/
//	  config.json result.json   written whole (temp file, rename)
//	  setup.txt                 what the setup commands printed
//	  agent/ verifier/          what the phases wrote to /logs/agent, /logs/verifier, and
//	                            printed (agent/<kind>.txt, verifier/test-stdout.txt)
//	  trajectory/               the agent's trajectory (empty for agents without a model)
//	  network/egress.jsonl      every gateway decision, one JSON line each
//	  network/ruleset.nft       the ruleset applied for the agent phase
//	  logs/                     mounted at /logs during the run; emptied into agent/ and verifier/ at the end
type trialDir struct {
	path string
	id   string   // the 8 hex digits
	made []string // the folders above it newTrialDir created, innermost first
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// newTrialDir creates the trial folder with a fresh id. Only the folder
// and its empty subfolders are made; remove undoes it.
func newTrialDir(jobsDir, job, task string) (*trialDir, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	id := hex.EncodeToString(b[:])
	// A --jobs-dir given as a symlink is the caller's choice: resolved
	// once here, and everything below it checked (checkOwnFolder).
	if real, err := filepath.EvalSymlinks(jobsDir); err == nil {
		jobsDir = real
	}
	name := unsafeName.ReplaceAllString(filepath.Base(task), "-")
	if name == "" || name == "." || name == ".." {
		name = "task"
	}
	d := &trialDir{path: filepath.Join(jobsDir, job, name+"__"+id), id: id}
	for p := filepath.Dir(d.path); ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) || p == filepath.Dir(p) {
			break
		}
		d.made = append(d.made, p)
	}
	if err := os.MkdirAll(filepath.Dir(d.path), 0o755); err != nil {
		return nil, errors.Join(fmt.Errorf("creating job folder: %w", err), d.removeMade())
	}
	for _, p := range []string{jobsDir, filepath.Join(jobsDir, job)} {
		if err := checkOwnFolder(p); err != nil {
			return nil, errors.Join(err, d.removeMade())
		}
	}
	if err := os.Mkdir(d.path, 0o755); err != nil {
		return nil, errors.Join(fmt.Errorf("creating trial folder: %w", err), d.removeMade())
	}
	for _, sub := range []string{"agent", "verifier", "trajectory", "network", "logs"} {
		if err := os.Mkdir(filepath.Join(d.path, sub), 0o755); err != nil {
			return nil, errors.Join(fmt.Errorf("creating trial folder: %w", err), d.remove())
		}
	}
	return d, nil
}

// checkOwnFolder refuses a jobs or job folder that another user could
// change under bench: a symlink (bench would write wherever it points), a
// folder owned by someone else than bench's user or the user who ran it
// through sudo, or one writable by all (unless sticky, as /tmp: then no one
// can rename what bench made) or by a group others are in (a rename and a
// symlink in its place would make bench, root, remove and write
// elsewhere).
func checkOwnFolder(p string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return fmt.Errorf("checking %s: %w", p, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("jobs folder %s is a symlink: give the folder it points to (bench writes the trial there as %s)", p, whoami())
	case !fi.IsDir():
		return fmt.Errorf("jobs folder %s is not a folder", p)
	case !ok:
		return fmt.Errorf("checking %s: no owner", p)
	case st.Uid != uint32(os.Geteuid()) && strconv.Itoa(int(st.Uid)) != os.Getenv("SUDO_UID"):
		return fmt.Errorf("jobs folder %s belongs to uid %d: another user could swap its contents while bench writes there as %s; use a folder of your own", p, st.Uid, whoami())
	case fi.Mode().Perm()&0o002 != 0 && fi.Mode()&fs.ModeSticky == 0,
		fi.Mode().Perm()&0o020 != 0 && !privateGroup(st.Uid, st.Gid):
		return fmt.Errorf("jobs folder %s is writable by others (mode %v): another user could swap its contents while bench writes there; chmod go-w it", p, fi.Mode())
	}
	return nil
}

// privateGroup reports whether gid is uid's own group: named like the user
// and holding no one else (the user-private-group convention, under which
// umask 002 makes folders group-writable to nobody else).
func privateGroup(uid, gid uint32) bool {
	u, err := user.LookupId(strconv.Itoa(int(uid)))
	if err != nil || u.Gid != strconv.Itoa(int(gid)) {
		return false
	}
	g, err := user.LookupGroupId(u.Gid)
	return err == nil && g.Name == u.Username && !groupHasOthers(g.Name, u.Gid, u.Username)
}

// groupHasOthers reports whether anyone but owner may be in the group:
// members listed in /etc/group, or another user whose primary group it is
// in /etc/passwd. A group /etc/group does not list (from NSS: LDAP, sssd)
// counts as having others: unknown is the worst case.
func groupHasOthers(name, gid, owner string) bool {
	group, err1 := os.ReadFile("/etc/group")
	passwd, err2 := os.ReadFile("/etc/passwd")
	if err1 != nil || err2 != nil {
		return true
	}
	return groupHasOthersIn(group, passwd, name, gid, owner)
}

// groupHasOthersIn is groupHasOthers on the two files' contents.
func groupHasOthersIn(group, passwd []byte, name, gid, owner string) bool {
	listed := false
	for _, line := range strings.Split(string(group), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 4 && f[0] == name {
			listed = true
			if strings.TrimSpace(f[3]) != "" {
				return true
			}
		}
	}
	if !listed {
		return true
	}
	for _, line := range strings.Split(string(passwd), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 4 && f[3] == gid && f[0] != owner {
			return true
		}
	}
	return false
}

func whoami() string {
	if os.Geteuid() == 0 {
		return "root"
	}
	return "uid " + strconv.Itoa(os.Geteuid())
}

// removeMade removes the folders newTrialDir created above the trial
// folder, when empty.
func (d *trialDir) removeMade() error {
	for _, p := range d.made {
		_ = os.Remove(p) // only succeeds when empty
	}
	return nil
}

func (d *trialDir) file(rel string) string { return filepath.Join(d.path, rel) }

// remove deletes the trial folder, and the folders above it that
// newTrialDir created (the job folder, the jobs folder) when they are left
// empty: used when a run is refused before it started.
func (d *trialDir) remove() error {
	err := os.RemoveAll(d.path)
	for _, p := range d.made {
		_ = os.Remove(p) // only succeeds when empty
	}
	return err
}

// writeJSON writes v to rel whole: a temp file in the same folder, synced,
// then renamed over the target, so no crash leaves half a file.
func (d *trialDir) writeJSON(rel string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding %s: %w", rel, err)
	}
	return writeFileAtomic(d.file(rel), append(b, '\n'), 0o644)
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	_, werr := tmp.Write(data)
	if werr == nil {
		werr = tmp.Sync()
	}
	if werr == nil {
		werr = tmp.Chmod(mode)
	}
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// settleLogs moves what the sandbox wrote under logs/agent and
// logs/verifier into agent/ and verifier/, keeping regular files and
// folders only: a symlink or device the agent planted is dropped (and
// listed), so nobody reading or exporting the trial folder follows it out
// of the folder. Names that already exist get a "sandbox-" prefix
// (see freeName).
func (d *trialDir) settleLogs() (dropped []string, err error) {
	var errs []error
	for _, sub := range []string{"agent", "verifier"} {
		src, dst := d.file(filepath.Join("logs", sub)), d.file(sub)
		entries, rerr := os.ReadDir(src)
		if rerr != nil {
			if !errors.Is(rerr, fs.ErrNotExist) {
				errs = append(errs, rerr)
			}
			continue
		}
		for _, e := range entries {
			from := filepath.Join(src, e.Name())
			dr, werr := dropIrregular(from)
			dropped = append(dropped, dr...)
			errs = append(errs, werr)
			if _, err := os.Lstat(from); err != nil {
				continue // dropped
			}
			to := freeName(dst, e.Name())
			if err := os.Rename(from, to); err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, chownTree(to))
		}
	}
	errs = append(errs, os.RemoveAll(d.file("logs")))
	for i := range dropped {
		dropped[i] = strings.TrimPrefix(dropped[i], d.path+"/")
	}
	return dropped, errors.Join(errs...)
}

// freeName returns dir/name, or when that exists dir/sandbox-name,
// dir/sandbox-2-name, ...: what the sandbox wrote never replaces a file
// bench wrote, nor one the sandbox wrote under another name.
// Any other answer than "does not exist" (a name too long for a prefix)
// ends the search; the rename then fails and says why.
func freeName(dir, name string) string {
	to := filepath.Join(dir, name)
	for i := 1; i <= 1000; i++ {
		if _, err := os.Lstat(to); err != nil {
			return to
		}
		prefix := "sandbox-"
		if i > 1 {
			prefix = fmt.Sprintf("sandbox-%d-", i)
		}
		to = filepath.Join(dir, prefix+name)
	}
	return to
}

// dropIrregular removes everything under root that is not a regular file
// or a folder, without following links.
func dropIrregular(root string) (dropped []string, err error) {
	err = filepath.WalkDir(root, func(p string, e fs.DirEntry, werr error) error {
		if werr != nil {
			return werr
		}
		if e.Type().IsRegular() || e.IsDir() {
			return nil
		}
		dropped = append(dropped, p)
		return os.Remove(p)
	})
	return dropped, err
}

// chownTree gives bench's own user (root, in production) what the agent
// wrote, so the trial folder does not hold files owned by a sandbox uid,
// and sets plain modes (0644 for files, 0755 for folders): no world-writable
// file or folder, no sticky, setuid or setgid bit of the agent's choosing.
func chownTree(root string) error {
	uid, gid := os.Geteuid(), os.Getegid()
	return filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(p, uid, gid); err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		switch {
		case e.IsDir():
			mode = 0o755
		case !e.Type().IsRegular():
			return nil // dropIrregular removes the rest; chmod would follow a link
		}
		return os.Chmod(p, mode)
	})
}

// trialConfig is config.json: what was run, under which policy.
type trialConfig struct {
	Task     taskInfo      `json:"task"`
	Agent    agentInfo     `json:"agent"`
	Model    *string       `json:"model"`
	Sandbox  sandboxInfo   `json:"sandbox"`
	Policy   policyInfo    `json:"policy"`
	Version  string        `json:"version"`
	Started  time.Time     `json:"started_at"`
	Restrict *restrictInfo `json:"restricted_web_model,omitempty"`
}

type taskInfo struct {
	Name string `json:"name"`
	Dir  string `json:"dir"`
}

type agentInfo struct {
	Name   string `json:"name"`
	Script string `json:"script,omitempty"`
	// Env lists the names of --agent-env variables; values are never kept.
	Env []string `json:"env"`
}

type sandboxInfo struct {
	Runtime string `json:"runtime"`
	Name    string `json:"name"`
	User    string `json:"user"`
	UID     uint32 `json:"uid"`
	Workdir string `json:"workdir"`
	IPv4    string `json:"ipv4,omitempty"`
	IPv6    string `json:"ipv6,omitempty"`
}

type policyInfo struct {
	NetworkMode string     `json:"network_mode"`
	Rules       []ruleInfo `json:"rules"`
}

type ruleInfo struct {
	Kind  string `json:"kind"`
	Field string `json:"field"`
	Rule  string `json:"rule"`
}

type restrictInfo struct {
	Model string `json:"model"`
	How   string `json:"how"`
}

func describePolicy(p *gate.Policy) policyInfo {
	info := policyInfo{NetworkMode: p.Mode.String(), Rules: []ruleInfo{}}
	for _, r := range p.Rules {
		info.Rules = append(info.Rules, ruleInfo{Kind: r.Kind.String(), Field: r.Field, Rule: r.Canonical})
	}
	return info
}

// envNames returns the names of NAME=VALUE pairs.
func envNames(env []string) []string {
	out := []string{}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		out = append(out, name)
	}
	return out
}

// trialResult is result.json: how the trial ended.
type trialResult struct {
	Reward      *float64           `json:"reward"`
	Rewards     map[string]float64 `json:"rewards,omitempty"`
	Error       *string            `json:"error"`
	Compromised bool               `json:"compromised"`
	Phases      []phaseInfo        `json:"phases"`
	Dropped     []string           `json:"dropped_files,omitempty"`
	Started     time.Time          `json:"started_at"`
	Finished    time.Time          `json:"finished_at"`
}

type phaseInfo struct {
	Name        string    `json:"name"`
	Started     time.Time `json:"started_at"`
	DurationSec float64   `json:"duration_sec"`
	ExitCode    *int      `json:"exit_code,omitempty"`
	TimedOut    bool      `json:"timed_out,omitempty"`
}
