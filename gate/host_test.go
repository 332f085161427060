package gate

import (
	"strings"
	"testing"
)

func TestCanonicalHost(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  string
	}{
		{in: "example.com", want: "example.com"},
		{in: "EXAMPLE.Com", want: "example.com"},
		{in: "example.com.", want: "example.com"},
		{in: "example.com:443", want: "example.com"},
		{in: "Example.COM.:8443", want: "example.com"},
		{in: "bücher.example", want: "xn--bcher-kva.example"},
		{in: "BÜCHER.example", want: "xn--bcher-kva.example"},
		{in: "xn--bcher-kva.example", want: "xn--bcher-kva.example"},
		{in: "XN--BCHER-KVA.EXAMPLE", want: "xn--bcher-kva.example"},
		{in: "例え.テスト", want: "xn--r8jz45g.xn--zckzah"},
		{in: "ｅｘａｍｐｌｅ.com", want: "example.com"}, // full-width letters map to ASCII
		{in: "r3---sn-abc.googlevideo.com", want: "r3---sn-abc.googlevideo.com"},
		{in: "192.0.2.1", want: "192.0.2.1"},
		{in: "192.0.2.1:80", want: "192.0.2.1"},
		{in: "[2001:db8::1]:443", want: "2001:db8::1"},
		{in: "[2001:DB8::1]", want: "2001:db8::1"},
		{in: "2001:db8::1", want: "2001:db8::1"},
		{in: "::ffff:192.0.2.1", want: "192.0.2.1"},
		{in: "[::ffff:169.254.169.254]:80", want: "169.254.169.254"},
		{in: "localhost", want: "localhost"},
		{in: "db", want: "db"},

		{in: "", wantErr: "empty host"},
		{in: ".", wantErr: "empty name"},
		{in: "example..com", wantErr: "empty label"},
		{in: ".example.com", wantErr: "empty label"},
		{in: "example.com..", wantErr: "empty label"},
		{in: "exa_mple.com", wantErr: "not a valid host name"},
		{in: "exa mple.com", wantErr: "not a valid host name"},
		{in: "-example.com", wantErr: "hyphen"},
		{in: "example-.com", wantErr: "hyphen"},
		{in: strings.Repeat("a", 64) + ".com", wantErr: "longer than 63"},
		{in: strings.Repeat("abcdefghi.", 26) + "com", wantErr: "longer than 253"},
		{in: "example.com:0", wantErr: "bad port"},
		{in: "example.com:65536", wantErr: "bad port"},
		{in: "example.com:http", wantErr: "bad port"},
		{in: "example.com:+80", wantErr: "bad port"},
		{in: "[2001:db8::1", wantErr: "missing ']'"},
		{in: "[2001:db8::1]x", wantErr: "unexpected"},
		{in: "[fe80::1%eth0]", wantErr: "zoned"},
		{in: "2001:db8::zz", wantErr: "not a valid IPv6"},
		{in: "127.1", wantErr: "numeric IP"},
		{in: "2130706433", wantErr: "numeric IP"},
		{in: "0x7f.1", wantErr: "numeric IP"},
		{in: "a.0x7f000001", wantErr: "numeric IP"},
		{in: "xn--zz.example", wantErr: "not a valid host name"},
		{in: "exam\x00ple.com", wantErr: "not a valid host name"},
	}
	for _, tt := range tests {
		h, err := CanonicalHost(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("CanonicalHost(%q) = %v, %v; want error containing %q", tt.in, h, err, tt.wantErr)
			}
			continue
		}
		if err != nil || h.String() != tt.want {
			t.Errorf("CanonicalHost(%q) = %q, %v; want %q", tt.in, h.String(), err, tt.want)
			continue
		}
		// Canonical output is a fixed point.
		again, err := CanonicalHost(h.String())
		if err != nil || again != h {
			t.Errorf("CanonicalHost(%q) not idempotent: %q -> %v, %v", tt.in, h, again, err)
		}
	}
}

func TestParseTarget(t *testing.T) {
	tests := []struct {
		in   string
		host string
		port uint16
	}{
		{"example.com:443", "example.com", 443},
		{"example.com", "example.com", 0},
		{"[2001:db8::1]:8443", "2001:db8::1", 8443},
		{"192.0.2.1:22", "192.0.2.1", 22},
	}
	for _, tt := range tests {
		h, p, err := ParseTarget(tt.in)
		if err != nil || h.String() != tt.host || p != tt.port {
			t.Errorf("ParseTarget(%q) = %q, %d, %v; want %q, %d", tt.in, h, p, err, tt.host, tt.port)
		}
	}
}

func TestCanonicalQueryName(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  string
	}{
		{in: "example.com", want: "example.com"},
		{in: "Bücher.example.", want: "xn--bcher-kva.example"},
		{in: "_dmarc.Example.COM.", want: "_dmarc.example.com"},
		{in: "_acme-challenge.example.com", want: "_acme-challenge.example.com"},
		{in: "_HTTP._tcp.example.com", want: "_http._tcp.example.com"},
		{in: "s1._domainkey.example.com", want: "s1._domainkey.example.com"},
		{in: "a_b.example.com", want: "a_b.example.com"},
		{in: "_dmarc.bücher.example", want: "_dmarc.xn--bcher-kva.example"},
		{in: "_x.db", want: "_x.db"},

		{in: "exa_mple", wantErr: "followed by a host name"},
		{in: "_dmarc.", wantErr: "empty host"},
		{in: "_dmarc..example.com", wantErr: "empty label"},
		{in: "a.._x.example.com", wantErr: "empty label"},
		{in: "_x.example..com", wantErr: "empty label"},
		{in: "_x.-bad.example.com", wantErr: "hyphen"},
		{in: "_x.exam ple.com", wantErr: "not a valid host name"},
		{in: "bü_cher.example.com", wantErr: "only letters, digits, hyphens and underscores"},
		{in: "_a\\.b.example.com", wantErr: "only letters, digits, hyphens and underscores"},
		{in: "_x." + strings.Repeat("a", 64) + ".com", wantErr: "longer than 63"},
		{in: "_" + strings.Repeat("a", 63) + ".com", wantErr: "longer than 63"},
		{in: "_x.127.1", wantErr: "numeric IP"},
		{in: "_x.192.0.2.1", wantErr: "IP address"},
		{in: strings.Repeat("_bcdefghi.", 25) + "example.com", wantErr: "longer than 253"},
	}
	for _, tt := range tests {
		got, err := CanonicalQueryName(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("CanonicalQueryName(%q) = %q, %v; want error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("CanonicalQueryName(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			continue
		}
		if again, err := CanonicalQueryName(got); err != nil || again != got {
			t.Errorf("CanonicalQueryName(%q) not idempotent: %q -> %q, %v", tt.in, got, again, err)
		}
		if _, err := CanonicalName(got); strings.Contains(got, "_") == (err == nil) {
			t.Errorf("CanonicalName(%q) = %v: host names must stay letters, digits and hyphens", got, err)
		}
	}
}

// FuzzCanonicalQueryName checks that query names come out canonical, as
// fixed points, and that a name without an underscore gets exactly
// CanonicalName's answer.
func FuzzCanonicalQueryName(f *testing.F) {
	for _, s := range []string{"_dmarc.example.com.", "s1._domainkey.Bücher.example", "_x.127.1", "a_b", "_a._b._c.d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := CanonicalQueryName(s)
		if !strings.Contains(s, "_") {
			want, werr := CanonicalName(s)
			if c != want || (err == nil) != (werr == nil) {
				t.Fatalf("CanonicalQueryName(%q) = %q, %v; CanonicalName = %q, %v", s, c, err, want, werr)
			}
		}
		if err != nil {
			return
		}
		for i := 0; i < len(c); i++ {
			if b := c[i]; !(b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '-' || b == '_' || b == '.') {
				t.Fatalf("CanonicalQueryName(%q) = %q: byte %q", s, c, b)
			}
		}
		if strings.HasSuffix(c, ".") || strings.HasPrefix(c, ".") || strings.Contains(c, "..") || len(c) > MaxNameLen {
			t.Fatalf("CanonicalQueryName(%q) = %q: not canonical", s, c)
		}
		if again, err := CanonicalQueryName(c); err != nil || again != c {
			t.Fatalf("CanonicalQueryName(%q) = %q, but again = %q, %v", s, c, again, err)
		}
	})
}

func TestCanonicalNameRejectsAddress(t *testing.T) {
	if _, err := CanonicalName("192.0.2.1"); err == nil || !strings.Contains(err.Error(), "IP address") {
		t.Fatalf("CanonicalName(192.0.2.1) err = %v, want an IP-address error", err)
	}
}

func FuzzCanonicalHost(f *testing.F) {
	for _, s := range []string{"example.com", "Bücher.example.", "[2001:db8::1]:443", "127.1", "a..b", "xn--bcher-kva.example:80", "ｅｘａｍｐｌｅ.com"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := CanonicalHost(s)
		if err != nil {
			return
		}
		c := h.String()
		if h.IsAddr() == (h.Name != "") {
			t.Fatalf("CanonicalHost(%q) = %+v: exactly one of Name and Addr must be set", s, h)
		}
		if !h.IsAddr() {
			if !isLowerLDH(c) || strings.HasSuffix(c, ".") || strings.Contains(c, "..") || len(c) > MaxNameLen {
				t.Fatalf("CanonicalHost(%q) = %q: not canonical", s, c)
			}
		}
		again, err := CanonicalHost(c)
		if err != nil || again != h {
			t.Fatalf("CanonicalHost(%q) = %q, but CanonicalHost(%q) = %v, %v", s, c, c, again, err)
		}
	})
}
