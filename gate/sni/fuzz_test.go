package sni

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"flowgate/gate"
)

// fuzzServer is a Server used only for its decisions.
var fuzzServer = sync.OnceValue(func() *Server {
	pol, err := gate.Compile(spec(gate.Denylist, []string{"blocked.example.net"}, "http://example.org/papers"))
	if err != nil {
		panic(err)
	}
	f := &loopFixture{names: gate.NewNames(nil), resolves: map[string]int{}}
	f.names.Learn("example.org", []netip.Addr{addrOrg}, time.Hour, true)
	s, err := New(Config{Policy: pol, Names: f.names, Resolve: f.resolve, Dial: f.dial})
	if err != nil {
		panic(err)
	}
	return s
})

// chunkedReader hands out its input in pieces whose sizes come from the
// input itself, so fuzzing also varies how a hello is split.
type chunkedReader struct {
	b     []byte
	sizes []byte
}

func (c *chunkedReader) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := len(c.b)
	if len(c.sizes) > 0 {
		n = int(c.sizes[0]) + 1
		c.sizes = c.sizes[1:]
	}
	n = min(n, len(p), len(c.b))
	copy(p, c.b[:n])
	c.b = c.b[n:]
	return n, nil
}

// FuzzPeekClientHello feeds raw bytes to classification and the ClientHello
// peek: they never panic, never keep more than MaxPeek, and keep for replay
// exactly the bytes they consumed, a prefix of the input.
func FuzzPeekClientHello(f *testing.F) {
	f.Add([]byte("\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00"), []byte{3, 1})
	f.Fuzz(func(t *testing.T, in, sizes []byte) {
		src := &countingReader{r: &chunkedReader{b: in, sizes: sizes}}
		p := &peeker{r: src}
		kind, err := classify(p)
		if err == nil && kind == kindTLS {
			if h, err := peekHello(p); err == nil {
				fuzzServer().decideTLS(context.Background(), h, addrOrg, "")
				alertVersion(h)
			}
		}
		kept := p.Bytes()
		if len(kept) > MaxPeek {
			t.Fatalf("kept %d bytes, more than MaxPeek", len(kept))
		}
		if src.n != len(kept) || !bytes.Equal(kept, in[:len(kept)]) {
			t.Fatalf("consumed %d bytes, kept %d: replay would differ from what the client sent", src.n, len(kept))
		}
	})
}

// FuzzReadRequest parses request heads the way the HTTP path does. Whatever
// is allowed is written upstream with exactly the path and host that were
// checked: re-reading the forwarded request gives them back.
func FuzzReadRequest(f *testing.F) {
	f.Add([]byte("GET /a/../b HTTP/1.1\r\nHost: example.org\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, kind := range []sessionKind{sessTransparent, sessTunnel, sessProxy} {
			req, err := http.ReadRequest(bufio.NewReader(&limitReader{r: bytes.NewReader(in), n: MaxRequestHead}))
			if err != nil {
				return
			}
			hs := &httpSession{s: fuzzServer(), ctx: context.Background(), kind: kind, dst: netip.AddrPortFrom(addrOrg, 80)}
			tg, d, _ := hs.parseTarget(req)
			if !d.Allow {
				continue
			}
			if kind == sessProxy {
				hs.s.decideTarget(tg.host, tg.path, true)
			} else {
				hs.s.decideRequest(context.Background(), req.Host, tg.path, addrOrg, "")
			}
			if c, err := gate.CanonicalPath(tg.path); err != nil || c != tg.path {
				t.Fatalf("checked path %q is not canonical (%q, %v)", tg.path, c, err)
			}
			prepareRequest(req, tg, kind == sessProxy)
			var out bytes.Buffer
			if err := req.Write(&out); err != nil {
				continue
			}
			again, err := http.ReadRequest(bufio.NewReader(&out))
			if err != nil {
				t.Fatalf("forwarded request does not parse: %v\n%q", err, out.String())
			}
			path, query, _ := strings.Cut(again.RequestURI, "?")
			if path != tg.path || query != tg.query {
				t.Fatalf("forwarded %q, checked path %q query %q", again.RequestURI, tg.path, tg.query)
			}
			if again.Host != tg.hostH {
				t.Fatalf("forwarded Host %q, checked %q", again.Host, tg.hostH)
			}
		}
	})
}

func TestClassifyBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		kind streamKind
		done bool
	}{
		{"", kindOther, false},
		{"\x16", kindTLS, true},
		{"G", kindOther, false},
		{"GET", kindOther, false},
		{"GET ", kindHTTP, true},
		{"\r\n\r\nPOST /", kindHTTP, true},
		{"get / HTTP/1.1\r\n", kindHTTP, true},
		{"get key\r\n", kindOther, true},
		{"EHLO mail.example\r\n", kindOther, true},
		{"EHLO mail", kindOther, false},
		{"FOO /x HTTP/1.1\r\n", kindHTTP, true},
		{"FOO /x HTTP/1.1\n", kindHTTP, true},
		{"FOO /x http/1.0 \r\n", kindHTTP, true},
		{"FOO /x HTTPS/1.1\r\n", kindOther, true},
		{"FOO / X/1.1\r\n", kindOther, true},
		{"get user/1\r\n", kindOther, true}, // memcached, a key with a slash
		{"delete session/42\r\n", kindOther, true},
		{":GET /admin HTTP/1.1\r\n", kindHTTP, true}, // Jetty reads it as GET
		{"\r\n:\r\n::::::::::GET /admin HTTP/1.1\r\n", kindHTTP, true},
		{strings.Repeat(":", 40), kindHTTP, true},
		{"(GET /admin HTTP/1.1\r\n", kindHTTP, true},
		{"\x05\x01\x00", kindOther, true}, // SOCKS5: a short binary first message is not held
		{"<?xml version=\"1.0\"?>\n", kindOther, true},
		{"SOURCE / ICE/1.0\r\n", kindHTTP, true},
		{"DESCRIBE / RTSP/1.0\r\n", kindHTTP, true},
		{"FOO /x HTTP/\r\n", kindOther, true},
		{"G!ET /x HTTP/1.1\r\n", kindHTTP, true},
		{"GET\t/x\tHTTP/1.1\r\n", kindHTTP, true},
		{"GET\r/x HTTP/1.1\r\n", kindHTTP, true},
		{"GET\r", kindOther, false},
		{"PING\r\n", kindOther, true},
		{"SSH-2.0-OpenSSH_9.2\r\n", kindOther, true},
		{"*2\r\n$3\r\nGET\r\n", kindOther, true},
		{"\x00\x00\x00\x08\x04\xd2\x16\x2f", kindOther, true},
		{strings.Repeat("\r\n", 40), kindHTTP, true},
		{"PRI * HTTP/2.0\r\n", kindHTTP, true},
		{"ABCDEFGHIJKLMNOPQRSTUVWXYZ ", kindOther, false},
		{strings.Repeat("A", 40) + " /x HTTP/1.1\r\n", kindHTTP, true},
		{"FOO /" + strings.Repeat("a", maxFirstLine), kindHTTP, true},
		{strings.Repeat("a", maxFirstLine+1), kindHTTP, true},
		{"0032git-upload-pack /project.git\x00host=example.org\x00", kindOther, true},
		{"x", kindOther, false},
		{"\x15\x03\x01\x00\x02\x01\x64\x16\x03\x01", kindTLS, true}, // an alert, then the hello
		{"\x14\x03\x03\x00\x01\x01", kindTLS, true},
		{"\x17\x03", kindOther, true},                 // application data first: no server skips it
		{"\x15\x03\x01\x12\x34\x00", kindOther, true}, // not an alert: a little-endian length (MongoDB)
		{"\x14\x03\x03\x00\x01\x05", kindOther, true},
		{"\tGET /x HTTP/1.1\r\n", kindHTTP, true}, // Python's http.server splits leading whitespace away
		{"\x1fGET /x HTTP/1.1\r\n", kindHTTP, true},
		{"GET\x1c/x\x1cHTTP/1.1\n", kindHTTP, true},
		{"GET\x85/x\xa0HTTP/1.1\n", kindHTTP, true},
		{"FOO\x1e/x\x1eHTTP/1.1\n", kindHTTP, true},
		{"GET\t/x\n", kindHTTP, true}, // HTTP/0.9
		{"\x15", kindOther, false},
		{"\x15\x00\x00", kindOther, false},
		{"\x15\x20\x00", kindOther, true},
		{"\x15\x00\x00\x00\x02\x01\x5a", kindTLS, true}, // Go takes any record version below 0x1000 before a hello
		{"\x80\x2e\x01\x03\x01", kindTLS, true},         // SSL 2 client hello
		{"\x80\x2e", kindOther, false},
		{"\x80\x2e\x05\x00", kindOther, true},
	} {
		kind, done := classifyBytes([]byte(tc.in))
		if kind != tc.kind || done != tc.done {
			t.Errorf("classifyBytes(%q) = %v %v, want %v %v", tc.in, kind, done, tc.kind, tc.done)
		}
	}
}

// FuzzClassifyGoRequests: whatever first line Go's net/http server reads as
// a request is classified HTTP, so it is checked before any server sees it.
func FuzzClassifyGoRequests(f *testing.F) {
	for _, seed := range []string{"GET / HTTP/1.1", "get /x HTTP/1.1", "G.ET /x HTTP/1.0", "FOO\t/x\tHTTP/1.1", "EHLO mail"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if bytes.ContainsAny(line, "\n") {
			return
		}
		req := string(line) + "\r\nHost: example.org\r\n\r\n"
		if _, err := http.ReadRequest(bufio.NewReader(strings.NewReader(req))); err != nil {
			return
		}
		if kind, err := classify(&peeker{r: strings.NewReader(req)}); err != nil || kind != kindHTTP {
			t.Fatalf("classify(%q) = %v %v; Go's server reads it as a request", line, kind, err)
		}
	})
}

// TestClassifyWhatGoServes: every first line Go's net/http server reads as
// a request is classified HTTP (and so checked); otherwise it would be
// spliced unchecked to a server that serves it.
func TestClassifyWhatGoServes(t *testing.T) {
	for _, line := range []string{
		"get /private/x HTTP/1.1",
		"Get /private/x HTTP/1.1",
		"GET1 /private/x HTTP/1.1",
		"G.ET /private/x HTTP/1.1",
		"G!ET /private/x HTTP/1.1",
		strings.Repeat("A", 30) + " /private/x HTTP/1.1",
		"FOO /private/" + strings.Repeat("a", 20000) + " HTTP/1.1",
	} {
		req := line + "\r\nHost: example.org\r\n\r\n"
		if _, err := http.ReadRequest(bufio.NewReader(strings.NewReader(req))); err != nil {
			t.Fatalf("%.40q: Go does not read it: %v", line, err)
		}
		kind, err := classify(&peeker{r: strings.NewReader(req)})
		if err != nil || kind != kindHTTP {
			t.Errorf("classify(%.40q) = %v %v, want http: Go's server would serve it", line, kind, err)
		}
	}
}

func TestHTTP2PriorKnowledgeRefused(t *testing.T) {
	f := newLoopFixture(t, denyPaper, nil)
	dst := ap(addrOrg, portHTTP)
	resp := f.rawHTTP(t, dst, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	if !strings.HasPrefix(resp, "HTTP/1.1 501 ") {
		t.Fatalf("h2 prior knowledge: %q", resp)
	}
	f.expectRecord(t, gate.ProtoHTTP, dst, gate.ReasonUnsupported)
}
