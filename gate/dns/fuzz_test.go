package dns

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"

	"flowgate/gate"

	"github.com/miekg/dns"
)

// FuzzHandle feeds raw bytes to the message handler, with the fake
// resolver upstream (no network). Whatever arrives, the handler writes
// exactly one record, and any reply it makes is a well-formed response with
// the client's ID, fits the transport, carries no ECH parameter or address
// hint, and holds no address that was not learned first.
func FuzzHandle(f *testing.F) {
	u := newUnit(f, policy(f, gate.Denylist, "blocked.test", "*.wild.test"), nil)
	f.Fuzz(func(t *testing.T, raw []byte, tcp bool) {
		if tcp && len(raw) > dns.MaxMsgSize {
			return // a TCP frame cannot hold it
		}
		before := len(u.rec.all())
		out := u.srv.handle(context.Background(), raw, tcp)
		if n := len(u.rec.all()) - before; n != 1 {
			t.Fatalf("%d records for one message, want 1", n)
		}
		query := len(raw) >= headerLen && raw[2]&0x80 == 0
		if out == nil {
			if query {
				t.Fatalf("no reply to a message with a query header")
			}
			return
		}
		if !query {
			t.Fatalf("replied to a message that is not a query")
		}
		if !tcp && len(out) > MaxUDPReply {
			t.Fatalf("UDP reply of %d bytes", len(out))
		}
		r := new(dns.Msg)
		if err := r.Unpack(out); err != nil {
			t.Fatalf("reply does not unpack: %v", err)
		}
		if !r.Response || r.Id != binary.BigEndian.Uint16(raw) {
			t.Fatalf("reply header %+v for query ID %d", r.MsgHdr, binary.BigEndian.Uint16(raw))
		}
		for _, sec := range [][]dns.RR{r.Answer, r.Ns, r.Extra} {
			for _, rr := range sec {
				if stripSvcParams(dns.Copy(rr)) {
					t.Fatalf("ECH or an address hint passed on: %v", rr)
				}
				var a netip.Addr
				switch rr := rr.(type) {
				case *dns.A:
					a, _ = netip.AddrFromSlice(rr.A.To4())
				case *dns.AAAA:
					a, _ = netip.AddrFromSlice(rr.AAAA)
				default:
					continue
				}
				if len(u.names.NamesOf(a)) == 0 {
					t.Fatalf("address %s passed on without being learned", a)
				}
			}
		}
	})
}
