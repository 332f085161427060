package sni

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"time"

	"flowgate/gate"
)

// serveTransparentConn handles one redirected connection: where it was
// going, whether that is a loop or a metadata address, then the stream.
func (s *Server) serveTransparentConn(c *net.TCPConn) {
	dst, err := s.cfg.OriginalDst(c)
	if err != nil {
		s.log.Debug("original destination", "err", err)
		r := gate.NewRecord(gate.ProtoTCP, "", "", gate.Deny(gate.ReasonBadRequest))
		r.Detail = err.Error()
		s.record(r)
		resetClose(c)
		return
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap().WithZone(""), dst.Port())
	local, _ := addrPort(c.LocalAddr())
	if s.isLoop(dst, local) {
		s.record(gate.NewRecord(gate.ProtoTCP, dst.String(), "", gate.Deny(gate.ReasonLoop)))
		resetClose(c)
		return
	}
	if d := s.cfg.Policy.Addr(dst.Addr()); d.Reason == gate.ReasonMetadata {
		s.record(gate.NewRecord(gate.ProtoTCP, dst.String(), "", d))
		resetClose(c)
		return
	}
	f := &flow{s: s, ctx: s.ctx, client: c, p: &peeker{r: c}, dst: dst}
	f.run()
}

// flow routes one client stream to one destination: a redirected
// connection (transparent port), or the inside of a CONNECT tunnel, whose
// destination is the address flowgate dialled for the target and whose
// TLS SNI or HTTP Host must name the target (want).
type flow struct {
	s      *Server
	ctx    context.Context
	client net.Conn
	p      *peeker
	dst    netip.AddrPort

	// Tunnel only: the CONNECT target's canonical name ("" for an IP
	// target), the CONNECT decision, and the upstream already dialled.
	tunnel  bool
	want    string
	connect gate.Decision

	// up is the upstream while the flow owns it; whoever takes it over
	// (splice, an HTTP session) sets it to nil. pending delivers an
	// upstream dialled while the first bytes were read.
	up         net.Conn
	pending    chan dialResult
	cancelDial context.CancelFunc
	banner     *banner
	upDone     bool      // the upstream closed its side while speaking first
	deadline   time.Time // for the first bytes to be routable: hello or request head
}

type dialResult struct {
	c   net.Conn
	err error
}

// run waits for the client's first bytes, then routes by what they are.
//
// A destination its address alone admits is dialled at once, while the
// first bytes are read, so the dial is not added to the connection's
// latency; it reaches nothing a plain TCP connection could not. Only the
// judged first bytes ever go upstream. A silent client to such a
// destination gets the upstream's first words after ServerFirstWait, so
// that a server-first protocol (SMTP, MySQL) can speak.
func (f *flow) run() {
	defer f.release()
	cfg := &f.s.cfg
	admit := f.addressVerdict()
	if admit.Allow && f.up == nil {
		var ctx context.Context
		ctx, f.cancelDial = context.WithCancel(f.ctx)
		f.pending = make(chan dialResult, 1)
		go f.s.dialAsync(ctx, f.dst, f.pending)
	}
	// One budget from here to a routed stream: a client cannot stretch it
	// by sending a byte at a time.
	f.deadline = time.Now().Add(cfg.HelloTimeout)
	var err error
	if len(f.p.Bytes()) == 0 {
		wait := f.deadline
		if admit.Allow {
			wait = time.Now().Add(cfg.ServerFirstWait)
		}
		f.client.SetReadDeadline(wait)
		err = f.p.more()
	}
	if isTimeout(err) && admit.Allow {
		if err = f.upstream(); err != nil {
			f.finish(gate.ProtoTCP, "", "", admit, err)
			return
		}
		f.banner = startBanner(f.up, f.client, cfg.IdleTimeout)
		f.client.SetReadDeadline(time.Now().Add(cfg.IdleTimeout))
		err = f.p.more()
		f.deadline = time.Now().Add(cfg.HelloTimeout)
	}
	if err != nil {
		f.refuseEarly(err)
		return
	}
	f.client.SetReadDeadline(f.deadline)
	kind, err := classify(f.p)
	if err != nil {
		f.refuseEarly(err)
		return
	}
	switch kind {
	case kindTLS:
		f.routeTLS()
	case kindHTTP:
		f.routeHTTP()
	default:
		f.finish(gate.ProtoTCP, "", "", f.opaqueVerdict(admit), nil)
	}
}

// opaqueVerdict decides a stream that is neither TLS nor HTTP: by the
// address (admit: the CONNECT decision in a tunnel), and like TLS without
// a name: refused in denylist to an address that blocked_urls rules apply
// to, since the stream may be a request in a form flowgate does not parse
// that such a server would serve.
func (f *flow) opaqueVerdict(admit gate.Decision) gate.Decision {
	if !admit.Allow {
		return admit
	}
	if r, ok := f.s.interceptRefusalAt(f.dst.Addr()); ok {
		return r
	}
	return admit
}

// addressVerdict is what the destination's address alone admits: the
// CONNECT decision in a tunnel, the address rules otherwise.
func (f *flow) addressVerdict() gate.Decision {
	if f.tunnel {
		return f.connect
	}
	return f.s.decideAddr(f.dst.Addr())
}

// refuseEarly ends a flow whose first bytes never came or could not be
// read: timeout, bad_request, or nothing at all (the client closed).
func (f *flow) refuseEarly(err error) {
	reason := gate.ReasonBadRequest
	if isTimeout(err) {
		reason = gate.ReasonTimeout
	}
	r := f.newRecord(gate.ProtoTCP, "", "", gate.Deny(reason))
	r.Detail = err.Error()
	if len(f.p.Bytes()) == 0 && errors.Is(err, io.EOF) {
		if f.tunnel || f.banner != nil {
			// The CONNECT, or the address, was admitted and the server may
			// have spoken; the client left without a word.
			r = f.newRecord(gate.ProtoTCP, "", "", f.addressVerdict())
		}
		r.Detail = "client closed before sending"
	}
	f.s.record(r)
	f.close()
}

// routeTLS peeks the whole ClientHello, decides, and answers or forwards.
func (f *flow) routeTLS() {
	hello, err := peekHello(f.p)
	if err != nil {
		d := gate.Deny(gate.ReasonBadRequest)
		if isTimeout(err) {
			d = gate.Deny(gate.ReasonTimeout)
		}
		r := f.newRecord(gate.ProtoTLS, "", "", d)
		r.Detail = err.Error()
		f.s.record(r)
		f.refuseTLS(nil)
		return
	}
	f.client.SetReadDeadline(time.Time{})
	d, name := f.s.decideTLS(f.ctx, hello, f.dst.Addr(), f.want)
	if !d.Allow {
		f.s.record(f.newRecord(gate.ProtoTLS, name, "", d))
		f.refuseTLS(hello)
		return
	}
	f.finish(gate.ProtoTLS, name, "", d, nil)
}

// refuseTLS sends the access_denied alert, unless the server has already
// spoken on this stream, in which case an alert would not parse.
func (f *flow) refuseTLS(hello *tls.ClientHelloInfo) {
	if f.banner != nil {
		f.close()
		return
	}
	refuseTLS(f.client, alertVersion(hello))
}

// finish records an allowed flow (or one that failed before it began, err)
// and forwards it: dial if needed, replay the peeked bytes, splice.
func (f *flow) finish(proto, name, path string, d gate.Decision, err error) {
	if err == nil && !d.Allow {
		f.s.record(f.newRecord(proto, name, path, d))
		f.close()
		return
	}
	if err == nil {
		err = f.upstream()
	}
	if err == nil && f.banner != nil {
		_, berr := f.banner.stop()
		f.banner = nil
		switch {
		case errors.Is(berr, io.EOF):
			f.upDone = true
			err = closeWrite(f.client)
		case berr != nil:
			err = berr
		}
	}
	if err == nil && len(f.p.Bytes()) > 0 {
		f.up.SetWriteDeadline(time.Now().Add(f.s.cfg.IdleTimeout))
		_, err = f.up.Write(f.p.Bytes())
		f.up.SetWriteDeadline(time.Time{})
	}
	r := f.newRecord(proto, name, path, d)
	if err != nil {
		r.Detail = "upstream: " + err.Error()
		f.s.record(r)
		f.s.log.Debug("forwarding", "dest", f.dst, "err", err)
		resetClose(f.client)
		return
	}
	f.s.record(r)
	f.client.SetReadDeadline(time.Time{})
	up := f.up
	f.up = nil // splice closes it
	f.s.splice(f.client, up, f.upDone)
}

// upstream makes sure f.up is open: the dial started early, or a new one.
func (f *flow) upstream() error {
	if f.up != nil {
		return nil
	}
	if f.pending != nil {
		r := <-f.pending
		f.pending = nil
		f.up = r.c
		return r.err
	}
	var err error
	f.up, err = f.s.dial(f.ctx, f.dst)
	return err
}

// release closes an upstream nobody took over; an early dial still running
// is cancelled and waited for, so that its conn is not left behind.
func (f *flow) release() {
	if f.cancelDial != nil {
		defer f.cancelDial()
	}
	if f.pending != nil {
		f.cancelDial()
		if r := <-f.pending; r.c != nil {
			f.s.closeUp(r.c)
		}
		f.pending = nil
	}
	if f.banner != nil {
		f.banner.stop()
		f.banner = nil
	}
	f.s.closeUp(f.up)
	f.up = nil
}

// newRecord makes the flow's record: in a tunnel, one connect record that
// names the target and says what the tunnel carried.
func (f *flow) newRecord(proto, name, path string, d gate.Decision) gate.Record {
	if !f.tunnel {
		r := gate.NewRecord(proto, f.dst.String(), name, d)
		r.Path = path
		return r
	}
	if f.want != "" {
		name = f.want
	}
	r := gate.NewRecord(gate.ProtoConnect, f.dst.String(), name, d)
	r.Path = path
	r.Detail = proto
	return r
}

// close ends a flow that will not be forwarded.
func (f *flow) close() {
	f.release()
	f.client.Close()
}

func isTimeout(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded)
}
