package sni

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"flowgate/gate"
)

// Refusals are answered here and only here: an HTTP client gets a status
// line, an X-Flowgate-Reason header and a one-line body naming what was
// refused, why and by which rule; a TLS client gets a fatal access_denied
// alert; anything else is closed. Then the connection is closed.

// ReasonHeader carries the reason code of a refusal in HTTP answers.
const ReasonHeader = "X-Flowgate-Reason"

// drainTime bounds how long a refused connection is read and discarded
// after the answer, so that closing it does not reset the answer away.
const drainTime = time.Second

// httpStatus is the status a refusal with reason r is answered with. Policy
// refusals are 403 Forbidden (Python's urllib then reports "Tunnel
// connection failed: 403 Forbidden"); requests flowgate cannot read are 400.
func httpStatus(r gate.Reason) int {
	switch r {
	case gate.ReasonBadRequest, gate.ReasonBadName:
		return http.StatusBadRequest
	case gate.ReasonTimeout:
		return http.StatusRequestTimeout
	case gate.ReasonLimit:
		return http.StatusServiceUnavailable
	case gate.ReasonResolveFailed:
		return http.StatusBadGateway
	case gate.ReasonUnsupported:
		return http.StatusNotImplemented
	}
	return http.StatusForbidden
}

// refusalText is the body of an HTTP refusal: "flowgate: <host><path>
// denied (<reason>) by <rule>".
func refusalText(e *gate.DeniedError, path string) string {
	return fmt.Sprintf("flowgate: %s%s denied (%s) by %s\n", e.Name, path, e.Decision.Reason, e.Decision.RuleText())
}

// writeHTTPRefusal answers a refused HTTP request or CONNECT.
func writeHTTPRefusal(w io.Writer, e *gate.DeniedError, path string) error {
	return writeHTTPAnswer(w, httpStatus(e.Decision.Reason), string(e.Decision.Reason), refusalText(e, path))
}

// writeHTTPAnswer writes a complete, closing HTTP/1.1 response with a text
// body, and the reason header when reason is not empty (it is empty for an
// upstream that could not be reached, which is no refusal).
func writeHTTPAnswer(w io.Writer, status int, reason, body string) error {
	hdr := ""
	if reason != "" {
		hdr = ReasonHeader + ": " + reason + "\r\n"
	}
	_, err := fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), hdr, len(body), body)
	return err
}

// refuseTLS answers a refused ClientHello with an access_denied alert in
// the client's record version, then closes.
func refuseTLS(c net.Conn, version uint16) {
	c.SetWriteDeadline(time.Now().Add(drainTime))
	c.Write(accessDenied(version))
	closeGracefully(c)
}

// closeGracefully half-closes c, reads and discards what the client still
// sends for a moment, and closes it: closing a socket with unread input
// sends a reset, which can destroy the answer before the client reads it.
func closeGracefully(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.SetReadDeadline(time.Now().Add(drainTime))
	io.CopyN(io.Discard, c, MaxPeek)
	c.Close()
}

// resetClose closes c with a reset, the way a refused or failed connection
// to a real server looks.
func resetClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}
