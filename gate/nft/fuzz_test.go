package nft

import (
	"context"
	"strings"
	"testing"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// ruleMessage encodes a rule as the kernel sends it in a rule dump, after
// the nfgenmsg header.
func ruleMessage(tb testing.TB, chain string, ru *rule) []byte {
	tb.Helper()
	var list []netlink.Attribute
	for _, e := range ru.exprs {
		b, err := expr.Marshal(unix.NFPROTO_INET, e)
		if err != nil {
			tb.Fatal(err)
		}
		list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: b})
	}
	exprs, err := netlink.MarshalAttributes(list)
	if err != nil {
		tb.Fatal(err)
	}
	b, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: []byte(TableName + "\x00")},
		{Type: unix.NFTA_RULE_CHAIN, Data: []byte(chain + "\x00")},
		{Type: unix.NFTA_RULE_HANDLE, Data: binaryutil.BigEndian.PutUint64(ru.handle)},
		{Type: unix.NLA_F_NESTED | unix.NFTA_RULE_EXPRESSIONS, Data: exprs},
		{Type: unix.NFTA_RULE_USERDATA, Data: userdata.AppendString(nil, userdata.TypeComment, ru.comment)},
	})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestParseRuleRoundTrip reads back every compiled rule from its netlink
// encoding and renders it the same.
func TestParseRuleRoundTrip(t *testing.T) {
	for name, spec := range specs {
		r := compile(t, spec, Params{Sandbox: "rt", UID: 1000})
		for _, ch := range r.chains {
			for _, ru := range ch.rules {
				ru := &rule{exprs: kernelExprs(ru.exprs, map[string]uint32{}, 0), comment: ru.comment, handle: 7}
				chain, back, err := parseRule(ruleMessage(t, ch.name, ru))
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if chain != ch.name || back.handle != 7 || back.comment != ru.comment {
					t.Errorf("%s: chain %q handle %d comment %q", name, chain, back.handle, back.comment)
				}
				if got, want := r.ruleText(back, true), r.ruleText(ru, true); got != want {
					t.Errorf("%s: read back %q, want %q", name, got, want)
				}
			}
		}
	}
	// An expression rendered field by field elsewhere is kept whole here.
	ru := &rule{exprs: []expr.Any{&expr.Meta{Key: expr.MetaKeySKUID, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{0xe8, 3, 0, 0}},
		&expr.Rt{Register: 1, Key: expr.RtTCPMSS}, &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: "agent"}}}
	_, back, err := parseRule(ruleMessage(t, ChainFilter, ru))
	if err != nil {
		t.Fatal(err)
	}
	if got := (&Ruleset{}).ruleText(back, false); !strings.HasPrefix(got, "meta skuid 1000 [rt 0x") || !strings.HasSuffix(got, "counter packets 0 bytes 0 jump agent") {
		t.Errorf("rule with rt: %q", got)
	}
}

// FuzzRuleText feeds arbitrary rule messages (as a root process in the
// namespace could shape them) to the parser and the renderer: no panic,
// the same text twice, and always one line.
func FuzzRuleText(f *testing.F) {
	for _, spec := range specs {
		r := compile(f, spec, Params{Sandbox: "fz", UID: 1000})
		for _, ch := range r.chains {
			for _, ru := range ch.rules {
				f.Add(ruleMessage(f, ch.name, &rule{exprs: kernelExprs(ru.exprs, map[string]uint32{}, 0), comment: ru.comment}))
			}
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, ru, err := parseRule(b)
		if err != nil {
			return
		}
		r := &Ruleset{present: true}
		a, c := r.ruleText(ru, true), r.ruleText(ru, true)
		if a != c {
			t.Fatalf("rendered twice differently: %q, %q", a, c)
		}
		if strings.ContainsAny(a, "\n\r") {
			t.Fatalf("rule text breaks a line: %q", a)
		}
	})
}

// FuzzWatchMessage feeds arbitrary nftables notifications to the watch:
// no panic, and nothing reported for a message that is not a NEWGEN.
func FuzzWatchMessage(f *testing.F) {
	r := compile(f, specs["denylist"], Params{Sandbox: "fz", UID: 1000})
	ru := r.chain(ChainAgent).rules[0]
	msg := ruleMessage(f, ChainAgent, &rule{exprs: kernelExprs(ru.exprs, map[string]uint32{}, 0), comment: ru.comment, handle: 3})
	f.Add(uint16(unix.NFT_MSG_DELRULE), append([]byte{unix.NFPROTO_INET, 0, 0, 0}, msg...))
	gen, _ := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_GEN_ID, Data: binaryutil.BigEndian.PutUint32(9)},
		{Type: unix.NFTA_GEN_PROC_PID, Data: binaryutil.BigEndian.PutUint32(1234)},
		{Type: unix.NFTA_GEN_PROC_NAME, Data: []byte("nft\x00")},
	})
	f.Add(uint16(unix.NFT_MSG_NEWGEN), append([]byte{0, 0, 0, 0}, gen...))
	f.Fuzz(func(t *testing.T, typ uint16, data []byte) {
		var events []Event
		w := &watcher{ctx: context.Background(), report: func(e Event) { events = append(events, e) }}
		w.handle(netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ&0xff), PID: 77}, Data: data})
		if typ&0xff != unix.NFT_MSG_NEWGEN && len(events) != 0 {
			t.Fatalf("reported without a NEWGEN: %v", events)
		}
		w.handle(netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWGEN)}, Data: []byte{0, 0, 0, 0}})
		for _, e := range events {
			if s := e.String(); strings.ContainsAny(s, "\n\r") {
				t.Fatalf("event text breaks a line: %q", s)
			}
		}
	})
}
