package sni

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The classifier against real lenient servers: whatever first line they
// read as a request must be classified HTTP (and so be checked, or
// refused), never passed on by address.

// TestClassifyWhatPythonServes: every first line Python's http.server
// (the base of wsgiref and Django's runserver) reads as a request is
// classified HTTP. Python splits the request line on any whitespace, in
// Latin-1, so the lines combine leading bytes, separators, methods and
// versions; one python3 process parses them all.
func TestClassifyWhatPythonServes(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed (.ci/deps installs it): %v", err)
	}
	var lines []string
	// Strings of code points below 256, one byte each on the wire.
	for _, lead := range []string{"", "\t", " ", "\x0c", "\x1f", "\r\n", "\u00a0"} {
		for _, sep := range []string{" ", "\t", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\u0085", "\u00a0", "\r", "  "} {
			for _, method := range []string{"GET", "POST", "FOO"} {
				for _, version := range []string{"", sep + "HTTP/1.1", sep + "HTTP/1.0" + sep} {
					lines = append(lines, lead+method+sep+"/papers/x"+version+"\n")
				}
			}
		}
	}
	const prog = `
import http.server, io, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def send_error(self, *a, **k): pass
out = []
for line in json.load(sys.stdin):
    h = H.__new__(H)
    h.rfile = io.BytesIO(line.encode("latin-1") + b"Host: example.org\r\n\r\n"); h.wfile = io.BytesIO()
    h.client_address = ("x", 0); h.request_version = "HTTP/0.9"
    h.raw_requestline = h.rfile.readline(65537)
    out.append(bool(h.parse_request()) and h.path == "/papers/x")
json.dump(out, sys.stdout)
`
	in, _ := json.Marshal(lines)
	cmd := exec.Command(py, "-c", prog)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3: %v\n%s", err, &stderr)
	}
	var served []bool
	if err := json.Unmarshal(raw, &served); err != nil || len(served) != len(lines) {
		t.Fatalf("python3 answered %q (%v)", raw, err)
	}
	n := 0
	for i, line := range lines {
		if !served[i] {
			continue
		}
		n++
		var b []byte // Latin-1: one byte a character
		for _, r := range line {
			b = append(b, byte(r))
		}
		if kind, done := classifyBytes(b); !done || kind != kindHTTP {
			t.Errorf("classifyBytes(%q) = %v %v; Python's http.server serves it", b, kind, done)
		}
	}
	if n < 100 {
		t.Fatalf("python served only %d of %d lines: the test lost its cases", n, len(lines))
	}
}

// TestClassifyWhatNodeServes: every first line Node's http server (llhttp)
// serves as a request, with its Host header, is classified HTTP. llhttp
// takes RTSP and ICE versions for their methods, and the HTTP/0.9 form of
// any method it knows.
func TestClassifyWhatNodeServes(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is needed (.ci/deps installs nodejs): %v", err)
	}
	const prog = `
const http = require('http');
const s = http.createServer((req, res) => res.end('SERVED ' + req.method + ' host=' + req.headers.host + '\\n'));
s.listen(0, '127.0.0.1', () => console.log('127.0.0.1:' + s.address().port));
`
	cmd := exec.Command(node, "-e", prog)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("node did not start: %v", err)
	}
	addr = strings.TrimSpace(addr)
	methods := []string{"GET", "SOURCE", "DESCRIBE", "ANNOUNCE", "SETUP", "PLAY", "PAUSE", "TEARDOWN", "GET_PARAMETER",
		"SET_PARAMETER", "REDIRECT", "RECORD", "FLUSH", "REBIND", "UNBIND", "MKCALENDAR", "QUERY", "FOO"}
	served := 0
	for _, m := range methods {
		for _, version := range []string{" HTTP/1.1", " RTSP/1.0", " ICE/1.0", " X/1.1", ""} {
			line := m + " /x" + version + "\r\n"
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, line+"Host: example.net\r\nConnection: close\r\n\r\n")
			b, _ := io.ReadAll(c)
			c.Close()
			if !strings.Contains(string(b), "SERVED") || !strings.Contains(string(b), "host=example.net") {
				continue
			}
			served++
			if kind, done := classifyBytes([]byte(line)); !done || kind != kindHTTP {
				t.Errorf("classifyBytes(%q) = %v %v; Node's http server serves it", line, kind, done)
			}
		}
	}
	if served < 20 {
		t.Fatalf("node served only %d lines: the test lost its cases", served)
	}
}
