package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"flowgate/gate"
	"flowgate/gate/nft"
	"flowgate/gate/nstest"
)

func policy(t *testing.T, s gate.Spec) *gate.Policy {
	t.Helper()
	p, err := gate.Compile(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAttachRefusesWhatItCannotEnforce(t *testing.T) {
	https := policy(t, gate.Spec{Mode: gate.Denylist, BlockedURLs: []gate.Entry{{Value: "https://example.org/papers/x", Field: "sandbox.blocked_urls[0]"}}})
	for name, c := range map[string]struct {
		uid  uint32
		p    *gate.Policy
		want string
	}{
		"no policy":    {1000, nil, "no policy"},
		"uid 0":        {0, policy(t, gate.Spec{}), "uid 0 cannot be filtered"},
		"https URL":    {1000, https, "blocked_urls over https need TLS interception"},
		"https naming": {1000, https, "sandbox.blocked_urls[0] https://example.org/papers/x"},
	} {
		// No namespace is touched before these checks: -1 is not a handle.
		if _, err := Attach(-1, c.uid, c.p, Options{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to contain %q", name, err, c.want)
		}
	}
}

func TestJSONLog(t *testing.T) {
	var b bytes.Buffer
	l := NewJSONLog(&b)
	d := gate.Deny(gate.ReasonHostBlocked)
	l.Record(gate.NewRecord(gate.ProtoDNS, "", "example.com", d))
	l.Record(gate.NewRecord(gate.ProtoTLS, "192.0.2.10:443", "example.com", d))
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), b.String())
	}
	var r gate.Record
	if err := json.Unmarshal([]byte(lines[1]), &r); err != nil || r.Reason != gate.ReasonHostBlocked || r.Verdict != "deny" || r.Dest != "192.0.2.10:443" {
		t.Fatalf("line %q decoded to %+v, %v", lines[1], r, err)
	}
	fail := NewJSONLog(failWriter{})
	fail.Record(r)
	if fail.Err() == nil {
		t.Fatal("a failed write was not reported")
	}
}

// TestJSONLogLimit: past its bound a log counts records by group instead
// of writing them, refusals past half of it; Close writes one record per
// group with the count.
func TestJSONLogLimit(t *testing.T) {
	var b bytes.Buffer
	one, _ := json.Marshal(gate.NewRecord(gate.ProtoTLS, "192.0.2.10:443", "example.com", gate.Deny(gate.ReasonHostBlocked)))
	l := NewJSONLogLimit(&b, int64(3*(len(one)+1)))
	deny := gate.Deny(gate.ReasonHostBlocked)
	for range 1000 {
		l.Record(gate.NewRecord(gate.ProtoTLS, "192.0.2.10:443", "example.com", deny))
	}
	folded := gate.NewRecord(gate.ProtoDNS, "", "", gate.Deny(gate.ReasonLimit))
	folded.Count = 40
	l.Record(folded)
	l.Record(gate.NewRecord(gate.ProtoDNS, "", "pypi.org", gate.Decision{Allow: true, Reason: gate.ReasonNotBlocked}))
	if n := strings.Count(b.String(), "\n"); n != 2 {
		t.Fatalf("%d lines before Close, want 1 refusal (half the bound) and the allowed line", n)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l.Record(gate.NewRecord(gate.ProtoTLS, "192.0.2.10:443", "example.com", deny))
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	want := []struct {
		proto  string
		reason gate.Reason
		count  int
	}{{gate.ProtoTLS, gate.ReasonHostBlocked, 999}, {gate.ProtoDNS, gate.ReasonLimit, 40}}
	if len(lines) != 2+len(want) {
		t.Fatalf("%d lines after Close, want 2 and %d summaries:\n%s", len(lines), len(want), b.String())
	}
	for i, w := range want {
		var r gate.Record
		if err := json.Unmarshal([]byte(lines[2+i]), &r); err != nil || r.Proto != w.proto || r.Reason != w.reason || r.Count != w.count ||
			!strings.Contains(r.Detail, "reached its limit") {
			t.Errorf("summary %d: %s (%v), want %s %s count %d", i, lines[2+i], err, w.proto, w.reason, w.count)
		}
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// TestAttachCloseDetach attaches a public policy in a throw-away netns:
// the live table matches, Close leaves the rules (fail closed), someone
// else's change is seen, and Detach removes the table.
func TestAttachCloseDetach(t *testing.T) {
	ns := nstest.New(t, "fgt-gw")
	tampered := make(chan nft.Event, 1)
	h, err := Attach(ns.Handle, nstest.AgentUID, policy(t, gate.Spec{Mode: gate.Public}), Options{Sandbox: "gwtest",
		OnTamper: func(ev nft.Event) {
			select {
			case tampered <- ev:
			default:
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Detach(ns.Handle) })
	if diffs, err := h.Audit(); err != nil || len(diffs) != 0 {
		t.Fatalf("audit after attach: %v %v", diffs, err)
	}
	if out, err := exec.Command("ip", "netns", "exec", ns.Name, "nft", "flush", "chain", "inet", "flowgate", "agent").CombinedOutput(); err != nil {
		t.Fatalf("nft flush: %v: %s", err, out)
	}
	select {
	case <-tampered:
	case <-time.After(5 * time.Second):
		t.Fatal("a flush by someone else was not reported")
	}
	if !h.Tampered() {
		t.Fatal("Tampered() is false after a flush")
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	live, err := nft.Read(ns.Handle)
	if err != nil || !live.Exists() {
		t.Fatalf("rules gone after Close (they must stay until Detach): %v", err)
	}
	if err := Detach(ns.Handle); err != nil {
		t.Fatal(err)
	}
	if live, err := nft.Read(ns.Handle); err != nil || live.Exists() {
		t.Fatalf("table still there after Detach: %v", err)
	}
}

// TestAttachDenylistKeepsRefusedNames: in denylist, the gateway's name
// table keeps what it knows of refused names and of hosts with URL rules
// from a flood of other lookups, and pins the names the policy spells out
// (resolved ahead of the agent; here the resolver is unreachable, which
// Attach does not wait long for).
func TestAttachDenylistKeepsRefusedNames(t *testing.T) {
	ns := nstest.New(t, "fgt-gwdeny")
	p := policy(t, gate.Spec{Mode: gate.Denylist,
		BlockedHosts: []gate.Entry{{Value: "example.com", Field: "sandbox.blocked_hosts[0]"}},
		BlockedURLs:  []gate.Entry{{Value: "http://docs.example.org/x", Field: "sandbox.blocked_urls[0]"}}})
	start := time.Now()
	h, err := Attach(ns.Handle, nstest.AgentUID, p, Options{Sandbox: "gwdeny",
		Resolvers: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Error(err)
		}
		if err := Detach(ns.Handle); err != nil {
			t.Error(err)
		}
	})
	if waited := time.Since(start); waited > keepWait+5*time.Second {
		t.Errorf("Attach took %v with an unreachable resolver", waited)
	}
	for name, want := range map[string][2]bool{ // protected, pinned
		"example.com":      {true, true},
		"www.example.com":  {true, false},
		"docs.example.org": {true, true},
		"pypi.org":         {false, false},
	} {
		if got := [2]bool{h.names.Protected(name), h.names.Pinned(name)}; got != want {
			t.Errorf("%s: protected, pinned = %v, want %v", name, got, want)
		}
	}
}
