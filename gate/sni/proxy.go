package sni

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"flowgate/gate"
)

// The explicit proxy port takes CONNECT host:port and absolute-form
// http:// requests, with the same decisions as the transparent port. It
// never dials a name: a target name is resolved through the sandbox's
// resolver, each address is checked (metadata, CIDR rules, flowgate's own
// ports), and a checked address is dialled, so a rebinding answer cannot
// slip past. A refusal is "HTTP/1.1 403 Forbidden" with X-Flowgate-Reason.
//
// A CONNECT to a host some blocked_urls rule covers is refused
// (needs_intercept): its HTTPS paths cannot be checked without
// interception. After "200 Connection established" the tunnel is routed
// like a redirected connection to the dialled address, with one more rule:
// a TLS SNI or HTTP Host in it must name the CONNECT target (name_mismatch).

// serveProxyConn handles one connection to the proxy port.
func (s *Server) serveProxyConn(c *net.TCPConn) {
	hs := s.newHTTPSession(s.ctx, sessProxy, c, nil)
	hs.run()
}

// routeHTTP hands a flow whose first bytes are an HTTP request to an HTTP
// session. If the server already spoke first, its bytes and the client's
// requests cannot be told apart as a request/response exchange: refused.
func (f *flow) routeHTTP() {
	if f.banner != nil {
		n, err := f.banner.stop()
		f.banner = nil
		if n > 0 || err != nil {
			r := f.newRecord(gate.ProtoHTTP, "", "", gate.Deny(gate.ReasonUnsupported))
			r.Detail = "HTTP request after the server spoke first"
			f.s.record(r)
			f.close()
			return
		}
	}
	f.client.SetReadDeadline(time.Time{})
	kind := sessTransparent
	if f.tunnel {
		kind = sessTunnel
		f.s.record(f.newRecord(gate.ProtoHTTP, "", "", f.connect))
	}
	hs := f.s.newHTTPSession(f.ctx, kind, f.client, trimLeadingNewlines(f.p.Bytes()))
	hs.dst, hs.want, hs.firstBy = f.dst, f.want, f.deadline
	if f.pending != nil {
		if r := <-f.pending; r.err == nil {
			f.up = r.c
		}
		f.pending = nil // a failed early dial is retried for an allowed request
	}
	if f.up != nil {
		hs.setUp(f.up, f.dst)
		f.up = nil // the session closes it
	}
	hs.run()
}

// connect serves a CONNECT request: decide the target, resolve and check
// its addresses, dial one, answer 200, then route the tunnel.
func (hs *httpSession) connect(req *http.Request) {
	s := hs.s
	host, port, err := gate.ParseTarget(req.RequestURI)
	if err == nil && port == 0 {
		err = errors.New("CONNECT target has no port")
	}
	if err != nil {
		d := gate.Deny(gate.ReasonBadRequest)
		if port != 0 {
			d = gate.Deny(gate.ReasonBadName)
		}
		hs.refuseConnect(d, req.RequestURI, netip.AddrPort{}, err.Error())
		return
	}
	name := host.String()
	d := s.decideTarget(host, "", false)
	if !d.Allow {
		hs.refuseConnect(d, name, netip.AddrPort{}, "")
		return
	}
	addrs, cd := s.candidates(hs.ctx, host, port)
	if !cd.Allow {
		hs.refuseConnect(cd, name, netip.AddrPort{}, "")
		return
	}
	var up net.Conn
	var dst netip.AddrPort
	var errs []error
	for _, a := range addrs {
		if up, err = s.dial(hs.ctx, a); err == nil {
			dst = a
			break
		}
		errs = append(errs, err)
	}
	if up == nil {
		r := gate.NewRecord(gate.ProtoConnect, "", name, d)
		r.Detail = "upstream: " + errors.Join(errs...).Error()
		s.record(r)
		writeHTTPAnswer(hs.cw, http.StatusBadGateway, "", fmt.Sprintf("flowgate: %s: cannot connect\n", name))
		hs.cw.Flush()
		return
	}
	hs.cw.WriteString("HTTP/1.1 200 Connection established\r\n\r\n")
	if err := hs.cw.Flush(); err != nil {
		s.closeUp(up)
		return
	}
	buffered, _ := hs.br.Peek(hs.br.Buffered())
	hs.client.SetDeadline(time.Time{})
	f := &flow{s: s, ctx: hs.ctx, client: hs.client, p: &peeker{r: hs.client, buf: append([]byte(nil), buffered...)},
		dst: dst, tunnel: true, want: host.Name, connect: d, up: up}
	f.run()
}

// refuseConnect records a refused CONNECT and answers it.
func (hs *httpSession) refuseConnect(d gate.Decision, name string, dst netip.AddrPort, detail string) {
	dest := ""
	if dst.IsValid() {
		dest = dst.String()
	}
	r := gate.NewRecord(gate.ProtoConnect, dest, name, d)
	r.Detail = detail
	hs.s.record(r)
	hs.client.SetWriteDeadline(time.Now().Add(drainTime))
	writeHTTPRefusal(hs.cw, &gate.DeniedError{Decision: d, Name: name}, "")
	hs.cw.Flush()
	closeGracefully(hs.client)
}
