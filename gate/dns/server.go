// Package dns is flowgate's DNS proxy for one sandbox: it answers the
// agent's queries per the sandbox's policy and forwards allowed ones to the
// sandbox's own resolver (github.com/miekg/dns for the messages).
//
// It owns the UDP and TCP listeners handed to it (Close closes them) and its
// upstream sockets, which it opens through Config.Dial inside the sandbox's
// namespace. It fills the gate.Names table with the addresses of allowed
// answers before the answer is written, so that the kernel admits an
// address before the agent sees it. It never opens a socket in the host's
// namespace by itself, never decides anything the gate.Policy does not say,
// and never sends a name upstream that the policy refuses in allowlist mode.
//
// Each query goes through a fixed chain of small stages (chain.go); every
// query produces exactly one gate.Record.
package dns

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"flowgate/gate"
)

// Defaults for the limits in Config.
const (
	DefaultTimeout        = 3 * time.Second
	DefaultMaxTCPConns    = 256
	DefaultTCPIdleTimeout = 10 * time.Second
	DefaultMaxUpstream    = 256
	DefaultMaxInflight    = 1024
	DefaultBlockedLookups = 8
)

// Message size bounds. A query longer than MaxQuery, over UDP or TCP, is
// refused (a question and an OPT record need far less); replies over UDP
// fit the client's EDNS size (at most MaxUDPReply) or 512 bytes without
// EDNS; replies over TCP are bounded by their 16-bit length.
const (
	MaxQuery    = 4096
	MaxUDPReply = 4096
	// tcpPipeline is how many queries of one TCP stream are answered at
	// once; further messages wait.
	tcpPipeline = 8
)

// Config configures a Server. Policy, Names and (in denylist and
// allowlist) Upstreams and Dial are required.
type Config struct {
	// Policy decides every name. Public mode is refused by New: the
	// gateway does not proxy DNS in public mode.
	Policy *gate.Policy
	// Names receives the addresses of answers, with their TTL.
	Names *gate.Names
	// Upstreams are the sandbox's resolvers, tried in order (see
	// ReadResolvConf).
	Upstreams []netip.AddrPort
	// Dial opens upstream sockets ("udp" or "tcp") inside the sandbox's
	// namespace, as root.
	Dial gate.DialFunc
	// Record receives one record per query; nil drops them.
	Record gate.Recorder
	// Sandbox and UID are copied into every record.
	Sandbox string
	UID     uint32
	// Logger receives operational messages; nil discards them.
	Logger *slog.Logger

	// Timeout bounds one query's upstream exchange, all upstreams and a
	// TCP retry included. Default DefaultTimeout.
	Timeout time.Duration
	// MaxTCPConns bounds open TCP client connections; more are closed at
	// once. Default DefaultMaxTCPConns.
	MaxTCPConns int
	// TCPIdleTimeout is how long a TCP client may take to send the next
	// message (or the rest of one). Default DefaultTCPIdleTimeout.
	TCPIdleTimeout time.Duration
	// MaxUpstream bounds concurrent upstream exchanges. Default
	// DefaultMaxUpstream.
	MaxUpstream int
	// MaxInflight bounds UDP queries being answered at once; further
	// packets are dropped (reason limit). Default DefaultMaxInflight.
	MaxInflight int
	// BlockedLookups bounds the background lookups of blocked names in
	// denylist mode (their addresses go into Names, not pushed, so that a
	// connection to them without a name is refused as address_blocked).
	// Default DefaultBlockedLookups; negative turns them off.
	BlockedLookups int
}

// Server is a running DNS proxy for one sandbox.
type Server struct {
	cfg     Config
	log     *slog.Logger
	up      *upstreams
	blocked *blockedLookups

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	inflight chan struct{}
	tcpSlots chan struct{}
	limits   *gate.Throttle // records of refusals over a limit

	mu     sync.Mutex
	closed bool
	pcs    map[net.PacketConn]struct{}
	ls     map[net.Listener]struct{}
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// New checks cfg and returns a server that serves nothing until ServeUDP or
// ServeTCP is called.
func New(cfg Config) (*Server, error) {
	if cfg.Policy == nil {
		return nil, errors.New("dns proxy: no policy")
	}
	if cfg.Names == nil {
		return nil, errors.New("dns proxy: no names table")
	}
	switch cfg.Policy.Mode {
	case gate.Public:
		return nil, errors.New("dns proxy: network_mode public is not proxied; the gateway must not start the DNS proxy")
	case gate.Denylist, gate.Allowlist:
		if len(cfg.Upstreams) == 0 {
			return nil, fmt.Errorf("dns proxy: network_mode %s needs at least one upstream resolver", cfg.Policy.Mode)
		}
		if cfg.Dial == nil {
			return nil, errors.New("dns proxy: no upstream dial function")
		}
	}
	for _, u := range cfg.Upstreams {
		if !u.IsValid() || u.Port() == 0 {
			return nil, fmt.Errorf("dns proxy: bad upstream %q", u)
		}
	}
	setDefault(&cfg.Timeout, DefaultTimeout)
	setDefault(&cfg.MaxTCPConns, DefaultMaxTCPConns)
	setDefault(&cfg.TCPIdleTimeout, DefaultTCPIdleTimeout)
	setDefault(&cfg.MaxUpstream, DefaultMaxUpstream)
	setDefault(&cfg.MaxInflight, DefaultMaxInflight)
	setDefault(&cfg.BlockedLookups, DefaultBlockedLookups)
	if cfg.Timeout < 0 || cfg.MaxTCPConns < 0 || cfg.TCPIdleTimeout < 0 || cfg.MaxUpstream < 0 || cfg.MaxInflight < 0 {
		return nil, errors.New("dns proxy: negative limit in config")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:      cfg,
		log:      log,
		up:       newUpstreams(cfg.Upstreams, cfg.Dial, cfg.MaxUpstream),
		ctx:      ctx,
		cancel:   cancel,
		inflight: make(chan struct{}, cfg.MaxInflight),
		tcpSlots: make(chan struct{}, cfg.MaxTCPConns),
		pcs:      make(map[net.PacketConn]struct{}),
		ls:       make(map[net.Listener]struct{}),
		conns:    make(map[net.Conn]struct{}),
	}
	if cfg.Policy.Mode == gate.Denylist && cfg.BlockedLookups > 0 {
		s.blocked = newBlockedLookups(cfg.BlockedLookups)
	}
	s.limits = gate.NewThrottle(gate.RecorderFunc(s.stamp), gate.DefaultThrottleInterval)
	return s, nil
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// track registers something Close must close, and counts it in s.wg so
// that goroutines it starts are added while the count is above zero; false
// when the server is already closed.
func track[T comparable](s *Server, m map[T]struct{}, v T) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	m[v] = struct{}{}
	s.wg.Add(1)
	return true
}

func untrack[T comparable](s *Server, m map[T]struct{}, v T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(m, v)
	s.wg.Done()
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// ServeUDP answers queries arriving on pc until Close, which closes pc.
// It returns nil after Close, also when called after Close (pc is then
// closed at once).
func (s *Server) ServeUDP(pc net.PacketConn) error {
	if !track(s, s.pcs, pc) {
		pc.Close() // closed already: nothing to serve
		return nil
	}
	defer untrack(s, s.pcs, pc)
	buf := make([]byte, MaxQuery+1)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if s.isClosed() {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("reading dns queries: %w", err)
			}
			s.log.Warn("dns proxy: reading a UDP query", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		select {
		case s.inflight <- struct{}{}:
		default:
			s.recordLimit("udp: too many queries in flight, dropped")
			continue
		}
		s.wg.Add(1)
		go s.serveUDPPacket(pc, from, bytes.Clone(buf[:n]))
	}
}

func (s *Server) serveUDPPacket(pc net.PacketConn, from net.Addr, pkt []byte) {
	defer s.wg.Done()
	defer func() { <-s.inflight }()
	s.serve(s.ctx, pkt, false, func(out []byte) { pc.WriteTo(out, from) })
}

// ServeTCP answers queries on connections accepted from l until Close,
// which closes l and every connection. It returns nil after Close, also
// when called after Close (l is then closed at once).
func (s *Server) ServeTCP(l net.Listener) error {
	if !track(s, s.ls, l) {
		l.Close() // closed already: nothing to serve
		return nil
	}
	defer untrack(s, s.ls, l)
	for {
		c, err := l.Accept()
		if err != nil {
			if s.isClosed() {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accepting dns connections: %w", err)
			}
			s.log.Warn("dns proxy: accepting a TCP connection", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		select {
		case s.tcpSlots <- struct{}{}:
		default:
			s.recordLimit("tcp: too many connections, closed")
			c.Close()
			continue
		}
		if !track(s, s.conns, c) {
			c.Close()
			<-s.tcpSlots
			return nil
		}
		go s.serveTCPConn(c)
	}
}

// serveTCPConn reads length-prefixed messages until the client closes,
// stalls past the idle timeout, or sends a bad length. Up to tcpPipeline
// queries are answered at once; answers may come out of order (RFC 7766).
func (s *Server) serveTCPConn(c net.Conn) {
	var answering sync.WaitGroup
	defer func() { <-s.tcpSlots }()
	defer untrack(s, s.conns, c)
	defer c.Close()
	defer answering.Wait()
	var wmu sync.Mutex
	pipeline := make(chan struct{}, tcpPipeline)
	var hdr [2]byte
	for {
		c.SetReadDeadline(time.Now().Add(s.cfg.TCPIdleTimeout))
		if got, err := io.ReadFull(c, hdr[:]); err != nil {
			// Idle between messages is a normal end; stalling inside a
			// length prefix is not.
			if got > 0 && (isTimeout(err) || errors.Is(err, io.ErrUnexpectedEOF)) {
				s.record(gate.Deny(gate.ReasonTimeout), "", "", "tcp: length prefix cut short, closed")
			}
			return
		}
		n := binary.BigEndian.Uint16(hdr[:])
		if n < headerLen || n > MaxQuery {
			s.record(gate.Deny(gate.ReasonBadRequest), "", "", fmt.Sprintf("tcp: message length %d, not %d to %d bytes, closed", n, headerLen, MaxQuery))
			return
		}
		msg := make([]byte, n)
		if _, err := io.ReadFull(c, msg); err != nil {
			if isTimeout(err) || errors.Is(err, io.ErrUnexpectedEOF) {
				s.record(gate.Deny(gate.ReasonTimeout), "", "", "tcp: message cut short, closed")
			}
			return
		}
		pipeline <- struct{}{}
		answering.Add(1)
		go func() {
			defer answering.Done()
			defer func() { <-pipeline }()
			s.serve(s.ctx, msg, true, func(out []byte) {
				frame := make([]byte, 2+len(out))
				binary.BigEndian.PutUint16(frame, uint16(len(out)))
				copy(frame[2:], out)
				wmu.Lock()
				defer wmu.Unlock()
				c.SetWriteDeadline(time.Now().Add(s.cfg.TCPIdleTimeout))
				if _, err := c.Write(frame); err != nil {
					c.Close()
				}
			})
		}()
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Close stops serving: it closes every listener, packet conn and client
// connection, waits for queries being answered and background lookups,
// and closes the upstream sockets. Calling it again does nothing.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var errs []error
	for pc := range s.pcs {
		errs = append(errs, ignoreClosed(pc.Close()))
	}
	for l := range s.ls {
		errs = append(errs, ignoreClosed(l.Close()))
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	s.up.close()
	s.limits.Close()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing dns proxy: %w", err)
	}
	return nil
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// record writes one decision record.
func (s *Server) record(d gate.Decision, dest, name, detail string) {
	r := gate.NewRecord(gate.ProtoDNS, dest, name, d)
	r.Detail = detail
	s.stamp(r)
}

// recordLimit records a refusal over a limit, which a client can cause at
// any rate: through the throttle, so that a flood is one record a second.
func (s *Server) recordLimit(detail string) {
	r := gate.NewRecord(gate.ProtoDNS, "", "", gate.Deny(gate.ReasonLimit))
	r.Detail = detail
	s.limits.Record(r)
}

// stamp labels a record with the sandbox and uid and hands it on.
func (s *Server) stamp(r gate.Record) {
	if s.cfg.Record == nil {
		return
	}
	r.Sandbox = s.cfg.Sandbox
	r.UID = s.cfg.UID
	s.cfg.Record.Record(r)
}
