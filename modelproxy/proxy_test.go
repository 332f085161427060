package modelproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

func TestKeySwapAndRefusal(t *testing.T) {
	var gotAuth, gotXKey, gotPath string
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth, gotXKey, gotPath = r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"), r.URL.Path
		io.WriteString(w, "upstream ok")
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	agentKey, err := NewAgentKey()
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	p, err := New(Config{Upstream: u, RealKey: "sk-real-secret", AgentKey: agentKey,
		Dial: (&net.Dialer{}).DialContext, TLS: &tls.Config{RootCAs: poolOf(up)}, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(l)
	defer p.Close()
	base := "http://" + l.Addr().String()

	call := func(header, value string) (int, string) {
		req, _ := http.NewRequestWithContext(context.Background(), "POST", base+"/v1/messages", strings.NewReader("{}"))
		if header != "" {
			req.Header.Set(header, value)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := call("Authorization", "Bearer "+agentKey); code != 200 || body != "upstream ok" {
		t.Fatalf("bearer call: %d %q", code, body)
	}
	if gotAuth != "Bearer sk-real-secret" || gotPath != "/v1/messages" {
		t.Fatalf("upstream saw Authorization %q path %q; want the real key", gotAuth, gotPath)
	}
	if code, _ := call("x-api-key", agentKey); code != 200 || gotXKey != "sk-real-secret" {
		t.Fatalf("x-api-key call: %d, upstream saw %q", code, gotXKey)
	}
	for _, c := range []struct{ h, v string }{{"", ""}, {"Authorization", "Bearer wrong-key-0123456789"}, {"x-api-key", "sk-real-secret"}} {
		if code, _ := call(c.h, c.v); code != http.StatusUnauthorized {
			t.Errorf("call with %s %q: status %d, want 401", c.h, c.v, code)
		}
	}
	// TRACE (an echoing upstream would hand back the real key) and
	// CONNECT never go upstream, whatever the key.
	gotAuth = ""
	for _, m := range []string{"TRACE", "CONNECT", "track"} {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "%s /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", m, agentKey)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s: %v %v, want 405", m, resp, err)
		}
	}
	if gotAuth != "" {
		t.Errorf("a refused method reached the upstream (Authorization %q)", gotAuth)
	}
	if strings.Contains(log.String(), "sk-real") || strings.Contains(log.String(), agentKey) {
		t.Fatalf("model-call log holds a key: %s", log.String())
	}
	if n := strings.Count(log.String(), "\n"); n != 8 {
		t.Fatalf("model-call log has %d lines, want 8:\n%s", n, log.String())
	}
}

func poolOf(s *httptest.Server) *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(s.Certificate())
	return pool
}

func TestNewRefusesBadConfig(t *testing.T) {
	u, _ := url.Parse("https://api.example.com")
	ftp, _ := url.Parse("ftp://api.example.com")
	d := (&net.Dialer{}).DialContext
	for name, c := range map[string]Config{
		"no upstream": {AgentKey: "0123456789abcdef0", Dial: d},
		"bad scheme":  {Upstream: ftp, AgentKey: "0123456789abcdef0", Dial: d},
		"short key":   {Upstream: u, AgentKey: "short", Dial: d},
		"no dialer":   {Upstream: u, AgentKey: "0123456789abcdef0"},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}
