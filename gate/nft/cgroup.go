package nft

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// maxCgroupLen bounds a cgroup path: it is printed in rules and must stay
// readable.
const maxCgroupLen = 200

// cleanCgroup checks a cgroup v2 path relative to the cgroup2 mount and
// returns it without leading or trailing slashes. Only characters that
// need no quoting in nft text are accepted.
func cleanCgroup(p string) (string, error) {
	if len(p) > maxCgroupLen {
		return "", fmt.Errorf("cgroup path is longer than %d characters", maxCgroupLen)
	}
	c := strings.Trim(p, "/")
	if c == "" {
		return "", errors.New("cgroup path names the root cgroup, which holds every process, flowgate included")
	}
	for _, r := range c {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-@:+=,", r)
		if !ok {
			return "", fmt.Errorf("cgroup path %q has character %q; use letters, digits and / . _ - @ : + = ,", p, r)
		}
	}
	if path.Clean(c) != c {
		return "", fmt.Errorf("cgroup path %q is not clean (empty, . or .. components)", p)
	}
	for _, part := range strings.Split(c, "/") {
		if part == "." || part == ".." {
			return "", fmt.Errorf("cgroup path %q has a %q component", p, part)
		}
	}
	return c, nil
}

// cgroupMount is where the cgroup v2 hierarchy is mounted in this process's
// mount namespace and the depth of the mount's root inside the hierarchy
// (0 unless a sub-tree is mounted).
type cgroupMount struct {
	dir       string
	rootDepth int
}

// findCgroup2 reads /proc/self/mountinfo for the first cgroup2 mount.
func findCgroup2() (cgroupMount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return cgroupMount{}, fmt.Errorf("finding the cgroup2 mount: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+1 >= len(fields) || fields[sep+1] != "cgroup2" {
			continue
		}
		root := strings.Trim(fields[3], "/")
		depth := 0
		if root != "" {
			depth = strings.Count(root, "/") + 1
		}
		return cgroupMount{dir: unescapeMount(fields[4]), rootDepth: depth}, nil
	}
	if err := sc.Err(); err != nil {
		return cgroupMount{}, fmt.Errorf("finding the cgroup2 mount: %w", err)
	}
	return cgroupMount{}, errors.New("finding the cgroup2 mount: no cgroup2 file system is mounted")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// level is the cgroup's depth in the whole hierarchy, which is what
// `socket cgroupv2 level` compares.
func (m cgroupMount) level(rel string) uint32 {
	return uint32(m.rootDepth + strings.Count(rel, "/") + 1)
}

// cgroupID returns the id the kernel gives the cgroup at rel: the inode
// number of its directory on the cgroup2 file system.
func (m cgroupMount) cgroupID(rel string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(m.dir, rel), &st); err != nil {
		return 0, fmt.Errorf("cgroup %q: %w", rel, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return 0, fmt.Errorf("cgroup %q: not a directory", rel)
	}
	return st.Ino, nil
}

// cgroupPath finds the cgroup whose id is id, relative to the mount, the
// way `nft list` names it; ok is false when no cgroup has that id.
func (m cgroupMount) cgroupPath(id uint64) (string, bool) {
	var found string
	errFound := errors.New("found")
	err := filepath.WalkDir(m.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Ino == id && p != m.dir {
			found, _ = filepath.Rel(m.dir, p)
			return errFound
		}
		return nil
	})
	return found, errors.Is(err, errFound)
}
