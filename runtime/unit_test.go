package runtime

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/google/nftables"
)

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"a", "t1", "half-life-1a2b3c4d", strings.Repeat("z", 20), "0-0"} {
		if err := validateName(ok); err != nil {
			t.Errorf("validateName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", "a-", "A", "a_b", "a.b", "a b", strings.Repeat("z", 21), "ä", "a\n"} {
		if err := validateName(bad); err == nil {
			t.Errorf("validateName(%q) accepted", bad)
		}
	}
}

func TestValidateWorkdir(t *testing.T) {
	good := map[string]string{"": "/app", "/app": "/app", "/opt/task": "/opt/task", "/srv/x": "/srv/x", "/usr/src/app": "/usr/src/app"}
	for in, want := range good {
		if got, err := validateWorkdir(in); err != nil || got != want {
			t.Errorf("validateWorkdir(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"/", "app", "/app/", "/app/../etc", "/tmp", "/tmp/x", "/var/tmp/x", "/home/agent/app", "/root/app", "/logs/x", "/proc/x", "/dev/shm/x", "/run/x", "/usr", "/etc", "/var", "/lib"} {
		if _, err := validateWorkdir(bad); err == nil {
			t.Errorf("validateWorkdir(%q) accepted", bad)
		}
	}
}

func TestHostLinkName(t *testing.T) {
	seen := map[string]string{}
	for _, n := range []string{"a", "abcdefghijkl", "abcdefghijklm", "half-life-1a2b3c4d", "half-life-1a2b3c4e", "a-----------------b", strings.Repeat("9", 20)} {
		l := hostLinkName(n)
		if len(l) > 15 || !strings.HasPrefix(l, "fg-") {
			t.Errorf("hostLinkName(%q) = %q", n, l)
		}
		if o, dup := seen[l]; dup {
			t.Errorf("%q and %q share link name %q", o, n, l)
		}
		seen[l] = n
	}
	if got := hostLinkName("abcdefghijkl"); got != "fg-abcdefghijkl" {
		t.Errorf("a name that fits is used as is: %q", got)
	}
}

func TestPool(t *testing.T) {
	p := DefaultPool()
	if err := p.validate(); err != nil {
		t.Fatal(err)
	}
	if n := p.slots(); n != 1<<14 {
		t.Errorf("slots = %d, want %d (a /16 of /30s)", n, 1<<14)
	}
	n4, n6 := p.subnets(0)
	if n4 != netip.MustParsePrefix("10.209.0.0/30") || n6 != netip.MustParsePrefix("fd66:6c67:7700::/64") {
		t.Errorf("slot 0 = %v %v", n4, n6)
	}
	n4, n6 = p.subnets(300)
	if n4 != netip.MustParsePrefix("10.209.4.176/30") || n6 != netip.MustParsePrefix("fd66:6c67:7700:12c::/64") {
		t.Errorf("slot 300 = %v %v", n4, n6)
	}
	if hostAddr(n4) != netip.MustParsePrefix("10.209.4.177/30") || peerAddr(n4) != netip.MustParsePrefix("10.209.4.178/30") {
		t.Errorf("slot 300 ends: %v %v", hostAddr(n4), peerAddr(n4))
	}
	if peerAddr(n6) != netip.MustParsePrefix("fd66:6c67:7700:12c::2/64") {
		t.Errorf("slot 300 v6 peer: %v", peerAddr(n6))
	}
	small := Pool{V4: netip.MustParsePrefix("192.168.7.0/29"), V6: netip.MustParsePrefix("fd00::/120")}
	if n := small.slots(); n != 2 {
		t.Errorf("small pool slots = %d", n)
	}
	if _, n6 := small.subnets(1); n6 != netip.MustParsePrefix("fd00::4/126") {
		t.Errorf("small pool slot 1 v6 = %v", n6)
	}
	i, a, _, err := small.pick([]netip.Prefix{netip.MustParsePrefix("192.168.7.1/32")})
	if err != nil || i != 1 || a != netip.MustParsePrefix("192.168.7.4/30") {
		t.Errorf("pick around a used address = %d %v %v", i, a, err)
	}
	if _, _, _, err := small.pick([]netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}); err == nil || !strings.Contains(err.Error(), "exhausted") {
		t.Errorf("pick in a covered pool = %v", err)
	}
	for _, bad := range [][2]string{{"10.0.0.0/31", ""}, {"10.0.0.1/16", ""}, {"fd00::/64", ""}, {"127.0.0.0/8", ""}, {"10.0.0.0/16", "fd00::/125"}, {"10.0.0.0/16", "10.1.0.0/16"}, {"10.0.0.0/16", "ff02::/16"}} {
		if _, err := ParsePool(bad[0], bad[1]); err == nil {
			t.Errorf("ParsePool(%q, %q) accepted", bad[0], bad[1])
		}
	}
	if p, err := ParsePool("10.1.0.0/24", "none"); err != nil || p.V6.IsValid() {
		t.Errorf("ParsePool without IPv6 = %v, %v", p, err)
	}
}

func TestParseNameservers(t *testing.T) {
	in := "# comment\nnameserver 127.0.0.53\nnameserver 10.255.255.53 # trailing\n  nameserver\t2001:db8::1\nnameserver fe80::1%eth0\nnameserver ::1\nnameserver nonsense\nsearch example.com\noptions edns0\nnameserver 0.0.0.0\n"
	got := parseNameservers([]byte(in))
	want := []string{"127.0.0.53", "10.255.255.53", "2001:db8::1", "fe80::1%eth0", "::1", "0.0.0.0"}
	if len(got) != len(want) {
		t.Fatalf("parseNameservers = %v", got)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("nameserver %d = %v, want %s", i, got[i], want[i])
		}
	}
	keep, dropped := usableResolvers(got)
	if len(keep) != 2 || keep[0].String() != "10.255.255.53" || keep[1].String() != "2001:db8::1" || len(dropped) != 4 {
		t.Errorf("usableResolvers = %v, dropped %v", keep, dropped)
	}
}

func TestResolversFromHost(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := dir + "/" + name
		if err := writeFileString(p, s); err != nil {
			t.Fatal(err)
		}
		return p
	}
	oldHost, oldUp := hostResolvConf, resolvedUpstreams
	defer func() { hostResolvConf, resolvedUpstreams = oldHost, oldUp }()

	hostResolvConf, resolvedUpstreams = write("a", "nameserver 127.0.0.53\n"), write("b", "nameserver 192.0.2.1\nnameserver 127.0.0.1\n")
	if got, err := (&Local{}).resolvers(); err != nil || len(got) != 1 || got[0].String() != "192.0.2.1" {
		t.Errorf("stub with upstreams = %v, %v", got, err)
	}
	resolvedUpstreams = dir + "/missing"
	if _, err := (&Local{}).resolvers(); err == nil || !strings.Contains(err.Error(), "pass --dns ADDR") || !strings.Contains(err.Error(), "127.0.0.53") {
		t.Errorf("only a stub: %v", err)
	}
	hostResolvConf = write("c", "search x\n")
	if _, err := (&Local{}).resolvers(); err == nil || !strings.Contains(err.Error(), "lists no nameserver") {
		t.Errorf("no nameserver: %v", err)
	}
	if got, err := (&Local{DNS: []netip.Addr{netip.MustParseAddr("192.0.2.9")}}).resolvers(); err != nil || got[0].String() != "192.0.2.9" {
		t.Errorf("--dns: %v, %v", got, err)
	}
	if _, err := (&Local{DNS: []netip.Addr{netip.MustParseAddr("::1")}}).resolvers(); err == nil {
		t.Errorf("--dns ::1 accepted")
	}
}

func TestUsers(t *testing.T) {
	passwd := parseIDFile([]byte("root:x:0:0:root:/root:/bin/bash\ncloudsdk:x:1000:1000::/home/cloudsdk:/bin/bash\n+nis\nbroken line\nagent:x:1001:1002::/home/agent:/bin/sh\nzero:x:60100:60100::/:/bin/sh\n"), true)
	group := parseIDFile([]byte("root:x:0:\ncloudsdk:x:1000:\nagent:x:1002:\nother:x:60101:\n"), false)

	if uid, gid, err := agentIDs("agent", passwd, group); err != nil || uid != 1001 || gid != 1002 {
		t.Errorf("existing host user: %d %d %v", uid, gid, err)
	}
	if uid, gid, err := agentIDs("bot", passwd, group); err != nil || uid != 60102 || gid != 60102 {
		t.Errorf("new user: %d %d %v, want 60102 (60100 and 60101 are used)", uid, gid, err)
	}
	badRoot := parseIDFile([]byte("toor:x:0:0::/:/bin/sh\n"), true)
	if _, _, err := agentIDs("toor", badRoot, nil); err == nil || !strings.Contains(err.Error(), "must not run as root") {
		t.Errorf("a host user with uid 0: %v", err)
	}

	f := renderUsers("bot", 60102, 60102, "/bin/bash", passwd, group)
	wantPasswd := "root:x:0:0:root:/root:/bin/bash\ncloudsdk:x:1000:1000::/home/cloudsdk:/bin/bash\n+nis\nbroken line\nagent:x:1001:1002::/home/agent:/bin/sh\nzero:x:60100:60100::/:/bin/sh\nbot:x:60102:60102:flowgate agent:/home/bot:/bin/bash\n"
	if string(f.passwd) != wantPasswd {
		t.Errorf("passwd:\n%s", f.passwd)
	}
	if !strings.HasSuffix(string(f.group), "other:x:60101:\nbot:x:60102:\n") {
		t.Errorf("group:\n%s", f.group)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(f.shadow)), "\n") {
		if fields := strings.Split(line, ":"); len(fields) < 2 || fields[1] != "*" {
			t.Errorf("shadow line %q does not lock the password", line)
		}
	}
	// The host's own agent entry is replaced, with the sandbox's home.
	f = renderUsers("agent", 1001, 1002, "/bin/sh", passwd, group)
	if countPrefix(string(f.passwd), "agent:") != 1 || !strings.Contains(string(f.passwd), "agent:x:1001:1002:flowgate agent:/home/agent:/bin/sh\n") {
		t.Errorf("passwd with the host's agent:\n%s", f.passwd)
	}
	if countPrefix(string(f.group), "agent:") != 1 {
		t.Errorf("group with the host's agent:\n%s", f.group)
	}
}

func TestParseStatStart(t *testing.T) {
	line := "1234 (a) b (c)) S 1 1234 1234 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000000 100\n"
	if got, err := parseStatStart([]byte(line)); err != nil || got != 987654 {
		t.Errorf("parseStatStart = %d, %v", got, err)
	}
	zombie := "1234 (bench) Z 1 1234 1234 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 987654 0 0\n"
	for _, bad := range []string{"", "1234 (x", "1 (x) S 1 2", zombie} {
		if _, err := parseStatStart([]byte(bad)); err == nil {
			t.Errorf("parseStatStart(%q) accepted", bad)
		}
	}
	me, err := self()
	if err != nil || !me.alive() {
		t.Errorf("self = %+v, %v", me, err)
	}
	if (owner{PID: me.PID, Start: me.Start + 1}).alive() {
		t.Errorf("a different start time counts as alive")
	}
}

func TestParseCgroup2Mount(t *testing.T) {
	mi := "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n41 31 0:38 / /sys/fs/cgroup/uni\\040fied rw,relatime shared:9 - cgroup2 cgroup2 rw\n"
	if got := parseCgroup2Mount([]byte(mi)); got != "/sys/fs/cgroup/uni fied" {
		t.Errorf("parseCgroup2Mount = %q", got)
	}
	if got := parseCgroup2Mount([]byte("garbage\n")); got != "" {
		t.Errorf("parseCgroup2Mount(garbage) = %q", got)
	}
}

func TestRuleOwner(t *testing.T) {
	r := &nftables.Rule{UserData: comment("half-life-1", "masquerade IPv4")}
	if got := ruleOwner(r); got != "half-life-1" {
		t.Errorf("ruleOwner = %q", got)
	}
	for _, c := range [][]byte{nil, comment("Bad_Name", "x"), []byte("junk")} {
		if got := ruleOwner(&nftables.Rule{UserData: c}); got != "" {
			t.Errorf("ruleOwner(%q) = %q", c, got)
		}
	}
}

func TestPlanOrder(t *testing.T) {
	st := &state{Name: "p", AgentUser: "agent", Workdir: "/opt/task", LogsDir: "/tmp/logs"}
	steps, err := plan(st, sandboxLayout{dir: t.TempDir()}, "/var/lib/flowgate")
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range steps {
		pos[m.Kind+" "+m.Target] = i
	}
	before := [][2]string{
		{"mount /opt", "bind /opt/task"},
		{"mount /var", "bind /var/tmp"},
		{"mount /etc", "bind /etc/resolv.conf"},
		{"mount /dev", "bind /dev/null"},
		{"mount /dev", "mount /dev/pts"},
		{"mount /run", "dir /run/lock"},
	}
	for _, b := range before {
		i, ok1 := pos[b[0]]
		j, ok2 := pos[b[1]]
		if !ok1 || !ok2 || i > j {
			t.Errorf("%s must come before %s (%d, %d)", b[0], b[1], i, j)
		}
	}
	if _, ok := pos["mount /var/lib/flowgate"]; ok {
		// Only hidden when it exists on this host.
		if pos["mount /var/lib/flowgate"] < pos["mount /var"] {
			t.Errorf("the state dir is hidden before /var is mounted")
		}
	}
	var kinds []string
	for _, m := range steps {
		if m.Target == "/usr" {
			kinds = append(kinds, m.Kind, m.FSType)
		}
	}
	if !reflect.DeepEqual(kinds, []string{"mount", "overlay"}) {
		t.Errorf("/usr steps = %v", kinds)
	}
}

func writeFileString(p, s string) error { return os.WriteFile(p, []byte(s), 0o644) }

func countPrefix(s, prefix string) int {
	n := 0
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(line, prefix) {
			n++
		}
	}
	return n
}

// TestReadTreeBounds: what CopyIn carries is bounded in entries as well as
// bytes (empty files cost no bytes).
func TestReadTreeBounds(t *testing.T) {
	dir := t.TempDir()
	for i := range maxCopyEntries {
		if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := readTree(dir, "/tests"); err == nil || !strings.Contains(err.Error(), "more than 50000 files, folders and links") {
		t.Errorf("readTree of %d empty files and their folder: %v", maxCopyEntries, err)
	}
	if err := os.Remove(filepath.Join(dir, "0")); err != nil {
		t.Fatal(err)
	}
	if entries, err := readTree(dir, "/tests"); err != nil || len(entries) != maxCopyEntries {
		t.Errorf("readTree at the bound: %d entries, %v", len(entries), err)
	}
}
