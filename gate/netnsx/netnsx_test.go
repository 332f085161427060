package netnsx_test

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/vishvananda/netns"

	"flowgate/gate/netnsx"
	"flowgate/gate/nstest"
)

// TestSocketsStayInNamespace opens a listener inside a throw-away netns and
// checks that it is reachable by a dial made inside that netns only, and
// that no goroutine is left in the wrong namespace afterwards.
func TestSocketsStayInNamespace(t *testing.T) {
	ns := nstest.New(t, "fgt-nx")
	l, err := netnsx.Listen(ns.Handle, "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	d := &netnsx.Dialer{NS: ns.Handle}
	c, err := d.DialContext(context.Background(), "tcp4", l.Addr().String())
	if err != nil {
		t.Fatalf("dial inside the namespace: %v", err)
	}
	c.Close()

	hostNS, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wrong := make(chan string, 200)
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = netnsx.Do(ns.Handle, func() error { return nil })
			if cur, _ := os.Readlink("/proc/thread-self/ns/net"); cur != hostNS {
				wrong <- cur
			}
		}()
	}
	wg.Wait()
	close(wrong)
	for w := range wrong {
		t.Fatalf("a goroutine ran in %s after Do, want the host's %s", w, hostNS)
	}
	// From the host namespace the listener's port on loopback is not the
	// same socket: the connection is refused (nothing listens there).
	if c, err := (&netnsx.Dialer{NS: mustGet(t)}).DialContext(context.Background(), "tcp4", l.Addr().String()); err == nil {
		c.Close()
		t.Fatalf("reached the sandbox's loopback listener from the host namespace")
	}
}

func mustGet(t *testing.T) netns.NsHandle {
	h, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// BenchmarkDo measures the cost of running a function inside a namespace.
func BenchmarkDo(b *testing.B) {
	ns := nstest.New(b, "fgt-nx")
	for b.Loop() {
		if err := netnsx.Do(ns.Handle, func() error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}
