// Package modelproxy is the model API proxy an agent talks to instead of
// its provider: it listens on loopback inside the agent's sandbox, checks
// the proxy key the agent was given, and forwards each call upstream with
// the real key, which never enters the sandbox. Each call is written as one
// JSON line to the model-call log, without keys or bodies.
//
// It never decides network policy (loopback is always open to the agent;
// the gateway owns everything else) and never logs a credential.
package modelproxy

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"flowgate/gate"
)

// Config configures a Proxy.
type Config struct {
	// Upstream is the provider's base URL (https://api.anthropic.com).
	Upstream *url.URL
	// RealKey is the provider key; it is sent upstream only.
	RealKey string
	// AgentKey is the key the agent holds (NewAgentKey).
	AgentKey string
	// Dial opens upstream connections; it must leave through a network
	// with the internet (the host's, not the sandbox's).
	Dial gate.DialFunc
	// TLS is the client configuration for the upstream (its RootCAs); nil
	// means the system roots.
	TLS *tls.Config
	// Log receives one JSON line per call; nil discards.
	Log io.Writer
}

// Proxy is a running model proxy.
type Proxy struct {
	cfg   Config
	srv   *http.Server
	logMu sync.Mutex
}

// NewAgentKey returns a fresh random proxy key for one trial.
func NewAgentKey() (string, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "fg-proxy-" + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// New checks cfg and returns a proxy; Serve starts it.
func New(cfg Config) (*Proxy, error) {
	switch {
	case cfg.Upstream == nil || cfg.Upstream.Host == "":
		return nil, errors.New("model proxy: no upstream URL")
	case cfg.Upstream.Scheme != "https" && cfg.Upstream.Scheme != "http":
		return nil, fmt.Errorf("model proxy: upstream %s: scheme must be https or http", cfg.Upstream)
	case len(cfg.AgentKey) < 16:
		return nil, errors.New("model proxy: agent key missing or too short")
	case cfg.Dial == nil:
		return nil, errors.New("model proxy: no upstream dialer")
	}
	p := &Proxy{cfg: cfg}
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.TLS != nil {
		tlsConf = cfg.TLS.Clone()
	}
	transport := &http.Transport{
		DialContext:           func(ctx context.Context, network, addr string) (net.Conn, error) { return cfg.Dial(ctx, network, addr) },
		TLSClientConfig:       tlsConf,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 10 * time.Minute,
	}
	rp := &httputil.ReverseProxy{
		Transport: transport,
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(cfg.Upstream)
			r.Out.Host = cfg.Upstream.Host
			swapKey(r.Out.Header, cfg.RealKey)
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "model proxy: upstream unreachable", http.StatusBadGateway)
		},
	}
	p.srv = &http.Server{Handler: p.handler(rp), ReadHeaderTimeout: 30 * time.Second}
	return p, nil
}

// Serve answers calls on l until Close. The proxy owns l.
func (p *Proxy) Serve(l net.Listener) error {
	err := p.srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops the proxy and every call in flight.
func (p *Proxy) Close() error { return p.srv.Close() }

// handler refuses calls without the agent's key and logs every call.
func (p *Proxy) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		switch {
		case refusedMethods[strings.ToUpper(r.Method)]:
			// An upstream that echoes a TRACE would hand the agent the
			// real key; CONNECT would make the proxy a tunnel.
			http.Error(rec, "model proxy: method "+r.Method+" not allowed", http.StatusMethodNotAllowed)
		case !p.authorised(r.Header):
			http.Error(rec, "model proxy: missing or wrong proxy key", http.StatusUnauthorized)
		default:
			next.ServeHTTP(rec, r)
		}
		p.log(callRecord{Time: start.UTC(), Method: r.Method, Path: r.URL.Path, Status: rec.status,
			DurationMS: float64(time.Since(start).Microseconds()) / 1000})
	})
}

// refusedMethods are never passed upstream.
var refusedMethods = map[string]bool{"TRACE": true, "TRACK": true, "CONNECT": true}

// keyHeaders are where providers take a key: Authorization (Bearer) and
// x-api-key.
func (p *Proxy) authorised(h http.Header) bool {
	want := []byte(p.cfg.AgentKey)
	if k, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer "); ok && subtle.ConstantTimeCompare([]byte(k), want) == 1 {
		return true
	}
	return subtle.ConstantTimeCompare([]byte(h.Get("X-Api-Key")), want) == 1
}

// swapKey replaces the agent's key with the real one in the header the
// agent used, and drops the other.
func swapKey(h http.Header, real string) {
	if h.Get("Authorization") != "" {
		h.Set("Authorization", "Bearer "+real)
	}
	if h.Get("X-Api-Key") != "" {
		h.Set("X-Api-Key", real)
	}
}

// callRecord is one line of the model-call log.
type callRecord struct {
	Time       time.Time `json:"time"`
	Method     string    `json:"method"`
	Path       string    `json:"path"`
	Status     int       `json:"status"`
	DurationMS float64   `json:"duration_ms"`
}

func (p *Proxy) log(r callRecord) {
	if p.cfg.Log == nil {
		return
	}
	b, _ := json.Marshal(r)
	p.logMu.Lock()
	defer p.logMu.Unlock()
	p.cfg.Log.Write(append(b, '\n'))
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
