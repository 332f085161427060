package gate

import (
	"errors"
	"fmt"
	"strings"
)

// MaxPathLen bounds the request paths flowgate canonicalises.
const MaxPathLen = 16 << 10

// CanonicalPath is the one URL-path canonicaliser. It takes the path of a
// request target (no query, no fragment), percent-decodes it once, treats
// "/" and "\" (which some servers read as "/") as separators, resolves "."
// and ".." segments (never above the root), merges repeated separators, and
// percent-encodes again every byte outside RFC 3986 pchar with upper-case
// hex. What it returns is both what the policy checks and what flowgate
// sends upstream, so a server cannot see a path other than the one checked.
//
// It refuses a path that does not start with "/", a malformed or NUL escape,
// a control character and an over-long path. The empty path is "/".
func CanonicalPath(p string) (string, error) {
	if p == "" {
		return "/", nil
	}
	if len(p) > MaxPathLen {
		return "", fmt.Errorf("path longer than %d bytes", MaxPathLen)
	}
	if p[0] != '/' && p[0] != '\\' {
		return "", fmt.Errorf("path %q does not start with /", truncate(p))
	}
	decoded, err := percentDecode(p)
	if err != nil {
		return "", err
	}
	trailing := false
	segs := make([]string, 0, 8)
	for _, s := range splitSegments(decoded) {
		trailing = false
		switch s {
		case "":
			trailing = true
		case ".":
			trailing = true
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
			trailing = true
		default:
			segs = append(segs, s)
		}
	}
	var b strings.Builder
	b.Grow(len(p) + 8)
	for _, s := range segs {
		b.WriteByte('/')
		encodeSegment(&b, s)
	}
	if len(segs) == 0 || trailing {
		b.WriteByte('/')
	}
	return b.String(), nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// splitSegments splits a decoded path after its leading separator at every
// "/" and "\"; empty segments are kept so the caller sees a trailing slash.
func splitSegments(p string) []string {
	var segs []string
	start := 1
	for i := 1; i < len(p); i++ {
		if p[i] == '/' || p[i] == '\\' {
			segs = append(segs, p[start:i])
			start = i + 1
		}
	}
	return append(segs, p[start:])
}

// percentDecode decodes every %XX once. A malformed escape, a NUL and a
// control character are errors: no server reads them the same way.
func percentDecode(p string) (string, error) {
	if strings.IndexByte(p, '%') < 0 {
		if err := checkControls(p); err != nil {
			return "", err
		}
		return p, nil
	}
	b := make([]byte, 0, len(p))
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '%' {
			if i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2]) {
				return "", fmt.Errorf("path %q: malformed percent escape", truncate(p))
			}
			c = unhex(p[i+1])<<4 | unhex(p[i+2])
			i += 2
		}
		b = append(b, c)
	}
	s := string(b)
	if err := checkControls(s); err != nil {
		return "", err
	}
	return s, nil
}

func checkControls(s string) error {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return errors.New("path holds a control character")
		}
	}
	return nil
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

// pchar reports whether c may stand unescaped in a path segment (RFC 3986
// unreserved, sub-delims, ':' and '@').
func pchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,;=:@", c) >= 0
}

const upperHex = "0123456789ABCDEF"

func encodeSegment(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if pchar(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&15])
	}
}

// pathKey is the form a canonical path is compared in: per segment, any
// ";params" dropped (servers such as Tomcat ignore them) and ASCII folded to
// lower case (servers such as IIS ignore case). Both make a blocked_urls rule
// match more requests, never fewer.
func pathKey(canonical string) []string {
	if canonical == "/" {
		return nil
	}
	parts := strings.Split(strings.Trim(canonical, "/"), "/")
	out := parts[:0]
	for _, s := range parts {
		if i := strings.IndexByte(s, ';'); i >= 0 {
			s = s[:i]
		}
		out = append(out, strings.ToLower(s))
	}
	return out
}

// pathUnder reports whether the request path key lies at or under the rule
// path key, segment by segment: /papers/x covers /papers/x/y, not /papers/xy.
func pathUnder(req, rule []string) bool {
	if len(req) < len(rule) {
		return false
	}
	for i, s := range rule {
		if req[i] != s {
			return false
		}
	}
	return true
}
