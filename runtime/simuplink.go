package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"flowgate/gate/netnsx"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"flowgate/integration/simnet"
)

// SimUplink stands in for the host's network: a throw-away "host"
// namespace joined to the built-in simulated internet, used by
// `bench run --simnet` and `bench doctor`. Sandboxes attach to it exactly
// as they attach to the real host (veth, NAT table, forwarding), so what
// they reach shows what the host would enforce, without sending a packet
// outside namespaces bench made.
type SimUplink struct {
	dir    string
	host   string // netns name of the stand-in host
	hostNS netns.NsHandle
	inet   *simnet.Internet
	link   *simnet.Uplink
}

// simRecord is written before anything is made, so GC can remove what a
// killed run left.
type simRecord struct {
	Owner      owner  `json:"owner"`
	HostNetNS  string `json:"host_netns"`
	InetPrefix string `json:"inet_prefix"`
}

func simDir(stateDir string) string { return filepath.Join(stateDir, "simnet") }

// StartSimUplink makes the stand-in host and the simulated internet.
// Close removes both; GC removes them after a crash.
func StartSimUplink(stateDir string) (s *SimUplink, err error) {
	if stateDir == "" {
		stateDir = DefaultStateDir
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	id := hex.EncodeToString(b[:])
	me, err := self()
	if err != nil {
		return nil, fmt.Errorf("starting simulated internet: %w", err)
	}
	s = &SimUplink{dir: filepath.Join(simDir(stateDir), id), host: "fg-simh-" + id}
	rec := simRecord{Owner: me, HostNetNS: s.host, InetPrefix: "fg-inet-" + id}
	if err := os.MkdirAll(filepath.Join(s.dir, "state"), 0o700); err != nil {
		return nil, fmt.Errorf("starting simulated internet: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Close())
			s = nil
		}
	}()
	data, _ := json.Marshal(rec)
	if err := writeFileAtomic(filepath.Join(s.dir, "record.json"), data, 0o600); err != nil {
		return nil, err
	}
	if s.hostNS, err = netnsx.NewNamed(s.host); err != nil {
		return s, fmt.Errorf("starting simulated internet: stand-in host netns: %w", err)
	}
	if err := linkUp(s.hostNS, "lo"); err != nil {
		return s, fmt.Errorf("starting simulated internet: %w", err)
	}
	if s.inet, err = simnet.Start(simnet.Options{Prefix: rec.InetPrefix, Dir: filepath.Join(s.dir, "ca")}); err != nil {
		return s, err
	}
	if s.link, err = s.inet.Attach(s.hostNS, simnet.AttachOptions{}); err != nil {
		return s, err
	}
	return s, nil
}

// Local returns a runtime whose sandboxes use this uplink and the
// simulated resolver.
func (s *SimUplink) Local() *Local {
	return &Local{StateDir: filepath.Join(s.dir, "state"), Uplink: "/run/netns/" + s.host,
		DNS: []netip.Addr{simnet.Resolver.Addr()}}
}

// Internet returns the simulated internet (its CA, its sites).
func (s *SimUplink) Internet() *simnet.Internet { return s.inet }

// CAPEM is the simulated internet's CA, for the sandbox's trust store.
func (s *SimUplink) CAPEM() []byte { return s.inet.CAPEM() }

// Close removes the simulated internet, the stand-in host (and with it
// every link and table in it) and the state directory. The state
// directory stays when something could not be removed, or when it still
// records sandboxes (their owner did not close them): `bench gc` removes
// what it records once this process has exited.
func (s *SimUplink) Close() error {
	var errs []error
	if s.link != nil {
		errs = append(errs, s.link.Close())
	}
	if s.inet != nil {
		errs = append(errs, s.inet.Close())
	}
	if s.hostNS.IsOpen() {
		errs = append(errs, s.hostNS.Close())
	}
	if _, err := os.Stat("/run/netns/" + s.host); err == nil {
		errs = append(errs, netns.DeleteNamed(s.host))
	}
	if left, _ := os.ReadDir(filepath.Join(s.dir, "state", "sandboxes")); len(left) > 0 {
		errs = append(errs, fmt.Errorf("simulated uplink %s still records %d sandbox(es); `bench gc` removes them once this process has exited", s.dir, len(left)))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.RemoveAll(s.dir); err != nil {
		return err
	}
	os.Remove(filepath.Dir(s.dir)) // StateDir/simnet, when no other uplink is left
	return nil
}

// gcSimUplinks removes the simulated uplinks of killed runs: their
// sandboxes first (through GC on their own state directory), then the
// simulated internet, the stand-in host and the state.
func gcSimUplinks(ctx context.Context, stateDir string, note func(string)) error {
	ents, err := os.ReadDir(simDir(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("gc: listing simulated uplinks: %w", err)
	}
	var errs []error
	for _, e := range ents {
		dir := filepath.Join(simDir(stateDir), e.Name())
		data, err := os.ReadFile(filepath.Join(dir, "record.json"))
		if err != nil {
			errs = append(errs, fmt.Errorf("gc: simulated uplink %s: %w (remove it by hand once you know what it holds)", dir, err))
			continue
		}
		var rec simRecord
		if err := json.Unmarshal(data, &rec); err != nil || !strings.HasPrefix(rec.HostNetNS, "fg-simh-") || !strings.HasPrefix(rec.InetPrefix, "fg-inet-") {
			errs = append(errs, fmt.Errorf("gc: simulated uplink %s: unreadable record", dir))
			continue
		}
		if rec.Owner.alive() {
			continue
		}
		if err := gcSimUplink(ctx, dir, rec, note); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		os.Remove(simDir(stateDir)) // only succeeds when empty
	}
	return errors.Join(errs...)
}

// gcSimUplink removes one killed run's simulated uplink: the sandboxes its
// state records (always with the recorded stand-in host as their uplink,
// never this host's namespace, even when the stand-in is gone already),
// then its namespaces, then its directory, which stays when anything
// could not be removed, so a later gc can retry.
func gcSimUplink(ctx context.Context, dir string, rec simRecord, note func(string)) error {
	var errs []error
	nested := &Local{StateDir: filepath.Join(dir, "state"), Uplink: "/run/netns/" + rec.HostNetNS}
	removed, err := GC(ctx, nested)
	for _, r := range removed {
		note(r)
	}
	if err != nil {
		errs = append(errs, err)
	}
	if err := ctx.Err(); err != nil {
		return errors.Join(append(errs, err)...)
	}
	if left, _ := os.ReadDir(nested.sandboxesDir()); len(left) > 0 && len(errs) == 0 {
		// A live owner, or a reservation younger than a minute, keeps a
		// sandbox from GC; leave its uplink be until a later gc.
		return fmt.Errorf("gc: simulated uplink %s still holds %d sandbox(es) gc may not remove yet; run bench gc again later", dir, len(left))
	}
	names, _ := filepath.Glob("/run/netns/" + rec.InetPrefix + "-*")
	if _, err := os.Stat("/run/netns/" + rec.HostNetNS); err == nil {
		names = append(names, "/run/netns/"+rec.HostNetNS)
	}
	for _, n := range names {
		if err := netns.DeleteNamed(filepath.Base(n)); err != nil {
			errs = append(errs, fmt.Errorf("gc: removing netns %s: %w", filepath.Base(n), err))
		} else {
			note("netns " + filepath.Base(n))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("gc: removing %s: %w", dir, err)
	}
	note("state " + dir)
	return nil
}

func linkUp(ns netns.NsHandle, name string) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	return h.LinkSetUp(l)
}

// dial connects from the stand-in host, as the real host's processes do,
// resolving names with the simulated resolver: the model proxy's upstream
// dialler under bench doctor.
func (s *SimUplink) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &netnsx.Dialer{NS: s.hostNS, Dialer: net.Dialer{Timeout: 5 * time.Second}}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if _, err := netip.ParseAddr(host); err != nil {
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, simnet.Resolver.String())
		}}
		ips, err := r.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, err
		}
		if len(ips) == 0 {
			return nil, fmt.Errorf("%s: no address", host)
		}
		addr = net.JoinHostPort(ips[0].Unmap().String(), port)
	}
	return d.DialContext(ctx, network, addr)
}
