package netnsx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Pool dials TCP from inside a namespace without a namespace switch per
// dial: it creates unconnected sockets there in batches (one trip of a
// locked thread into the namespace for many sockets) and connects them
// from whatever goroutine dials, through Go's poller. A socket stays in
// the namespace it was created in, whatever thread later uses it.
//
// Only TCP to an IP address takes the fast path; anything else is dialled
// with Do. Close releases the sockets in stock.
type Pool struct {
	ns      netns.NsHandle
	timeout time.Duration

	mu     sync.Mutex
	stock  map[int][]int // address family -> unconnected socket fds
	closed bool
}

// poolBatch is how many sockets one trip into the namespace makes.
const poolBatch = 16

// NewPool returns a dialer for ns with a per-dial timeout (0: none beyond
// the context's). The caller keeps ownership of ns and keeps it open
// until Close.
func NewPool(ns netns.NsHandle, timeout time.Duration) *Pool {
	return &Pool{ns: ns, timeout: timeout, stock: make(map[int][]int)}
}

// DialContext opens a connection whose socket lives in the pool's
// namespace. It satisfies gate.DialFunc.
func (p *Pool) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || (network != "tcp" && network != "tcp4" && network != "tcp6") {
		d := &Dialer{NS: p.ns, Dialer: net.Dialer{Timeout: p.timeout}}
		return d.DialContext(ctx, network, addr)
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if (network == "tcp4" && !ap.Addr().Is4()) || (network == "tcp6" && !ap.Addr().Is6()) {
		return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("address family mismatch")}
	}
	if p.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.timeout)
		defer cancel()
	}
	var family int
	var sa unix.Sockaddr
	if ap.Addr().Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	} else {
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	fd, err := p.socket(family)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	c, err := connect(ctx, fd, sa)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Addr: net.TCPAddrFromAddrPort(ap), Err: err}
	}
	return c, nil
}

// socket takes an unconnected non-blocking TCP socket of the family from
// the stock, refilling it inside the namespace when it is empty.
func (p *Pool) socket(family int) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return -1, errors.New("netns dial pool closed")
	}
	if len(p.stock[family]) == 0 {
		var made []int
		err := Do(p.ns, func() error {
			for range poolBatch {
				fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
				if err != nil {
					return err
				}
				made = append(made, fd)
			}
			return nil
		})
		if err != nil && len(made) == 0 {
			return -1, fmt.Errorf("creating sockets in netns: %w", err)
		}
		p.stock[family] = made
	}
	l := p.stock[family]
	fd := l[len(l)-1]
	p.stock[family] = l[:len(l)-1]
	return fd, nil
}

// connect connects fd to sa, waiting in Go's poller, and returns it as a
// *net.TCPConn. It owns fd: on error fd is closed.
func connect(ctx context.Context, fd int, sa unix.Sockaddr) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		unix.Close(fd)
		return nil, err
	}
	err := unix.Connect(fd, sa)
	if err != nil && err != unix.EINPROGRESS && err != unix.EINTR {
		unix.Close(fd)
		return nil, os.NewSyscallError("connect", err)
	}
	f := os.NewFile(uintptr(fd), "netnsx-dial") // non-blocking: registered with the poller
	defer f.Close()
	if dl, ok := ctx.Deadline(); ok {
		f.SetWriteDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var connErr error
	werr := rc.Write(func(s uintptr) bool {
		soErr, err := unix.GetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			connErr = os.NewSyscallError("getsockopt", err)
			return true
		}
		switch e := unix.Errno(soErr); e {
		case 0:
			if _, err := unix.Getpeername(int(s)); err != nil {
				return false // still connecting
			}
			return true
		case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
			return false
		default:
			connErr = os.NewSyscallError("connect", e)
			return true
		}
	})
	if werr != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, werr
	}
	if connErr != nil {
		return nil, connErr
	}
	return net.FileConn(f) // a duplicate; f is closed on return
}

// Close releases the sockets in stock. Connections already made are the
// callers'.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	for _, l := range p.stock {
		for _, fd := range l {
			unix.Close(fd)
		}
	}
	p.stock = nil
	return nil
}
