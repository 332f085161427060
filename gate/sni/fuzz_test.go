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
		{"get / HTTP/1.1\r\n", kindOther, true},
		{"EHLO mail.example\r\n", kindOther, true},
		{"EHLO mail", kindOther, false},
		{"FOO /x HTTP/1.1\r\n", kindHTTP, true},
		{"FOO /x HTTP/1.1\n", kindHTTP, true},
		{"SSH-2.0-OpenSSH_9.2\r\n", kindOther, true},
		{"*2\r\n$3\r\nGET\r\n", kindOther, true},
		{"\x00\x00\x00\x08\x04\xd2\x16\x2f", kindOther, true},
		{strings.Repeat("\r\n", 40), kindHTTP, true},
		{"PRI * HTTP/2.0\r\n", kindHTTP, true},
		{"ABCDEFGHIJKLMNOPQRSTUVWXYZ ", kindOther, true},
	} {
		kind, done := classifyBytes([]byte(tc.in))
		if kind != tc.kind || done != tc.done {
			t.Errorf("classifyBytes(%q) = %v %v, want %v %v", tc.in, kind, done, tc.kind, tc.done)
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
