package sni

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
)

// errPeekTooLong is returned when a client sends more than MaxPeek bytes
// without completing what routing needs (a ClientHello, a first line).
var errPeekTooLong = errors.New("client sent too much before it could be routed")

// peeker reads a stream and keeps every byte it has read, so that routing
// can look at the start of a stream and then hand all of it on unchanged.
// Read replays the kept bytes from the replay position, then reads on and
// keeps what it reads. peeker never reads more than MaxPeek bytes.
type peeker struct {
	r   io.Reader
	buf []byte // every byte read from r so far
	pos int    // replay position for Read
}

// Read implements io.Reader over the kept bytes, then r.
func (p *peeker) Read(b []byte) (int, error) {
	if p.pos == len(p.buf) {
		if _, err := p.fill(len(b)); err != nil {
			return 0, err
		}
	}
	n := copy(b, p.buf[p.pos:])
	p.pos += n
	return n, nil
}

// more reads once from r and keeps what arrived.
func (p *peeker) more() error {
	_, err := p.fill(4096)
	return err
}

// fill reads once from r, at most want bytes (and no more than the MaxPeek
// budget), straight into the kept bytes, and returns how many arrived. A
// read that returns data and EOF together reports the data now and the EOF
// on the next call.
func (p *peeker) fill(want int) (int, error) {
	room := min(MaxPeek-len(p.buf), max(want, 1))
	if room <= 0 {
		return 0, errPeekTooLong
	}
	p.buf = slices.Grow(p.buf, room)
	n, err := p.r.Read(p.buf[len(p.buf) : len(p.buf)+room])
	p.buf = p.buf[:len(p.buf)+n]
	if n > 0 {
		err = nil
	} else if err == nil {
		err = io.ErrNoProgress
	}
	return n, err
}

// Bytes returns every byte read so far, the bytes to replay upstream.
func (p *peeker) Bytes() []byte { return p.buf }

// streamKind is what the first bytes of a stream look like.
type streamKind uint8

const (
	kindOther streamKind = iota // decided by the destination address
	kindTLS                     // a TLS handshake record: decided by the ClientHello
	kindHTTP                    // an HTTP/1.x request: decided by Host and path
)

func (k streamKind) String() string {
	switch k {
	case kindTLS:
		return "tls"
	case kindHTTP:
		return "http"
	}
	return "tcp"
}

// Classification bounds: leading whitespace an HTTP server may skip, the
// longest first line read to look for an HTTP version (a stream whose
// first word runs longer, or whose first line does, is parsed as HTTP: it
// is never passed on unread).
const (
	maxLeadingSpace = 32
	maxFirstLine    = 8 << 10
)

// classify reads until the stream's kind is known (reading as little as
// possible) and returns it. It reads through p, so every byte stays
// available for replay.
func classify(p *peeker) (streamKind, error) {
	for {
		if k, ok := classifyBytes(p.buf); ok {
			return k, nil
		}
		if err := p.more(); err != nil {
			return kindOther, err
		}
	}
}

// httpMethods are the request methods in use over HTTP/1.x: RFC 9110,
// PATCH, WebDAV and its extensions, UPnP, cache purges, the HTTP/2 preface,
// and the rest of what llhttp (Node's parser) takes: RTSP's and ICE's
// (Node serves "DESCRIBE / RTSP/1.0" with a Host as a request). A stream
// starting with one of them and whitespace is HTTP, whatever follows, so a
// server that would accept it never sees it unchecked; one that is not
// HTTP/1.x (RTSP, SIP) is then refused, since its requests cannot be read.
var httpMethods = map[string]bool{
	"GET": true, "HEAD": true, "POST": true, "PUT": true, "DELETE": true, "CONNECT": true,
	"OPTIONS": true, "TRACE": true, "PATCH": true, "QUERY": true, "PRI": true,
	"PROPFIND": true, "PROPPATCH": true, "MKCOL": true, "COPY": true, "MOVE": true,
	"LOCK": true, "UNLOCK": true, "SEARCH": true, "REPORT": true, "MKACTIVITY": true,
	"CHECKOUT": true, "MERGE": true, "MKCALENDAR": true, "ACL": true, "BIND": true,
	"REBIND": true, "UNBIND": true, "M-SEARCH": true, "NOTIFY": true, "SUBSCRIBE": true,
	"UNSUBSCRIBE": true, "PURGE": true, "LINK": true, "UNLINK": true, "SOURCE": true,
	"DESCRIBE": true, "ANNOUNCE": true, "SETUP": true, "PLAY": true, "PAUSE": true,
	"TEARDOWN": true, "GET_PARAMETER": true, "SET_PARAMETER": true, "REDIRECT": true,
	"RECORD": true, "FLUSH": true,
}

// classifyBytes decides from the bytes read so far, or reports that it
// needs more. TLS is a stream that starts with a TLS handshake record
// (0x16); with a warning alert or a change_cipher_spec record first, which
// a server may skip before the ClientHello (Go's skips the alert); or with
// an SSL 2 ClientHello, which servers no longer take and crypto/tls
// refuses. So the hello is judged, or the stream refused, never passed on
// by address.
//
// HTTP is a request line as a lenient server reads it: after leading
// whitespace (empty lines, which servers skip; any whitespace, which
// Python's http.server splits away), a method and whitespace. A method is
// any token (RFC 9110: Go's server accepts "get", "G.ET" or forty
// letters); whitespace is any a lenient server splits a request line on
// (space, tab, vertical tab, form feed, a bare CR, and what Python's
// str.split takes for it in Latin-1: 0x1c to 0x1f, 0x85, 0xa0). A known
// method and whitespace is HTTP at once (HTTP/0.9 is "GET /path"); any
// other token and whitespace is HTTP if its first line ends in an HTTP
// version, so that line protocols such as SMTP ("EHLO host") and memcached
// ("get key") stay plain TCP, or if the line runs past maxFirstLine
// without ending. A line holding other control bytes is no request.
func classifyBytes(b []byte) (streamKind, bool) {
	if len(b) == 0 {
		return kindOther, false
	}
	if k, ok, isTLS := classifyTLS(b); isTLS {
		return k, ok
	}
	i := 0
	// Whitespace and printable bytes that are not a token, in any mix, are
	// stepped over before the method: servers skip empty lines, Python
	// splits leading whitespace away, and Jetty skips CR, LF and ':' without
	// bound ("\r\n:\r\nGET"); other punctuation is stepped over too,
	// which only makes flowgate stricter. Past maxLeadingSpace such bytes
	// the stream is parsed as HTTP, never passed on unread. Control bytes
	// are not stepped over: a binary protocol's short first message
	// (SOCKS5's 05 01 00) must not wait for more.
	for i < len(b) && (b[i] == '\r' || b[i] == '\n' || isLineSpace(b[i]) || b[i] > ' ' && b[i] < 0x7f && !isTokenByte(b[i])) {
		i++
	}
	if i > maxLeadingSpace {
		return kindHTTP, true
	}
	if i == len(b) {
		return kindOther, false
	}
	j := i
	for j < len(b) && isTokenByte(b[j]) {
		j++
	}
	switch {
	case j == i:
		return kindOther, true
	case j == len(b) || b[j] == '\r' && j+1 == len(b):
		if len(b)-i > maxFirstLine {
			return kindHTTP, true
		}
		return kindOther, false
	case !isLineSpace(b[j]) && !(b[j] == '\r' && b[j+1] != '\n'):
		return kindOther, true // "PING\r\n", "SSH-2.0-x\r\n", binary
	case httpMethods[string(b[i:j])]:
		return kindHTTP, true
	}
	line := b[j:]
	eol := bytes.IndexByte(line, '\n')
	if eol >= 0 {
		line = line[:eol]
	}
	if hasControl(line) {
		return kindOther, true // no HTTP server takes a request line with NUL and the like (git://)
	}
	if eol < 0 {
		if len(b)-i > maxFirstLine {
			return kindHTTP, true
		}
		return kindOther, false
	}
	return kindOf(endsInHTTPVersion(line)), true
}

// classifyTLS reports whether b starts like TLS (isTLS), and if so the
// kind and whether that is decided; a prefix too short to tell asks for
// more. Records before the hello must look like what a server skips (an
// alert of 2 bytes whose record version is below 0x1000, as Go's server
// checks before a hello; a change_cipher_spec of 1), so that a binary protocol
// whose little-endian length happens to start with 0x14 or 0x15 and 0x03
// (a MongoDB message of 788 to 792 bytes) is not taken for TLS.
func classifyTLS(b []byte) (kind streamKind, done, isTLS bool) {
	need := func(n int) bool { return len(b) >= n }
	switch c := b[0]; {
	case c == 0x16:
		return kindTLS, true, true
	case c == 0x15: // alert: 0x15, a version below 0x1000 (all Go checks), a length of 2
		if !need(5) {
			return kindOther, false, len(b) < 2 || b[1] < 0x10
		}
		return kindTLS, true, b[1] < 0x10 && b[3] == 0 && b[4] == 2
	case c == 0x14: // change_cipher_spec: 0x14 0x03 x 0x00 0x01 0x01
		if !need(6) {
			return kindOther, false, len(b) < 2 || b[1] == 0x03
		}
		return kindTLS, true, b[1] == 0x03 && b[3] == 0 && b[4] == 1 && b[5] == 1
	case c&0x80 != 0:
		// SSL 2 record header (2 bytes), message type 1 (client hello),
		// version 0.2 or 3.x.
		if !need(4) {
			return kindOther, false, true
		}
		return kindTLS, true, b[2] == 0x01 && (b[3] == 0x00 || b[3] == 0x03)
	}
	return kindOther, false, false
}

// hasControl reports whether a request line holds a control byte other than
// the whitespace lenient servers split on.
func hasControl(line []byte) bool {
	for _, c := range line {
		if (c < 0x20 && !isLineSpace(c) && c != '\r') || c == 0x7f {
			return true
		}
	}
	return false
}

func kindOf(http bool) streamKind {
	if http {
		return kindHTTP
	}
	return kindOther
}

// isTokenByte reports whether c may be part of an RFC 9110 token (tchar).
func isTokenByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// isLineSpace reports whether c separates the words of a request line for a
// lenient server, a bare CR aside: RFC 9112 section 3's whitespace, and
// what Python's str.split takes for whitespace in Latin-1.
func isLineSpace(c byte) bool {
	switch c {
	case ' ', '\t', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x1f, 0x85, 0xa0:
		return true
	}
	return false
}

// versionProtos are the protocols whose versions HTTP servers take on an
// HTTP port (llhttp takes RTSP and ICE): other words with a slash and
// digits ("get user/1", a memcached key) end no request line.
var versionProtos = map[string]bool{"HTTP": true, "RTSP": true, "ICE": true}

// endsInHTTPVersion reports whether the last word of a request line (split
// on any whitespace) is a protocol version: one of versionProtos in any
// case, a slash, digits and dots ("HTTP/1.1", "http/2", "RTSP/1.0").
func endsInHTTPVersion(line []byte) bool {
	for len(line) > 0 && (isLineSpace(line[len(line)-1]) || line[len(line)-1] == '\r') {
		line = line[:len(line)-1]
	}
	k := len(line)
	for k > 0 && !isLineSpace(line[k-1]) && line[k-1] != '\r' {
		k--
	}
	if k == 0 {
		return false // one word: no version after the method
	}
	proto, version, ok := bytes.Cut(line[k:], []byte("/"))
	if !ok || len(version) == 0 || !isDigit(version[0]) || !versionProtos[strings.ToUpper(string(proto))] {
		return false
	}
	for _, c := range version {
		if !isDigit(c) && c != '.' {
			return false
		}
	}
	return true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// trimLeadingNewlines drops the empty lines a client may send before its
// first request; net/http's parser does not skip them.
func trimLeadingNewlines(b []byte) []byte {
	return bytes.TrimLeft(b, "\r\n")
}
