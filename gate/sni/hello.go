package sni

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"time"
)

// extensionECH is the encrypted_client_hello extension (RFC 9849). With it
// the SNI a client sends is only the outer, public name.
const extensionECH = 0xfe0d

// errHelloRead stops crypto/tls once it has parsed the ClientHello.
var errHelloRead = errors.New("client hello read")

// errReadOnly refuses every write crypto/tls tries while peeking: the
// client must see nothing from flowgate until routing has decided.
var errReadOnly = errors.New("peeking conn is read-only")

// peekConfig runs crypto/tls's server handshake only up to the point where
// it has a parsed ClientHello, which it hands to GetConfigForClient. The
// hello is stored on the read-only conn it was read from.
var peekConfig = &tls.Config{
	GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		if c, ok := h.Conn.(*readOnlyConn); ok {
			c.hello = h
		}
		return nil, errHelloRead
	},
}

// peekHello reads a whole ClientHello through p, however many records and
// TCP segments it spans, and returns what crypto/tls parsed from it. Every
// byte read stays in p for replay; nothing is written to the client. The
// caller bounds the time with a read deadline on the conn under p.
func peekHello(p *peeker) (*tls.ClientHelloInfo, error) {
	p.pos = 0
	rc := &readOnlyConn{r: p}
	err := tls.Server(rc, peekConfig).Handshake()
	if rc.hello != nil {
		return rc.hello, nil
	}
	if err == nil {
		err = errors.New("tls handshake ended without a ClientHello")
	}
	return nil, err
}

// hasECH reports whether the hello carries an encrypted ClientHello.
func hasECH(h *tls.ClientHelloInfo) bool {
	return slices.Contains(h.Extensions, extensionECH)
}

// alertVersion is the record version for an alert answering h: the
// highest version the client offers, at most TLS 1.2's 0x0303 (TLS 1.3
// records carry 0x0303 too); 0x0301 when there is no usable hello.
func alertVersion(h *tls.ClientHelloInfo) uint16 {
	v := uint16(0)
	if h != nil {
		for _, s := range h.SupportedVersions {
			if s&0x0f0f == 0x0a0a { // GREASE (RFC 8701)
				continue
			}
			v = max(v, s)
		}
	}
	switch {
	case v >= tls.VersionTLS12:
		return tls.VersionTLS12
	case v >= 0x0300: // SSL 3.0 to TLS 1.1: answer in the client's own version
		return v
	}
	return tls.VersionTLS10
}

// accessDenied is a fatal access_denied (49) alert record for version v.
func accessDenied(v uint16) []byte {
	return []byte{0x15, byte(v >> 8), byte(v), 0x00, 0x02, 0x02, 49}
}

// readOnlyConn is the net.Conn crypto/tls peeks through: reads come from
// the peeker, writes fail, and closing or deadlines do nothing (the flow
// sets deadlines on the real conn).
type readOnlyConn struct {
	r     io.Reader
	hello *tls.ClientHelloInfo
}

func (c *readOnlyConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c *readOnlyConn) Write(b []byte) (int, error)      { return 0, errReadOnly }
func (c *readOnlyConn) Close() error                     { return nil }
func (c *readOnlyConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *readOnlyConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (c *readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (c *readOnlyConn) SetWriteDeadline(time.Time) error { return nil }
