package gate

import (
	"fmt"
	"time"
)

// Reason is the code a decision carries. The set is closed: every branch
// that allows or denies, defaults and errors included, names one of these.
type Reason string

// Reasons for allowing.
const (
	ReasonPublic         Reason = "public"          // public mode admits all but metadata
	ReasonNotBlocked     Reason = "not_blocked"     // denylist: no rule matched
	ReasonHostAllowed    Reason = "host_allowed"    // allowlist: a host or wildcard rule matched
	ReasonServiceAllowed Reason = "service_allowed" // allowlist: a service name matched
	ReasonCIDRAllowed    Reason = "cidr_allowed"    // allowlist: an address or CIDR rule matched
	ReasonLearned        Reason = "learned"         // allowlist: the address came from an allowed DNS answer
	ReasonLocal          Reason = "local"           // flowgate check: 127.0.0.1, ::1, 0.0.0.0, :: or localhost, the sandbox's own loopback
)

// Reasons for denying.
const (
	ReasonMetadata       Reason = "metadata"         // a cloud metadata address or name
	ReasonNoNetwork      Reason = "no_network"       // no-network admits only the model
	ReasonHostBlocked    Reason = "host_blocked"     // denylist: a blocked_hosts rule matched
	ReasonURLBlocked     Reason = "url_blocked"      // denylist: a blocked_urls rule matched the path
	ReasonCIDRBlocked    Reason = "cidr_blocked"     // denylist: an address or CIDR rule matched
	ReasonNotAllowed     Reason = "not_allowed"      // allowlist: no rule matched
	ReasonUnknownAddress Reason = "unknown_address"  // allowlist: no name, and the address was never learned
	ReasonAddressBlocked Reason = "address_blocked"  // denylist: no name, and the address belongs to a blocked host
	ReasonAddrMismatch   Reason = "address_mismatch" // the destination is not among the name's addresses (fronting)
	ReasonNameMismatch   Reason = "name_mismatch"    // SNI and CONNECT target (or Host) disagree
	ReasonECH            Reason = "ech_refused"      // encrypted ClientHello hides the name
	ReasonNeedsIntercept Reason = "needs_intercept"  // TLS to a host with blocked_urls, and no interception
	ReasonDoHCanary      Reason = "doh_canary"       // use-application-dns.net: tells browsers to keep DoH off
	ReasonBadName        Reason = "bad_name"         // the name is not a valid host name (nor, in DNS, a service name under one)
	ReasonBadRequest     Reason = "bad_request"      // malformed DNS message, ClientHello or HTTP request
	ReasonLoop           Reason = "loop"             // a connection aimed at flowgate's own port
	ReasonLimit          Reason = "limit"            // too many connections at once
	ReasonLoopback       Reason = "loopback"         // a loopback address other than 127.0.0.1 and ::1 (can hold a forwarder)
	ReasonTimeout        Reason = "timeout"          // the client sent too little in time
	ReasonResolveFailed  Reason = "resolve_failed"   // the name could not be resolved to check the destination
	ReasonUnsupported    Reason = "unsupported"      // a protocol or query type flowgate does not carry
)

// AllReasons lists the closed set of reason codes.
func AllReasons() []Reason {
	return []Reason{
		ReasonPublic, ReasonNotBlocked, ReasonHostAllowed, ReasonServiceAllowed, ReasonCIDRAllowed, ReasonLearned, ReasonLocal,
		ReasonMetadata, ReasonNoNetwork, ReasonHostBlocked, ReasonURLBlocked, ReasonCIDRBlocked, ReasonNotAllowed,
		ReasonUnknownAddress, ReasonAddressBlocked, ReasonAddrMismatch, ReasonNameMismatch, ReasonECH,
		ReasonNeedsIntercept, ReasonDoHCanary, ReasonBadName, ReasonBadRequest, ReasonLoop, ReasonLimit,
		ReasonLoopback, ReasonTimeout, ReasonResolveFailed, ReasonUnsupported,
	}
}

// Decision is a verdict with the reason and the rule behind it.
type Decision struct {
	Allow  bool
	Reason Reason
	// Rule is the rule that decided, nil when a mode's default decided.
	Rule *Rule
}

// Verdict returns "allow" or "deny".
func (d Decision) Verdict() string {
	if d.Allow {
		return VerdictAllow
	}
	return VerdictDeny
}

// RuleText names the deciding rule, or the mode default.
func (d Decision) RuleText() string {
	if d.Rule != nil {
		return d.Rule.String()
	}
	return "default"
}

// Err returns nil for an allow and a *DeniedError for a deny.
func (d Decision) Err() error {
	if d.Allow {
		return nil
	}
	return &DeniedError{Decision: d}
}

// Verdict values as the egress log writes them.
const (
	VerdictAllow = "allow"
	VerdictDeny  = "deny"
)

func allow(r Reason, rule *Rule) Decision { return Decision{Allow: true, Reason: r, Rule: rule} }
func deny(r Reason, rule *Rule) Decision  { return Decision{Reason: r, Rule: rule} }

// Deny returns a deny decision with no rule, for the data plane's own
// refusals (bad input, limits, mismatches).
func Deny(r Reason) Decision { return deny(r, nil) }

// DeniedError is a refusal. Each protocol turns it into the client's answer
// in one place: 403 with the reason for HTTP, REFUSED or NXDOMAIN with an
// extended error for DNS, an access_denied alert for TLS.
type DeniedError struct {
	Decision Decision
	// Name is the host the refusal is about, if any.
	Name string
}

func (e *DeniedError) Error() string {
	s := fmt.Sprintf("denied (%s)", e.Decision.Reason)
	if e.Name != "" {
		s = fmt.Sprintf("%s denied (%s)", e.Name, e.Decision.Reason)
	}
	if e.Decision.Rule != nil {
		s += " by " + e.Decision.Rule.String()
	}
	return s
}

// Protocols a decision record names.
const (
	ProtoDNS     = "dns"
	ProtoTLS     = "tls"
	ProtoHTTP    = "http"
	ProtoTCP     = "tcp"
	ProtoConnect = "connect"
)

// Record is one decision, one JSON line in the trial's egress log. The same
// record feeds the metrics and the audit. The JSON field names below are the
// log's schema.
type Record struct {
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox"`
	UID     uint32    `json:"uid"`
	Proto   string    `json:"proto"`
	Dest    string    `json:"dest,omitempty"`
	Name    string    `json:"name,omitempty"`
	Path    string    `json:"path,omitempty"`
	Verdict string    `json:"verdict"`
	Reason  Reason    `json:"reason"`
	Rule    string    `json:"rule"`
	Detail  string    `json:"detail,omitempty"`
	// Count is how many alike events the record stands for, when a
	// Throttle has folded a flood of them into one; 0 means one.
	Count int `json:"count,omitempty"`
}

// Events is how many events the record stands for: Count, or 1.
func (r Record) Events() int { return max(r.Count, 1) }

// NewRecord fills a record's verdict, reason and rule from a decision.
func NewRecord(proto, dest, name string, d Decision) Record {
	return Record{Time: time.Now().UTC(), Proto: proto, Dest: dest, Name: name,
		Verdict: d.Verdict(), Reason: d.Reason, Rule: d.RuleText()}
}

// Recorder receives decision records. It must not block for long: it is
// called on the connection's path.
type Recorder interface {
	Record(Record)
}

// RecorderFunc adapts a function to Recorder.
type RecorderFunc func(Record)

// Record calls f.
func (f RecorderFunc) Record(r Record) { f(r) }
