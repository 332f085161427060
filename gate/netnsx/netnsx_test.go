package netnsx_test

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

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
	go acceptAndClose(l)
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

// TestPool dials through the worker pool into a namespace, concurrently,
// and checks that Close stops every worker.
func TestPool(t *testing.T) {
	ns := nstest.New(t, "fgt-nx")
	l, err := netnsx.Listen(ns.Handle, "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go acceptAndClose(l)
	p := netnsx.NewPool(ns.Handle, 5*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := p.DialContext(context.Background(), "tcp4", l.Addr().String())
			if err != nil {
				errs <- err
				return
			}
			c.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("dial through pool: %v", err)
	}
	// A closed port is refused at once; a cancelled context stops a dial.
	if _, err := p.DialContext(context.Background(), "tcp4", "127.0.0.1:1"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial to a closed port: %v, want connection refused", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.DialContext(ctx, "tcp4", l.Addr().String()); err == nil {
		t.Fatal("dial with a cancelled context succeeded")
	}
	if _, err := p.DialContext(context.Background(), "tcp6", l.Addr().String()); err == nil {
		t.Fatal("tcp6 dial to an IPv4 address succeeded")
	}
	l6, err := netnsx.Listen(ns.Handle, "tcp6", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l6.Close()
	c6, err := p.DialContext(context.Background(), "tcp", l6.Addr().String())
	if err != nil {
		t.Fatalf("IPv6 dial through pool: %v", err)
	}
	c6.Close()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DialContext(context.Background(), "tcp4", l.Addr().String()); err == nil {
		t.Fatal("dial after Close succeeded")
	}
}

// BenchmarkPoolDial and BenchmarkDoDial compare a loopback dial inside a
// namespace through the pool and through Do.
func BenchmarkPoolDial(b *testing.B) {
	ns, addr := benchListener(b)
	p := netnsx.NewPool(ns.Handle, 5*time.Second)
	defer p.Close()
	for b.Loop() {
		c, err := p.DialContext(context.Background(), "tcp4", addr)
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

func BenchmarkDoDial(b *testing.B) {
	ns, addr := benchListener(b)
	d := &netnsx.Dialer{NS: ns.Handle}
	for b.Loop() {
		c, err := d.DialContext(context.Background(), "tcp4", addr)
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

func benchListener(b *testing.B) (*nstest.NS, string) {
	ns := nstest.New(b, "fgt-nx")
	l, err := netnsx.Listen(ns.Handle, "tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	go acceptAndClose(l)
	return ns, l.Addr().String()
}

// acceptAndClose accepts connections on l and closes them, until l closes.
func acceptAndClose(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}
