// Package simnet is the simulated internet the end-to-end tests and `bench
// doctor` talk to: one network namespace holding DNS, HTTP and HTTPS servers
// for real-looking names (example.com, pypi.org, ...) on documentation
// addresses (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32),
// a TCP and UDP echo service, a cloud metadata server on 169.254.169.254,
// and its own test CA.
//
// The servers run as goroutines of the calling process on sockets opened
// inside the namespace (gate/netnsx). Client namespaces join with Attach.
// simnet owns its namespace, the links it creates, its goroutines and its
// temporary CA file, and Close removes all of them; it never touches the
// host namespace's links, routes or rules, and never reaches a real address.
package simnet

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"flowgate/gate/netnsx"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DefaultPrefix names the namespace when Options.Prefix is empty.
const DefaultPrefix = "fg-inet"

// DefaultTTL is the TTL of every DNS record unless Options.TTL says
// otherwise.
const DefaultTTL = 300 * time.Second

// Options configure Start.
type Options struct {
	// Prefix is the namespace name prefix; a random suffix is added.
	// Default DefaultPrefix.
	Prefix string
	// TTL is the TTL of every DNS record, in whole seconds. Default
	// DefaultTTL; SetTTL changes it later.
	TTL time.Duration
	// Dir is a folder to create for the CA file (CAFile), which Close
	// removes; empty means a fresh temporary folder. A caller that keeps
	// its own state folder passes one inside it, so that its clean-up
	// after a crash (bench gc) removes the CA file too.
	Dir string
}

// Internet is a running simulated internet. It is safe for concurrent use.
// Close removes it.
type Internet struct {
	name string
	ns   netns.NsHandle
	nl   *netlink.Handle
	ca   *testCA
	dir  string // 0755 temp dir holding the CA file

	auth  *authority
	web   *web
	http  *http.Server
	dnss  []*dns.Server
	echoL []net.Listener
	echoP []net.PacketConn
	conns connSet
	wg    sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	next    int // next uplink index
	uplinks map[*Uplink]struct{}
}

// Start builds the simulated internet: the CA and site certificates, the
// namespace with every site address, and the servers. On failure
// everything made so far is removed.
func Start(opts Options) (_ *Internet, err error) {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	ttl := opts.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if ttl < 0 || ttl > 7*24*time.Hour {
		return nil, fmt.Errorf("simnet: TTL %v out of range (0 to 168h)", ttl)
	}
	in := &Internet{
		ns:      -1,
		auth:    newAuthority(uint32(ttl / time.Second)),
		uplinks: make(map[*Uplink]struct{}),
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, in.Close())
		}
	}()
	if in.ca, err = newCA(); err != nil {
		return nil, err
	}
	in.web = &web{certs: make(map[*site]*tls.Certificate), hits: make(map[string]int)}
	for i := range siteTable {
		c, err := in.ca.leaf(&siteTable[i])
		if err != nil {
			return nil, err
		}
		in.web.certs[&siteTable[i]] = c
	}
	if err := in.writeCAFile(opts.Dir); err != nil {
		return nil, err
	}
	var b [4]byte
	rand.Read(b[:])
	name := prefix + "-" + hex.EncodeToString(b[:])
	if len(name) > 64 {
		return nil, fmt.Errorf("simnet: namespace prefix %q too long", prefix)
	}
	in.ns, err = netnsx.NewNamed(name)
	if in.ns.IsOpen() {
		in.name = name
	}
	if err != nil {
		return nil, fmt.Errorf("creating netns %s: %w", name, err)
	}
	if in.nl, err = netlink.NewHandleAt(in.ns); err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", name, err)
	}
	if err := in.setupLinks(); err != nil {
		return nil, err
	}
	if err := in.startServers(); err != nil {
		return nil, err
	}
	if testHookStarted != nil {
		if err := testHookStarted(in); err != nil {
			return nil, err
		}
	}
	return in, nil
}

// testHookStarted, when set by a test, runs at the end of Start; an error
// from it makes Start fail, to check the clean-up of a started internet.
var testHookStarted func(*Internet) error

func (in *Internet) writeCAFile(dir string) error {
	var err error
	if dir == "" {
		dir, err = os.MkdirTemp("", "simnet-ca-")
	} else {
		err = os.Mkdir(dir, 0o755)
	}
	if err != nil {
		return fmt.Errorf("creating CA dir: %w", err)
	}
	in.dir = dir
	// Readable by the agent's uid, for SSL_CERT_FILE and curl --cacert.
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("opening CA dir to other users: %w", err)
	}
	if err := os.WriteFile(in.CAFile(), in.ca.pem, 0o644); err != nil {
		return fmt.Errorf("writing CA file: %w", err)
	}
	return nil
}

// setupLinks brings lo up and puts every site and service address on it
// (this kernel has no dummy links).
func (in *Internet) setupLinks() error {
	lo, err := in.nl.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("finding lo in %s: %w", in.name, err)
	}
	if err := in.nl.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bringing lo up in %s: %w", in.name, err)
	}
	for _, a := range allAddrs() {
		if err := in.nl.AddrAdd(lo, hostAddr(a)); err != nil {
			return fmt.Errorf("adding %s to lo in %s: %w", a, in.name, err)
		}
	}
	for _, a := range allAddrs() {
		if a.Is6() {
			if err := waitLocal(in.nl, a); err != nil {
				return fmt.Errorf("in %s: %w", in.name, err)
			}
		}
	}
	return nil
}

// allAddrs lists every address the namespace holds.
func allAddrs() []netip.Addr {
	seen := make(map[netip.Addr]bool)
	var out []netip.Addr
	add := func(a netip.Addr) {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	for _, s := range siteTable {
		for _, a := range s.addrs {
			add(a)
		}
	}
	add(Resolver.Addr())
	add(Resolver6.Addr())
	for _, a := range manyAddrs() {
		add(a)
	}
	return out
}

func hostAddr(a netip.Addr) *netlink.Addr {
	na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
	if a.Is6() {
		na.Flags = unix.IFA_F_NODAD
	}
	return na
}

// startServers opens every socket inside the namespace in one visit, then
// serves them from goroutines of this process.
func (in *Internet) startServers() error {
	var webL, webTLS, dnsL []net.Listener
	var dnsP []net.PacketConn
	err := netnsx.Do(in.ns, func() error {
		for _, s := range siteTable {
			for _, a := range s.addrs {
				l, err := net.Listen("tcp", netip.AddrPortFrom(a, 80).String())
				if err != nil {
					return err
				}
				webL = append(webL, l)
				l, err = net.Listen("tcp", netip.AddrPortFrom(a, 443).String())
				if err != nil {
					return err
				}
				webTLS = append(webTLS, l)
			}
		}
		for _, ap := range []netip.AddrPort{Resolver, Resolver6} {
			pc, err := net.ListenPacket("udp", ap.String())
			if err != nil {
				return err
			}
			dnsP = append(dnsP, pc)
			l, err := net.Listen("tcp", ap.String())
			if err != nil {
				return err
			}
			dnsL = append(dnsL, l)
		}
		for _, ap := range []netip.AddrPort{Echo, Echo6} {
			l, err := net.Listen("tcp", ap.String())
			if err != nil {
				return err
			}
			in.echoL = append(in.echoL, l)
			pc, err := net.ListenPacket("udp", ap.String())
			if err != nil {
				return err
			}
			in.echoP = append(in.echoP, pc)
		}
		return nil
	})
	in.http = &http.Server{
		Handler:           in.web,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       time.Minute,
		ErrorLog:          log.New(io.Discard, "", 0),
		TLSConfig:         &tls.Config{GetCertificate: in.web.getCertificate, NextProtos: []string{"h2", "http/1.1"}},
	}
	// Start whatever was opened, so that Close owns and closes it, even
	// when opening the rest failed.
	for _, l := range webL {
		in.wg.Go(func() { in.http.Serve(l) })
	}
	for _, l := range webTLS {
		in.wg.Go(func() { in.http.ServeTLS(l, "", "") })
	}
	for _, l := range in.echoL {
		in.wg.Go(func() { echoTCP(l, &in.conns) })
	}
	for _, pc := range in.echoP {
		in.wg.Go(func() { echoUDP(pc) })
	}
	var serr error
	for _, pc := range dnsP {
		serr = errors.Join(serr, in.serveDNS(&dns.Server{PacketConn: pc, Handler: in.auth}))
	}
	for _, l := range dnsL {
		serr = errors.Join(serr, in.serveDNS(&dns.Server{Listener: l, Handler: in.auth, IdleTimeout: func() time.Duration { return 10 * time.Second }}))
	}
	if err != nil {
		return fmt.Errorf("opening server sockets in %s: %w", in.name, err)
	}
	return serr
}

// serveDNS starts one DNS server and waits until it serves, so that
// Shutdown never races its start.
func (in *Internet) serveDNS(srv *dns.Server) error {
	started := make(chan struct{})
	failed := make(chan error, 1)
	srv.NotifyStartedFunc = func() { close(started) }
	in.wg.Go(func() { runDNS(srv, failed) })
	select {
	case <-started:
		in.dnss = append(in.dnss, srv)
		return nil
	case err := <-failed:
		if srv.PacketConn != nil {
			srv.PacketConn.Close()
		}
		if srv.Listener != nil {
			srv.Listener.Close()
		}
		return fmt.Errorf("starting DNS server: %w", err)
	}
}

func runDNS(srv *dns.Server, failed chan<- error) {
	if err := srv.ActivateAndServe(); err != nil {
		failed <- err
	}
}

// Close stops every server, removes every uplink, the namespace and the CA
// file. It keeps going past failures and returns them joined. Calling it
// again does nothing.
func (in *Internet) Close() error {
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return nil
	}
	in.closed = true
	ups := make([]*Uplink, 0, len(in.uplinks))
	for u := range in.uplinks {
		ups = append(ups, u)
	}
	in.mu.Unlock()

	var errs []error
	for _, u := range ups {
		errs = append(errs, u.Close())
	}
	if in.http != nil {
		errs = append(errs, ignoreClosed(in.http.Close()))
	}
	for _, srv := range in.dnss {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := srv.ShutdownContext(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stopping DNS server: %w", err))
		}
		cancel()
	}
	for _, l := range in.echoL {
		errs = append(errs, ignoreClosed(l.Close()))
	}
	for _, pc := range in.echoP {
		errs = append(errs, ignoreClosed(pc.Close()))
	}
	in.conns.closeAll()
	in.wg.Wait()
	if in.nl != nil {
		in.nl.Close()
	}
	if in.ns.IsOpen() {
		errs = append(errs, in.ns.Close())
	}
	if in.name != "" {
		if err := netns.DeleteNamed(in.name); err != nil {
			errs = append(errs, fmt.Errorf("removing netns %s: %w", in.name, err))
		}
	}
	if in.dir != "" {
		if err := os.RemoveAll(in.dir); err != nil {
			errs = append(errs, fmt.Errorf("removing CA dir: %w", err))
		}
	}
	return errors.Join(errs...)
}

func ignoreClosed(err error) error {
	if err == nil || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// NS is the namespace handle. It stays owned by the Internet.
func (in *Internet) NS() netns.NsHandle { return in.ns }

// Name is the namespace's name, as `ip netns list` shows it.
func (in *Internet) Name() string { return in.name }

// Path is the namespace's bind mount, /run/netns/NAME.
func (in *Internet) Path() string { return "/run/netns/" + in.name }

// CAPEM is the simulated CA's certificate in PEM.
func (in *Internet) CAPEM() []byte { return append([]byte(nil), in.ca.pem...) }

// CAFile is a PEM file holding the CA certificate, readable by every uid
// (for SSL_CERT_FILE, curl --cacert). It is removed by Close.
func (in *Internet) CAFile() string { return filepath.Join(in.dir, "ca.pem") }

// CertPool is a pool holding only the simulated CA.
func (in *Internet) CertPool() *x509.CertPool { return in.ca.pool.Clone() }

// Addrs returns the addresses the simulated resolver gives for name
// (following its aliases), IPv4 first, or nil for an unknown name.
func (in *Internet) Addrs(name string) []netip.Addr {
	_, out, _ := lookup(normName(name))
	return append([]netip.Addr(nil), out...)
}

// Queries is the number of DNS queries of any type the resolver received
// for name (case and trailing dot ignored).
func (in *Internet) Queries(name string) int { return in.auth.get(normName(name), 0) }

// QueriesOf is the number of DNS queries of type qtype the resolver
// received for name.
func (in *Internet) QueriesOf(name string, qtype uint16) int {
	return in.auth.get(normName(name), qtype)
}

// Hits is the number of HTTP requests the sites served for name (HTTP and
// HTTPS; an address as Host counts under the site's first name).
func (in *Internet) Hits(name string) int { return in.web.hitCount(normName(name)) }

// SetTTL changes the TTL of every record from now on.
// Negative values count as zero.
func (in *Internet) SetTTL(ttl time.Duration) {
	in.auth.ttl.Store(uint32(min(max(ttl, 0), 7*24*time.Hour) / time.Second))
}
