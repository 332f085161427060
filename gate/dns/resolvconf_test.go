package dns

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseResolvConf(t *testing.T) {
	cases := []struct {
		name, text string
		want       []string
		err        string
	}{
		{"plain", "nameserver 192.0.2.53\n", []string{"192.0.2.53:53"}, ""},
		{"comments and options", "# generated\nsearch example.com\nnameserver 192.0.2.53 # main\n; other\noptions ndots:1\nnameserver 2001:db8::53\n", []string{"192.0.2.53:53", "[2001:db8::53]:53"}, ""},
		{"loopback stub skipped", "nameserver 127.0.0.53\nnameserver 10.0.0.2\n", []string{"10.0.0.2:53"}, ""},
		{"v4-mapped unmapped", "nameserver ::ffff:10.0.0.2\n", []string{"10.0.0.2:53"}, ""},
		{"at most three", "nameserver 10.0.0.1\nnameserver 10.0.0.2\nnameserver 10.0.0.3\nnameserver 10.0.0.4\n", []string{"10.0.0.1:53", "10.0.0.2:53", "10.0.0.3:53"}, ""},
		{"tabs", "nameserver\t10.0.0.9\n", []string{"10.0.0.9:53"}, ""},
		{"only stubs", "nameserver 127.0.0.53\nnameserver ::1\n", nil, "only loopback nameservers (127.0.0.53, ::1)"},
		{"empty", "", nil, "no nameserver lines"},
		{"bad address", "nameserver 10.0.0.2\nnameserver resolver.local\n", nil, `line 2: nameserver "resolver.local" is not an IP address`},
		{"two fields", "nameserver 10.0.0.2 10.0.0.3\n", nil, "line 1: nameserver takes one address, got 2 fields"},
		{"missing address", "nameserver\n", nil, "line 1: nameserver takes one address, got 0 fields"},
		{"unspecified", "nameserver 0.0.0.0\n", nil, "line 1: nameserver 0.0.0.0 cannot be a resolver"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseResolvConf([]byte(c.text))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Errorf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v", err)
			}
			var s []string
			for _, a := range got {
				s = append(s, a.String())
			}
			if !slices.Equal(s, c.want) {
				t.Errorf("got %v, want %v", s, c.want)
			}
		})
	}
}

func TestReadResolvConf(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(p, []byte("nameserver 192.0.2.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ReadResolvConf(p)
	if err != nil || len(got) != 1 || got[0] != netip.MustParseAddrPort("192.0.2.53:53") {
		t.Errorf("ReadResolvConf = %v, %v", got, err)
	}
	if _, err := ReadResolvConf(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "reading resolv.conf") {
		t.Errorf("missing file: err = %v", err)
	}
	if err := os.WriteFile(p, []byte("nameserver 127.0.0.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadResolvConf(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("stub only: err = %v, want it to name the file", err)
	}
	big := make([]byte, maxResolvConf+10)
	for i := range big {
		big[i] = '#'
	}
	if err := os.WriteFile(p, big, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadResolvConf(p); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("huge file: err = %v", err)
	}
}
