package dns

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"flowgate/gate"

	"github.com/miekg/dns"
)

// headerLen is the length of a DNS message header.
const headerLen = 12

// exchange is one query on its way through the chain.
type exchange struct {
	raw []byte
	tcp bool

	id   uint16
	req  *dns.Msg
	q    dns.Question
	opt  *dns.OPT // the client's EDNS record; nil without EDNS
	name string   // canonical query name

	decision gate.Decision
	dest     string // the upstream asked, if any
	detail   string
	ede      *dns.EDNS0_EDE
	resp     *dns.Msg    // the upstream's answer, screened in place
	info     *answerInfo // what resp says about the name
	reply    *dns.Msg    // the answer to write; nil when dropped
	drop     bool        // write nothing
	rcode    int         // reply code when the chain answers by itself
	respDone bool        // reply built from resp
}

// stage is one step of the chain: it answers (sets the reply or drop and
// returns true) or passes on.
type stage func(s *Server, ctx context.Context, x *exchange) (done bool)

// chain is the order every query goes through. Reading it top to bottom
// is reading the proxy.
var chain = []stage{
	(*Server).parse,        // bytes to message; not a query, or malformed: drop or FORMERR (bad_request)
	(*Server).validate,     // one IN question, opcode QUERY, a type we carry: FORMERR, NOTIMP, REFUSED, BADVERS
	(*Server).canonicalise, // the query name through gate.CanonicalQueryName: NXDOMAIN (bad_name)
	(*Server).decide,       // gate.Policy.Name (metadata, DoH canary, mode, rules): NXDOMAIN + extended error
	(*Server).forward,      // the sandbox's resolver: SERVFAIL when none answers
	(*Server).screen,       // CNAME targets and addresses the policy refuses; ECH removed; stray records dropped
	(*Server).learn,        // addresses into gate.Names (and the kernel's sets) before the reply: SERVFAIL if that fails
	(*Server).answer,       // the upstream's answer with the client's ID and question
}

// serve runs one raw query through the chain, hands the bytes to send
// back to send (not called when nothing is sent), and then writes exactly
// one record: the client has its answer before flowgate logs it.
func (s *Server) serve(ctx context.Context, raw []byte, tcp bool, send func([]byte)) {
	x := &exchange{raw: raw, tcp: tcp}
	for _, st := range chain {
		if st(s, ctx, x) {
			break
		}
	}
	if out := s.finish(x); out != nil {
		send(out)
	}
	s.recordExchange(x)
}

// refuse ends the exchange with a reply code, a decision and an optional
// extended error.
func (x *exchange) refuse(rcode int, d gate.Decision, ede uint16, detail string) bool {
	x.rcode = rcode
	x.decision = d
	x.detail = detail
	if ede != noEDE {
		x.ede = &dns.EDNS0_EDE{InfoCode: ede, ExtraText: edeText(d, detail)}
	}
	return true
}

// noEDE marks a refusal without an extended error.
const noEDE = 0xffff

func edeText(d gate.Decision, detail string) string {
	s := "flowgate: " + string(d.Reason)
	if d.Rule != nil {
		s += " by " + d.Rule.String()
	}
	if detail != "" {
		s += ": " + detail
	}
	return s
}

func (s *Server) parse(_ context.Context, x *exchange) bool {
	bad := gate.Deny(gate.ReasonBadRequest)
	if len(x.raw) < headerLen {
		x.drop = true
		return x.refuse(0, bad, noEDE, fmt.Sprintf("%d-byte message is shorter than a header, dropped", len(x.raw)))
	}
	x.id = binary.BigEndian.Uint16(x.raw)
	if x.raw[2]&0x80 != 0 {
		// Answering a response could start a loop between two servers.
		x.drop = true
		return x.refuse(0, bad, noEDE, "a response, not a query, dropped")
	}
	if len(x.raw) > MaxQuery {
		return x.refuse(dns.RcodeFormatError, bad, noEDE, fmt.Sprintf("query longer than %d bytes", MaxQuery))
	}
	// A query is one question and at most an OPT record; the counts are
	// checked before unpacking, so that no message makes the proxy hold
	// thousands of records (each a string) while it waits upstream.
	qd, an, ns, ar := binary.BigEndian.Uint16(x.raw[4:]), binary.BigEndian.Uint16(x.raw[6:]),
		binary.BigEndian.Uint16(x.raw[8:]), binary.BigEndian.Uint16(x.raw[10:])
	if qd != 1 || an != 0 || ns != 0 || ar > 1 {
		return x.refuse(dns.RcodeFormatError, bad, noEDE,
			fmt.Sprintf("a query has one question and at most one additional record (OPT), not %d/%d/%d/%d", qd, an, ns, ar))
	}
	req := new(dns.Msg)
	if err := req.Unpack(x.raw); err != nil {
		return x.refuse(dns.RcodeFormatError, bad, noEDE, "malformed message: "+err.Error())
	}
	x.req = req
	return false
}

func (s *Server) validate(_ context.Context, x *exchange) bool {
	unsupported := gate.Deny(gate.ReasonUnsupported)
	if x.req.Opcode != dns.OpcodeQuery {
		return x.refuse(dns.RcodeNotImplemented, unsupported, noEDE, "opcode "+opcodeName(x.req.Opcode))
	}
	if n := len(x.req.Question); n != 1 {
		return x.refuse(dns.RcodeFormatError, gate.Deny(gate.ReasonBadRequest), noEDE, fmt.Sprintf("%d questions, want 1", n))
	}
	x.q = x.req.Question[0]
	x.opt = x.req.IsEdns0()
	if x.opt != nil && x.opt.Version() != 0 {
		return x.refuse(dns.RcodeBadVers, gate.Deny(gate.ReasonBadRequest), noEDE, fmt.Sprintf("EDNS version %d", x.opt.Version()))
	}
	if x.q.Qclass != dns.ClassINET {
		return x.refuse(dns.RcodeRefused, unsupported, dns.ExtendedErrorCodeNotSupported, "class "+dns.Class(x.q.Qclass).String())
	}
	switch x.q.Qtype {
	case dns.TypeANY, dns.TypeAXFR, dns.TypeIXFR, dns.TypeMAILA, dns.TypeMAILB, dns.TypeOPT, dns.TypeTSIG, dns.TypeTKEY:
		return x.refuse(dns.RcodeNotImplemented, unsupported, dns.ExtendedErrorCodeNotSupported, "query type "+dns.Type(x.q.Qtype).String())
	}
	return false
}

func opcodeName(op int) string {
	if n, ok := dns.OpcodeToString[op]; ok {
		return n
	}
	return fmt.Sprint(op)
}

// canonicalise puts the query name in the one canonical form
// (gate.CanonicalQueryName: a host name, possibly behind underscore labels
// such as _dmarc or _http._tcp). Names it rejects (other characters,
// numeric final labels, bad IDNs) get NXDOMAIN: a definite answer, so that
// no stub tries another server.
func (s *Server) canonicalise(_ context.Context, x *exchange) bool {
	name, err := gate.CanonicalQueryName(x.q.Name)
	if err != nil {
		return x.refuse(dns.RcodeNameError, gate.Deny(gate.ReasonBadName), dns.ExtendedErrorCodeOther, err.Error())
	}
	x.name = name
	return false
}

// decide asks the policy. Refused names, the DoH canary among them, get
// NXDOMAIN with an extended error (RFC 8914 code 15, Blocked) naming the
// reason and rule, and nothing goes upstream. In denylist mode a blocked
// name is also looked up in the background (lookupBlocked).
func (s *Server) decide(_ context.Context, x *exchange) bool {
	d := s.cfg.Policy.Name(x.name)
	if d.Allow {
		x.decision = d
		return false
	}
	if d.Reason == gate.ReasonHostBlocked {
		s.lookupBlocked(x.name)
	}
	return x.refuse(dns.RcodeNameError, d, dns.ExtendedErrorCodeBlocked, "")
}

// forward asks the upstreams with a fresh ID, the canonical name and our
// own EDNS record (the client's DO and CD bits kept); a truncated UDP
// answer is asked again over TCP.
func (s *Server) forward(ctx context.Context, x *exchange) bool {
	do := x.opt != nil && x.opt.Do()
	m := upstreamQuery(x.name, x.q.Qtype, do)
	m.CheckingDisabled = x.req.CheckingDisabled
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	resp, dest, err := s.up.exchange(ctx, m)
	x.dest = dest
	if err != nil {
		s.log.Debug("dns proxy: upstream failed", "name", x.name, "err", err)
		return x.refuse(dns.RcodeServerFailure, x.decision, dns.ExtendedErrorCodeNoReachableAuthority, "upstream: "+err.Error())
	}
	x.resp = resp
	return false
}

func upstreamQuery(name string, qtype uint16, do bool) *dns.Msg {
	m := new(dns.Msg)
	m.Id = dns.Id()
	m.RecursionDesired = true
	m.Question = []dns.Question{{Name: name + ".", Qtype: qtype, Qclass: dns.ClassINET}}
	m.SetEdns0(upstreamUDPSize, do)
	return m
}

// screen refuses an answer whose CNAME chain or addresses the policy
// refuses, and cleans what is passed on (see screenAnswer).
func (s *Server) screen(_ context.Context, x *exchange) bool {
	x.info = analyse(x.name, x.resp, gate.MaxAddrsPerName) // what the client gets, all learned
	if d, detail, refused := s.screenAnswer(x.info); refused {
		if d.Reason == gate.ReasonHostBlocked {
			s.lookupBlocked(x.name)
		}
		return x.refuse(dns.RcodeNameError, d, dns.ExtendedErrorCodeBlocked, detail)
	}
	clean(x.resp, x.info)
	return false
}

// learn records the answer's addresses before anything is written back.
func (s *Server) learn(_ context.Context, x *exchange) bool {
	if err := s.learnAnswer(x.info, true); err != nil {
		s.log.Warn("dns proxy: learning addresses failed", "name", x.name, "err", err)
		return x.refuse(dns.RcodeServerFailure, x.decision, dns.ExtendedErrorCodeOther, "learning addresses: "+err.Error())
	}
	return false
}

// answer passes the screened upstream answer on with the client's ID and
// question, the upstream's code and flags, and no upstream EDNS record.
func (s *Server) answer(_ context.Context, x *exchange) bool {
	r := new(dns.Msg)
	r.SetReply(x.req)
	r.Rcode = x.resp.Rcode
	r.RecursionAvailable = x.resp.RecursionAvailable
	r.AuthenticatedData = x.resp.AuthenticatedData
	r.Answer = x.resp.Answer
	r.Ns = x.resp.Ns
	for _, rr := range x.resp.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			r.Extra = append(r.Extra, rr)
		}
	}
	x.reply = r
	x.respDone = true
	return true
}

// finish builds the reply for a refusal, adds EDNS when the client used
// it, fits the reply to the transport and packs it.
func (s *Server) finish(x *exchange) []byte {
	if x.decision.Reason == "" {
		// Every stage that ends the chain decides; this is a bug guard.
		x.decision = gate.Deny(gate.ReasonBadRequest)
		x.rcode = dns.RcodeServerFailure
		x.detail = "no stage answered"
	}
	if x.drop {
		return nil
	}
	r := x.reply
	if r == nil {
		r = new(dns.Msg)
		if x.req != nil {
			r.SetReply(x.req)
		} else {
			r.Id = x.id
			r.Response = true
			r.Opcode = int(x.raw[2]>>3) & 0xf
		}
		r.Rcode = x.rcode
		r.RecursionAvailable = true
	}
	limit := dns.MaxMsgSize
	if x.opt != nil {
		o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		o.SetUDPSize(MaxUDPReply)
		o.SetDo(x.opt.Do())
		if x.ede != nil {
			o.Option = append(o.Option, x.ede)
		}
		r.Extra = append(r.Extra, o)
		if !x.tcp {
			limit = min(max(int(x.opt.UDPSize()), dns.MinMsgSize), MaxUDPReply)
		}
	} else if !x.tcp {
		limit = dns.MinMsgSize
	}
	r.Truncate(limit)
	r.Compress = true
	out, err := r.Pack()
	if err != nil || len(out) > limit {
		x.detail = strings.TrimPrefix(x.detail+"; ", "; ") + fmt.Sprintf("packing the reply failed (%d bytes, %v)", len(out), err)
		m := &dns.Msg{MsgHdr: dns.MsgHdr{Id: x.id, Response: true, Rcode: dns.RcodeServerFailure}}
		out, _ = m.Pack()
	}
	return out
}

// recordExchange writes the one record of a query.
func (s *Server) recordExchange(x *exchange) {
	var b strings.Builder
	if x.req != nil && len(x.req.Question) == 1 {
		b.WriteString(dns.Type(x.q.Qtype).String())
		b.WriteByte(' ')
		if x.name == "" {
			fmt.Fprintf(&b, "%.300q ", x.q.Name)
		}
	}
	switch {
	case x.drop:
		b.WriteString("dropped")
	case x.respDone:
		b.WriteString(dns.RcodeToString[x.reply.Rcode])
	default:
		b.WriteString(dns.RcodeToString[x.rcode])
	}
	if x.detail != "" {
		b.WriteString(": ")
		b.WriteString(x.detail)
	}
	s.record(x.decision, x.dest, x.name, b.String())
}
