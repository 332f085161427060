package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"flowgate/gate"
	"flowgate/gate/dns"
	"flowgate/gate/netnsx"
	"flowgate/gate/nft"
	"flowgate/gate/sni"
)

// Options configure Attach. The zero value works for a namespace whose
// resolver is given by Resolvers or ResolvConf.
type Options struct {
	// Sandbox names the sandbox in rule comments and decision records
	// ([a-z0-9-], at most 32 characters). Default "flowgate".
	Sandbox string
	// Cgroup is an optional cgroup v2 path (relative to the cgroup2 mount)
	// whose sockets are filtered like the uid's.
	Cgroup string
	// Ports are flowgate's ports inside the namespace; zero fields take
	// gate.DefaultPorts.
	Ports gate.Ports
	// ModelPort is the model proxy's loopback port, documented in the
	// ruleset; loopback is always reachable.
	ModelPort uint16
	// Resolvers are the upstream DNS servers the proxy forwards to. When
	// empty, ResolvConf is read.
	Resolvers []netip.AddrPort
	// ResolvConf is the path of the sandbox's resolv.conf (for a container,
	// /proc/PID/root/etc/resolv.conf).
	ResolvConf string
	// Record receives every decision (the trial's egress log).
	Record gate.Recorder
	// Logger receives operational messages. Default: discard.
	Logger *slog.Logger
	// OnTamper is called when someone else changes the table (the run is
	// then compromised). It may be called from another goroutine.
	OnTamper func(nft.Event)
}

// Handle is an attached gateway. Close it to stop the data plane; the
// rules stay until Detach.
type Handle struct {
	ns       netns.NsHandle // our own duplicate; closed by Close
	policy   *gate.Policy
	opts     Options
	ruleset  *nft.Ruleset
	names    *gate.Names
	learner  *nft.Learner
	pool     *netnsx.Pool // upstream sockets, made inside the namespace
	flows    *flowForgetter
	dns      *dns.Server
	sni      *sni.Server
	closers  []io.Closer
	wg       sync.WaitGroup
	stop     context.CancelFunc
	tampered atomic.Bool
	closeMu  sync.Mutex
	closed   bool
}

// Attach enforces policy p for uid inside the namespace ns: it applies the
// ruleset atomically, starts the DNS proxy and the TCP data plane on
// loopback inside ns (for denylist and allowlist), and watches the table.
// The caller keeps ownership of ns; Attach works on its own duplicate. A
// failed Attach may leave the ruleset applied (fail closed); Detach
// removes it.
//
// A policy the gateway cannot enforce as written is refused: HTTPS
// blocked_urls need TLS interception, which this gateway does not have.
func Attach(ns netns.NsHandle, uid uint32, p *gate.Policy, opts Options) (h *Handle, err error) {
	if p == nil {
		return nil, errors.New("attaching gateway: no policy")
	}
	if uid == 0 {
		return nil, errors.New("attaching gateway: uid 0 cannot be filtered (flowgate itself runs as root)")
	}
	if rules := p.HTTPSRules(); len(rules) > 0 {
		var names []string
		for _, r := range rules {
			names = append(names, r.String())
		}
		return nil, fmt.Errorf("attaching gateway: blocked_urls over https need TLS interception, which this flowgate does not have yet, so it would not hold (%s); block the whole host with blocked_hosts instead",
			strings.Join(names, ", "))
	}
	if opts.Sandbox == "" {
		opts.Sandbox = "flowgate"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Ports = withDefaults(opts.Ports)
	dup, err := unix.Dup(int(ns))
	if err != nil {
		return nil, fmt.Errorf("attaching gateway: duplicating netns handle: %w", err)
	}
	h = &Handle{ns: netns.NsHandle(dup), policy: p, opts: opts}
	made := h // a failing return sets h to nil before this defer runs
	defer func() {
		if err != nil {
			err = errors.Join(err, made.Close())
			h = nil
		}
	}()
	h.ruleset, err = nft.Compile(p, nft.Params{Sandbox: opts.Sandbox, UID: uid, Cgroup: opts.Cgroup, Ports: opts.Ports, ModelPort: opts.ModelPort})
	if err != nil {
		return nil, fmt.Errorf("attaching gateway in %s: compiling ruleset: %w", opts.Sandbox, err)
	}
	// The ruleset goes in first: an allowlist's learned sets must exist
	// before the data plane opens them, and until the listeners are up
	// the agent's redirected traffic is refused (fail closed).
	if err := nft.Apply(h.ns, h.ruleset); err != nil {
		return nil, fmt.Errorf("attaching gateway in %s: applying ruleset: %w", opts.Sandbox, err)
	}
	if p.Mode.Proxied() {
		if err := h.startDataPlane(uid); err != nil {
			return nil, fmt.Errorf("attaching gateway in %s: %w", opts.Sandbox, err)
		}
	}
	if err := h.watch(); err != nil {
		return nil, fmt.Errorf("attaching gateway in %s: %w", opts.Sandbox, err)
	}
	return h, nil
}

func withDefaults(p gate.Ports) gate.Ports {
	if p.DNS == 0 {
		p.DNS = gate.DefaultPorts.DNS
	}
	if p.Transparent == 0 {
		p.Transparent = gate.DefaultPorts.Transparent
	}
	if p.Proxy == 0 {
		p.Proxy = gate.DefaultPorts.Proxy
	}
	return p
}

// startDataPlane opens the learned-set updater, the DNS proxy and the TCP
// data plane, with listeners on 127.0.0.1 and ::1 inside the namespace.
func (h *Handle) startDataPlane(uid uint32) error {
	upstreams := h.opts.Resolvers
	if len(upstreams) == 0 {
		if h.opts.ResolvConf == "" {
			return errors.New("no upstream resolver: give Resolvers or ResolvConf")
		}
		var err error
		if upstreams, err = dns.ReadResolvConf(h.opts.ResolvConf); err != nil {
			return fmt.Errorf("reading the sandbox's resolvers: %w", err)
		}
	}
	var err error
	if h.policy.Mode == gate.Allowlist {
		if h.learner, err = nft.NewLearner(h.ns); err != nil {
			return fmt.Errorf("opening learned-address sets: %w", err)
		}
		h.names = gate.NewNames(h.learner.Add)
	} else {
		h.names = gate.NewNames(nil)
	}
	if p := h.policy; p.Mode == gate.Denylist {
		// What is known of refused names and of hosts with URL rules is
		// what refuses a connection to their addresses with no name: a
		// flood of other lookups must not evict it.
		h.names.Protect(func(name string) bool {
			return !p.Name(name).Allow || p.NeedsIntercept(gate.Host{Name: name})
		})
	}
	h.pool = netnsx.NewPool(h.ns, 10*time.Second)
	dial := h.pool.DialContext
	if h.flows, err = newFlowForgetter(h.ns); err != nil {
		return fmt.Errorf("opening conntrack in the namespace: %w", err)
	}
	record := h.recorder(uid)
	h.dns, err = dns.New(dns.Config{
		Policy: h.policy, Names: h.names, Upstreams: upstreams, Dial: h.flows.dial(dial),
		Record: record, Sandbox: h.opts.Sandbox, UID: uid, Logger: h.opts.Logger,
	})
	if err != nil {
		return fmt.Errorf("starting DNS proxy: %w", err)
	}
	h.keepBlockedResolved()
	ports := h.opts.Ports
	h.sni, err = sni.New(sni.Config{
		Policy: h.policy, Names: h.names, Resolve: h.dns.Resolve, Dial: dial,
		Record: record, Sandbox: h.opts.Sandbox, UID: uid, Logger: h.opts.Logger,
		LocalPorts: []uint16{ports.DNS, ports.Transparent, ports.Proxy},
	})
	if err != nil {
		return fmt.Errorf("starting TCP data plane: %w", err)
	}
	for _, fam := range []struct{ tcp, udp, host string }{{"tcp4", "udp4", "127.0.0.1"}, {"tcp6", "udp6", "::1"}} {
		if err := h.listenFamily(fam.tcp, fam.udp, fam.host, ports); err != nil {
			if fam.host == "::1" && errors.Is(err, unix.EADDRNOTAVAIL) {
				h.opts.Logger.Warn("IPv6 loopback unavailable in sandbox; serving IPv4 only", "sandbox", h.opts.Sandbox)
				continue
			}
			return err
		}
	}
	return nil
}

// keepWait bounds how long Attach waits for the first lookups of a
// denylist's blocked names.
const keepWait = 2 * time.Second

// keepBlockedResolved has the DNS proxy resolve a denylist's blocked names
// ahead of the agent (dns.Server.KeepBlockedResolved) and waits, at most
// keepWait, until each was tried once: the agent's traffic is refused until
// the listeners open, so a connection by address to a blocked host made
// right after Attach is judged with its addresses known.
func (h *Handle) keepBlockedResolved() {
	ready, kept, skipped := h.dns.KeepBlockedResolved()
	log := h.opts.Logger.With("sandbox", h.opts.Sandbox)
	if skipped > 0 {
		log.Warn("too many blocked names to keep resolved; the rest are looked up when the agent asks for them",
			"kept", kept, "not_kept", skipped)
	}
	if kept == 0 {
		return
	}
	select {
	case <-ready:
		log.Debug("blocked names resolved", "names", kept)
	case <-time.After(keepWait):
		log.Warn("blocked names not all resolved yet; attaching anyway, the lookups go on", "names", kept, "waited", keepWait)
	}
}

// listenFamily opens the DNS (UDP and TCP), transparent and proxy listeners
// of one address family and starts serving them.
func (h *Handle) listenFamily(tcp, udp, host string, ports gate.Ports) error {
	addr := func(p uint16) string { return net.JoinHostPort(host, fmt.Sprint(p)) }
	pc, err := netnsx.ListenPacket(h.ns, udp, addr(ports.DNS))
	if err != nil {
		return fmt.Errorf("listening for DNS on %s/udp: %w", addr(ports.DNS), err)
	}
	h.closers = append(h.closers, pc)
	h.serve(func() error { return h.dns.ServeUDP(pc) })
	for _, l := range []struct {
		port  uint16
		what  string
		serve func(net.Listener) error
	}{
		{ports.DNS, "DNS", h.dns.ServeTCP},
		{ports.Transparent, "transparent TCP", h.sni.ServeTransparent},
		{ports.Proxy, "explicit proxy", h.sni.ServeProxy},
	} {
		ln, err := netnsx.Listen(h.ns, tcp, addr(l.port))
		if err != nil {
			return fmt.Errorf("listening for %s on %s: %w", l.what, addr(l.port), err)
		}
		h.closers = append(h.closers, ln)
		serve := l.serve
		h.serve(func() error { return serve(ln) })
	}
	return nil
}

// serve runs one listener's loop until the handle closes it.
func (h *Handle) serve(loop func() error) {
	h.wg.Add(1)
	go h.serveLoop(loop)
}

func (h *Handle) serveLoop(loop func() error) {
	defer h.wg.Done()
	if err := loop(); err != nil && !errors.Is(err, net.ErrClosed) {
		h.opts.Logger.Error("listener stopped", "sandbox", h.opts.Sandbox, "err", err)
	}
}

// watch starts the tamper watch on the table.
func (h *Handle) watch() error {
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	return nft.Watch(ctx, h.ns, func(ev nft.Event) {
		h.tampered.Store(true)
		tamperTotal.Inc()
		h.opts.Logger.Error("flowgate table changed by someone else", "sandbox", h.opts.Sandbox, "event", ev.String())
		if h.opts.OnTamper != nil {
			h.opts.OnTamper(ev)
		}
	})
}

// Ruleset returns the ruleset Attach applied.
func (h *Handle) Ruleset() *nft.Ruleset { return h.ruleset }

// Tampered reports whether anyone else changed the table since Attach.
func (h *Handle) Tampered() bool { return h.tampered.Load() }

// Audit compares the live table with the ruleset Attach applied.
func (h *Handle) Audit() ([]nft.Difference, error) {
	live, err := nft.Read(h.ns)
	if err != nil {
		return nil, fmt.Errorf("auditing %s: %w", h.opts.Sandbox, err)
	}
	return nft.Diff(h.ruleset, live), nil
}

// Close stops the watch and the data plane and waits for their goroutines.
// The rules stay: the agent is left with no proxied egress until Detach.
func (h *Handle) Close() error {
	h.closeMu.Lock()
	defer h.closeMu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	var errs []error
	if h.stop != nil {
		h.stop()
	}
	if h.sni != nil {
		errs = append(errs, h.sni.Close())
	}
	if h.dns != nil {
		errs = append(errs, h.dns.Close())
	}
	for _, c := range h.closers {
		if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	h.wg.Wait()
	if h.pool != nil {
		errs = append(errs, h.pool.Close())
	}
	if h.flows != nil {
		errs = append(errs, h.flows.Close())
	}
	if h.learner != nil {
		errs = append(errs, h.learner.Close())
	}
	errs = append(errs, h.ns.Close())
	return errors.Join(errs...)
}

// Detach removes flowgate's table from the namespace, restoring its plain
// network for every uid. It succeeds when there is no table.
func Detach(ns netns.NsHandle) error {
	if err := nft.Remove(ns); err != nil {
		return fmt.Errorf("detaching gateway: %w", err)
	}
	return nil
}
