// Package snitest holds what the sni tests and their client program share:
// a throw-away test CA with leaf certificates, a crafted ECH config list,
// and a conn that writes in small, delayed pieces. It is test support only;
// nothing in flowgate's own code imports it.
package snitest

import (
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"time"
)

// CA is a test certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	PEM  []byte
	Pool *x509.CertPool
}

// NewCA makes a fresh ECDSA P-256 CA valid for a day.
func NewCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "flowgate sni test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("creating CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, Key: key, Pool: pool,
		PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Leaf issues a server certificate for names (DNS names or IP literals).
func (ca *CA) Leaf(names ...string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generating leaf key: %w", err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if a, err := netip.ParseAddr(n); err == nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("creating leaf certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// ECHConfigList builds a one-entry ECHConfigList (draft-ietf-tls-esni,
// version 0xfe0d) for a fresh X25519 key, HKDF-SHA256 and AES-128-GCM, with
// the given public name. A Go client given it sends a real encrypted
// ClientHello whose outer SNI is publicName.
func ECHConfigList(publicName string) ([]byte, error) {
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	pub := key.PublicKey().Bytes()
	var c []byte
	c = append(c, 7)                         // config_id
	c = binary.BigEndian.AppendUint16(c, 32) // kem: DHKEM(X25519, HKDF-SHA256)
	c = binary.BigEndian.AppendUint16(c, uint16(len(pub)))
	c = append(c, pub...)
	c = binary.BigEndian.AppendUint16(c, 4) // cipher suites: one
	c = binary.BigEndian.AppendUint16(c, 1) // HKDF-SHA256
	c = binary.BigEndian.AppendUint16(c, 1) // AES-128-GCM
	c = append(c, 0)                        // maximum_name_length
	c = append(c, byte(len(publicName)))
	c = append(c, publicName...)
	c = binary.BigEndian.AppendUint16(c, 0) // extensions
	var cfg []byte
	cfg = binary.BigEndian.AppendUint16(cfg, 0xfe0d)
	cfg = binary.BigEndian.AppendUint16(cfg, uint16(len(c)))
	cfg = append(cfg, c...)
	list := binary.BigEndian.AppendUint16(nil, uint16(len(cfg)))
	return append(list, cfg...), nil
}

// PaddedProtos returns ALPN protocol names that make a ClientHello about
// n bytes longer, to test hellos that span several segments and records.
func PaddedProtos(n int) []string {
	var out []string
	for i := 0; n > 0; i++ {
		l := min(n, 200)
		b := make([]byte, l)
		for j := range b {
			b[j] = 'a' + byte((i+j)%26)
		}
		out = append(out, string(b))
		n -= l + 1
	}
	return append(out, "http/1.1")
}

// ChunkConn writes its first Limit bytes in pieces of Size bytes with Delay
// between them, each its own TCP segment (Go sets TCP_NODELAY), then writes
// normally. Written keeps a copy of those first bytes.
type ChunkConn struct {
	net.Conn
	Size    int
	Delay   time.Duration
	Limit   int
	Written []byte
}

func (c *ChunkConn) Write(b []byte) (int, error) {
	total := 0
	for len(b) > 0 && len(c.Written) < c.Limit {
		n := min(c.Size, len(b), c.Limit-len(c.Written))
		w, err := c.Conn.Write(b[:n])
		c.Written = append(c.Written, b[:w]...)
		total += w
		if err != nil {
			return total, err
		}
		b = b[n:]
		time.Sleep(c.Delay)
	}
	if len(b) == 0 {
		return total, nil
	}
	w, err := c.Conn.Write(b)
	return total + w, err
}
