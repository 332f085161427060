package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// ruleText renders one rule's expressions as nft prints them. It knows the
// expressions flowgate generates, and nft's habit of leaving out a
// protocol match that only makes a later field match possible (meta
// nfproto before ip daddr, meta l4proto before tcp dport). Anything else
// renders in brackets, so that a foreign rule never reads like one of
// ours.
func (r *Ruleset) ruleText(ru *rule, counters bool) string {
	d := decoder{r: r, counters: counters}
	for _, e := range ru.exprs {
		d.step(e)
	}
	d.flushImm()
	d.flushDeps()
	s := strings.Join(d.out, " ")
	if ru.comment != "" {
		if s != "" {
			s += " "
		}
		s += "comment " + strconv.Quote(ru.comment)
	}
	return s
}

// loadKind says what register 1 holds.
type loadKind int

const (
	loadNone loadKind = iota
	loadMeta
	loadPayload
	loadSocket
)

type regLoad struct {
	kind  loadKind
	meta  expr.MetaKey
	base  expr.PayloadBase
	off   uint32
	len   uint32
	mask  []byte
	sock  expr.SocketKey
	level uint32
}

// dep is a protocol match that nft prints only if nothing consumed it.
type dep struct {
	key   expr.MetaKey // MetaKeyNFPROTO or MetaKeyL4PROTO
	value byte
	text  string
}

type decoder struct {
	r        *Ruleset
	counters bool
	out      []string
	deps     []dep
	reg      regLoad
	imm      []byte // an immediate's data, waiting for a redir
}

func (d *decoder) emit(s string) {
	d.flushImm()
	d.flushDeps()
	d.out = append(d.out, s)
}

func (d *decoder) flushDeps() {
	for _, x := range d.deps {
		d.out = append(d.out, x.text)
	}
	d.deps = nil
}

func (d *decoder) flushImm() {
	if d.imm != nil {
		imm := d.imm
		d.imm = nil
		d.emit(fmt.Sprintf("[immediate 0x%x]", imm))
	}
}

// take removes and returns the last pending dependency on key.
func (d *decoder) take(key expr.MetaKey) (dep, bool) {
	for i := len(d.deps) - 1; i >= 0; i-- {
		if d.deps[i].key == key {
			x := d.deps[i]
			d.deps = append(d.deps[:i], d.deps[i+1:]...)
			return x, true
		}
	}
	return dep{}, false
}

func (d *decoder) step(e expr.Any) {
	switch e := e.(type) {
	case *expr.Meta:
		if e.SourceRegister || e.Register != 1 {
			d.emit(fmt.Sprintf("[meta %+v]", *e))
			return
		}
		d.reg = regLoad{kind: loadMeta, meta: e.Key}
	case *expr.Payload:
		if e.OperationType != expr.PayloadLoad || e.DestRegister != 1 {
			d.emit(fmt.Sprintf("[payload %+v]", *e))
			return
		}
		d.reg = regLoad{kind: loadPayload, base: e.Base, off: e.Offset, len: e.Len}
	case *expr.Socket:
		if e.Register != 1 {
			d.emit(fmt.Sprintf("[socket %+v]", *e))
			return
		}
		d.reg = regLoad{kind: loadSocket, sock: e.Key, level: e.Level}
	case *expr.Bitwise:
		if d.reg.kind != loadPayload || e.SourceRegister != 1 || e.DestRegister != 1 || !allZero(e.Xor) || d.reg.mask != nil {
			d.emit(fmt.Sprintf("[bitwise %+v]", *e))
			return
		}
		d.reg.mask = e.Mask
	case *expr.Cmp:
		d.cmp(e)
	case *expr.Lookup:
		if e.IsDestRegSet || e.SourceRegister != 1 {
			d.emit(fmt.Sprintf("[lookup @%s sreg %d dreg %d]", nameText(e.SetName), e.SourceRegister, e.DestRegister))
			return
		}
		op := ""
		if e.Invert {
			op = "!= "
		}
		reg := d.reg
		d.reg = regLoad{}
		d.emit(d.lhs(reg) + " " + op + "@" + nameText(e.SetName))
	case *expr.Counter:
		p, by := e.Packets, e.Bytes
		if !d.counters {
			p, by = 0, 0
		}
		d.emit(fmt.Sprintf("counter packets %d bytes %d", p, by))
	case *expr.Verdict:
		d.emit(verdictText(e))
	case *expr.Reject:
		d.reject(e)
	case *expr.Immediate:
		if e.Register == 1 {
			d.flushImm()
			d.imm = e.Data
			return
		}
		d.emit(fmt.Sprintf("[immediate %+v]", *e))
	case *expr.Redir:
		imm := d.imm
		d.imm = nil
		switch {
		case e.RegisterProtoMin == 1 && e.RegisterProtoMax == 1 && len(imm) == 2 && e.Flags == unix.NF_NAT_RANGE_PROTO_SPECIFIED:
			d.emit(fmt.Sprintf("redirect to :%d", binary.BigEndian.Uint16(imm)))
		case e.RegisterProtoMin == 0 && imm == nil && e.Flags == 0:
			d.emit("redirect")
		default:
			if imm != nil {
				d.emit(fmt.Sprintf("[immediate 0x%x]", imm))
			}
			d.emit(fmt.Sprintf("[redir %+v]", *e))
		}
	case *opaque:
		d.emit(fmt.Sprintf("[%s 0x%x]", nameText(e.name), e.data))
	default:
		d.emit(fmt.Sprintf("[%T %+v]", e, e))
	}
}

// cmp renders a comparison with what register 1 holds; an equality on
// meta nfproto or meta l4proto becomes a pending dependency.
func (d *decoder) cmp(e *expr.Cmp) {
	op, ok := cmpOps[e.Op]
	if !ok || e.Register != 1 {
		d.emit(fmt.Sprintf("[cmp %+v]", *e))
		return
	}
	if d.reg.kind == loadMeta && e.Op == expr.CmpOpEq && len(e.Data) == 1 {
		switch d.reg.meta {
		case expr.MetaKeyNFPROTO:
			d.deps = append(d.deps, dep{expr.MetaKeyNFPROTO, e.Data[0], "meta nfproto " + nfprotoName(e.Data[0])})
			return
		case expr.MetaKeyL4PROTO:
			d.deps = append(d.deps, dep{expr.MetaKeyL4PROTO, e.Data[0], "meta l4proto " + l4Name(e.Data[0])})
			return
		}
	}
	reg := d.reg
	d.reg = regLoad{}
	lhs := d.lhs(reg)
	d.emit(lhs + " " + op + d.value(reg, lhs, e.Data))
}

var cmpOps = map[expr.CmpOp]string{
	expr.CmpOpEq: "", expr.CmpOpNeq: "!= ", expr.CmpOpLt: "< ", expr.CmpOpLte: "<= ", expr.CmpOpGt: "> ", expr.CmpOpGte: ">= ",
}

// lhs names what register 1 holds, consuming the dependency that gives a
// header field its protocol.
func (d *decoder) lhs(reg regLoad) string {
	switch reg.kind {
	case loadMeta:
		return "meta " + metaName(reg.meta)
	case loadSocket:
		if reg.sock == expr.SocketKeyCgroupv2 {
			return fmt.Sprintf("socket cgroupv2 level %d", reg.level)
		}
		return fmt.Sprintf("[socket key %d]", reg.sock)
	case loadPayload:
		s := d.payloadName(reg)
		if reg.mask != nil && !strings.HasPrefix(s, "ip") {
			s += fmt.Sprintf(" & 0x%x", reg.mask)
		}
		return s
	}
	return "[nothing loaded]"
}

// payloadName names a header field: ip/ip6 daddr and saddr after their
// nfproto dependency, tcp/udp ports after their l4proto dependency, else
// nft's raw @nh/@th form.
func (d *decoder) payloadName(reg regLoad) string {
	switch reg.base {
	case expr.PayloadBaseNetworkHeader:
		full4 := reg.len <= 4 && (reg.off == 12 || reg.off == 16)
		full6 := reg.len <= 16 && (reg.off == 8 || reg.off == 24)
		if x, ok := d.peek(expr.MetaKeyNFPROTO); ok {
			switch {
			case x.value == unix.NFPROTO_IPV4 && full4:
				d.take(expr.MetaKeyNFPROTO)
				return "ip " + map[uint32]string{12: "saddr", 16: "daddr"}[reg.off]
			case x.value == unix.NFPROTO_IPV6 && full6:
				d.take(expr.MetaKeyNFPROTO)
				return "ip6 " + map[uint32]string{8: "saddr", 24: "daddr"}[reg.off]
			}
		}
		return fmt.Sprintf("@nh,%d,%d", reg.off*8, reg.len*8)
	case expr.PayloadBaseTransportHeader:
		if x, ok := d.peek(expr.MetaKeyL4PROTO); ok && (x.value == protoTCP || x.value == protoUDP) && reg.len == 2 && (reg.off == 0 || reg.off == 2) {
			d.take(expr.MetaKeyL4PROTO)
			return l4Name(x.value) + " " + map[uint32]string{0: "sport", 2: "dport"}[reg.off]
		}
		return fmt.Sprintf("@th,%d,%d", reg.off*8, reg.len*8)
	}
	return fmt.Sprintf("@ll,%d,%d", reg.off*8, reg.len*8)
}

func (d *decoder) peek(key expr.MetaKey) (dep, bool) {
	for i := len(d.deps) - 1; i >= 0; i-- {
		if d.deps[i].key == key {
			return d.deps[i], true
		}
	}
	return dep{}, false
}

// value renders compared data the way nft prints the loaded field's type.
func (d *decoder) value(reg regLoad, lhs string, data []byte) string {
	switch {
	case reg.kind == loadMeta && (reg.meta == expr.MetaKeySKUID || reg.meta == expr.MetaKeySKGID) && len(data) == 4:
		return strconv.FormatUint(uint64(binaryutil.NativeEndian.Uint32(data)), 10)
	case reg.kind == loadMeta && reg.meta == expr.MetaKeyNFPROTO && len(data) == 1:
		return nfprotoName(data[0])
	case reg.kind == loadMeta && reg.meta == expr.MetaKeyL4PROTO && len(data) == 1:
		return l4Name(data[0])
	case reg.kind == loadMeta && (reg.meta == expr.MetaKeyOIFNAME || reg.meta == expr.MetaKeyIIFNAME):
		return strconv.Quote(strings.TrimRight(string(data), "\x00"))
	case reg.kind == loadSocket && reg.sock == expr.SocketKeyCgroupv2 && len(data) == 8:
		return d.r.cgroupText(binaryutil.NativeEndian.Uint64(data))
	case strings.HasPrefix(lhs, "ip ") || strings.HasPrefix(lhs, "ip6 "):
		full := 4
		if strings.HasPrefix(lhs, "ip6 ") {
			full = 16
		}
		if v, ok := addrValue(data, reg.mask, full); ok {
			return v
		}
	case (strings.HasPrefix(lhs, "tcp ") || strings.HasPrefix(lhs, "udp ")) && len(data) == 2:
		return strconv.Itoa(int(binary.BigEndian.Uint16(data)))
	}
	return fmt.Sprintf("0x%x", data)
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

func nfprotoName(v byte) string {
	switch v {
	case unix.NFPROTO_IPV4:
		return "ipv4"
	case unix.NFPROTO_IPV6:
		return "ipv6"
	}
	return strconv.Itoa(int(v))
}

func l4Name(v byte) string {
	switch v {
	case protoTCP:
		return "tcp"
	case protoUDP:
		return "udp"
	case protoICMP:
		return "icmp"
	case protoICMPv6:
		return "ipv6-icmp"
	}
	return strconv.Itoa(int(v))
}

func metaName(k expr.MetaKey) string {
	switch k {
	case expr.MetaKeySKUID:
		return "skuid"
	case expr.MetaKeySKGID:
		return "skgid"
	case expr.MetaKeyMARK:
		return "mark"
	case expr.MetaKeyOIFNAME:
		return "oifname"
	case expr.MetaKeyOIF:
		return "oif"
	case expr.MetaKeyIIFNAME:
		return "iifname"
	case expr.MetaKeyNFPROTO:
		return "nfproto"
	case expr.MetaKeyL4PROTO:
		return "l4proto"
	}
	return fmt.Sprintf("key(%d)", k)
}

func verdictText(v *expr.Verdict) string {
	switch v.Kind {
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictContinue:
		return "continue"
	case expr.VerdictJump:
		return "jump " + nameText(v.Chain)
	case expr.VerdictGoto:
		return "goto " + nameText(v.Chain)
	}
	return fmt.Sprintf("[verdict %d %s]", v.Kind, nameText(v.Chain))
}

// nameText prints a chain or set name as nft does, quoted when it holds
// anything but letters, digits and . _ - / (the kernel takes any bytes): a
// name must never break a line of Text, Diff or an Event.
func nameText(s string) string {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-/", r)) {
			return strconv.Quote(s)
		}
	}
	if s == "" {
		return `""`
	}
	return s
}

var icmpxCodes = map[uint8]string{0: "no-route", 1: "port-unreachable", 2: "host-unreachable", 3: "admin-prohibited"}

func (d *decoder) reject(e *expr.Reject) {
	switch e.Type {
	case unix.NFT_REJECT_TCP_RST:
		d.emit("reject with tcp reset")
	case unix.NFT_REJECT_ICMPX_UNREACH:
		if e.Code == unix.NFT_REJECT_ICMPX_PORT_UNREACH {
			d.emit("reject")
			return
		}
		if n, ok := icmpxCodes[e.Code]; ok {
			d.emit("reject with icmpx " + n)
			return
		}
		d.emit(fmt.Sprintf("reject with icmpx %d", e.Code))
	default:
		fam := "icmp"
		if x, ok := d.take(expr.MetaKeyNFPROTO); ok && x.value == unix.NFPROTO_IPV6 {
			fam = "icmpv6"
		}
		d.emit(fmt.Sprintf("reject with %s %d", fam, e.Code))
	}
}

// cgroupText names a cgroup id as nft does: its quoted path, or the number
// when no cgroup has that id.
func (r *Ruleset) cgroupText(id uint64) string {
	if p, ok := r.cgroupNames[id]; ok {
		return strconv.Quote(p)
	}
	return strconv.FormatUint(id, 10)
}

// addrValue renders address bytes compared with a (possibly partial or
// masked) address field as an address or a prefix.
func addrValue(data, mask []byte, full int) (string, bool) {
	if len(data) > full || full != 4 && full != 16 {
		return "", false
	}
	b := make([]byte, full)
	copy(b, data)
	a, _ := netip.AddrFromSlice(b)
	bits := len(data) * 8
	if mask != nil {
		if len(mask) != len(data) {
			return "", false
		}
		bits = 0
		for i := 0; i < len(mask)*8; i++ {
			if mask[i/8]&(0x80>>(i%8)) == 0 {
				break
			}
			bits++
		}
		for i := bits; i < len(mask)*8; i++ {
			if mask[i/8]&(0x80>>(i%8)) != 0 {
				return "", false // not a prefix mask
			}
		}
	}
	if bits == full*8 {
		return addrText(a), true
	}
	return addrText(a) + "/" + strconv.Itoa(bits), true
}
