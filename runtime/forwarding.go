package runtime

// Forwarding in the uplink namespace.
//
// IPv4: net.ipv4.ip_forward is set to 1 when it is 0 and never set back:
// other software (container engines) relies on it once on, and per-link
// IPv4 forwarding on the uplink's links would be no smaller a change. The
// sandbox's host link also gets conf.<link>.forwarding=1 (gone with it).
//
// IPv6: net.ipv6.conf.all.forwarding is never touched. Setting it turns
// the host into a router on every link, which makes links with accept_ra=1
// ignore router advertisements: a host whose IPv6 default route comes from
// RAs would lose it when the route expires. Since Linux 6.17 a link can
// forward on its own (net.ipv6.conf.<link>.force_forwarding) without
// changing its router/host behaviour, so the runtime sets that on the
// sandbox's host link (gone with the link) and on the links the uplink's
// IPv6 default routes leave by (replies are forwarded from there), records
// the latter in StateDir/forwarding.json, and sets them back to 0 when the
// last sandbox leaves (its host table is removed). On an older kernel, or
// with IPv6 disabled in the uplink, sandboxes get no IPv6 (eth0 has IPv6
// disabled), which takes nothing away from any policy. If all.forwarding
// is already 1, nothing is changed.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// forwardingFile records, per uplink path, the links on which the runtime
// turned force_forwarding on.
const forwardingFile = "forwarding.json"

// ipv6Forwardable reports whether sandboxes on this uplink can have IPv6:
// IPv6 is enabled there and either forwards already or supports per-link
// forwarding.
func ipv6Forwardable(uplink netns.NsHandle) bool {
	all, err := readSysctl(uplink, "net/ipv6/conf/all/forwarding")
	if err != nil {
		return false
	}
	if dis, err := readSysctl(uplink, "net/ipv6/conf/all/disable_ipv6"); err == nil && dis == "1" {
		return false
	}
	if all == "1" {
		return true
	}
	_, err = readSysctl(uplink, "net/ipv6/conf/default/force_forwarding")
	return err == nil
}

// enableForwarding turns on what the sandbox's traffic needs in the
// uplink. The caller holds the host lock.
func (l *Local) enableForwarding(uplink netns.NsHandle, st *state) error {
	if v, err := readSysctl(uplink, "net/ipv4/ip_forward"); err != nil {
		return err
	} else if v != "1" {
		if err := writeSysctl(uplink, "net/ipv4/ip_forward", "1"); err != nil {
			return err
		}
	}
	// A link takes conf.default's value when made, which an admin may
	// have set to 0 while ip_forward is 1; IPv4 forwards by the input
	// link's setting.
	if err := writeSysctl(uplink, "net/ipv4/conf/"+st.HostLink+"/forwarding", "1"); err != nil {
		return err
	}
	if !st.IPv6 {
		return nil
	}
	if all, err := readSysctl(uplink, "net/ipv6/conf/all/forwarding"); err == nil && all == "1" {
		return nil
	}
	if err := writeSysctl(uplink, "net/ipv6/conf/"+st.HostLink+"/force_forwarding", "1"); err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(uplink)
	if err != nil {
		return fmt.Errorf("netlink handle in uplink: %w", err)
	}
	defer h.Close()
	links, err := v6DefaultLinks(h)
	if err != nil {
		return err
	}
	rec, err := l.readForwarding()
	if err != nil {
		return err
	}
	for _, name := range links {
		v, err := readSysctl(uplink, "net/ipv6/conf/"+name+"/force_forwarding")
		if err != nil {
			return err
		}
		if v == "1" {
			continue
		}
		// Record before changing, so a crash leaves it to be undone.
		if !slices.Contains(rec[st.Uplink], name) {
			rec[st.Uplink] = append(rec[st.Uplink], name)
			if err := l.writeForwarding(rec); err != nil {
				return err
			}
		}
		if err := writeSysctl(uplink, "net/ipv6/conf/"+name+"/force_forwarding", "1"); err != nil {
			return err
		}
	}
	return nil
}

// revertForwarding sets force_forwarding back to 0 on the links recorded
// for this uplink. The caller holds the host lock and has just removed the
// host table (no sandbox is left on the uplink).
func (l *Local) revertForwarding(uplink netns.NsHandle, uplinkPath string) ([]string, error) {
	rec, err := l.readForwarding()
	if err != nil {
		return nil, err
	}
	links := rec[uplinkPath]
	if len(links) == 0 {
		return nil, nil
	}
	var done []string
	var errs []error
	for _, name := range links {
		err := writeSysctl(uplink, "net/ipv6/conf/"+name+"/force_forwarding", "0")
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		if err == nil {
			done = append(done, name)
		}
	}
	if len(errs) == 0 {
		delete(rec, uplinkPath)
		errs = append(errs, l.writeForwarding(rec))
	}
	return done, errors.Join(errs...)
}

func (l *Local) readForwarding() (map[string][]string, error) {
	rec := make(map[string][]string)
	b, err := os.ReadFile(filepath.Join(l.stateDir(), forwardingFile))
	if errors.Is(err, os.ErrNotExist) {
		return rec, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading forwarding record: %w", err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("reading forwarding record %s: %w", filepath.Join(l.stateDir(), forwardingFile), err)
	}
	return rec, nil
}

func (l *Local) writeForwarding(rec map[string][]string) error {
	p := filepath.Join(l.stateDir(), forwardingFile)
	if len(rec) == 0 {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing forwarding record: %w", err)
		}
		return nil
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encoding forwarding record: %w", err)
	}
	if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
		return fmt.Errorf("writing forwarding record: %w", err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return fmt.Errorf("writing forwarding record: %w", err)
	}
	return nil
}
