package gate

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// Host is a canonical host: exactly one of Name and Addr is set.
type Host struct {
	// Name is a canonical DNS name: A-labels, lower case, no trailing dot.
	Name string
	// Addr is an IP literal, IPv4-mapped IPv6 unmapped to IPv4, no zone.
	Addr netip.Addr
}

// IsAddr reports whether the host is an IP literal.
func (h Host) IsAddr() bool { return h.Addr.IsValid() }

// String returns the canonical text: the name, or the address.
func (h Host) String() string {
	if h.Addr.IsValid() {
		return h.Addr.String()
	}
	return h.Name
}

// MaxNameLen is the longest canonical name accepted, in presentation form
// without the trailing dot (RFC 1035: 255 octets on the wire).
const MaxNameLen = 253

// profile maps Unicode to A-labels the way a browser does for lookup. Hyphen
// checks are off because real names carry "--" in the third and fourth
// positions (r3---sn-abc.googlevideo.com); LDH is enforced by checkLDH.
var profile = idna.New(
	idna.MapForLookup(),
	idna.Transitional(false),
	idna.BidiRule(),
	idna.ValidateLabels(true),
	idna.StrictDomainName(true),
	idna.CheckHyphens(false),
	idna.CheckJoiners(true),
)

// CanonicalHost is the one function every matched host goes through: a DNS
// query name, a TLS SNI, an HTTP Host header, a CONNECT target, the host of a
// URL and every policy entry. It removes a port and IPv6 brackets, removes one
// trailing dot, maps IDNs to A-labels, lower-cases, and rejects empty labels,
// names that are not letters-digits-hyphens, and names that a resolver would
// read as a numeric IPv4 address (2130706433, 0x7f.1).
func CanonicalHost(s string) (Host, error) {
	h, _, err := splitPort(s)
	if err != nil {
		return Host{}, err
	}
	return canonicalHostOnly(h)
}

// ParseTarget reads "host", "host:port" or "[v6]:port" into a canonical host
// and a port (0 when absent).
func ParseTarget(s string) (Host, uint16, error) {
	h, port, err := splitPort(s)
	if err != nil {
		return Host{}, 0, err
	}
	host, err := canonicalHostOnly(h)
	return host, port, err
}

// CanonicalName is CanonicalHost for names only: an IP literal is an error.
func CanonicalName(s string) (string, error) {
	h, err := CanonicalHost(s)
	if err != nil {
		return "", err
	}
	if h.IsAddr() {
		return "", fmt.Errorf("%q is an IP address, not a host name", s)
	}
	return h.Name, nil
}

// CanonicalQueryName is CanonicalName for a DNS query name, which may also
// start with underscore labels (RFC 8552: _dmarc.example.com,
// _acme-challenge.example.com, _http._tcp.example.com,
// selector._domainkey.example.com). Such names are not host names: no TLS
// SNI, Host header or policy entry may carry one. A name without an
// underscore gets CanonicalName's answer. In one with underscores,
// everything up to the last label holding an underscore is the service
// part: ASCII letters, digits, hyphens and underscores only, lower-cased,
// no empty label, none longer than 63; the rest is a host name and goes
// through CanonicalName. The whole is at most MaxNameLen long. Policy
// rules match such a name through its host part's suffixes, like any
// subdomain.
func CanonicalQueryName(s string) (string, error) {
	last := strings.LastIndexByte(s, '_')
	if last < 0 {
		return CanonicalName(s)
	}
	dot := strings.IndexByte(s[last:], '.')
	if dot < 0 {
		return "", fmt.Errorf("name %q: an underscore label must be followed by a host name", s)
	}
	service, rest := s[:last+dot], s[last+dot+1:]
	host, err := CanonicalName(rest)
	if err != nil {
		return "", fmt.Errorf("name %q: %w", s, err)
	}
	b := make([]byte, 0, len(service)+1+len(host))
	for label := range strings.SplitSeq(service, ".") {
		switch {
		case label == "":
			return "", fmt.Errorf("name %q: empty label", s)
		case len(label) > 63:
			return "", fmt.Errorf("name %q: label longer than 63 characters", s)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			case c >= 'A' && c <= 'Z':
				c += 'a' - 'A'
			default:
				return "", fmt.Errorf("name %q: the labels up to the last one with an underscore may hold only letters, digits, hyphens and underscores", s)
			}
			b = append(b, c)
		}
		b = append(b, '.')
	}
	b = append(b, host...)
	if len(b) > MaxNameLen {
		return "", fmt.Errorf("name %q: name longer than %d characters", s, MaxNameLen)
	}
	return string(b), nil
}

// splitPort separates an optional port. A bare IPv6 literal (more than one
// colon, no brackets) has no port.
func splitPort(s string) (host string, port uint16, err error) {
	if s == "" {
		return "", 0, errors.New("empty host")
	}
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", 0, fmt.Errorf("host %q: missing ']'", s)
		}
		host, rest := s[1:end], s[end+1:]
		if rest == "" {
			return host, 0, nil
		}
		if rest[0] != ':' {
			return "", 0, fmt.Errorf("host %q: unexpected %q after ']'", s, rest)
		}
		port, err := parsePort(s, rest[1:])
		return host, port, err
	}
	switch strings.Count(s, ":") {
	case 0:
		return s, 0, nil
	case 1:
		i := strings.IndexByte(s, ':')
		port, err := parsePort(s, s[i+1:])
		return s[:i], port, err
	default:
		return s, 0, nil
	}
}

func parsePort(whole, p string) (uint16, error) {
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 || p[0] == '+' || (len(p) > 1 && p[0] == '0') {
		return 0, fmt.Errorf("host %q: bad port %q (want 1-65535)", whole, p)
	}
	return uint16(n), nil
}

func canonicalHostOnly(h string) (Host, error) {
	if h == "" {
		return Host{}, errors.New("empty host")
	}
	if strings.ContainsRune(h, ':') || (h[0] >= '0' && h[0] <= '9') {
		if a, err := netip.ParseAddr(h); err == nil {
			if a.Zone() != "" {
				return Host{}, fmt.Errorf("host %q: zoned IPv6 addresses are not accepted", h)
			}
			return Host{Addr: a.Unmap()}, nil
		}
		if strings.ContainsRune(h, ':') {
			return Host{}, fmt.Errorf("host %q: not a valid IPv6 address", h)
		}
	}
	name, err := canonicalName(h)
	if err != nil {
		return Host{}, err
	}
	return Host{Name: name}, nil
}

func canonicalName(h string) (string, error) {
	orig := h
	if strings.HasSuffix(h, ".") {
		h = h[:len(h)-1]
	}
	if h == "" {
		return "", fmt.Errorf("host %q: empty name", orig)
	}
	if lower, ok := asciiLDHLower(h); ok && !strings.Contains(lower, "xn--") {
		// Fast path: ASCII letters, digits and hyphens with no A-label to
		// validate; IDNA mapping would only lower-case it. DNS clients
		// randomise case (0x20), so mixed case is common here.
		if err := checkLabels(orig, lower); err != nil {
			return "", err
		}
		return lower, nil
	}
	if !utf8.ValidString(h) {
		return "", fmt.Errorf("host %q: not a valid host name: not UTF-8", orig)
	}
	a, err := profile.ToASCII(h)
	if err != nil {
		return "", fmt.Errorf("host %q: not a valid host name: %v", orig, idnaReason(err))
	}
	a = strings.ToLower(a)
	// The A-labels produced must themselves validate, or the canonical
	// form would not be a fixed point.
	if again, err := profile.ToASCII(a); err != nil || again != a {
		return "", fmt.Errorf("host %q: not a valid host name: its A-label form does not validate", orig)
	}
	if !isLowerLDH(a) {
		return "", fmt.Errorf("host %q: only letters, digits, hyphens and dots are allowed", orig)
	}
	if err := checkLabels(orig, a); err != nil {
		return "", err
	}
	return a, nil
}

func idnaReason(err error) string {
	s := err.Error()
	return strings.TrimPrefix(s, "idna: ")
}

// asciiLDHLower lower-cases s when it holds only ASCII letters, digits,
// '-' and '.'; it allocates only when s has upper-case letters.
func asciiLDHLower(s string) (string, bool) {
	upper := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '.':
		case c >= 'A' && c <= 'Z':
			upper = true
		default:
			return "", false
		}
	}
	if upper {
		return strings.ToLower(s), true
	}
	return s, true
}

// isLowerLDH reports whether s holds only a-z, 0-9, '-' and '.'.
func isLowerLDH(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// checkLabels enforces label lengths, no leading or trailing hyphen, and no
// numeric final label (which resolvers and browsers read as an IPv4 address).
func checkLabels(orig, h string) error {
	if len(h) > MaxNameLen {
		return fmt.Errorf("host %q: name longer than %d characters", orig, MaxNameLen)
	}
	last := ""
	for rest := h; ; {
		i := strings.IndexByte(rest, '.')
		label := rest
		if i >= 0 {
			label = rest[:i]
		}
		switch {
		case label == "":
			return fmt.Errorf("host %q: empty label", orig)
		case len(label) > 63:
			return fmt.Errorf("host %q: label longer than 63 characters", orig)
		case label[0] == '-' || label[len(label)-1] == '-':
			return fmt.Errorf("host %q: label %q starts or ends with a hyphen", orig, label)
		}
		last = label
		if i < 0 {
			break
		}
		rest = rest[i+1:]
	}
	if numericLabel(last) {
		return fmt.Errorf("host %q: looks like a numeric IP address; write an IP address in dotted or colon form", orig)
	}
	return nil
}

// numericLabel reports whether a final label would be read as a number by
// inet_aton: all decimal digits, or 0x followed by hex digits.
func numericLabel(l string) bool {
	if strings.HasPrefix(l, "0x") {
		for i := 2; i < len(l); i++ {
			c := l[i]
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			return false
		}
	}
	return true
}
