package sni

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSoOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/
// ip6_tables.h, which x/sys does not define.
const ip6tSoOriginalDst = 80

// OriginalDst returns where a connection redirected by nftables was going:
// SO_ORIGINAL_DST for IPv4, IP6T_SO_ORIGINAL_DST for IPv6, chosen by the
// family of the connection's local address. A connection that was not
// redirected returns its own local address, which the caller treats as a
// loop.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	local, ok := addrPort(c.LocalAddr())
	if !ok {
		return netip.AddrPort{}, errors.New("reading original destination: connection has no TCP local address")
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("reading original destination: %w", err)
	}
	var dst netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		if local.Addr().Is4() {
			dst, serr = originalDst4(int(fd))
		} else {
			dst, serr = originalDst6(int(fd))
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("reading original destination: %w", err)
	}
	return dst, nil
}

// originalDst4 reads a sockaddr_in through the only x/sys getter of the
// right size: port in bytes 2-3, address in bytes 4-7.
func originalDst4(fd int) (netip.AddrPort, error) {
	m, err := unix.GetsockoptIPv6Mreq(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", err)
	}
	port := binary.BigEndian.Uint16(m.Multiaddr[2:4])
	addr := netip.AddrFrom4([4]byte(m.Multiaddr[4:8]))
	return netip.AddrPortFrom(addr, port), nil
}

// originalDst6 reads a sockaddr_in6 with a raw getsockopt.
func originalDst6(fd int) (netip.AddrPort, error) {
	var sa unix.RawSockaddrInet6
	size := uint32(unix.SizeofSockaddrInet6)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_IPV6, ip6tSoOriginalDst,
		uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&size)), 0)
	if errno != 0 {
		return netip.AddrPort{}, fmt.Errorf("IP6T_SO_ORIGINAL_DST: %w", errno)
	}
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	addr := netip.AddrFrom16(sa.Addr).Unmap()
	return netip.AddrPortFrom(addr, port), nil
}
