package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/miekg/dns"
)

// benchTry returns one try of a timing mode. For handshake it first
// resolves the server name once, untimed, as an agent would before
// connecting: the address is then known to flowgate, and the timed tries
// measure connect, handshake and one request only.
func benchTry(mode, target, sni, path, server string, tcp bool) func() result {
	switch mode {
	case "bulk":
		cl := httpClient(false, true)
		return func() result { return bulkGet(cl, target) }
	case "handshake":
		if _, err := netip.ParseAddr(sni); sni != "" && err != nil {
			if _, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", sni); err != nil {
				fmt.Fprintf(os.Stderr, "resolving %s: %v\n", sni, err)
				os.Exit(1)
			}
		}
		return func() result { return tlsGet(target, sni, "", path, "", "") }
	case "roundtrip":
		return roundTrips(target)
	default:
		return dnsTries(server, tcp, target)
	}
}

// dnsTries returns a try that asks for name's A record on one connection
// (UDP or TCP) kept for every try, as a stub with a long-lived socket
// would: each try is one query and its answer. One socket keeps each path
// of the benchmark to one conntrack flow, so no path's stale flow can
// capture another's queries.
func dnsTries(server string, tcp bool, name string) func() result {
	network := "udp"
	if tcp {
		network = "tcp"
	}
	c, err := net.DialTimeout(network, server, timeout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "connecting to %s: %v\n", server, err)
		os.Exit(1)
	}
	conn := &dns.Conn{Conn: c}
	cl := &dns.Client{Net: network, Timeout: timeout}
	return func() result {
		r := result{Target: name + " A"}
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		m.SetEdns0(1232, false)
		resp, _, err := cl.ExchangeWithConn(m, conn)
		if err != nil {
			return fail(r, err)
		}
		r.OK = resp.Rcode == dns.RcodeSuccess && len(resp.Answer) > 0
		r.Rcode = dns.RcodeToString[resp.Rcode]
		if !r.OK {
			r.Kind, r.Err = "error", "no answer: "+r.Rcode
		}
		return r
	}
}

// roundTrips opens one TCP connection to an echo server and returns a try
// that sends a short line on it and reads the echo: each try is a round
// trip on an established stream, without connect or handshake.
func roundTrips(target string) func() result {
	c, err := net.DialTimeout("tcp", target, timeout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "connecting to %s: %v\n", target, err)
		os.Exit(1)
	}
	const line = "flowgate round trip\n"
	buf := make([]byte, len(line))
	return func() result {
		r := result{Target: target}
		c.SetDeadline(time.Now().Add(timeout))
		if _, err := io.WriteString(c, line); err != nil {
			return fail(r, err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return fail(r, err)
		}
		r.OK = string(buf) == line
		if !r.OK {
			r.Kind, r.Err = "error", "echo mismatch"
		}
		return r
	}
}

// bulkGet downloads u on a fresh connection and discards the body,
// counting its bytes.
func bulkGet(cl *http.Client, u string) result {
	r := result{Target: u}
	resp, err := cl.Get(u)
	if err != nil {
		return fail(r, err)
	}
	defer resp.Body.Close()
	r.Status = resp.StatusCode
	r.Bytes, err = io.Copy(io.Discard, resp.Body)
	if err != nil {
		return fail(r, err)
	}
	r.OK = resp.StatusCode == http.StatusOK && (resp.ContentLength < 0 || r.Bytes == resp.ContentLength)
	if !r.OK {
		r.Kind, r.Err = "error", fmt.Sprintf("status %d, %d of %d bytes", resp.StatusCode, r.Bytes, resp.ContentLength)
	}
	return r
}

// summarise is the last line of a timing mode: how many tries succeeded,
// their latency percentiles, and the throughput over all of them.
func summarise(rs []result) result {
	s := result{Mode: "summary", OK: true}
	var us []int64
	var bytes, total int64
	for _, r := range rs {
		if !r.OK {
			s.OK = false
			continue
		}
		us = append(us, r.Us)
		bytes += r.Bytes
		total += r.Us
	}
	s.N = len(us)
	if len(us) == 0 {
		return s
	}
	slices.Sort(us)
	pct := func(p int) int64 { return us[min(len(us)-1, len(us)*p/100)] }
	s.P50, s.P90, s.P99 = pct(50), pct(90), pct(99)
	if bytes > 0 && total > 0 {
		s.MBps = float64(bytes) / float64(total) // bytes per µs is MB/s
	}
	return s
}
