package gate

import (
	"errors"
	"net/netip"
	"slices"
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

func itoa(i int) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + i%10)}, b...)
		if i /= 10; i == 0 {
			return string(b)
		}
	}
}
