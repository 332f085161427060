package sni

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"flowgate/gate"
)

// Defaults for the Config fields left zero.
const (
	DefaultMaxConns        = 4096
	DefaultHelloTimeout    = 5 * time.Second
	DefaultIdleTimeout     = 5 * time.Minute
	DefaultHeaderTimeout   = 60 * time.Second
	DefaultDialTimeout     = 10 * time.Second
	DefaultServerFirstWait = 250 * time.Millisecond
)

// Size bounds on what a client or an upstream may send before flowgate has
// decided: a request head, a response head, and the bytes kept while peeking
// a ClientHello (crypto/tls caps a handshake message at 64 KiB).
const (
	MaxRequestHead  = 64 << 10
	MaxResponseHead = 256 << 10
	MaxPeek         = 96 << 10
)

// Config is what the gateway hands the data plane for one sandbox.
type Config struct {
	// Policy is the compiled policy; required.
	Policy *gate.Policy
	// Names is the table of names and the addresses they resolved to,
	// filled by the DNS proxy and by Resolve; required.
	Names *gate.Names
	// Resolve resolves a canonical name through the sandbox's resolver and
	// records the answer in Names; required.
	Resolve gate.ResolveFunc
	// Dial opens upstream connections inside the sandbox's namespace, as
	// root; required.
	Dial gate.DialFunc
	// Record receives one record per connection or HTTP request; nil drops
	// them.
	Record gate.Recorder
	// Sandbox and UID label the records.
	Sandbox string
	UID     uint32
	// Logger receives debug detail on failed connections; nil discards.
	Logger *slog.Logger
	// OriginalDst reads a redirected connection's original destination.
	// The default reads SO_ORIGINAL_DST (IPv4) or IP6T_SO_ORIGINAL_DST.
	OriginalDst func(c *net.TCPConn) (netip.AddrPort, error)
	// LocalPorts are flowgate's own ports. A destination on loopback at one
	// of them, or an original destination equal to the connection's own
	// local address, is a loop and refused. The ports of the listeners
	// served are added automatically.
	LocalPorts []uint16
	// MaxConns bounds the client connections served at once, over both
	// ports; beyond it a connection is closed at once (reason limit).
	MaxConns int
	// HelloTimeout is one budget for a client's first bytes to become
	// routable: a whole ClientHello, or a first request head.
	HelloTimeout time.Duration
	// IdleTimeout closes a spliced or proxied connection on which no byte
	// moved for this long.
	IdleTimeout time.Duration
	// HeaderTimeout bounds the wait for each later request head on a
	// keep-alive connection and on the explicit proxy port.
	HeaderTimeout time.Duration
	// DialTimeout bounds resolving and dialling an upstream.
	DialTimeout time.Duration
	// ServerFirstWait is how long flowgate waits for a silent client's
	// first bytes, to a destination its address alone admits, before it
	// passes on what the server says first (SMTP, MySQL, FTP). The
	// client's first bytes are still judged before any go upstream.
	ServerFirstWait time.Duration
}

// Server serves the transparent and the explicit proxy ports of one sandbox.
// It is safe for concurrent use; Close stops everything it serves.
type Server struct {
	cfg    Config
	log    *slog.Logger
	sem    chan struct{}
	proc   chan struct{} // processSlots(), shared by every Server
	ctx    context.Context
	cancel context.CancelFunc

	limits *gate.Throttle // records of connections refused over MaxConns

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{}
	loopPorts map[uint16]bool
	wg        sync.WaitGroup
}

// CheckPolicy reports whether this data plane can enforce p as written. A
// blocked_urls rule written with https needs TLS interception, which this
// package does not do; such a policy is refused rather than enforced weaker.
func CheckPolicy(p *gate.Policy) error {
	if p == nil {
		return errors.New("sni: no policy")
	}
	if rules := p.HTTPSRules(); len(rules) > 0 {
		names := make([]string, 0, len(rules))
		for _, r := range rules {
			names = append(names, r.Field+" "+r.Written)
		}
		return fmt.Errorf("sni: %s: blocking an https URL needs TLS interception, which this flowgate build does not do; "+
			"block the whole host with blocked_hosts instead, or write the rule with http:// to block plain HTTP only "+
			"(its host's HTTPS is then refused as needs_intercept)", strings.Join(names, ", "))
	}
	return nil
}

// New checks cfg, fills defaults and returns a Server that serves nothing
// yet.
func New(cfg Config) (*Server, error) {
	if err := CheckPolicy(cfg.Policy); err != nil {
		return nil, err
	}
	switch {
	case cfg.Names == nil:
		return nil, errors.New("sni: Config.Names is required")
	case cfg.Resolve == nil:
		return nil, errors.New("sni: Config.Resolve is required")
	case cfg.Dial == nil:
		return nil, errors.New("sni: Config.Dial is required")
	}
	if cfg.OriginalDst == nil {
		cfg.OriginalDst = OriginalDst
	}
	setDefault(&cfg.HelloTimeout, DefaultHelloTimeout)
	setDefault(&cfg.IdleTimeout, DefaultIdleTimeout)
	setDefault(&cfg.HeaderTimeout, DefaultHeaderTimeout)
	setDefault(&cfg.DialTimeout, DefaultDialTimeout)
	setDefault(&cfg.ServerFirstWait, DefaultServerFirstWait)
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:       cfg,
		log:       log,
		sem:       make(chan struct{}, cfg.MaxConns),
		proc:      processSlots(),
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[net.Conn]struct{}),
		loopPorts: make(map[uint16]bool),
	}
	for _, p := range cfg.LocalPorts {
		s.loopPorts[p] = true
	}
	s.limits = gate.NewThrottle(gate.RecorderFunc(s.record), gate.DefaultThrottleInterval)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// ServeTransparent accepts redirected connections on l until l fails or the
// Server is closed; it returns nil after Close. The Server closes l.
func (s *Server) ServeTransparent(l net.Listener) error {
	return s.serve(l, s.serveTransparentConn)
}

// ServeProxy accepts explicit proxy connections (CONNECT and absolute-form
// HTTP) on l until l fails or the Server is closed; it returns nil after
// Close. The Server closes l.
func (s *Server) ServeProxy(l net.Listener) error {
	return s.serve(l, s.serveProxyConn)
}

// serve is the accept loop shared by both ports. Each accepted connection
// takes a slot of MaxConns for its whole life.
func (s *Server) serve(l net.Listener, handle func(*net.TCPConn)) error {
	if !s.addListener(l) {
		l.Close()
		return nil
	}
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if s.isClosed() {
				return nil
			}
			if isTemporaryAccept(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("accepting on %s: %w", l.Addr(), err)
		}
		backoff = 0
		tc, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			continue
		}
		if detail := s.takeSlot(); detail != "" {
			tc.SetLinger(0)
			tc.Close()
			// A client can cause these at any rate: one record a second.
			r := gate.NewRecord(gate.ProtoTCP, "", "", gate.Deny(gate.ReasonLimit))
			r.Detail = detail
			s.limits.Record(r)
			continue
		}
		if !s.track(tc) {
			s.releaseSlot()
			tc.Close()
			return nil
		}
		s.wg.Add(1)
		go s.runConn(tc, handle)
	}
}

// takeSlot takes a slot of MaxConns and one of the process's connection
// budget, or neither; it says which limit refused ("" when taken).
func (s *Server) takeSlot() string {
	select {
	case s.sem <- struct{}{}:
	default:
		return fmt.Sprintf("more than %d connections", cap(s.sem))
	}
	select {
	case s.proc <- struct{}{}:
		return ""
	default:
		<-s.sem
		return fmt.Sprintf("the process serves %d connections, all its open-files limit allows (raise it: ulimit -n, LimitNOFILE)", cap(s.proc))
	}
}

func (s *Server) releaseSlot() {
	<-s.proc
	<-s.sem
}

// isTemporaryAccept reports the accept errors worth retrying after a pause:
// out of descriptors or memory, a handshake aborted before accept.
func isTemporaryAccept(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// runConn runs one connection's handler and releases what the accept loop
// took for it. A panic in a handler costs that connection only: the
// gateway runs inside bench's own process, and one client's bytes must not
// end every sandbox's traffic. It is logged with its stack.
func (s *Server) runConn(c *net.TCPConn, handle func(*net.TCPConn)) {
	defer s.wg.Done()
	defer s.releaseSlot()
	defer s.untrack(c)
	defer c.Close()
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("sni: connection handler panicked", "remote", c.RemoteAddr(), "panic", p, "stack", string(debug.Stack()))
		}
	}()
	handle(c)
}

func (s *Server) addListener(l net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.listeners[l] = struct{}{}
	if ap, ok := addrPort(l.Addr()); ok {
		s.loopPorts[ap.Port()] = true
	}
	return true
}

// track registers a live connection so Close can close it; it reports false
// once the Server is closed.
func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// isLoop reports whether a destination leads back into flowgate.
func (s *Server) isLoop(dst, local netip.AddrPort) bool {
	if dst == local {
		return true
	}
	a := dst.Addr()
	if !a.IsLoopback() && !a.IsUnspecified() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loopPorts[dst.Port()]
}

// Close closes the listeners being served and every live connection, both
// the clients' and the upstreams', and returns when every handler has
// returned. Errors from closing listeners are joined.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	s.cancel()
	var errs []error
	for l := range s.listeners {
		if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("closing listener %s: %w", l.Addr(), err))
		}
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.limits.Close()
	return errors.Join(errs...)
}

// record stamps and hands on one decision record.
func (s *Server) record(r gate.Record) {
	r.Sandbox = s.cfg.Sandbox
	r.UID = s.cfg.UID
	if s.cfg.Record != nil {
		s.cfg.Record.Record(r)
	}
}

// dial opens an upstream connection to a checked address and registers it
// for Close. Loopback addresses at flowgate's own ports are refused here too.
func (s *Server) dial(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	c, err := s.cfg.Dial(ctx, "tcp", dst.String())
	if err != nil {
		return nil, fmt.Errorf("dialling %s: %w", dst, err)
	}
	if !s.track(c) {
		c.Close()
		return nil, fmt.Errorf("dialling %s: %w", dst, net.ErrClosed)
	}
	return c, nil
}

// dialAsync is dial on its own goroutine, for a flow that reads its
// client's first bytes meanwhile; the flow always receives the result.
func (s *Server) dialAsync(ctx context.Context, dst netip.AddrPort, out chan<- dialResult) {
	c, err := s.dial(ctx, dst)
	out <- dialResult{c: c, err: err}
}

// closeUp closes an upstream opened by dial.
func (s *Server) closeUp(c net.Conn) {
	if c == nil {
		return
	}
	c.Close()
	s.untrack(c)
}

func addrPort(a net.Addr) (netip.AddrPort, bool) {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, false
	}
	ap := ta.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port()), true
}
