package runtime

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The host table's chains. Each has policy accept and holds only rules
// that match a sandbox's own link or subnet, so traffic that is not a
// sandbox's passes through untouched.
const (
	chainPostrouting = "postrouting" // nat: masquerade what a sandbox sends out
	chainForward     = "forward"     // filter: nothing new enters a sandbox
	chainInput       = "input"       // filter: a sandbox cannot reach the host itself
)

// commentPrefix starts every rule comment: "flowgate sandbox=<name>: why".
const commentPrefix = "flowgate sandbox="

func hostTable() *nftables.Table {
	return &nftables.Table{Name: HostTable, Family: nftables.TableFamilyINet}
}

func hostChains(t *nftables.Table) map[string]*nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return map[string]*nftables.Chain{
		chainPostrouting: {Name: chainPostrouting, Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept},
		chainForward:     {Name: chainForward, Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept},
		chainInput:       {Name: chainInput, Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept},
	}
}

// chainOrder is the order chains are created and read in.
var chainOrder = []string{chainPostrouting, chainForward, chainInput}

func nftConn(ns netns.NsHandle) (*nftables.Conn, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return nil, fmt.Errorf("opening nftables in uplink netns: %w", err)
	}
	return c, nil
}

// comment builds a rule's UserData naming its sandbox and purpose, in the
// form `nft list` prints as comment "...".
func comment(name, why string) []byte {
	return userdata.AppendString(nil, userdata.TypeComment, commentPrefix+name+": "+why)
}

// ruleOwner returns the sandbox a rule's comment names, or "". Anyone
// with root can write a rule's UserData, so it is parsed here with bounds
// checks (userdata.Get trusts the length bytes).
func ruleOwner(r *nftables.Rule) string {
	c, ok := commentOf(r.UserData)
	if !ok || !strings.HasPrefix(c, commentPrefix) {
		return ""
	}
	c = strings.TrimPrefix(c, commentPrefix)
	name, _, ok := strings.Cut(c, ":")
	if !ok || validateName(name) != nil {
		return ""
	}
	return name
}

// commentOf returns the comment TLV of nftables rule UserData (type,
// length, value; the value NUL-terminated).
func commentOf(ud []byte) (string, bool) {
	for len(ud) >= 2 {
		typ, n := ud[0], int(ud[1])
		if len(ud) < 2+n {
			return "", false
		}
		if userdata.Type(typ) == userdata.TypeComment {
			return strings.TrimRight(string(ud[2:2+n]), "\x00"), true
		}
		ud = ud[2+n:]
	}
	return "", false
}

// hostRule is one rule to add: chain, expressions, purpose.
type hostRule struct {
	chain string
	why   string
	exprs []expr.Any
}

// sandboxRules builds a sandbox's rules. localDNS are resolver addresses
// that belong to the uplink namespace itself, which the sandbox must
// still reach on port 53.
func sandboxRules(st *state, localDNS []netip.Addr) []hostRule {
	l := st.HostLink
	var rs []hostRule
	add := func(chain, why string, e ...[]expr.Any) {
		var all []expr.Any
		for _, x := range e {
			all = append(all, x...)
		}
		rs = append(rs, hostRule{chain, why, all})
	}
	add(chainPostrouting, "masquerade IPv4", nfproto(unix.NFPROTO_IPV4), addrMatch(st.Net4, false, expr.CmpOpEq), ifname(expr.MetaKeyOIFNAME, expr.CmpOpNeq, l), masq())
	if st.IPv6 {
		add(chainPostrouting, "masquerade IPv6", nfproto(unix.NFPROTO_IPV6), addrMatch(st.Net6, false, expr.CmpOpEq), ifname(expr.MetaKeyOIFNAME, expr.CmpOpNeq, l), masq())
	}
	add(chainForward, "replies into the sandbox", ifname(expr.MetaKeyOIFNAME, expr.CmpOpEq, l), ctReply(), verdict(expr.VerdictAccept))
	add(chainForward, "nothing else enters the sandbox", ifname(expr.MetaKeyOIFNAME, expr.CmpOpEq, l), verdict(expr.VerdictDrop))
	add(chainForward, "no spoofed IPv4 source", ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, l), nfproto(unix.NFPROTO_IPV4), addrMatch(st.Net4, false, expr.CmpOpNeq), verdict(expr.VerdictDrop))
	if st.IPv6 {
		add(chainForward, "no spoofed IPv6 source", ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, l), nfproto(unix.NFPROTO_IPV6), addrMatch(st.Net6, false, expr.CmpOpNeq), verdict(expr.VerdictDrop))
	} else {
		add(chainForward, "no IPv6 out of the sandbox", ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, l), nfproto(unix.NFPROTO_IPV6), verdict(expr.VerdictDrop))
	}
	if st.IPv6 {
		for _, t := range []byte{135, 136} { // neighbour solicitation, advertisement
			add(chainInput, "IPv6 neighbour discovery", ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, l), l4proto(unix.IPPROTO_ICMPV6), icmpv6Type(t), verdict(expr.VerdictAccept))
		}
	}
	for _, a := range localDNS {
		fam, p := byte(unix.NFPROTO_IPV4), netip.PrefixFrom(a, 32)
		if a.Is6() {
			fam, p = unix.NFPROTO_IPV6, netip.PrefixFrom(a, 128)
		}
		if a.Is6() && !st.IPv6 {
			continue
		}
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			add(chainInput, "DNS to the host's resolver "+a.String(), ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, l), nfproto(fam), addrMatch(p, true, expr.CmpOpEq), l4proto(proto), dport(53), verdict(expr.VerdictAccept))
		}
	}
	add(chainInput, "the sandbox cannot reach the host", ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, l), verdict(expr.VerdictDrop))
	return rs
}

// addHostRules creates the table and chains if needed and puts the
// sandbox's rules in, replacing any it had, in one batch: applying it
// twice leaves the same ruleset.
func addHostRules(uplink netns.NsHandle, st *state, localDNS []netip.Addr) error {
	c, err := nftConn(uplink)
	if err != nil {
		return err
	}
	old, _, err := hostRulesByOwner(c)
	if err != nil {
		return err
	}
	for _, r := range old[st.Name] {
		if err := c.DelRule(r); err != nil {
			return fmt.Errorf("replacing rules of %s: %w", st.Name, err)
		}
	}
	t := c.AddTable(hostTable())
	chains := hostChains(t)
	for _, name := range chainOrder {
		c.AddChain(chains[name])
	}
	for _, r := range sandboxRules(st, localDNS) {
		c.AddRule(&nftables.Rule{Table: t, Chain: chains[r.chain], Exprs: r.exprs, UserData: comment(st.Name, r.why)})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("adding rules for %s to inet %s: %w", st.Name, HostTable, err)
	}
	return nil
}

// hostTableExists reports whether the uplink has the host table.
func hostTableExists(c *nftables.Conn) (bool, error) {
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("listing nftables tables: %w", err)
	}
	for _, t := range ts {
		if t.Name == HostTable {
			return true, nil
		}
	}
	return false, nil
}

// hostRulesByOwner lists the host table's rules per sandbox name; rules
// without a flowgate comment are listed under "".
func hostRulesByOwner(c *nftables.Conn) (map[string][]*nftables.Rule, bool, error) {
	ok, err := hostTableExists(c)
	if err != nil || !ok {
		return nil, false, err
	}
	t := hostTable()
	out := make(map[string][]*nftables.Rule)
	for _, name := range chainOrder {
		ch := &nftables.Chain{Name: name, Table: t}
		rs, err := c.GetRules(t, ch)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return nil, true, fmt.Errorf("listing rules of inet %s %s: %w", HostTable, name, err)
		}
		for _, r := range rs {
			r.Table, r.Chain = t, ch
			o := ruleOwner(r)
			out[o] = append(out[o], r)
		}
	}
	return out, true, nil
}

// removeHostRules deletes the rules named after the sandboxes in names
// and, when no rule remains, the table. It returns how many rules it
// removed and whether it removed the table.
func removeHostRules(uplink netns.NsHandle, names ...string) (int, bool, error) {
	c, err := nftConn(uplink)
	if err != nil {
		return 0, false, err
	}
	byOwner, exists, err := hostRulesByOwner(c)
	if err != nil || !exists {
		return 0, false, err
	}
	n := 0
	for _, name := range names {
		for _, r := range byOwner[name] {
			if err := c.DelRule(r); err != nil {
				return 0, false, fmt.Errorf("removing rule of %s: %w", name, err)
			}
			n++
		}
		delete(byOwner, name)
	}
	dropTable := true
	for _, rs := range byOwner {
		if len(rs) > 0 {
			dropTable = false
		}
	}
	if dropTable {
		c.DelTable(hostTable())
	}
	if n == 0 && !dropTable {
		return 0, false, nil
	}
	if err := c.Flush(); err != nil {
		return 0, false, fmt.Errorf("removing rules of %s from inet %s: %w", strings.Join(names, ", "), HostTable, err)
	}
	return n, dropTable, nil
}

// Expression helpers. Register 1 throughout.

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func ifname(key expr.MetaKey, op expr.CmpOp, name string) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: b},
	}
}

// addrMatch compares the packet's source (or, with dst, destination)
// address with prefix p. The caller has matched the family.
func addrMatch(p netip.Prefix, dst bool, op expr.CmpOp) []expr.Any {
	off, n := uint32(12), uint32(4)
	if p.Addr().Is6() {
		off, n = 8, 16
	}
	if dst {
		off += n
	}
	mask := make([]byte, n)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: op, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func icmpv6Type(t byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{t}},
	}
}

// ctReply matches ct state established,related.
func ctReply() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func masq() []expr.Any { return []expr.Any{&expr.Masq{}} }

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }
