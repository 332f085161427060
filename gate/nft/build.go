package nft

import (
	"net/netip"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Layer-4 protocol numbers the rules name.
const (
	protoICMP   = unix.IPPROTO_ICMP
	protoTCP    = unix.IPPROTO_TCP
	protoUDP    = unix.IPPROTO_UDP
	protoICMPv6 = unix.IPPROTO_ICMPV6
)

// Offsets of the destination address in the IPv4 and IPv6 headers.
const (
	ip4DaddrOff = 16
	ip6DaddrOff = 24
)

// rb builds the expressions of one rule in the order nft would generate
// them for the same rule text, so that `nft list` prints what Text prints.
type rb struct {
	exprs   []expr.Any
	comment string
}

func newRule(comment string) *rb { return &rb{comment: comment} }

func (b *rb) add(e ...expr.Any) *rb {
	b.exprs = append(b.exprs, e...)
	return b
}

func (b *rb) rule() *rule { return &rule{exprs: b.exprs, comment: b.comment} }

func load(k expr.MetaKey) *expr.Meta { return &expr.Meta{Key: k, Register: 1} }

func eq(data []byte) *expr.Cmp { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data} }

// skuid: meta skuid UID (the uid in host byte order).
func (b *rb) skuid(uid uint32) *rb {
	return b.add(load(expr.MetaKeySKUID), eq(binaryutil.NativeEndian.PutUint32(uid)))
}

// cgroupv2: socket cgroupv2 level L "PATH". The id is a placeholder that
// Apply replaces with the cgroup's id.
func (b *rb) cgroupv2(level uint32) *rb {
	return b.add(&expr.Socket{Key: expr.SocketKeyCgroupv2, Level: level, Register: 1},
		eq(binaryutil.NativeEndian.PutUint64(0)))
}

// nfproto: meta nfproto ipv4|ipv6, the dependency of any address match in
// an inet table.
func (b *rb) nfproto(v6 bool) *rb {
	p := byte(unix.NFPROTO_IPV4)
	if v6 {
		p = unix.NFPROTO_IPV6
	}
	return b.add(load(expr.MetaKeyNFPROTO), eq([]byte{p}))
}

// l4proto: meta l4proto P.
func (b *rb) l4proto(p byte) *rb {
	return b.add(load(expr.MetaKeyL4PROTO), eq([]byte{p}))
}

// dport: tcp|udp dport PORT.
func (b *rb) dport(p byte, port uint16) *rb {
	return b.l4proto(p).add(
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		eq(binaryutil.BigEndian.PutUint16(port)))
}

func daddr(v6 bool) *expr.Payload {
	if v6 {
		return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ip6DaddrOff, Len: 16}
	}
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ip4DaddrOff, Len: 4}
}

// daddrIn: ip|ip6 daddr @SET.
func (b *rb) daddrIn(set string, v6 bool) *rb {
	return b.nfproto(v6).add(daddr(v6), &expr.Lookup{SourceRegister: 1, SetName: set})
}

// daddrPrefix: ip|ip6 daddr PREFIX. A prefix on a byte boundary loads only
// its bytes, as nft does; others are masked.
func (b *rb) daddrPrefix(p netip.Prefix) *rb {
	p = p.Masked()
	v6 := p.Addr().Is6()
	b.nfproto(v6)
	addr := p.Addr().AsSlice()
	pl := daddr(v6)
	if p.Bits() == p.Addr().BitLen() {
		return b.add(pl, eq(addr))
	}
	if p.Bits()%8 == 0 {
		pl.Len = uint32(p.Bits() / 8)
		return b.add(pl, eq(addr[:pl.Len]))
	}
	mask := make([]byte, len(addr))
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return b.add(pl, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(addr)), Mask: mask, Xor: make([]byte, len(addr))}, eq(addr))
}

func (b *rb) counter() *rb { return b.add(&expr.Counter{}) }

func (b *rb) accept() *rb { return b.add(&expr.Verdict{Kind: expr.VerdictAccept}) }

func (b *rb) ret() *rb { return b.add(&expr.Verdict{Kind: expr.VerdictReturn}) }

func (b *rb) jump(chain string) *rb {
	return b.add(&expr.Verdict{Kind: expr.VerdictJump, Chain: chain})
}

// rejectTCPReset: reject with tcp reset (needs a tcp match before it).
func (b *rb) rejectTCPReset() *rb {
	return b.add(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
}

// rejectICMPX: reject with icmpx CODE, the family-independent ICMP error.
func (b *rb) rejectICMPX(code uint8) *rb {
	return b.add(&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: code})
}

// redirect: redirect to :PORT, to the same port on 127.0.0.1 or ::1.
func (b *rb) redirect(port uint16) *rb {
	return b.add(&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1, RegisterProtoMax: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED})
}
