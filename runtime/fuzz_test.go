package runtime

import (
	"strings"
	"testing"

	"github.com/google/nftables"
)

// The host's resolv.conf, passwd and group files, rule UserData in the
// uplink's ruleset and /proc/PID/stat lines are read from outside: none
// may make the parsers panic, and what they return must be usable.

func FuzzParseNameservers(f *testing.F) {
	f.Add([]byte("nameserver 10.0.0.1\nnameserver ::1\n"))
	f.Add([]byte("nameserver fe80::1%eth0 # c\nsearch a b\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		addrs := parseNameservers(b)
		keep, dropped := usableResolvers(addrs)
		if len(keep)+len(dropped) != len(addrs) {
			t.Fatalf("usableResolvers lost addresses: %v -> %v + %v", addrs, keep, dropped)
		}
		for _, a := range keep {
			if a.IsLoopback() || a.Zone() != "" || !a.IsValid() {
				t.Fatalf("kept %v", a)
			}
		}
		conf := string(resolvConf(keep))
		if got := parseNameservers([]byte(conf)); len(got) != len(keep) {
			t.Fatalf("rendered resolv.conf reads back as %v, want %v", got, keep)
		}
	})
}

func FuzzUsers(f *testing.F) {
	f.Add([]byte("root:x:0:0:root:/root:/bin/bash\nagent:x:1001:1001::/home/agent:/bin/sh\n"), []byte("root:x:0:\nagent:x:1001:\n"))
	f.Add([]byte("a:b\n::::\n+::::::\nx:x:4294967296:1::/:/bin/sh\n"), []byte(":x:1:\n"))
	f.Fuzz(func(t *testing.T, pw, gr []byte) {
		passwd, group := parseIDFile(pw, true), parseIDFile(gr, false)
		uid, gid, err := agentIDs("agent", passwd, group)
		if err != nil {
			return
		}
		if uid == 0 || gid == 0 {
			t.Fatalf("agent ids %d:%d", uid, gid)
		}
		f := renderUsers("agent", uid, gid, "/bin/sh", passwd, group)
		n := 0
		for _, e := range parseIDFile(f.passwd, true) {
			if e.Name == "agent" {
				n++
				if e.UID != uid || e.GID != gid {
					t.Fatalf("agent entry %q", e.Line)
				}
			}
		}
		if n != 1 {
			t.Fatalf("%d agent entries in\n%s", n, f.passwd)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(f.shadow)), "\n") {
			if parts := strings.Split(line, ":"); len(parts) < 2 || parts[1] != "*" {
				t.Fatalf("shadow line %q", line)
			}
		}
	})
}

func FuzzRuleOwner(f *testing.F) {
	f.Add(comment("half-life-1", "masquerade IPv4"))
	f.Add([]byte{0, 200, 'a'})
	f.Add([]byte{1, 1, 0, 0, 3, 'a', 'b', 0})
	f.Fuzz(func(t *testing.T, ud []byte) {
		name := ruleOwner(&nftables.Rule{UserData: ud})
		if name != "" && validateName(name) != nil {
			t.Fatalf("ruleOwner returned invalid name %q", name)
		}
	})
}

func FuzzParseStatStart(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 42 1 1\n"))
	f.Add([]byte("7 (a) b) c) R 1 2 3"))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseStatStart(b)
	})
}
