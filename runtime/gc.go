package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// GC removes what killed runs left under l: every sandbox whose recorded
// owner process is gone (its cgroups, host rules, link, netns and state),
// host-table rules in l's uplink that name a sandbox with no state at all,
// the table when no rule remains, and scratch cgroups of killed probes.
// Sandboxes whose owner still runs are left alone. It returns one line per
// removed thing, and keeps going past failures, returning them joined.
//
// GC assumes one state directory per uplink namespace (the production
// default): rules in the uplink's host table that no sandbox of this
// state directory records are taken as leftovers.
func GC(ctx context.Context, l *Local) (removed []string, err error) {
	note := func(s string) { removed = append(removed, s) }
	var errs []error

	ents, rerr := os.ReadDir(l.sandboxesDir())
	if rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		return nil, fmt.Errorf("gc: listing sandboxes: %w", rerr)
	}
	known := make(map[string]bool)
	for _, e := range ents {
		if ctx.Err() != nil {
			return removed, errors.Join(append(errs, ctx.Err())...)
		}
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(l.sandboxesDir(), e.Name())
		st, err := readState(dir)
		if err != nil {
			// A reservation that died before its record was complete.
			if strings.HasPrefix(e.Name(), ".new-") {
				if info, ierr := e.Info(); ierr == nil && time.Since(info.ModTime()) > time.Minute {
					if err := os.RemoveAll(dir); err != nil {
						errs = append(errs, fmt.Errorf("gc: removing %s: %w", dir, err))
					} else {
						note("state " + dir)
					}
				}
				continue
			}
			errs = append(errs, fmt.Errorf("gc: %w (remove %s by hand once you know what it holds)", err, dir))
			known[e.Name()] = true // its rules, if any, are not orphans
			continue
		}
		known[st.Name] = true
		if st.Owner.alive() {
			continue
		}
		if err := l.teardown(st, dir, note); err != nil {
			errs = append(errs, fmt.Errorf("gc: sandbox %s: %w", st.Name, err))
		}
	}

	if err := l.gcOrphanRules(ctx, known, note); err != nil {
		errs = append(errs, err)
	}
	gcProbeCgroups(note)
	if err := gcSimUplinks(ctx, l.stateDir(), note); err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// gcOrphanRules removes host-table rules whose sandbox has no state.
func (l *Local) gcOrphanRules(ctx context.Context, known map[string]bool, note func(string)) error {
	uplink, err := openUplink(l.Uplink)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("gc: %w", err)
	}
	defer uplink.Close()
	lk, err := l.lockHost(ctx)
	if err != nil {
		return fmt.Errorf("gc: %w", err)
	}
	defer lk.unlock()
	c, err := nftConn(uplink)
	if err != nil {
		return fmt.Errorf("gc: %w", err)
	}
	byOwner, exists, err := hostRulesByOwner(c)
	if err != nil || !exists {
		return err
	}
	var orphans []string
	for name, rs := range byOwner {
		if name != "" && !known[name] && len(rs) > 0 {
			orphans = append(orphans, name)
		}
	}
	sort.Strings(orphans)
	if len(orphans) == 0 && len(byOwner) > 0 {
		return nil
	}
	n, dropped, err := removeHostRules(uplink, orphans...)
	if err != nil {
		return fmt.Errorf("gc: %w", err)
	}
	if n > 0 {
		note(fmt.Sprintf("nft rules of %s in inet %s (%d)", strings.Join(orphans, ", "), HostTable, n))
	}
	if dropped {
		note("nft table inet " + HostTable)
		links, err := l.revertForwarding(uplink, l.Uplink)
		for _, ln := range links {
			note("force_forwarding on " + ln)
		}
		if err != nil {
			return fmt.Errorf("gc: %w", err)
		}
	}
	return nil
}

// gcProbeCgroups removes scratch cgroups of probes whose process is gone.
func gcProbeCgroups(note func(string)) {
	m := cgroup2Mount()
	if m == "" {
		return
	}
	ents, err := os.ReadDir(filepath.Join(m, cgroupRoot))
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, ok := probeCgroupPID(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue
		}
		p := filepath.Join(m, cgroupRoot, e.Name())
		if err := os.Remove(p); err == nil {
			note("cgroup " + cgroupRoot + "/" + e.Name())
		}
	}
	os.Remove(filepath.Join(m, cgroupRoot))
}
