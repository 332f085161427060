package sni

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"flowgate/gate"
)

// HTTP is checked request by request, never by its first request alone:
// keep-alive and pipelining would otherwise carry unchecked requests. A
// session parses each request head with net/http (bounded in size and
// time), decides it, and forwards it re-serialised by net/http, with the
// canonical path in the request line and the canonical host in Host: the
// upstream sees exactly what was checked, in one framing (Content-Length or
// chunked as net/http understood it), so no second request can hide in a
// body. It then reads the response and writes it back before reading the
// next request. An Upgrade is passed on only for WebSocket (after 101 the
// bytes are no longer HTTP requests); h2c and other upgrades are removed, as
// HTTP/2 would carry requests no one checks.

// sessionKind is where an HTTP session's requests come from.
type sessionKind uint8

const (
	sessTransparent sessionKind = iota // redirected: every request goes to dst
	sessTunnel                         // inside CONNECT: to dst, Host must be the target
	sessProxy                          // the proxy port: absolute-form, each to its own host
)

// httpSession serves the HTTP requests of one client connection.
type httpSession struct {
	s      *Server
	ctx    context.Context
	kind   sessionKind
	client net.Conn // the raw client conn: closing, and splicing after 101
	ct     *timedConn
	cw     *bufio.Writer
	head   *limitReader // bounds each request head
	br     *bufio.Reader

	dst     netip.AddrPort // transparent and tunnel
	want    string         // tunnel: the CONNECT target name
	firstBy time.Time      // when set, the deadline for the first request head

	up     net.Conn // current upstream (raw), nil until the first allowed request
	upAddr netip.AddrPort
	upKey  string // proxy: the target the upstream was dialled for
	upHead *limitReader
	upBr   *bufio.Reader
	upW    *bufio.Writer
}

// newHTTPSession reads requests from prefix (bytes already read from
// client), then client.
func (s *Server) newHTTPSession(ctx context.Context, kind sessionKind, client net.Conn, prefix []byte) *httpSession {
	ct := &timedConn{Conn: client, idle: s.cfg.IdleTimeout}
	var r io.Reader = ct
	if len(prefix) > 0 {
		r = io.MultiReader(bytes.NewReader(prefix), ct)
	}
	head := &limitReader{r: r, n: -1}
	return &httpSession{s: s, ctx: ctx, kind: kind, client: client, ct: ct,
		cw: bufio.NewWriter(ct), head: head, br: bufio.NewReader(head)}
}

// run serves requests until the client is done, a request is refused, or
// either side fails; it closes the client and the upstream.
func (hs *httpSession) run() {
	defer hs.closeAll()
	for n := 0; ; n++ {
		hs.ct.readBy = time.Now().Add(hs.s.cfg.HeaderTimeout)
		if n == 0 && !hs.firstBy.IsZero() {
			hs.ct.readBy = hs.firstBy
		}
		hs.head.n = MaxRequestHead
		req, err := http.ReadRequest(hs.br)
		hs.head.n = -1
		hs.ct.readBy = time.Time{}
		if err != nil {
			hs.readFailed(n, err)
			return
		}
		if !hs.serve(req) {
			return
		}
	}
}

// readFailed answers a request head that could not be read. A client that
// simply stops between requests is not a refusal.
func (hs *httpSession) readFailed(n int, err error) {
	if n > 0 && (errors.Is(err, io.EOF) || isTimeout(err) || errors.Is(err, net.ErrClosed)) {
		return
	}
	reason := gate.ReasonBadRequest
	if isTimeout(err) {
		reason = gate.ReasonTimeout
	}
	if errors.Is(err, io.EOF) && n == 0 && hs.kind == sessProxy {
		return // connected and left without a word
	}
	hs.refuse(gate.Deny(reason), "", "", err.Error())
}

// target is where one allowed request goes, and how it is written.
type target struct {
	name  string // canonical host judged ("" when none), for the record
	path  string // canonical path
	query string // raw query, passed on as it is
	hostH string // the Host header sent upstream
	host  gate.Host
	port  uint16
}

// serve decides one request and, if allowed, forwards it and its response.
// It reports whether the session goes on.
func (hs *httpSession) serve(req *http.Request) bool {
	if req.Method == http.MethodConnect {
		if hs.kind == sessProxy {
			hs.connect(req)
			return false
		}
		hs.refuse(gate.Deny(gate.ReasonUnsupported), req.Host, "", "CONNECT through a transparent connection")
		return false
	}
	t, d, detail := hs.parseTarget(req)
	if d.Allow {
		switch hs.kind {
		case sessProxy:
			d = hs.s.decideTarget(t.host, t.path, true)
		default:
			d, t.name = hs.s.decideRequest(hs.ctx, req.Host, t.path, hs.dst.Addr(), hs.want)
		}
	}
	if !d.Allow {
		hs.refuse(d, t.name, t.path, detail)
		return false
	}
	err := hs.upstream(t, &d)
	if err == nil && hs.kind == sessProxy {
		// Rules written for the address dialled bind whatever name the
		// request sent there (the transparent path checks its own).
		if r := hs.s.addrURLRule(hs.upAddr.Addr(), t.path); r != nil {
			hs.refuse(gate.Decision{Reason: gate.ReasonURLBlocked, Rule: r}, t.name, t.path, "")
			return false
		}
	}
	if err != nil {
		if !d.Allow {
			hs.refuse(d, t.name, t.path, err.Error())
			return false
		}
		r := hs.newRecord(t, d)
		r.Detail = "upstream: " + err.Error()
		hs.s.record(r)
		writeHTTPAnswer(hs.cw, http.StatusBadGateway, "", fmt.Sprintf("flowgate: %s: %v\n", t.name, err))
		hs.cw.Flush()
		return false
	}
	hs.s.record(hs.newRecord(t, d))
	return hs.forward(req, t)
}

// parseTarget reads host and canonical path from a request head. A refusal
// comes back as a deny decision with a detail.
func (hs *httpSession) parseTarget(req *http.Request) (target, gate.Decision, string) {
	ok := gate.Decision{Allow: true}
	var t target
	if req.ProtoMajor != 1 {
		return t, gate.Deny(gate.ReasonUnsupported), "HTTP version " + req.Proto
	}
	rawPath, query := req.RequestURI, ""
	if req.URL.IsAbs() {
		if !strings.EqualFold(req.URL.Scheme, "http") {
			return t, gate.Deny(gate.ReasonUnsupported), "absolute-form " + req.URL.Scheme + " request"
		}
		rawPath, query = req.URL.EscapedPath(), req.URL.RawQuery
	} else {
		if hs.kind == sessProxy {
			return t, gate.Deny(gate.ReasonBadRequest), "the proxy takes CONNECT or absolute-form http:// requests"
		}
		rawPath, query, _ = strings.Cut(rawPath, "?")
	}
	path, err := gate.CanonicalPath(rawPath)
	if err != nil {
		return t, gate.Deny(gate.ReasonBadRequest), err.Error()
	}
	t.path, t.query = path, query
	if req.Host == "" {
		if req.ProtoAtLeast(1, 1) || hs.kind == sessProxy {
			return t, gate.Deny(gate.ReasonBadRequest), "HTTP/1.1 request without Host"
		}
		return t, ok, ""
	}
	host, port, err := gate.ParseTarget(req.Host)
	if err != nil {
		t.name = req.Host
		return t, gate.Deny(gate.ReasonBadName), err.Error()
	}
	t.host, t.port, t.name = host, port, host.String()
	t.hostH = hostForHeader(host, port)
	return t, ok, ""
}

// hostForHeader writes a canonical host (and the port the client gave) as a
// Host header value.
func hostForHeader(h gate.Host, port uint16) string {
	s := h.String()
	if h.Addr.Is6() {
		s = "[" + s + "]"
	}
	if port != 0 {
		s += ":" + strconv.Itoa(int(port))
	}
	return s
}

// upstream makes sure the session has an upstream for t: the destination
// for transparent and tunnel sessions, the target's checked address for the
// proxy. A refusal found on the way (an address that may not be dialled)
// is written into d.
func (hs *httpSession) upstream(t target, d *gate.Decision) error {
	if hs.kind != sessProxy {
		if hs.up == nil {
			up, err := hs.s.dial(hs.ctx, hs.dst)
			if err != nil {
				return err
			}
			hs.setUp(up, hs.dst)
		}
		return nil
	}
	port := t.port
	if port == 0 {
		port = 80
	}
	key := t.host.String() + " " + strconv.Itoa(int(port))
	if hs.up != nil && hs.upKey == key {
		return nil
	}
	hs.dropUp()
	addrs, cd := hs.s.candidates(hs.ctx, t.host, port)
	if !cd.Allow {
		*d = cd
		return &gate.DeniedError{Decision: cd, Name: t.name}
	}
	var errs []error
	for _, a := range addrs {
		up, err := hs.s.dial(hs.ctx, a)
		if err == nil {
			hs.setUp(up, a)
			hs.upKey = key
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (hs *httpSession) setUp(up net.Conn, a netip.AddrPort) {
	hs.up, hs.upAddr = up, a
	ut := &timedConn{Conn: up, idle: hs.s.cfg.IdleTimeout}
	hs.upHead = &limitReader{r: ut, n: -1}
	hs.upBr = bufio.NewReader(hs.upHead)
	hs.upW = bufio.NewWriter(ut)
}

func (hs *httpSession) dropUp() {
	if hs.up != nil {
		hs.s.closeUp(hs.up)
		hs.up, hs.upKey = nil, ""
	}
}

// forward writes req upstream as checked, then relays the response. It
// reports whether the connection stays open for another request.
func (hs *httpSession) forward(req *http.Request, t target) bool {
	clientHTTP11 := req.ProtoAtLeast(1, 1)
	cont := expectsContinue(req)
	websocket := prepareRequest(req, t, hs.kind == sessProxy)
	if cont {
		hs.cw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		if hs.cw.Flush() != nil {
			return false
		}
	}
	if err := req.Write(hs.upW); err != nil || hs.upW.Flush() != nil {
		return false
	}
	resp, err := hs.readResponse(req)
	if err != nil {
		hs.s.log.Debug("reading response", "dest", hs.upAddr, "err", err)
		if resp == nil {
			writeHTTPAnswer(hs.cw, http.StatusBadGateway, "", "flowgate: bad response from upstream\n")
			hs.cw.Flush()
		}
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if !websocket {
			return false
		}
		if resp.Write(hs.cw) != nil || hs.cw.Flush() != nil {
			return false
		}
		hs.switchProtocols()
		return false
	}
	if !clientHTTP11 && len(resp.TransferEncoding) > 0 {
		resp.TransferEncoding = nil // an HTTP/1.0 client cannot read chunks:
		resp.ContentLength = -1     // send the body until close instead
		resp.Close = true
	}
	if resp.Write(hs.cw) != nil || hs.cw.Flush() != nil {
		return false
	}
	return !req.Close && !resp.Close
}

// readResponse reads the final response to req, passing interim (1xx)
// responses to the client as they come.
func (hs *httpSession) readResponse(req *http.Request) (*http.Response, error) {
	for {
		hs.upHead.n = MaxResponseHead
		resp, err := http.ReadResponse(hs.upBr, req)
		hs.upHead.n = -1
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, nil
		}
		fmt.Fprintf(hs.cw, "HTTP/1.1 %s\r\n", resp.Status)
		resp.Header.Write(hs.cw)
		hs.cw.WriteString("\r\n")
		if err := hs.cw.Flush(); err != nil {
			return resp, err
		}
	}
}

// switchProtocols hands a WebSocket connection over to splicing, after
// passing on what each side's reader had already buffered.
func (hs *httpSession) switchProtocols() {
	if n := hs.br.Buffered(); n > 0 {
		b, _ := hs.br.Peek(n)
		if _, err := hs.up.Write(b); err != nil {
			return
		}
	}
	if n := hs.upBr.Buffered(); n > 0 {
		b, _ := hs.upBr.Peek(n)
		if _, err := hs.client.Write(b); err != nil {
			return
		}
	}
	hs.client.SetDeadline(time.Time{})
	hs.up.SetDeadline(time.Time{})
	up := hs.up
	hs.up = nil // splice closes it
	hs.s.splice(hs.client, up, false)
}

// prepareRequest turns a parsed request into the one sent upstream: the
// canonical path (and the raw query) in origin form, the canonical Host,
// proxy-only and rerouting headers removed, Expect answered here, upgrades other than
// WebSocket removed. It reports whether a WebSocket upgrade is asked for.
func prepareRequest(req *http.Request, t target, fromProxy bool) bool {
	req.URL = &url.URL{Opaque: t.path, RawQuery: t.query}
	req.RequestURI = ""
	req.Host = t.hostH
	if fromProxy {
		req.Header.Del("Proxy-Connection")
		req.Header.Del("Proxy-Authorization")
	}
	req.Header.Del("Expect")
	for k := range req.Header {
		if isRerouting(k) {
			delete(req.Header, k)
		}
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // net/http would add its own
	}
	websocket := false
	if up := req.Header.Values("Upgrade"); len(up) > 0 {
		websocket = len(up) == 1 && strings.EqualFold(strings.TrimSpace(up[0]), "websocket")
		if !websocket {
			req.Header.Del("Upgrade")
			req.Header.Del("HTTP2-Settings")
		}
	}
	return websocket
}

// isRerouting reports whether a request header is one that some servers
// and frameworks take in place of the request line's path (IIS and
// Symfony's X-Original-URL and X-Rewrite-URL, Envoy's original path) or
// of the Host (reverse proxies that trust forwarding headers): an agent
// could name a blocked path or host in them while the request line and
// Host, which flowgate checks, name allowed ones. Names are compared as a
// CGI or WSGI gateway sees them, '_' and '-' alike ("X_Original_URL" is
// HTTP_X_ORIGINAL_URL too). Every X-Forwarded-*, X-Original-* and
// X-Rewrite-* header goes, and Forwarded, X-Host, X-Envoy-Original-Path,
// X-Script-Name (WSGI middleware moves the path's prefix into SCRIPT_NAME)
// and X-Replaced-Path. The list is best effort: a server may route by any
// header it likes.
func isRerouting(name string) bool {
	n := strings.ToLower(strings.ReplaceAll(name, "_", "-"))
	switch n {
	case "forwarded", "x-host", "x-envoy-original-path", "x-script-name", "x-replaced-path":
		return true
	}
	for _, p := range []string{"x-forwarded-", "x-original-", "x-rewrite-"} {
		if strings.HasPrefix(n, p) {
			return true
		}
	}
	return false
}

// expectsContinue reports whether the client waits for 100 Continue before
// sending its body. flowgate answers it itself and drops Expect upstream, so
// a client never waits on an upstream that would not say it.
func expectsContinue(req *http.Request) bool {
	return req.Body != nil && req.Body != http.NoBody && req.ContentLength != 0 &&
		strings.EqualFold(strings.TrimSpace(req.Header.Get("Expect")), "100-continue")
}

// refuse records a refusal and answers it, then the session ends.
func (hs *httpSession) refuse(d gate.Decision, name, path, detail string) {
	r := gate.NewRecord(gate.ProtoHTTP, hs.dest(), name, d)
	r.Path, r.Detail = path, detail
	hs.s.record(r)
	e := &gate.DeniedError{Decision: d, Name: name}
	if name == "" {
		e.Name = hs.dest()
	}
	hs.client.SetWriteDeadline(time.Now().Add(drainTime))
	writeHTTPRefusal(hs.cw, e, path)
	hs.cw.Flush()
	closeGracefully(hs.client)
}

func (hs *httpSession) dest() string {
	switch {
	case hs.up != nil:
		return hs.upAddr.String()
	case hs.kind != sessProxy:
		return hs.dst.String()
	}
	return ""
}

func (hs *httpSession) newRecord(t target, d gate.Decision) gate.Record {
	r := gate.NewRecord(gate.ProtoHTTP, hs.dest(), t.name, d)
	r.Path = t.path
	return r
}

// closeAll ends the session: the upstream at once, the client gracefully,
// so that a response it has not read yet is not reset away.
func (hs *httpSession) closeAll() {
	hs.dropUp()
	hs.client.SetWriteDeadline(time.Now().Add(drainTime))
	hs.cw.Flush()
	closeGracefully(hs.client)
}
