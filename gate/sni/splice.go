package sni

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// splice copies both ways between client and up until both directions have
// ended, half-closing each destination when its source reaches EOF, then
// closes both. The conns are handed to io.Copy as they are: between two
// *net.TCPConn the kernel moves the bytes with splice(2). The client-to-
// upstream direction runs on a new goroutine, the other on the caller's,
// which is the one the handshake waits on. A direction that fails closes
// both at once. An idle watchdog closes both when no byte has moved through
// the client's socket for IdleTimeout. upDone says that the upstream-to-
// client direction has already ended (its EOF was seen while the server
// spoke first).
func (s *Server) splice(client, up net.Conn, upDone bool) {
	defer s.closeUp(up)
	defer client.Close()
	w := s.watchIdle(client, up)
	defer w.stop()
	done := make(chan error, 1)
	go pipe(up, client, done)
	if !upDone {
		_, err := io.Copy(client, up)
		if err == nil {
			err = closeWrite(client)
		}
		if err != nil {
			client.Close()
			up.Close()
		}
	}
	if err := <-done; err != nil {
		client.Close()
		up.Close()
	}
}

// pipe copies src to dst and half-closes dst at EOF; it reports a failure
// (nil for a clean EOF).
func pipe(dst, src net.Conn, done chan<- error) {
	_, err := io.Copy(dst, src)
	if err == nil {
		err = closeWrite(dst)
	}
	done <- err
}

func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// idleWatch closes a spliced pair once the client socket's byte counters
// (TCP_INFO: bytes received from the client, bytes the client
// acknowledged), which move with traffic either way without touching the
// spliced data path, have stood still for the idle timeout. It is a timer,
// not a goroutine: nothing runs between checks.
type idleWatch struct {
	mu         sync.Mutex
	raw        syscall.RawConn
	client, up net.Conn
	idle, tick time.Duration
	timer      *time.Timer
	last       uint64
	lastMove   time.Time
	stopped    bool
}

// watchIdle starts an idle watch on a spliced pair. For a client that is
// not a TCP socket it watches nothing.
func (s *Server) watchIdle(client, up net.Conn) *idleWatch {
	w := &idleWatch{client: client, up: up, idle: s.cfg.IdleTimeout, lastMove: time.Now()}
	tc, ok := client.(*net.TCPConn)
	if !ok {
		return w
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return w
	}
	w.raw = raw
	w.tick = min(max(w.idle/4, 50*time.Millisecond), 30*time.Second)
	w.mu.Lock()
	w.timer = time.AfterFunc(w.tick, w.check)
	w.mu.Unlock()
	return w
}

// check runs on each tick.
func (w *idleWatch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	n, err := tcpBytes(w.raw)
	if err != nil {
		return
	}
	now := time.Now()
	if n != w.last {
		w.last, w.lastMove = n, now
	} else if now.Sub(w.lastMove) >= w.idle {
		w.client.Close()
		w.up.Close()
		return
	}
	w.timer.Reset(w.tick)
}

func (w *idleWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
	}
}

// tcpBytes sums a socket's received and acknowledged byte counters.
func tcpBytes(raw syscall.RawConn) (uint64, error) {
	var n uint64
	var serr error
	err := raw.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			serr = err
			return
		}
		n = info.Bytes_received + info.Bytes_acked
	})
	if err == nil {
		err = serr
	}
	return n, err
}

// banner forwards what an upstream says before the client has spoken
// (server-first protocols) with plain reads that can be stopped, so that the
// upstream is handed back whole once the client's first bytes are judged.
// Nothing flows from the client to the upstream while it runs.
type banner struct {
	up, client net.Conn
	idle       time.Duration
	done       chan struct{}
	stopping   atomic.Bool
	n          int64 // bytes forwarded; read after done
	err        error // why it ended on its own (io.EOF: the server closed)
}

func startBanner(up, client net.Conn, idle time.Duration) *banner {
	b := &banner{up: up, client: client, idle: idle, done: make(chan struct{})}
	go b.run()
	return b
}

// run is the banner's goroutine.
func (b *banner) run() {
	defer close(b.done)
	buf := make([]byte, 4096)
	for {
		n, err := b.up.Read(buf)
		if n > 0 {
			b.client.SetWriteDeadline(time.Now().Add(b.idle))
			if _, werr := b.client.Write(buf[:n]); werr != nil {
				b.err = werr
				return
			}
			b.n += int64(n)
		}
		if err != nil {
			if b.stopping.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
				return
			}
			b.err = err
			return
		}
	}
}

// stop ends the banner and reports how many bytes it forwarded and why it
// had ended by itself, if it had (io.EOF when the server closed its side).
func (b *banner) stop() (int64, error) {
	b.stopping.Store(true)
	b.up.SetReadDeadline(time.Unix(1, 0))
	<-b.done
	b.up.SetReadDeadline(time.Time{})
	b.client.SetWriteDeadline(time.Time{})
	return b.n, b.err
}
