// Command probe is the nft tests' traffic generator: run inside a test
// namespace as some uid, it tries each destination it is given and prints
// one line per try, "PROBE RESULT [DETAIL] TIME", where RESULT is ok,
// refused, eperm, eacces, unreachable, timeout or error. It only sends
// traffic where its arguments say, which the tests point at namespaces
// they made.
//
//	tcp:HOST:PORT  connect and read one line
//	udp:HOST:PORT  send a datagram on a connected socket and read a reply
//	ping:HOST      one ICMP echo over a ping socket (SOCK_DGRAM)
package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

const wait = 2 * time.Second

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe tcp:HOST:PORT|udp:HOST:PORT|ping:HOST ...")
		os.Exit(2)
	}
	for _, p := range os.Args[1:] {
		start := time.Now()
		res := run(p)
		fmt.Printf("%s %s %dms\n", p, res, time.Since(start).Milliseconds())
	}
}

func run(p string) string {
	kind, target, ok := strings.Cut(p, ":")
	if !ok {
		return "error bad-probe"
	}
	switch kind {
	case "tcp":
		return tcp(target)
	case "udp":
		return udp(target)
	case "ping":
		return ping(target)
	}
	return "error bad-probe"
}

func tcp(addr string) string {
	c, err := net.DialTimeout("tcp", addr, wait)
	if err != nil {
		return classify(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(wait))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return classify(err)
	}
	return "ok " + strings.ReplaceAll(strings.TrimSpace(line), " ", "_")
}

func udp(addr string) string {
	c, err := net.DialTimeout("udp", addr, wait)
	if err != nil {
		return classify(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return classify(err)
	}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		return classify(err)
	}
	return "ok " + strings.ReplaceAll(strings.TrimSpace(string(buf[:n])), " ", "_")
}

func ping(host string) string {
	ip := net.ParseIP(host)
	if ip == nil {
		return "error bad-address"
	}
	network, laddr, proto := "udp4", "0.0.0.0", 1
	var typ icmp.Type = ipv4.ICMPTypeEcho
	if ip.To4() == nil {
		network, laddr, proto, typ = "udp6", "::", 58, ipv6.ICMPTypeEchoRequest
	}
	c, err := icmp.ListenPacket(network, laddr)
	if err != nil {
		return classify(err)
	}
	defer c.Close()
	msg, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: os.Getpid() & 0xffff, Seq: 1, Data: []byte("probe")}}).Marshal(nil)
	if err != nil {
		return "error " + err.Error()
	}
	if _, err := c.WriteTo(msg, &net.UDPAddr{IP: ip}); err != nil {
		return classify(err)
	}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 1500)
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return classify(err)
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil {
			continue
		}
		if m.Type == ipv4.ICMPTypeEchoReply || m.Type == ipv6.ICMPTypeEchoReply {
			return "ok echo-reply"
		}
	}
}

func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.EPERM):
		return "eperm"
	case errors.Is(err, syscall.EACCES):
		return "eacces"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "error " + strings.ReplaceAll(err.Error(), " ", "_")
}
