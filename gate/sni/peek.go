package sni

import (
	"bytes"
	"errors"
	"io"
	"slices"
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

// Classification bounds: leading empty lines an HTTP server may skip, the
// longest method word, the longest first line read to look for a version.
const (
	maxLeadingNewlines = 32
	maxMethodLen       = 24
	maxFirstLine       = 8 << 10
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
// PATCH, WebDAV and its extensions, UPnP, cache purges, and the HTTP/2
// preface. A stream starting with one of them and a space is HTTP, whatever
// follows, so a server that would accept it never sees it unchecked.
var httpMethods = map[string]bool{
	"GET": true, "HEAD": true, "POST": true, "PUT": true, "DELETE": true, "CONNECT": true,
	"OPTIONS": true, "TRACE": true, "PATCH": true, "QUERY": true, "PRI": true,
	"PROPFIND": true, "PROPPATCH": true, "MKCOL": true, "COPY": true, "MOVE": true,
	"LOCK": true, "UNLOCK": true, "SEARCH": true, "REPORT": true, "MKACTIVITY": true,
	"CHECKOUT": true, "MERGE": true, "MKCALENDAR": true, "ACL": true, "BIND": true,
	"M-SEARCH": true, "NOTIFY": true, "SUBSCRIBE": true, "UNSUBSCRIBE": true,
	"PURGE": true, "LINK": true, "UNLINK": true,
}

// classifyBytes decides from the bytes read so far, or reports that it
// needs more. TLS starts with a handshake record (0x16). HTTP is an
// upper-case method word and a space, after at most a few empty lines
// (which servers skip): a known method is HTTP at once; another word is HTTP
// only if its first line ends in an HTTP version, so that line protocols
// such as SMTP ("EHLO host") stay plain TCP.
func classifyBytes(b []byte) (streamKind, bool) {
	if len(b) == 0 {
		return kindOther, false
	}
	if b[0] == 0x16 {
		return kindTLS, true
	}
	i := 0
	for i < len(b) && (b[i] == '\r' || b[i] == '\n') {
		i++
	}
	if i > maxLeadingNewlines {
		return kindHTTP, true // parsed and checked as a request, never passed on unread
	}
	if i == len(b) {
		return kindOther, false
	}
	j := i
	for j < len(b) && j-i <= maxMethodLen && isMethodByte(b[j]) {
		j++
	}
	switch {
	case j == i || j-i > maxMethodLen:
		return kindOther, true
	case j == len(b):
		return kindOther, false
	case b[j] != ' ':
		return kindOther, true
	case httpMethods[string(b[i:j])]:
		return kindHTTP, true
	}
	eol := bytes.IndexByte(b[j:], '\n')
	if eol < 0 {
		if len(b)-j > maxFirstLine {
			return kindOther, true
		}
		return kindOther, false
	}
	return kindOf(hasHTTPVersion(bytes.TrimSuffix(b[j:j+eol], []byte("\r")))), true
}

func kindOf(http bool) streamKind {
	if http {
		return kindHTTP
	}
	return kindOther
}

func isMethodByte(c byte) bool { return c >= 'A' && c <= 'Z' || c == '-' || c == '_' }

// hasHTTPVersion reports whether a request line's tail ends in
// " HTTP/<digit>.<digit>".
func hasHTTPVersion(line []byte) bool {
	const n = len(" HTTP/1.1")
	if len(line) < n {
		return false
	}
	t := line[len(line)-n:]
	return bytes.HasPrefix(t, []byte(" HTTP/")) && isDigit(t[6]) && t[7] == '.' && isDigit(t[8])
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// trimLeadingNewlines drops the empty lines a client may send before its
// first request; net/http's parser does not skip them.
func trimLeadingNewlines(b []byte) []byte {
	return bytes.TrimLeft(b, "\r\n")
}
