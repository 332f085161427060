package runtime

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupRoot is the runtime's subtree below the cgroup v2 mount; each
// sandbox has cgroupRoot/<name>/agent (agent phases: what gateway's
// cgroup match names) and cgroupRoot/<name>/root (root phases, kept apart
// so a verifier's sockets never match the agent's rules).
const cgroupRoot = "flowgate"

// cgroup2Mount returns the mount point of the cgroup v2 hierarchy ("" if
// there is none): /sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified
// on a hybrid one.
func cgroup2Mount() string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	return parseCgroup2Mount(b)
}

// parseCgroup2Mount finds the first cgroup2 mount in mountinfo text.
func parseCgroup2Mount(b []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 1 || qf[0] != "cgroup2" {
			continue
		}
		return unescapeMountinfo(pf[4])
	}
	return ""
}

// unescapeMountinfo undoes the octal escapes (\040 for space, ...) of a
// mountinfo path field.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// makeCgroups creates a sandbox's cgroup directories under base.
// The shared parent may vanish under it (another process removes it when
// empty), so a missing parent is retried.
func makeCgroups(base string) error {
	var err error
	for range 5 {
		err = nil
		for _, d := range []string{filepath.Dir(base), base, filepath.Join(base, "agent"), filepath.Join(base, "root")} {
			if e := os.Mkdir(d, 0o755); e != nil && !errors.Is(e, os.ErrExist) {
				err = fmt.Errorf("creating cgroup %s: %w", d, e)
				break
			}
		}
		if !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return err
}

// killCgroup kills every process in dir (cgroup.kill, or one by one on
// kernels before 5.14) and waits until it is empty or ctx ends.
func killCgroup(ctx context.Context, dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	useKill := true
	for {
		pop, err := cgroupPopulated(dir)
		if err != nil {
			return err
		}
		if !pop {
			return nil
		}
		if useKill {
			err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0o644)
			if errors.Is(err, os.ErrNotExist) {
				useKill = false
			} else if err != nil {
				return fmt.Errorf("killing cgroup %s: %w", dir, err)
			}
		}
		if !useKill {
			killProcs(dir)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for cgroup %s to empty: %w", dir, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// cgroupPopulated reads "populated" from cgroup.events.
func cgroupPopulated(dir string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading cgroup %s: %w", dir, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "populated "); ok {
			return v == "1", nil
		}
	}
	return false, nil
}

func killProcs(dir string) {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			unix.Kill(pid, unix.SIGKILL)
		}
	}
}

// removeCgroups kills what runs in a sandbox's cgroups and removes them
// (and the runtime's parent directory when it is empty). It reports
// whether base existed.
func removeCgroups(base string) (bool, error) {
	if _, err := os.Stat(base); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, d := range []string{filepath.Join(base, "agent"), filepath.Join(base, "root"), base} {
		if err := killCgroup(ctx, d); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
		}
	}
	// Shared by every sandbox: removed only when empty.
	os.Remove(filepath.Dir(base))
	return true, errors.Join(errs...)
}
