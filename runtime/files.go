package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Kinds of fileEntry.
const (
	entryFile    = "file"
	entryDir     = "dir"
	entrySymlink = "symlink"
)

// fileEntry is one thing to make in the sandbox.
type fileEntry struct {
	Path string `json:"path"` // absolute, inside the sandbox
	Kind string `json:"kind"`
	Data []byte `json:"data,omitempty"`
	Mode uint32 `json:"mode,omitempty"` // permission bits
	Link string `json:"link,omitempty"` // a symlink's target
}

// maxCopy bounds what CopyIn and WriteFile carry into a sandbox at once,
// and maxCopyEntries how many files, folders and links CopyIn carries (an
// empty file costs no bytes, but each entry costs memory and time).
const (
	maxCopy        = 256 << 20
	maxCopyEntries = 50000
)

// WriteFile writes data to path inside the sandbox, owned by owner, with
// mode's permission bits; an existing file is replaced. Missing parent
// directories are created (mode 0755, owned by owner). It runs like a
// short root phase, so the path resolves inside the sandbox, never on the
// host; a symlink as the file or as one of its parents is refused. It
// cannot run during a Run.
func (s *LocalSandbox) WriteFile(path string, data []byte, mode os.FileMode, owner Owner) error {
	if err := checkSandboxPath(path); err != nil {
		return fmt.Errorf("writing %q in sandbox %s: %w", path, s.st.Name, err)
	}
	if len(data) > maxCopy {
		return fmt.Errorf("writing %s in sandbox %s: %d bytes is more than %d", path, s.st.Name, len(data), maxCopy)
	}
	e := fileEntry{Path: path, Kind: entryFile, Data: data, Mode: uint32(mode.Perm())}
	if err := s.writeEntries([]fileEntry{e}, owner); err != nil {
		return fmt.Errorf("writing %s in sandbox %s: %w", path, s.st.Name, err)
	}
	return nil
}

// CopyIn copies the host file or directory tree hostPath to sandboxPath,
// like `cp -r` to a path that does not exist yet (into an existing
// directory, it merges: files are replaced, directories kept). Regular
// files and directories keep their permission bits (never setuid or
// setgid), symlinks are copied as symlinks (they resolve inside the
// sandbox), and everything is owned by owner; other file types are an
// error. The host side is read without following symlinks; the sandbox
// side is written as WriteFile does. Up to 256 MiB at once.
//
// Put what the agent must not change (a verifier's tests) where the agent
// cannot write, such as a new top-level directory, and copy it in after
// the agent phase.
func (s *LocalSandbox) CopyIn(hostPath, sandboxPath string, owner Owner) error {
	if err := checkSandboxPath(sandboxPath); err != nil {
		return fmt.Errorf("copying %s into sandbox %s: %w", hostPath, s.st.Name, err)
	}
	entries, err := readTree(hostPath, sandboxPath)
	if err != nil {
		return fmt.Errorf("copying %s into sandbox %s: %w", hostPath, s.st.Name, err)
	}
	if err := s.writeEntries(entries, owner); err != nil {
		return fmt.Errorf("copying %s into sandbox %s: %w", hostPath, s.st.Name, err)
	}
	return nil
}

func checkSandboxPath(p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return errors.New("give a clean absolute path below /")
	}
	if strings.ContainsRune(p, 0) {
		return errors.New("path contains NUL")
	}
	return nil
}

// readTree lists hostPath's tree as entries under dst, parents first.
func readTree(hostPath, dst string) ([]fileEntry, error) {
	var out []fileEntry
	total := 0
	err := filepath.WalkDir(hostPath, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if len(out) == maxCopyEntries {
			return fmt.Errorf("more than %d files, folders and links", maxCopyEntries)
		}
		rel, err := filepath.Rel(hostPath, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		e := fileEntry{Path: target, Mode: uint32(info.Mode().Perm())}
		switch t := info.Mode().Type(); {
		case t.IsDir():
			e.Kind = entryDir
		case t.IsRegular():
			e.Kind = entryFile
			total += int(info.Size())
			if total > maxCopy {
				return fmt.Errorf("more than %d bytes", maxCopy)
			}
			if e.Data, err = os.ReadFile(p); err != nil {
				return err
			}
		case t&fs.ModeSymlink != 0:
			e.Kind = entrySymlink
			if e.Link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s is a %v, not a file, directory or symlink", p, t)
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

// writeEntries runs the init to make entries, owned by owner.
func (s *LocalSandbox) writeEntries(entries []fileEntry, owner Owner) error {
	sp := &initSpec{Op: opFiles, Files: entries, Env: []string{}}
	switch owner {
	case Root:
	case Agent:
		sp.UID, sp.GID = s.st.AgentUID, s.st.AgentGID
	default:
		return fmt.Errorf("owner is %v: say Root or Agent", owner)
	}
	_, err := s.runInit(context.Background(), sp, Root, nil, nil, nil, 0)
	return err
}

// initFiles makes sp.Files inside the built root, in order.
func initFiles(sp *initSpec) error {
	uid, gid := int(sp.UID), int(sp.GID)
	for _, e := range sp.Files {
		if err := checkSandboxPath(e.Path); err != nil {
			return fmt.Errorf("%q: %w", e.Path, err)
		}
		if err := makeParents(e.Path, uid, gid); err != nil {
			return err
		}
		fi, lerr := os.Lstat(e.Path)
		switch e.Kind {
		case entryDir:
			if lerr == nil {
				if !fi.IsDir() {
					return fmt.Errorf("%s exists and is not a directory", e.Path)
				}
				continue // merge into it, keeping its owner
			}
			if err := os.Mkdir(e.Path, 0o700); err != nil {
				return fmt.Errorf("creating %s: %w", e.Path, err)
			}
			if err := errors.Join(os.Lchown(e.Path, uid, gid), os.Chmod(e.Path, os.FileMode(e.Mode).Perm())); err != nil {
				return fmt.Errorf("creating %s: %w", e.Path, err)
			}
		case entryFile:
			if lerr == nil && fi.IsDir() {
				return fmt.Errorf("%s exists and is a directory", e.Path)
			}
			f, err := os.OpenFile(e.Path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
			if err != nil {
				return fmt.Errorf("writing %s: %w", e.Path, err)
			}
			_, werr := f.Write(e.Data)
			if err := errors.Join(werr, f.Chown(uid, gid), f.Chmod(os.FileMode(e.Mode).Perm()), f.Close()); err != nil {
				return fmt.Errorf("writing %s: %w", e.Path, err)
			}
		case entrySymlink:
			if lerr == nil {
				if fi.IsDir() {
					return fmt.Errorf("%s exists and is a directory", e.Path)
				}
				if err := os.Remove(e.Path); err != nil {
					return fmt.Errorf("replacing %s: %w", e.Path, err)
				}
			}
			if err := errors.Join(os.Symlink(e.Link, e.Path), os.Lchown(e.Path, uid, gid)); err != nil {
				return fmt.Errorf("creating symlink %s: %w", e.Path, err)
			}
		default:
			return fmt.Errorf("%s: unknown entry kind %q", e.Path, e.Kind)
		}
	}
	return nil
}

// makeParents checks the parents of p from / down: each must be a real
// directory; missing ones are created (0755) owned by uid:gid.
func makeParents(p string, uid, gid int) error {
	cur := "/"
	parts := strings.Split(strings.TrimPrefix(filepath.Dir(p), "/"), "/")
	for _, c := range parts {
		if c == "" {
			continue
		}
		cur = filepath.Join(cur, c)
		fi, err := os.Lstat(cur)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(cur, 0o755); err != nil {
				return fmt.Errorf("creating %s: %w", cur, err)
			}
			if err := errors.Join(os.Lchown(cur, uid, gid), os.Chmod(cur, 0o755)); err != nil {
				return fmt.Errorf("creating %s: %w", cur, err)
			}
		case err != nil:
			return fmt.Errorf("checking %s: %w", cur, err)
		case !fi.IsDir():
			return fmt.Errorf("refusing to write %s: %s is not a directory (%v)", p, cur, fi.Mode().Type())
		}
	}
	return nil
}

// maxTrapEntries bounds the entries RemoveVerifierTraps walks.
const maxTrapEntries = 4 << 20

// RemoveVerifierTraps removes what the agent may have left to steer the
// root verifier's writes, and returns the removed paths as the sandbox
// names them. Root follows symlinks: a link the agent left at a path the
// verifier writes (/tmp/out, /app/result.txt) would make it write where
// the agent chose, such as its own reward file under /logs/verifier.
//
//   - A symlink goes when its target names a "logs" or "proc" path
//     element: the only way to /logs inside the sandbox is to spell it, or
//     to go through /proc (/proc/self/root). Other links stay: a project's
//     own (a virtualenv's bin/python, node_modules/.bin) must work for the
//     verifier. This holds in /tmp, /var/tmp, the work folder and the
//     agent's home, the folders the agent leaves behind.
//   - FIFOs, sockets and devices go too, in all four (a FIFO at a path the
//     verifier reads or writes, or one a kept link leads to, would hang
//     it).
//
// Call it only when no process of the sandbox runs.
func (s *LocalSandbox) RemoveVerifierTraps() ([]string, error) {
	var removed []string
	seen := 0
	for _, d := range []struct{ host, inside string }{
		{s.lay.tmp(), "/tmp"}, {s.lay.varTmp(), "/var/tmp"},
		{s.lay.workdir(), s.st.Workdir}, {s.lay.home(), "/home/" + s.st.AgentUser},
	} {
		err := filepath.WalkDir(d.host, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) && p == d.host {
					return fs.SkipAll // no such folder of its own
				}
				return err
			}
			if seen++; seen > maxTrapEntries {
				return fmt.Errorf("more than %d entries to check", maxTrapEntries)
			}
			t := e.Type()
			switch {
			case t.IsRegular() || t.IsDir():
				return nil
			case t&fs.ModeSymlink != 0:
				if !linksOut(p) {
					return nil
				}
			}
			if err := os.Remove(p); err != nil {
				return err
			}
			rel, _ := filepath.Rel(d.host, p)
			removed = append(removed, filepath.Join(d.inside, rel))
			return nil
		})
		if err != nil {
			return removed, fmt.Errorf("removing what could steer the verifier from the sandbox's %s: %w", d.inside, err)
		}
	}
	return removed, nil
}

// linksOut reports whether the symlink at p names a "logs" or "proc" path
// element in its target.
func linksOut(p string) bool {
	target, err := os.Readlink(p)
	if err != nil {
		return true // unreadable: not worth the risk
	}
	for _, el := range strings.Split(target, "/") {
		if el == "logs" || el == "proc" {
			return true
		}
	}
	return false
}
