package nft

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// opaque is an expression this package does not render field by field:
// its name and raw attributes. google/nftables silently drops expressions
// it cannot parse (socket, tproxy, dup, fwd, ...), which would let a
// rule read like one of ours while it does something else; reading rules
// here keeps every expression. The embedded interface is never called.
type opaque struct {
	expr.Any
	name string
	data []byte
}

// newExpr returns an empty expression of a type that ruleText renders, or
// nil.
func newExpr(name string) expr.Any {
	switch name {
	case "meta":
		return &expr.Meta{}
	case "cmp":
		return &expr.Cmp{}
	case "payload":
		return &expr.Payload{}
	case "lookup":
		return &expr.Lookup{}
	case "immediate":
		return &expr.Immediate{}
	case "counter":
		return &expr.Counter{}
	case "reject":
		return &expr.Reject{}
	case "redir":
		return &expr.Redir{}
	case "bitwise":
		return &expr.Bitwise{}
	case "socket":
		return &expr.Socket{}
	}
	return nil
}

// dumpRules reads every rule of table inet flowgate in one netlink dump,
// by chain, in order.
func dumpRules(ns netns.NsHandle) (map[string][]*rule, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns)})
	if err != nil {
		return nil, fmt.Errorf("opening netlink socket: %w", err)
	}
	defer func() { go closeNetlink(conn) }() // see closeLater
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_RULE_TABLE, Data: []byte(TableName + "\x00")}})
	if err != nil {
		return nil, err
	}
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("dumping rules: %w", err)
	}
	out := make(map[string][]*rule)
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		chain, ru, err := parseRule(m.Data[4:])
		if err != nil {
			return nil, fmt.Errorf("reading a rule: %w", err)
		}
		out[chain] = append(out[chain], ru)
	}
	return out, nil
}

func closeNetlink(c *netlink.Conn) { c.Close() }

// commentOf reads the comment from a rule's user data: type-length-value
// records, the comment NUL-terminated. userdata.GetString panics on a
// record that claims more bytes than there are, which anyone who can add a
// rule can write; here a malformed record ends the search.
func commentOf(udata []byte) string {
	for len(udata) >= 2 {
		typ, n := udata[0], int(udata[1])
		if len(udata) < 2+n {
			return ""
		}
		if userdata.Type(typ) == userdata.TypeComment {
			return cString(udata[2 : 2+n])
		}
		udata = udata[2+n:]
	}
	return ""
}

// parseRule decodes one rule message's attributes.
func parseRule(b []byte) (string, *rule, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return "", nil, err
	}
	ad.ByteOrder = binary.BigEndian
	var chain string
	ru := &rule{}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_RULE_CHAIN:
			chain = ad.String()
		case unix.NFTA_RULE_HANDLE:
			ru.handle = ad.Uint64()
		case unix.NFTA_RULE_USERDATA:
			ru.comment = commentOf(ad.Bytes())
		case unix.NFTA_RULE_EXPRESSIONS:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					e, err := parseExpr(nad.Bytes())
					if err != nil {
						return err
					}
					ru.exprs = append(ru.exprs, e)
				}
				return nil
			})
		}
	}
	return chain, ru, ad.Err()
}

// parseExpr decodes one NFTA_LIST_ELEM of a rule's expressions.
func parseExpr(b []byte) (expr.Any, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	var name string
	var data []byte
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_EXPR_NAME:
			name = ad.String()
		case unix.NFTA_EXPR_DATA:
			data = ad.Bytes()
		}
	}
	if err := ad.Err(); err != nil {
		return nil, err
	}
	e := newExpr(name)
	if e == nil {
		return &opaque{name: name, data: data}, nil
	}
	if err := unmarshal(data, e); err != nil {
		return &opaque{name: name, data: data}, nil
	}
	// A verdict is an immediate into the verdict register.
	if imm, ok := e.(*expr.Immediate); ok && imm.Register == unix.NFT_REG_VERDICT && len(imm.Data) == 0 {
		v := &expr.Verdict{}
		if err := unmarshal(data, v); err != nil {
			return &opaque{name: name, data: data}, nil
		}
		return v, nil
	}
	return e, nil
}

// unmarshal runs google/nftables' decoder, which indexes attributes without
// checking their length: a malformed expression is an error here, not a
// panic.
func unmarshal(data []byte, e expr.Any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed expression: %v", r)
		}
	}()
	return expr.Unmarshal(unix.NFPROTO_INET, data, e)
}
