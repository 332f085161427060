// Command testclient is the agent-side client of the sni namespace tests.
// The tests run it as uid 1000 inside the sandbox namespace, so that its
// connections are redirected to flowgate by the test's nftables rule. It
// prints one line, "OK <status> <body>" or "ERR <error>", and exits 0 or 1.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"flowgate/gate/sni/internal/snitest"
)

func main() {
	mode := flag.String("mode", "tls", "tls (HTTPS GET), http (plain GET), tcp (send a line, print the reply)")
	addr := flag.String("addr", "", "ip:port to connect to (through the redirect), or the CONNECT target with -proxy")
	proxy := flag.String("proxy", "", "explicit proxy ip:port: CONNECT to -addr first")
	sni := flag.String("sni", "", "TLS server name; empty sends none and skips verification")
	host := flag.String("host", "", "HTTP Host (default: -sni)")
	path := flag.String("path", "/", "request path")
	caFile := flag.String("ca", "", "CA certificate PEM file")
	chunk := flag.Int("chunk", 0, "write the first 64 KiB in pieces of this many bytes")
	delay := flag.Duration("delay", 2*time.Millisecond, "pause between pieces")
	pad := flag.Int("pad", 0, "grow the ClientHello by about this many bytes (ALPN)")
	ech := flag.String("ech", "", "send an encrypted ClientHello with this outer public name")
	flag.Parse()
	out, err := run(*mode, *addr, *proxy, *sni, *host, *path, *caFile, *chunk, *delay, *pad, *ech)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Println("OK", out)
}

func run(mode, addr, proxy, sni, host, path, caFile string, chunk int, delay time.Duration, pad int, ech string) (string, error) {
	dial := addr
	if proxy != "" {
		dial = proxy
	}
	raw, err := net.DialTimeout("tcp", dial, 10*time.Second)
	if err != nil {
		return "", err
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(20 * time.Second))
	var c net.Conn = raw
	br := bufio.NewReader(raw)
	if proxy != "" {
		fmt.Fprintf(raw, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, addr)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			return "", err
		}
		if resp.StatusCode != 200 {
			return "", fmt.Errorf("CONNECT: %s", resp.Status)
		}
		c = &readerConn{Conn: raw, r: br}
	}
	if chunk > 0 {
		c = &snitest.ChunkConn{Conn: c, Size: chunk, Delay: delay, Limit: 64 << 10}
	}
	if host == "" {
		host = sni
	}
	switch mode {
	case "tcp":
		io.WriteString(c, "ping\n")
		line, err := bufio.NewReader(c).ReadString('\n')
		return strings.TrimSpace(line), err
	case "http":
		return get(c, host, path)
	}
	cfg := &tls.Config{ServerName: sni, InsecureSkipVerify: sni == ""}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return "", err
		}
		cfg.RootCAs = x509.NewCertPool()
		cfg.RootCAs.AppendCertsFromPEM(pem)
	}
	if pad > 0 {
		cfg.NextProtos = snitest.PaddedProtos(pad)
	}
	if ech != "" {
		list, err := snitest.ECHConfigList(ech)
		if err != nil {
			return "", err
		}
		cfg.EncryptedClientHelloConfigList = list
		cfg.MinVersion = tls.VersionTLS13
	}
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return "", err
	}
	return get(tc, host, path)
}

// get sends one GET and returns "status body".
func get(c net.Conn, host, path string) (string, error) {
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b))), err
}

// readerConn reads first what the CONNECT response reader buffered.
type readerConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *readerConn) Read(b []byte) (int, error) { return c.r.Read(b) }
