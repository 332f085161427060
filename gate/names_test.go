package gate

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestNamesLearnAndExpire(t *testing.T) {
	var pushed []netip.Addr
	var pushedTTL time.Duration
	n := NewNames(func(a []netip.Addr, ttl time.Duration) error {
		pushed = append(pushed, a...)
		pushedTTL = ttl
		return nil
	})
	now := time.Unix(1000, 0)
	n.now = func() time.Time { return now }
	a1, a2 := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("::ffff:192.0.2.11")
	if err := n.Learn("example.com", []netip.Addr{a1, a2}, 5*time.Second, true); err != nil {
		t.Fatal(err)
	}
	if pushedTTL != MinLearnTTL || len(pushed) != 2 || pushed[1] != netip.MustParseAddr("192.0.2.11") {
		t.Fatalf("push got %v ttl %v; want both addresses unmapped, ttl raised to %v", pushed, pushedTTL, MinLearnTTL)
	}
	if !n.Has("example.com", a1) || !n.Has("example.com", netip.MustParseAddr("192.0.2.11")) {
		t.Fatal("learned addresses missing")
	}
	if n.Has("example.org", a1) {
		t.Fatal("address bound to the wrong name")
	}
	if err := n.Learn("blocked.example.net", []netip.Addr{a1}, time.Hour, false); err != nil {
		t.Fatal(err)
	}
	if len(pushed) != 2 {
		t.Fatal("a not-allowed name was pushed to the kernel sets")
	}
	got := n.NamesOf(a1)
	slices.Sort(got)
	if !slices.Equal(got, []string{"blocked.example.net", "example.com"}) {
		t.Fatalf("NamesOf = %v", got)
	}
	if exp, ok := n.Expires("example.com"); !ok || !exp.Equal(now.Add(MinLearnTTL)) {
		t.Fatalf("Expires(example.com) = %v, %v; want %v", exp, ok, now.Add(MinLearnTTL))
	}
	if _, ok := n.Expires("example.org"); ok {
		t.Fatal("Expires of a name never learned reports a time")
	}
	now = now.Add(31 * time.Second)
	if _, ok := n.Expires("example.com"); ok {
		t.Fatal("Expires of a name whose addresses expired reports a time")
	}
	if exp, ok := n.Expires("blocked.example.net"); !ok || !exp.Equal(time.Unix(1000, 0).Add(time.Hour)) {
		t.Fatalf("Expires(blocked.example.net) = %v, %v; want an hour after learning", exp, ok)
	}
	if n.Has("example.com", a1) {
		t.Fatal("entry did not expire")
	}
	if got := n.NamesOf(a1); !slices.Equal(got, []string{"blocked.example.net"}) {
		t.Fatalf("NamesOf after expiry = %v", got)
	}
}

func TestNamesPushFailureRecordsNothing(t *testing.T) {
	n := NewNames(func([]netip.Addr, time.Duration) error { return errors.New("netlink down") })
	a := netip.MustParseAddr("192.0.2.10")
	if err := n.Learn("example.com", []netip.Addr{a}, time.Minute, true); err == nil {
		t.Fatal("Learn succeeded although the push failed")
	}
	if n.Has("example.com", a) {
		t.Fatal("address recorded although the kernel set was not updated")
	}
}

func TestNamesBounded(t *testing.T) {
	n := NewNames(nil)
	n.max = 100
	a := netip.MustParseAddr("192.0.2.10")
	for i := range 1000 {
		name := "n" + string(rune('a'+i%26)) + "x" + itoa(i) + ".example"
		if err := n.Learn(name, []netip.Addr{a}, time.Minute, false); err != nil {
			t.Fatal(err)
		}
	}
	if n.Len() > 100 {
		t.Fatalf("table grew to %d names, bound is 100", n.Len())
	}
}

// TestNamesProtected: an agent that resolves many names cannot push what
// is known of refused names out of a full table; refused names make room
// among themselves, never by dropping a pinned one; expired entries go
// first.
func TestNamesProtected(t *testing.T) {
	n := NewNames(nil)
	n.max = 64
	now := time.Unix(1000, 0)
	n.now = func() time.Time { return now }
	n.Protect(func(name string) bool { return strings.HasSuffix(name, ".blocked.example") })
	a := netip.MustParseAddr("192.0.2.10")
	learn := func(name string) {
		t.Helper()
		if err := n.Learn(name, []netip.Addr{a}, time.Hour, false); err != nil {
			t.Fatal(err)
		}
	}
	learn("apex.example") // plain, then pinned: it moves to the protected class
	n.Pin("apex.example")
	for i := range 16 {
		learn("b" + itoa(i) + ".blocked.example")
	}
	for i := range 1000 {
		learn("flood" + itoa(i) + ".example")
	}
	if n.Len() > 64 {
		t.Fatalf("table grew to %d names, bound is 64", n.Len())
	}
	for i := range 16 {
		if name := "b" + itoa(i) + ".blocked.example"; !n.Has(name, a) {
			t.Errorf("%s was evicted by a flood of other names", name)
		}
	}
	if !n.Has("apex.example", a) {
		t.Error("a pinned name was evicted")
	}
	if !n.Has("flood999.example", a) {
		t.Error("the latest unprotected name was not recorded although unprotected ones could make room")
	}
	// Protected names fill the table: they evict each other, and once
	// nothing unprotected is left a new unprotected name is not recorded.
	for i := range 1000 {
		learn("x" + itoa(i) + ".blocked.example")
	}
	if n.Len() > 64 || !n.Has("apex.example", a) || !n.Has("x999.blocked.example", a) {
		t.Fatalf("after a flood of protected names: %d names, pinned kept %v, latest kept %v",
			n.Len(), n.Has("apex.example", a), n.Has("x999.blocked.example", a))
	}
	for i := 0; n.Len() < 64; i++ {
		learn("y" + itoa(i) + ".blocked.example")
	}
	learn("late.example")
	if n.Has("late.example", a) || n.Len() != 64 {
		t.Errorf("an unprotected name evicted a protected one (recorded %v, %d names)", n.Has("late.example", a), n.Len())
	}
	// Expired entries make room again.
	now = now.Add(2 * time.Hour)
	learn("after.example")
	if !n.Has("after.example", a) || n.Len() != 1 {
		t.Errorf("after everything expired: after.example recorded %v, %d names; want it alone", n.Has("after.example", a), n.Len())
	}
}

// TestNamesAddressBounds: an answer's addresses are learned up to
// MaxAddrsPerName (and only those are pushed); a name keeps at most that
// many, the latest; and the table keeps at most maxEntries pairs in all.
func TestNamesAddressBounds(t *testing.T) {
	var pushed int
	n := NewNames(func(a []netip.Addr, _ time.Duration) error { pushed = len(a); return nil })
	now := time.Unix(1000, 0)
	n.now = func() time.Time { return now }
	addrs := func(from, count int) []netip.Addr {
		out := make([]netip.Addr, count)
		for i := range out {
			out[i] = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte((from + i) >> 8), 15: byte(from + i)})
		}
		return out
	}
	wide := addrs(0, 2000)
	if err := n.Learn("wide.example", wide, time.Hour, true); err != nil {
		t.Fatal(err)
	}
	if pushed != MaxAddrsPerName || !n.Has("wide.example", wide[MaxAddrsPerName-1]) || n.Has("wide.example", wide[MaxAddrsPerName]) {
		t.Fatalf("pushed %d; want the first %d addresses of the answer learned and pushed, no more", pushed, MaxAddrsPerName)
	}
	// A later answer with new addresses replaces the oldest.
	now = now.Add(time.Minute)
	next := addrs(5000, 10)
	if err := n.Learn("wide.example", next, time.Hour, false); err != nil {
		t.Fatal(err)
	}
	if n.entries != MaxAddrsPerName || !n.Has("wide.example", next[9]) {
		t.Fatalf("%d entries after a rotating answer, want %d with the new addresses in", n.entries, MaxAddrsPerName)
	}

	// A protected name keeps more: what is known of a blocked host must
	// not stop at 64 of its addresses.
	n.Protect(func(name string) bool { return name == "blocked.example" })
	if err := n.Learn("blocked.example", wide, time.Hour, false); err != nil {
		t.Fatal(err)
	}
	if !n.Has("blocked.example", wide[MaxAddrsPerProtectedName-1]) || n.Has("blocked.example", wide[MaxAddrsPerProtectedName]) {
		t.Errorf("a protected name kept other than its first %d addresses", MaxAddrsPerProtectedName)
	}

	m := NewNames(nil)
	m.maxEntries = 100
	for i := range 50 {
		if err := m.Learn("n"+itoa(i)+".example", addrs(10*i, 10), time.Hour, false); err != nil {
			t.Fatal(err)
		}
		if m.entries > 100 {
			t.Fatalf("%d entries after %d names, bound is 100", m.entries, i+1)
		}
	}
	if !m.Has("n49.example", addrs(490, 1)[0]) {
		t.Error("the latest name was not recorded")
	}
	got := 0
	for _, am := range m.byName {
		got += len(am)
	}
	if got != m.entries {
		t.Errorf("entries counts %d, the table holds %d", m.entries, got)
	}
}

func itoa(i int) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + i%10)}, b...)
		if i /= 10; i == 0 {
			return string(b)
		}
	}
}
