package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount step kinds, run by the init in order inside its private mount
// namespace, on paths below the new root.
const (
	stepMount   = "mount"   // mount Source (FSType, Flags, Data) on a directory
	stepBind    = "bind"    // bind Source (a directory or file) on Target, then apply Flags
	stepSymlink = "symlink" // make Target a symlink to Source
	stepDir     = "dir"     // make Target a directory with Mode
)

// mountStep is one step of building a sandbox root.
type mountStep struct {
	Kind   string  `json:"kind"`
	Target string  `json:"target"` // absolute path inside the sandbox
	Source string  `json:"source,omitempty"`
	FSType string  `json:"fstype,omitempty"`
	Data   string  `json:"data,omitempty"`
	Flags  uintptr `json:"flags,omitempty"`
	Mode   uint32  `json:"mode,omitempty"`
}

// enterRoot builds the sandbox root described by sp and pivots into it.
// No other process of the sandbox runs while it does (the previous
// phase's PID namespace is gone), so checking a path and then mounting on
// it cannot race with the sandbox's own code.
func enterRoot(sp *initSpec) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	root := sp.Root
	if err := unix.Mount(root, root, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding the sandbox root %s: %w", root, err)
	}
	for _, m := range sp.Mounts {
		if err := applyStep(root, m); err != nil {
			return err
		}
	}
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("entering the sandbox root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the host's root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("entering /: %w", err)
	}
	if sp.Hostname != "" {
		if err := unix.Sethostname([]byte(sp.Hostname)); err != nil {
			return fmt.Errorf("setting hostname: %w", err)
		}
	}
	return nil
}

func applyStep(root string, m mountStep) error {
	switch m.Kind {
	case stepMount:
		p, err := ensureDir(root, m.Target)
		if err != nil {
			return err
		}
		if err := unix.Mount(m.Source, p, m.FSType, m.Flags, m.Data); err != nil {
			return fmt.Errorf("mounting %s on %s: %w", m.FSType, m.Target, err)
		}
	case stepBind:
		fi, err := os.Stat(m.Source)
		if err != nil {
			return fmt.Errorf("bind source for %s: %w", m.Target, err)
		}
		var p string
		if fi.IsDir() {
			p, err = ensureDir(root, m.Target)
		} else {
			p, err = ensureFile(root, m.Target)
		}
		if err != nil {
			return err
		}
		if err := unix.Mount(m.Source, p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding %s on %s: %w", m.Source, m.Target, err)
		}
		if m.Flags != 0 {
			if err := unix.Mount("", p, "", unix.MS_REMOUNT|unix.MS_BIND|m.Flags, ""); err != nil {
				return fmt.Errorf("setting flags of %s: %w", m.Target, err)
			}
		}
	case stepSymlink:
		return ensureSymlink(root, m.Target, m.Source)
	case stepDir:
		p, err := ensureDir(root, m.Target)
		if err != nil {
			return err
		}
		if err := os.Chmod(p, os.FileMode(m.Mode)); err != nil {
			return fmt.Errorf("setting mode of %s: %w", m.Target, err)
		}
	default:
		return fmt.Errorf("unknown mount step %q", m.Kind)
	}
	return nil
}

// walk checks every component of rel below root except the last: each
// must be a real directory (created 0755 if missing). A symlink there is
// an error: nothing the sandbox wrote may redirect a mount.
func walk(root, rel string) (parent, last string, err error) {
	rel = filepath.Clean("/" + rel)
	if rel == "/" {
		return "", "", errors.New("mount target is the root itself")
	}
	parts := strings.Split(strings.TrimPrefix(rel, "/"), "/")
	cur := root
	for _, c := range parts[:len(parts)-1] {
		cur = filepath.Join(cur, c)
		fi, err := os.Lstat(cur)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(cur, 0o755); err != nil {
				return "", "", fmt.Errorf("creating %s in the sandbox: %w", strings.TrimPrefix(cur, root), err)
			}
		case err != nil:
			return "", "", fmt.Errorf("checking %s in the sandbox: %w", strings.TrimPrefix(cur, root), err)
		case !fi.IsDir():
			return "", "", fmt.Errorf("%s in the sandbox is not a directory (%v); refusing to mount %s through it", strings.TrimPrefix(cur, root), fi.Mode().Type(), rel)
		}
	}
	return cur, parts[len(parts)-1], nil
}

// ensureDir makes root+rel a directory; a final component that is
// anything else (a symlink, a file) is replaced.
func ensureDir(root, rel string) (string, error) {
	parent, last, err := walk(root, rel)
	if err != nil {
		return "", err
	}
	p := filepath.Join(parent, last)
	fi, err := os.Lstat(p)
	if err == nil && fi.IsDir() {
		return p, nil
	}
	if err == nil {
		if err := os.Remove(p); err != nil {
			return "", fmt.Errorf("replacing %s in the sandbox: %w", rel, err)
		}
	}
	if err := os.Mkdir(p, 0o755); err != nil {
		return "", fmt.Errorf("creating %s in the sandbox: %w", rel, err)
	}
	return p, nil
}

// ensureFile makes root+rel a regular file; a final component that is
// anything else (a symlink, an empty directory) is replaced.
func ensureFile(root, rel string) (string, error) {
	parent, last, err := walk(root, rel)
	if err != nil {
		return "", err
	}
	p := filepath.Join(parent, last)
	fi, err := os.Lstat(p)
	if err == nil && fi.Mode().IsRegular() {
		return p, nil
	}
	if err == nil {
		if err := os.Remove(p); err != nil {
			return "", fmt.Errorf("replacing %s in the sandbox: %w", rel, err)
		}
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return "", fmt.Errorf("creating %s in the sandbox: %w", rel, err)
	}
	return p, f.Close()
}

// ensureSymlink makes root+rel a symlink to target unless something else
// the sandbox made is there (a phase may have replaced a merged-usr link
// on purpose).
func ensureSymlink(root, rel, target string) error {
	parent, last, err := walk(root, rel)
	if err != nil {
		return err
	}
	p := filepath.Join(parent, last)
	fi, err := os.Lstat(p)
	if err == nil {
		if fi.Mode()&os.ModeSymlink == 0 {
			return nil
		}
		if cur, err := os.Readlink(p); err == nil && cur == target {
			return nil
		}
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("replacing %s in the sandbox: %w", rel, err)
		}
	}
	if err := os.Symlink(target, p); err != nil {
		return fmt.Errorf("creating %s in the sandbox: %w", rel, err)
	}
	return nil
}

// Host device nodes a sandbox gets in its own /dev.
var devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

// sandboxLayout names the host paths of a sandbox's persistent parts
// below its state directory.
type sandboxLayout struct{ dir string }

func (l sandboxLayout) root() string { return filepath.Join(l.dir, "root") }
func (l sandboxLayout) upper(sysdir string) string {
	return filepath.Join(l.dir, "upper", strings.TrimPrefix(sysdir, "/"))
}
func (l sandboxLayout) work(sysdir string) string {
	return filepath.Join(l.dir, "work", strings.TrimPrefix(sysdir, "/"))
}
func (l sandboxLayout) tmp() string             { return filepath.Join(l.dir, "tmp") }
func (l sandboxLayout) varTmp() string          { return filepath.Join(l.dir, "vartmp") }
func (l sandboxLayout) home() string            { return filepath.Join(l.dir, "home") }
func (l sandboxLayout) rootHome() string        { return filepath.Join(l.dir, "roothome") }
func (l sandboxLayout) workdir() string         { return filepath.Join(l.dir, "workdir") }
func (l sandboxLayout) file(name string) string { return filepath.Join(l.dir, "files", name) }

// plan returns the steps that build the sandbox's root. It creates the
// overlay upper and work directories of system directories the host has
// (the host may have gained one since Create).
func plan(st *state, lay sandboxLayout, stateDir string) ([]mountStep, error) {
	const dataFlags = unix.MS_NOSUID | unix.MS_NODEV
	var m []mountStep
	overlaid := []string{}
	for _, sd := range systemDirs {
		fi, err := os.Lstat(sd)
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			t, err := os.Readlink(sd)
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", sd, err)
			}
			m = append(m, mountStep{Kind: stepSymlink, Target: sd, Source: t})
			continue
		}
		if !fi.IsDir() {
			continue
		}
		for _, d := range []string{lay.upper(sd), lay.work(sd)} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return nil, fmt.Errorf("creating overlay dir %s: %w", d, err)
			}
		}
		overlaid = append(overlaid, sd)
		m = append(m, mountStep{Kind: stepMount, Target: sd, Source: "overlay", FSType: "overlay",
			Data: fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off", sd, lay.upper(sd), lay.work(sd))})
	}
	// What must stay invisible although it lies under an overlaid
	// directory: the state directory (every sandbox's files), and the
	// caller's list.
	for _, h := range outermost(append([]string{stateDir}, st.Hide...)) {
		under := false
		for _, sd := range overlaid {
			if strings.HasPrefix(h, sd+"/") {
				under = true
			}
		}
		if !under {
			continue
		}
		fi, err := os.Lstat(h)
		switch {
		case err != nil:
			continue
		case fi.IsDir():
			m = append(m, mountStep{Kind: stepMount, Target: h, Source: "tmpfs", FSType: "tmpfs", Flags: unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Data: "mode=755,size=4k"})
		default:
			m = append(m, mountStep{Kind: stepBind, Target: h, Source: "/dev/null"})
		}
	}
	m = append(m,
		mountStep{Kind: stepMount, Target: "/proc", Source: "proc", FSType: "proc", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		mountStep{Kind: stepMount, Target: "/dev", Source: "tmpfs", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "mode=755,size=65536k"},
	)
	for _, d := range devNodes {
		if _, err := os.Stat("/dev/" + d); err == nil {
			m = append(m, mountStep{Kind: stepBind, Target: "/dev/" + d, Source: "/dev/" + d})
		}
	}
	m = append(m,
		mountStep{Kind: stepMount, Target: "/dev/pts", Source: "devpts", FSType: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "newinstance,ptmxmode=0666,mode=0620"},
		mountStep{Kind: stepSymlink, Target: "/dev/ptmx", Source: "pts/ptmx"},
		mountStep{Kind: stepMount, Target: "/dev/shm", Source: "tmpfs", FSType: "tmpfs", Flags: dataFlags, Data: "mode=1777"},
		mountStep{Kind: stepSymlink, Target: "/dev/fd", Source: "/proc/self/fd"},
		mountStep{Kind: stepSymlink, Target: "/dev/stdin", Source: "/proc/self/fd/0"},
		mountStep{Kind: stepSymlink, Target: "/dev/stdout", Source: "/proc/self/fd/1"},
		mountStep{Kind: stepSymlink, Target: "/dev/stderr", Source: "/proc/self/fd/2"},
		mountStep{Kind: stepMount, Target: "/sys", Source: "sysfs", FSType: "sysfs", Flags: unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		mountStep{Kind: stepBind, Target: "/tmp", Source: lay.tmp(), Flags: dataFlags},
	)
	if isOverlaid(overlaid, "/var") {
		m = append(m, mountStep{Kind: stepBind, Target: "/var/tmp", Source: lay.varTmp(), Flags: dataFlags})
	}
	m = append(m,
		mountStep{Kind: stepMount, Target: "/run", Source: "tmpfs", FSType: "tmpfs", Flags: dataFlags, Data: "mode=755"},
		mountStep{Kind: stepDir, Target: "/run/lock", Mode: uint32(os.ModeSticky | 0o777)},
		mountStep{Kind: stepBind, Target: "/home/" + st.AgentUser, Source: lay.home(), Flags: dataFlags},
		mountStep{Kind: stepBind, Target: "/root", Source: lay.rootHome(), Flags: dataFlags},
		mountStep{Kind: stepBind, Target: "/logs", Source: st.LogsDir, Flags: dataFlags},
		mountStep{Kind: stepBind, Target: st.Workdir, Source: lay.workdir(), Flags: dataFlags},
	)
	if isOverlaid(overlaid, "/etc") {
		for _, f := range []string{"resolv.conf", "hosts", "hostname"} {
			m = append(m, mountStep{Kind: stepBind, Target: "/etc/" + f, Source: lay.file(f)})
		}
	}
	return m, nil
}

func isOverlaid(overlaid []string, d string) bool {
	for _, o := range overlaid {
		if o == d {
			return true
		}
	}
	return false
}

// outermost cleans the paths and keeps those not below another of them:
// a path inside a hidden folder is hidden with it, and mounting over it
// there would fail (the mask is read-only).
func outermost(paths []string) []string {
	clean := make([]string, 0, len(paths))
	for _, p := range paths {
		clean = append(clean, filepath.Clean(p))
	}
	slices.Sort(clean)
	clean = slices.Compact(clean)
	var out []string
	for _, p := range clean {
		if len(out) > 0 && (p == out[len(out)-1] || strings.HasPrefix(p, out[len(out)-1]+"/")) {
			continue
		}
		out = append(out, p)
	}
	return out
}
