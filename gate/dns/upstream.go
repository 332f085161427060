package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"flowgate/gate"

	"github.com/miekg/dns"
)

// upstreamUDPSize is the EDNS size flowgate offers upstream (the DNS flag
// day value: no IP fragmentation on common paths).
const upstreamUDPSize = 1232

// idlePerUpstream is how many idle UDP sockets are kept per upstream.
// Reusing a socket saves a setns round trip per query; each query still
// gets a fresh random ID, and a socket whose exchange failed is closed.
const idlePerUpstream = 16

// upstreams exchanges messages with the sandbox's resolvers.
type upstreams struct {
	addrs []netip.AddrPort
	dial  gate.DialFunc
	sem   chan struct{}
	idle  []chan net.Conn
	bufs  sync.Pool

	mu     sync.Mutex
	closed bool
}

func newUpstreams(addrs []netip.AddrPort, dial gate.DialFunc, max int) *upstreams {
	u := &upstreams{addrs: addrs, dial: dial, sem: make(chan struct{}, max)}
	for range addrs {
		u.idle = append(u.idle, make(chan net.Conn, idlePerUpstream))
	}
	u.bufs.New = func() any { b := make([]byte, dns.MaxMsgSize); return &b }
	return u
}

// exchange sends m to each upstream in turn until one answers with
// something other than SERVFAIL or REFUSED (or none is left), within ctx.
// It returns the answer and the upstream that gave it.
func (u *upstreams) exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, string, error) {
	if len(u.addrs) == 0 {
		return nil, "", errors.New("no upstream resolver")
	}
	select {
	case u.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, "", fmt.Errorf("waiting for an upstream slot: %w", ctx.Err())
	}
	defer func() { <-u.sem }()
	wire, err := m.Pack()
	if err != nil {
		return nil, "", fmt.Errorf("packing upstream query: %w", err)
	}
	var (
		errs     []error
		best     *dns.Msg
		bestDest string
	)
	for i, a := range u.addrs {
		actx, cancel := attemptContext(ctx, len(u.addrs)-i)
		resp, err := u.try(actx, i, m, wire)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a, err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if resp.Rcode == dns.RcodeServerFailure || resp.Rcode == dns.RcodeRefused {
			if best == nil {
				best, bestDest = resp, a.String()
			}
			continue
		}
		return resp, a.String(), nil
	}
	if best != nil {
		return best, bestDest, nil
	}
	dest := ""
	if len(u.addrs) == 1 {
		dest = u.addrs[0].String()
	}
	return nil, dest, errors.Join(errs...)
}

// attemptContext gives one upstream its share of what is left of ctx.
func attemptContext(ctx context.Context, left int) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok || left <= 1 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, time.Until(dl)/time.Duration(left))
}

// try asks upstream i over UDP and, if the answer is truncated, over TCP.
func (u *upstreams) try(ctx context.Context, i int, m *dns.Msg, wire []byte) (*dns.Msg, error) {
	resp, err := u.udp(ctx, i, m, wire)
	if err != nil {
		return nil, err
	}
	if resp.Truncated {
		return u.tcp(ctx, i, m, wire)
	}
	return resp, nil
}

// deadline makes c give up when ctx ends; the returned func undoes that.
func deadline(ctx context.Context, c net.Conn) func() bool {
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	return context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
}

func (u *upstreams) udp(ctx context.Context, i int, m *dns.Msg, wire []byte) (*dns.Msg, error) {
	var c net.Conn
	select {
	case c = <-u.idle[i]:
	default:
		var err error
		if c, err = u.dial(ctx, "udp", u.addrs[i].String()); err != nil {
			return nil, fmt.Errorf("dialing udp: %w", err)
		}
	}
	stop := deadline(ctx, c)
	resp, err := u.udpRoundTrip(c, m, wire)
	if !stop() || err != nil {
		// The context fired or the exchange failed: a late answer could
		// still arrive on this socket, so it is not reused.
		c.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
	u.putIdle(i, c)
	return resp, nil
}

func (u *upstreams) udpRoundTrip(c net.Conn, m *dns.Msg, wire []byte) (*dns.Msg, error) {
	if _, err := c.Write(wire); err != nil {
		return nil, fmt.Errorf("sending udp: %w", err)
	}
	bp := u.bufs.Get().(*[]byte)
	defer u.bufs.Put(bp)
	buf := *bp
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, fmt.Errorf("reading udp: %w", err)
		}
		resp := new(dns.Msg)
		if resp.Unpack(buf[:n]) != nil || !answers(m, resp) {
			continue // garbage or a stray answer: keep waiting
		}
		return resp, nil
	}
}

func (u *upstreams) putIdle(i int, c net.Conn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	select {
	case u.idle[i] <- c:
	default:
		c.Close()
	}
}

func (u *upstreams) tcp(ctx context.Context, i int, m *dns.Msg, wire []byte) (*dns.Msg, error) {
	c, err := u.dial(ctx, "tcp", u.addrs[i].String())
	if err != nil {
		return nil, fmt.Errorf("dialing tcp: %w", err)
	}
	defer c.Close()
	defer deadline(ctx, c)()
	frame := make([]byte, 2+len(wire))
	binary.BigEndian.PutUint16(frame, uint16(len(wire)))
	copy(frame[2:], wire)
	if _, err := c.Write(frame); err != nil {
		return nil, fmt.Errorf("sending tcp: %w", err)
	}
	for {
		var hdr [2]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return nil, fmt.Errorf("reading tcp: %w", err)
		}
		buf := make([]byte, binary.BigEndian.Uint16(hdr[:]))
		if _, err := io.ReadFull(c, buf); err != nil {
			return nil, fmt.Errorf("reading tcp: %w", err)
		}
		resp := new(dns.Msg)
		if err := resp.Unpack(buf); err != nil {
			return nil, fmt.Errorf("malformed tcp answer: %w", err)
		}
		if answers(m, resp) {
			return resp, nil
		}
	}
}

// answers reports whether r is the answer to q: same ID and question, or
// an error code with no question at all.
func answers(q, r *dns.Msg) bool {
	if !r.Response || r.Id != q.Id {
		return false
	}
	if len(r.Question) == 0 {
		return r.Rcode != dns.RcodeSuccess
	}
	a, b := q.Question[0], r.Question[0]
	return len(r.Question) == 1 && a.Qtype == b.Qtype && a.Qclass == b.Qclass && strings.EqualFold(a.Name, b.Name)
}

// close closes the idle sockets; sockets in use are closed when their
// exchange ends.
func (u *upstreams) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	for _, ch := range u.idle {
		for {
			select {
			case c := <-ch:
				c.Close()
				continue
			default:
			}
			break
		}
	}
}
