package sni

import (
	"errors"
	"io"
	"net"
	"time"
)

// timedConn gives every read and write a fresh deadline, so that a peer
// that stalls in the middle of a request or response is cut off after idle.
// It is used on HTTP sessions only; spliced streams keep their bare
// *net.TCPConn and an idle watchdog instead.
type timedConn struct {
	net.Conn
	idle time.Duration
	// readBy, when set, is a fixed deadline for reads: the time budget of
	// a request head.
	readBy time.Time
}

func (c *timedConn) Read(b []byte) (int, error) {
	d := c.readBy
	if d.IsZero() {
		d = time.Now().Add(c.idle)
	}
	c.Conn.SetReadDeadline(d)
	return c.Conn.Read(b)
}

func (c *timedConn) Write(b []byte) (int, error) {
	c.Conn.SetWriteDeadline(time.Now().Add(c.idle))
	return c.Conn.Write(b)
}

// errHeadTooLarge is returned when a request or response head exceeds its
// bound.
var errHeadTooLarge = errors.New("message head too large")

// limitReader bounds the bytes read while a head is parsed: n is the bytes
// left, or negative for no bound (while a body is read).
type limitReader struct {
	r io.Reader
	n int64
}

func (l *limitReader) Read(b []byte) (int, error) {
	if l.n == 0 {
		return 0, errHeadTooLarge
	}
	if l.n > 0 && int64(len(b)) > l.n {
		b = b[:l.n]
	}
	n, err := l.r.Read(b)
	if l.n > 0 {
		l.n -= int64(n)
	}
	return n, err
}
