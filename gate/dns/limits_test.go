package dns

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"flowgate/gate"
	"flowgate/integration/simnet"

	"github.com/miekg/dns"
)

func TestMalformedPacketsOverTheNetwork(t *testing.T) {
	e := newEnv(t, policy(t, gate.Denylist), nil)
	two := new(dns.Msg)
	two.SetQuestion("example.com.", dns.TypeA)
	two.Question = append(two.Question, dns.Question{Name: "pypi.org.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	twoRaw, _ := two.Pack()
	packets := map[string][]byte{
		"garbage":       []byte("\x00\x01this is not dns at all"),
		"short":         {0x01},
		"two questions": twoRaw,
		"huge":          bytes.Repeat([]byte{0x41}, 9000),
	}
	for name, p := range packets {
		c := e.dial(t, "udp", e.udp4)
		if _, err := c.Write(p); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		c.Close()
	}
	// Over TCP: a frame of garbage, then a zero length that ends the stream.
	c := e.dial(t, "tcp", e.tcp4)
	c.Write([]byte{0x00, 0x10, 0xab, 0xcd, 0x01, 0x00, 0x00, 0x05})
	c.Write(bytes.Repeat([]byte{0xff}, 10))
	c.Write([]byte{0x00, 0x00})
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest, _ := io.ReadAll(c)
	c.Close()
	formerr := new(dns.Msg)
	if len(rest) < 2 || formerr.Unpack(rest[2:]) != nil || formerr.Id != 0xabcd || formerr.Rcode != dns.RcodeFormatError {
		t.Errorf("want a FORMERR for the garbage frame before the stream closed, got %x", rest)
	}
	eventually(t, "bad_request records", func() bool {
		n := 0
		for _, r := range e.rec.all() {
			if r.Reason == gate.ReasonBadRequest {
				n++
			}
		}
		return n >= 5
	})
	// A frame announced longer than any query: closed before it is read.
	c2 := e.dial(t, "tcp", e.tcp4)
	c2.Write([]byte{0xff, 0xff, 0xab, 0xcd})
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	// (Closed with the rest of the frame unread: a reset, or an end.)
	if rest, err := io.ReadAll(c2); len(rest) != 0 || err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a 65535-byte frame: read %x, %v; want the stream closed at once", rest, err)
	}
	c2.Close()
	eventually(t, "the record of the oversized frame", func() bool {
		for _, r := range e.rec.all() {
			if r.Reason == gate.ReasonBadRequest && strings.Contains(r.Detail, "message length 65535") {
				return true
			}
		}
		return false
	})
	r := e.mustQuery(t, "udp", e.udp4, "example.com", dns.TypeA, false)
	wantAddrs(t, r, "192.0.2.10")
	r = e.mustQuery(t, "tcp", e.tcp4, "example.com", dns.TypeA, false)
	wantAddrs(t, r, "192.0.2.10")
}

func TestStalledTCPClientIsCutOff(t *testing.T) {
	e := newEnv(t, policy(t, gate.Denylist), func(c *Config) { c.TCPIdleTimeout = 300 * time.Millisecond })
	stalled := e.dial(t, "tcp", e.tcp4)
	defer stalled.Close()
	// Half a length prefix, then nothing.
	if _, err := stalled.Write([]byte{0x00}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Others are served meanwhile.
	r := e.mustQuery(t, "tcp", e.tcp4, "example.org", dns.TypeA, false)
	wantAddrs(t, r, "192.0.2.20")
	stalled.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := stalled.Read(make([]byte, 10))
	if n != 0 || err != io.EOF {
		t.Errorf("stalled conn read = %d, %v; want EOF (closed by the server)", n, err)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("stalled conn closed after %v", d)
	}
	eventually(t, "a timeout record", func() bool {
		for _, r := range e.rec.all() {
			if r.Reason == gate.ReasonTimeout && r.Verdict == gate.VerdictDeny {
				return true
			}
		}
		return false
	})
}

func TestTCPConnectionLimit(t *testing.T) {
	e := newEnv(t, policy(t, gate.Denylist), func(c *Config) { c.MaxTCPConns = 2 })
	a := e.dial(t, "tcp", e.tcp4)
	defer a.Close()
	b := e.dial(t, "tcp", e.tcp6)
	defer b.Close()
	// Make sure both are being served before the third arrives.
	for _, c := range []interface {
		Write([]byte) (int, error)
	}{a, b} {
		m := new(dns.Msg)
		m.SetQuestion("example.com.", dns.TypeA)
		raw, _ := m.Pack()
		c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(raw))), raw...))
	}
	for _, c := range []*dns.Conn{{Conn: a}, {Conn: b}} {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.ReadMsg(); err != nil {
			t.Fatalf("held connection not served: %v", err)
		}
	}
	third := e.dial(t, "tcp", e.tcp4)
	defer third.Close()
	third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := third.Read(make([]byte, 10)); n != 0 || err != io.EOF {
		t.Errorf("third conn read = %d, %v; want EOF (over the limit)", n, err)
	}
	found := false
	for _, r := range e.rec.all() {
		if r.Reason == gate.ReasonLimit && strings.Contains(r.Detail, "too many connections") {
			found = true
		}
	}
	if !found {
		t.Errorf("no limit record")
	}
	// UDP is unaffected; after one closes, TCP works again.
	wantAddrs(t, e.mustQuery(t, "udp", e.udp4, "example.com", dns.TypeA, false), "192.0.2.10")
	a.Close()
	eventually(t, "a TCP slot to free up", func() bool {
		r, err := e.query(t, "tcp", e.tcp4, "example.com", dns.TypeA, false)
		return err == nil && len(addrsOf(r)) == 1
	})
}

func TestUDPInflightLimit(t *testing.T) {
	e := newEnv(t, policy(t, gate.Denylist), func(c *Config) { c.MaxInflight = 1; c.Timeout = 1500 * time.Millisecond })
	// The one slot is held by a query the resolver never answers.
	hold := e.dial(t, "udp", e.udp4)
	defer hold.Close()
	m := new(dns.Msg)
	m.SetQuestion(simnet.BlackholeName+".", dns.TypeA)
	raw, _ := m.Pack()
	hold.Write(raw)
	eventually(t, "the held query to reach the resolver", func() bool { return e.in.Queries(simnet.BlackholeName) == 1 })
	c := e.dial(t, "udp", e.udp4)
	defer c.Close()
	m2 := new(dns.Msg)
	m2.SetQuestion("example.com.", dns.TypeA)
	cl := &dns.Client{Net: "udp", Timeout: 300 * time.Millisecond}
	if _, _, err := cl.ExchangeWithConn(m2, &dns.Conn{Conn: c}); err == nil {
		t.Errorf("second query answered while the only slot was held")
	}
	found := false
	for _, r := range e.rec.all() {
		if r.Reason == gate.ReasonLimit && strings.Contains(r.Detail, "in flight") {
			found = true
		}
	}
	if !found {
		t.Errorf("no limit record for the dropped query")
	}
	// A flood while the slot is held: the drops are counted, not logged
	// one by one (gate.Throttle: at most one record a second).
	const flood = 200
	c.SetDeadline(time.Time{}) // the exchange above left an expired one
	for range flood {
		if _, err := c.Write(raw); err != nil {
			t.Fatalf("flooding: %v", err)
		}
	}
	limits := func() (recs, events int) {
		for _, r := range e.rec.all() {
			if r.Reason == gate.ReasonLimit {
				recs++
				events += r.Events()
			}
		}
		return recs, events
	}
	eventually(t, "the flood's drops to be recorded", func() bool { _, n := limits(); return n >= flood/2 })
	if recs, events := limits(); recs > 3 || events > flood+1 {
		t.Errorf("%d limit records standing for %d drops; want at most 3 for at most %d", recs, events, flood+1)
	}
	// The held query ends in SERVFAIL; then the slot is free again.
	hold.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	n, err := hold.Read(buf)
	r := new(dns.Msg)
	if err != nil || r.Unpack(buf[:n]) != nil || r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("held query: %v %v, want SERVFAIL", r, err)
	}
	eventually(t, "the slot to free up", func() bool {
		r, err := e.query(t, "udp", e.udp4, "example.com", dns.TypeA, false)
		return err == nil && len(addrsOf(r)) == 1
	})
}
