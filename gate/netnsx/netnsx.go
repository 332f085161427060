// Package netnsx runs code with a thread inside a network namespace, so that
// sockets created there stay there whatever thread later uses them. It is
// the only place in flowgate that calls setns for sockets; it owns no
// namespace and closes none of the handles it is given.
package netnsx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs fn on a fresh goroutine whose locked OS thread is inside ns, then
// moves the thread back. If moving back fails, the goroutine exits still
// locked, so the runtime discards the thread instead of reusing it in the
// wrong namespace. Goroutines that fn starts run in the caller's namespace.
func Do(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("reading current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering netns: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leaving netns: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Listen opens a stream listener inside ns.
func Listen(ns netns.NsHandle, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := Do(ns, func() (err error) {
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// ListenPacket opens a packet socket inside ns.
func ListenPacket(ns netns.NsHandle, network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := Do(ns, func() (err error) {
		c, err = net.ListenPacket(network, addr)
		return err
	})
	return c, err
}

// Dialer dials from inside a namespace. The zero Dialer field is used as the
// template; NS must be set.
type Dialer struct {
	NS     netns.NsHandle
	Dialer net.Dialer
}

// DialContext opens a connection whose socket lives in d.NS. The connect
// itself runs on the locked thread; the returned conn is usable anywhere.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := Do(d.NS, func() (err error) {
		c, err = d.Dialer.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// NewNamed creates a named namespace (/run/netns/NAME, as `ip netns add`
// does) and returns a handle on it.
func NewNamed(name string) (netns.NsHandle, error) {
	h, err := create(func() (netns.NsHandle, error) { return netns.NewNamed(name) })
	if err != nil {
		return h, fmt.Errorf("creating netns %s: %w", name, err)
	}
	return h, nil
}

// New creates an unnamed namespace, held only by the returned handle: it
// disappears when the handle is closed, whatever happens to this process.
func New() (netns.NsHandle, error) {
	h, err := create(netns.New)
	if err != nil {
		return h, fmt.Errorf("creating netns: %w", err)
	}
	return h, nil
}

// create runs mk, which moves its caller into the new namespace, on a
// locked thread that moves back, or is discarded if it cannot; no thread
// is left in the wrong namespace.
func create(mk func() (netns.NsHandle, error)) (netns.NsHandle, error) {
	type res struct {
		h   netns.NsHandle
		err error
	}
	c := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			c <- res{h: netns.None(), err: fmt.Errorf("reading current netns: %w", err)}
			return
		}
		defer orig.Close()
		h, err := mk()
		if serr := netns.Set(orig); serr != nil {
			c <- res{h: h, err: errors.Join(err, fmt.Errorf("returning to original netns: %w", serr))}
			return // stay locked: the thread is discarded
		}
		runtime.UnlockOSThread()
		c <- res{h: h, err: err}
	}()
	r := <-c
	return r.h, r.err
}
