package dns

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"flowgate/gate"
)

// fastKeep runs the keep schedule in milliseconds for one test.
func fastKeep(t *testing.T) {
	t.Helper()
	old := []time.Duration{keepMargin, keepMin, keepRetry, keepRetryMax}
	keepMargin, keepMin, keepRetry, keepRetryMax = time.Hour, 30*time.Millisecond, 30*time.Millisecond, 60*time.Millisecond
	t.Cleanup(func() { keepMargin, keepMin, keepRetry, keepRetryMax = old[0], old[1], old[2], old[3] })
}

func denylistSpec(t *testing.T, hosts []string, urls ...string) *gate.Policy {
	t.Helper()
	spec := gate.Spec{Mode: gate.Denylist}
	for i, h := range hosts {
		spec.BlockedHosts = append(spec.BlockedHosts, gate.Entry{Value: h, Field: fmt.Sprintf("sandbox.blocked_hosts[%d]", i)})
	}
	for i, u := range urls {
		spec.BlockedURLs = append(spec.BlockedURLs, gate.Entry{Value: u, Field: fmt.Sprintf("sandbox.blocked_urls[%d]", i)})
	}
	p, err := gate.Compile(spec)
	if err != nil {
		t.Fatalf("compiling policy: %v", err)
	}
	return p
}

func waitReady(t *testing.T, ready <-chan struct{}) {
	t.Helper()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the first round of kept names never finished")
	}
}

// TestKeepBlockedResolved: the names of blocked_hosts and the hosts of
// blocked_urls are resolved before the agent asks for anything, recorded
// (never pushed, never logged as decisions), and resolved again on
// schedule; a name that fails is tried again; wildcards, addresses and
// CIDR rules are not resolved; Close stops it all.
func TestKeepBlockedResolved(t *testing.T) {
	fastKeep(t)
	p := denylistSpec(t, []string{"blocked.test", "*.wild.test", "192.0.2.0/28", "nx.test", "blocked.test", "big.test"},
		"http://docs.test/private", "http://192.0.2.99/x", "http://blocked.test/also")
	u := newUnit(t, p, func(c *Config) {
		c.Names.Protect(func(name string) bool { return !p.Name(name).Allow || p.NeedsIntercept(gate.Host{Name: name}) })
	})
	ready, kept, skipped := u.srv.KeepBlockedResolved()
	if kept != 4 || skipped != 0 {
		t.Fatalf("kept %d, skipped %d; want 4 (blocked.test, nx.test, big.test, docs.test) and 0", kept, skipped)
	}
	waitReady(t, ready)
	a4, a6 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	for _, name := range []string{"blocked.test", "docs.test"} {
		if !u.names.Has(name, a4) || !u.names.Has(name, a6) {
			t.Errorf("%s's addresses are not in Names after the first round", name)
		}
	}
	// A blocked name keeps all its addresses, not only the first 64.
	if last := netip.MustParseAddr("198.51.100.120"); !u.names.Has("big.test", last) {
		t.Errorf("big.test's 120th address is not in Names")
	}
	if got := u.names.NamesOf(a4); !slices.Contains(got, "blocked.test") {
		t.Errorf("NamesOf(%v) = %v, want blocked.test among them", a4, got)
	}
	if len(u.push.pushed(a4)) != 0 || len(u.push.pushed(a6)) != 0 {
		t.Error("a blocked name's addresses were pushed to the kernel")
	}
	// Again on schedule (every 30 ms here), and the failing name retried.
	eventually(t, "blocked.test resolved three times", func() bool { return u.fake.asked("blocked.test") >= 6 })
	eventually(t, "nx.test tried three times", func() bool { return u.fake.asked("nx.test") >= 6 })
	for _, name := range []string{"wild.test", "192.0.2.0", "192.0.2.99"} {
		if n := u.fake.asked(name); n != 0 {
			t.Errorf("%s asked upstream %d times, want never", name, n)
		}
	}
	if n := len(u.rec.all()); n != 0 {
		t.Errorf("%d records, want none: kept names are not the agent's queries", n)
	}
	if err := u.srv.Close(); err != nil {
		t.Fatal(err)
	}
	n := u.fake.asked("blocked.test")
	time.Sleep(150 * time.Millisecond)
	if m := u.fake.asked("blocked.test"); m != n {
		t.Errorf("blocked.test asked %d more times after Close", m-n)
	}
}

// TestKeepBlockedResolvedBounds: at most MaxKeptNames names, the first in
// the policy's order; nothing outside denylist or with background lookups
// off; nothing after Close.
func TestKeepBlockedResolvedBounds(t *testing.T) {
	fastKeep(t)
	var hosts []string
	for i := range MaxKeptNames + 10 {
		hosts = append(hosts, fmt.Sprintf("h%d.test", i))
	}
	u := newUnit(t, denylistSpec(t, hosts), nil)
	ready, kept, skipped := u.srv.KeepBlockedResolved()
	if kept != MaxKeptNames || skipped != 10 {
		t.Errorf("kept %d, skipped %d; want %d and 10", kept, skipped, MaxKeptNames)
	}
	waitReady(t, ready)
	last := fmt.Sprintf("h%d.test", MaxKeptNames-1)
	if u.fake.asked(last) == 0 || u.fake.asked(fmt.Sprintf("h%d.test", MaxKeptNames)) != 0 {
		t.Errorf("want %s resolved and h%d.test not", last, MaxKeptNames)
	}

	for name, srv := range map[string]*Server{
		"allowlist":   newUnit(t, policy(t, gate.Allowlist, "blocked.test"), nil).srv,
		"lookups off": newUnit(t, policy(t, gate.Denylist, "blocked.test"), func(c *Config) { c.BlockedLookups = -1 }).srv,
	} {
		ready, kept, _ := srv.KeepBlockedResolved()
		if kept != 0 {
			t.Errorf("%s: kept %d names, want none", name, kept)
		}
		select {
		case <-ready:
		default:
			t.Errorf("%s: ready is not closed", name)
		}
	}

	c := newUnit(t, policy(t, gate.Denylist, "closed.test"), nil)
	if err := c.srv.Close(); err != nil {
		t.Fatal(err)
	}
	ready, kept, _ = c.srv.KeepBlockedResolved()
	waitReady(t, ready)
	time.Sleep(50 * time.Millisecond)
	if kept != 0 || c.fake.asked("closed.test") != 0 {
		t.Errorf("after Close: kept %d, closed.test asked %d times; want nothing", kept, c.fake.asked("closed.test"))
	}
}
