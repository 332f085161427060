// Command barerelay is the floor the end-to-end benchmarks measure flowgate
// against: a userspace relay in a process of its own that decides nothing.
// It runs as root inside the sandbox's namespace, where nftables sends
// another uid's TCP and DNS to it, and
//
//   - on its TCP port accepts a redirected connection, reads the original
//     destination, dials it and splices both ways (io.Copy between TCP
//     conns);
//   - on its UDP port forwards each datagram to the resolver and the answer
//     back, on a kept upstream socket.
//
// Whatever it adds to a connection or a query is what any proxy in its
// own process adds on the machine; flowgate's own cost is what it adds
// beyond that. It prints "ready" once it listens and runs until killed.
//
//	barerelay -tcp 127.0.0.1:15101 -udp 127.0.0.1:15102 -resolver 192.0.2.53:53
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"flowgate/gate/sni"
)

func main() {
	tcpAddr := flag.String("tcp", "127.0.0.1:15101", "TCP port for redirected connections")
	udpAddr := flag.String("udp", "127.0.0.1:15102", "UDP port for DNS queries")
	resolver := flag.String("resolver", "", "where DNS queries go (host:port)")
	flag.Parse()
	if *resolver == "" {
		fmt.Fprintln(os.Stderr, "barerelay: -resolver is required")
		os.Exit(2)
	}
	l, err := net.Listen("tcp", *tcpAddr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "barerelay:", err)
		os.Exit(1)
	}
	pc, err := net.ListenPacket("udp", *udpAddr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "barerelay:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	go serveTCP(l.(*net.TCPListener))
	serveUDP(pc, *resolver)
}

func serveTCP(l *net.TCPListener) {
	for {
		c, err := l.AcceptTCP()
		if err != nil {
			fmt.Fprintln(os.Stderr, "barerelay: accept:", err)
			os.Exit(1)
		}
		go relay(c)
	}
}

// relay splices one redirected connection to where it was going.
func relay(c *net.TCPConn) {
	defer c.Close()
	dst, err := sni.OriginalDst(c)
	if err != nil {
		return
	}
	conn, err := net.DialTimeout("tcp", dst.String(), 10*time.Second)
	if err != nil {
		return
	}
	up := conn.(*net.TCPConn)
	defer up.Close()
	done := make(chan struct{})
	go func() {
		io.Copy(up, c)
		up.CloseWrite()
		close(done)
	}()
	io.Copy(c, up)
	c.CloseWrite()
	<-done
}

// serveUDP answers each query with the resolver's answer.
func serveUDP(pc net.PacketConn, resolver string) {
	var idle sync.Pool // upstream sockets between queries
	buf := make([]byte, 65535)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			fmt.Fprintln(os.Stderr, "barerelay: read:", err)
			os.Exit(1)
		}
		q := append([]byte(nil), buf[:n]...)
		go func() {
			up, _ := idle.Get().(net.Conn)
			if up == nil {
				if up, err = net.Dial("udp", resolver); err != nil {
					return
				}
			}
			ans := make([]byte, 65535)
			up.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := up.Write(q); err != nil {
				up.Close()
				return
			}
			m, err := up.Read(ans)
			if err != nil {
				up.Close()
				return
			}
			pc.WriteTo(ans[:m], from)
			idle.Put(up)
		}()
	}
}
