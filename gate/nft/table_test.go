package nft

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"flowgate/gate"
	"flowgate/gate/nstest"
)

// specs are one policy per mode, with CIDR rules that need merging,
// IPv4-mapped forms and a range that is not a byte boundary.
var specs = map[string]gate.Spec{
	"public":     {Mode: gate.Public},
	"no-network": {Mode: gate.NoNetwork},
	"denylist": {Mode: gate.Denylist, BlockedHosts: entries("mirror.example.net", "198.51.100.0/24", "198.51.100.7",
		"10.0.0.0/8", "10.1.0.0/16", "11.0.0.0/8", "2001:db8:bad::/48", "::ffff:203.0.113.0/120")},
	"allowlist": {Mode: gate.Allowlist, AllowedHosts: entries("pypi.org", "*.example.com", "db", "198.51.100.0/24",
		"10.1.2.0/23", "::1.2.3.4", "2001:db8:cafe::/64")},
}

// TestTextMatchesNft applies each mode's ruleset and compares Text with
// what the nft command prints, and with Text of the table read back.
func TestTextMatchesNft(t *testing.T) {
	nstest.RequireRoot(t)
	for name, spec := range specs {
		t.Run(name, func(t *testing.T) {
			s := nstest.New(t, "fgtxt")
			r := compile(t, spec, Params{Sandbox: "bf-1a2b", UID: nstest.AgentUID, ModelPort: 4000})
			if err := Apply(s.Handle, r); err != nil {
				t.Fatal(err)
			}
			if got, want := zeroCounters(nftList(t, s)), r.Text(); got != want {
				t.Errorf("nft list differs from Text:\n--- nft list\n%s--- Text\n%s", got, want)
			}
			live, err := Read(s.Handle)
			if err != nil {
				t.Fatal(err)
			}
			if got := live.Text(); zeroCounters(got) != r.Text() {
				t.Errorf("Read's Text differs from Compile's:\n--- read\n%s--- compiled\n%s", got, r.Text())
			}
			if d := Diff(r, live); len(d) != 0 {
				t.Errorf("Diff of a fresh table: %v", d)
			}
		})
	}
}

// TestApplyTwice applies the same ruleset twice, and then another one:
// each time the table is exactly the last ruleset, nothing is left over.
func TestApplyTwice(t *testing.T) {
	nstest.RequireRoot(t)
	s := nstest.New(t, "fgtwice")
	deny := compile(t, specs["denylist"], Params{Sandbox: "twice", UID: 1000})
	for i := range 2 {
		if err := Apply(s.Handle, deny); err != nil {
			t.Fatalf("apply %d: %v", i+1, err)
		}
		if got := zeroCounters(nftList(t, s)); got != deny.Text() {
			t.Fatalf("after apply %d:\n%s\nwant\n%s", i+1, got, deny.Text())
		}
	}
	// Another table in the namespace is left alone.
	nftRun(t, s, "add", "table", "inet", "other")
	nftRun(t, s, "add", "chain", "inet", "other", "c")
	allow := compile(t, specs["allowlist"], Params{Sandbox: "twice", UID: 1000})
	if err := Apply(s.Handle, allow); err != nil {
		t.Fatal(err)
	}
	if got := zeroCounters(nftList(t, s)); got != allow.Text() {
		t.Fatalf("after replacing denylist with allowlist:\n%s\nwant\n%s", got, allow.Text())
	}
	if out := nftRun(t, s, "list", "table", "inet", "other"); !strings.Contains(out, "chain c") {
		t.Errorf("table inet other was touched:\n%s", out)
	}
	if err := Remove(s.Handle); err != nil {
		t.Fatal(err)
	}
	if err := Remove(s.Handle); err != nil {
		t.Fatalf("removing a missing table: %v", err)
	}
	out := nftRun(t, s, "list", "tables")
	if strings.Contains(out, TableName) || !strings.Contains(out, "table inet other") {
		t.Errorf("after Remove, tables are:\n%s", out)
	}
	live, err := Read(s.Handle)
	if err != nil {
		t.Fatal(err)
	}
	if live.Exists() || live.Text() != "" {
		t.Errorf("Read after Remove: exists %v, text %q", live.Exists(), live.Text())
	}
	d := Diff(allow, live)
	if len(d) != 1 || d[0].Kind != Missing || d[0].String() != "missing in table inet flowgate: table inet flowgate" {
		t.Errorf("Diff against a removed table: %v", d)
	}
}

// TestAuditCatchesHandEdits changes the live table with the nft command in
// every way an auditor must see, and checks Diff names each change.
func TestAuditCatchesHandEdits(t *testing.T) {
	nstest.RequireRoot(t)
	s := nstest.New(t, "fgaudit")
	r := compile(t, specs["denylist"], Params{Sandbox: "audit", UID: 1000})
	if err := Apply(s.Handle, r); err != nil {
		t.Fatal(err)
	}
	metaRule := `ip daddr @meta4 counter packets 0 bytes 0 jump refuse comment "flowgate audit: refuse cloud metadata (IPv4)"`
	steps := []struct {
		name   string
		edit   []string
		want   []string
		prefix bool // want holds one difference's leading text
	}{
		{
			name: "rule deleted",
			edit: []string{"delete", "rule", "inet", TableName, ChainAgent, "handle", "HANDLE:agent:flowgate audit: refuse cloud metadata (IPv4)"},
			want: []string{"missing in chain agent: " + metaRule},
		},
		{
			name: "rule added",
			edit: []string{"insert", "rule", "inet", TableName, ChainAgent, "meta", "skuid", "1000", "accept"},
			want: []string{"extra in chain agent: meta skuid 1000 accept"},
		},
		{
			name: "set element added",
			edit: []string{"add", "element", "inet", TableName, SetMeta4, "{ 192.0.2.99 }"},
			want: []string{"extra in set meta4: element 192.0.2.99"},
		},
		{
			name: "set element deleted",
			edit: []string{"delete", "element", "inet", TableName, SetBlock4, "{ 10.0.0.0/8 }"},
			want: []string{"missing in set block4: element 10.0.0.0/8"},
		},
		{
			name: "chain policy changed",
			edit: []string{"add", "chain", "inet", TableName, ChainFilter, "{ type filter hook output priority -150; policy drop; }"},
			want: []string{"changed in chain output_filter: want type filter hook output priority mangle; policy accept;; got type filter hook output priority mangle; policy drop;"},
		},
		{
			name: "table made dormant",
			edit: []string{"add", "table", "inet", TableName, "{ flags dormant; }"},
			want: []string{"changed in table inet flowgate: want flags none; got flags dormant"},
		},
		{
			name: "rule replaced",
			edit: []string{"replace", "rule", "inet", TableName, ChainAgentNAT, "handle", "HANDLE:agent_nat:flowgate audit: redirect TCP to the transparent proxy",
				"meta", "l4proto", "tcp", "counter", "redirect", "to", ":9999", "comment", `"flowgate audit: redirect TCP to the transparent proxy"`},
			want: []string{`changed in chain agent_nat: want meta l4proto tcp counter packets 0 bytes 0 redirect to :15001 comment "flowgate audit: redirect TCP to the transparent proxy"; got meta l4proto tcp counter packets 0 bytes 0 redirect to :9999 comment "flowgate audit: redirect TCP to the transparent proxy"`},
		},
		{
			// google/nftables drops expressions it cannot parse (rt here);
			// without them this rule would read like ours.
			name: "rule narrowed with an rt expression",
			edit: []string{"replace", "rule", "inet", TableName, ChainFilter, "handle", "HANDLE:output_filter:flowgate audit: filter the agent's uid",
				"meta", "skuid", "1000", "rt", "mtu", "1400", "counter", "jump", "agent", "comment", `"flowgate audit: filter the agent's uid"`},
			want:   []string{`changed in chain output_filter: want meta skuid 1000 counter packets 0 bytes 0 jump agent comment "flowgate audit: filter the agent's uid"; got meta skuid 1000 [rt 0x`},
			prefix: true,
		},
	}
	for _, st := range steps {
		if err := Apply(s.Handle, r); err != nil {
			t.Fatal(err)
		}
		args := append([]string(nil), st.edit...)
		for i, a := range args {
			if rest, ok := strings.CutPrefix(a, "HANDLE:"); ok {
				chain, comment, _ := strings.Cut(rest, ":")
				args[i] = handleOf(t, s, chain, comment)
			}
		}
		nftRun(t, s, args...)
		live, err := Read(s.Handle)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range Diff(r, live) {
			got = append(got, d.String())
		}
		if st.prefix && len(got) == 1 && strings.HasPrefix(got[0], st.want[0]) {
			continue
		}
		if strings.Join(got, "\n") != strings.Join(st.want, "\n") {
			t.Errorf("%s: diff\n%s\nwant\n%s", st.name, strings.Join(got, "\n"), strings.Join(st.want, "\n"))
		}
	}
	// Whatever traffic passed, counters do not make a difference.
	if err := Apply(s.Handle, r); err != nil {
		t.Fatal(err)
	}
	out, err := s.Output(s.Command(1000, probePath(t), "tcp:127.0.0.1:1", "udp:192.0.2.1:9"))
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out := nftList(t, s); !strings.Contains(out, "counter packets 1 ") {
		t.Fatalf("no counter moved:\n%s", out)
	}
	live, err := Read(s.Handle)
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(r, live); len(d) != 0 {
		t.Errorf("diff after re-apply: %v", d)
	}
}

// TestWatch checks that the watch reports a flush made with the nft
// command, and not the changes this process makes itself.
func TestWatch(t *testing.T) {
	nstest.RequireRoot(t)
	s := nstest.New(t, "fgwatch")
	r := compile(t, specs["allowlist"], Params{Sandbox: "watch", UID: 1000})
	if err := Apply(s.Handle, r); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []Event
	got := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := Watch(ctx, s.Handle, func(e Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
		got <- struct{}{}
	}); err != nil {
		t.Fatal(err)
	}
	// Our own changes: a re-apply, learned addresses, a removal and an
	// apply again.
	if err := Apply(s.Handle, r); err != nil {
		t.Fatal(err)
	}
	l, err := NewLearner(s.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Add(addrs("192.0.2.10", "2001:db8::10"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := Remove(s.Handle); err != nil {
		t.Fatal(err)
	}
	if err := Apply(s.Handle, r); err != nil {
		t.Fatal(err)
	}
	// Changes to another table are not ours to watch.
	nftRun(t, s, "add", "table", "inet", "other")
	// Someone else's: a flush of the agent chain.
	nftRun(t, s, "flush", "chain", "inet", TableName, ChainAgent)
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no event for a flush made with nft")
	}
	// And someone else's learned address.
	nftRun(t, s, "add", "element", "inet", TableName, SetLearned4, "{ 192.0.2.66 timeout 1m }")
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no event for an element added with nft")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 2 {
		t.Fatalf("got %d events, want 2: %v", len(events), events)
	}
	e := events[0]
	agentRules := 0
	for _, ch := range r.chains {
		if ch.name == ChainAgent {
			agentRules = len(ch.rules)
		}
	}
	if e.Err != nil || e.Comm != "nft" || e.PID == 0 || len(e.Changes) != agentRules {
		t.Errorf("flush event: %s (%d changes, want one per rule of chain agent: %d)", e, len(e.Changes), agentRules)
	}
	for _, c := range e.Changes {
		if c.Op != "delete" || c.Object != "rule" || c.Name != ChainAgent || c.Handle == 0 || !strings.HasPrefix(c.Comment, "flowgate watch: ") {
			t.Errorf("flush change: %+v", c)
		}
	}
	if want := `delete rule agent handle`; !strings.Contains(e.String(), want) {
		t.Errorf("event text %q lacks %q", e.String(), want)
	}
	e = events[1]
	if len(e.Changes) != 1 || e.Changes[0].String() != "add 1 elements of set learned4" || e.Comm != "nft" {
		t.Errorf("element event: %s", e)
	}
}

// TestCgroup checks that with a cgroup, a root process inside it is
// filtered like the agent's uid, and root outside it is not.
func TestCgroup(t *testing.T) {
	nstest.RequireRoot(t)
	m, err := findCgroup2()
	if err != nil {
		t.Fatal(err)
	}
	var rnd [4]byte
	rand.Read(rnd[:])
	rel := fmt.Sprintf("flowgate-nfttest-%x", rnd)
	dir := filepath.Join(m.dir, rel)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("making cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("removing cgroup %s: %v", dir, err)
		}
	})
	tp := newTopo(t)
	r := compile(t, gate.Spec{Mode: gate.NoNetwork}, Params{Sandbox: "cg", UID: nstest.AgentUID, Cgroup: "/" + rel + "/"})
	if !strings.Contains(r.Text(), `socket cgroupv2 level 1 "`+rel+`" counter packets 0 bytes 0 jump agent comment "flowgate cg: filter the agent's cgroup"`) {
		t.Fatalf("no cgroup rule in:\n%s", r.Text())
	}
	if err := Apply(tp.s.Handle, r); err != nil {
		t.Fatal(err)
	}
	live, err := Read(tp.s.Handle)
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(r, live); len(d) != 0 {
		t.Errorf("diff: %v", d)
	}
	if zeroCounters(live.Text()) != r.Text() {
		t.Errorf("read back:\n%s\nwant\n%s", live.Text(), r.Text())
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	run := func(inCgroup bool) map[string]string {
		cmd := tp.s.Command(0, probePath(t), tcpPeer4, udpPeer4, tcpLocal4)
		if inCgroup {
			cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(f.Fd())
		}
		out, err := tp.s.Output(cmd)
		if err != nil {
			t.Fatalf("probe: %v\n%s", err, out)
		}
		res := make(map[string]string)
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			fl := strings.Fields(line)
			res[fl[0]] = strings.Join(fl[1:len(fl)-1], " ")
		}
		return res
	}
	if got := run(true); got[tcpPeer4] != refused || got[udpPeer4] != eperm || got[tcpLocal4] != "ok local" {
		t.Errorf("root in the cgroup: %v", got)
	}
	if got := run(false); got[tcpPeer4] != open[tcpPeer4] || got[udpPeer4] != "ok peer" {
		t.Errorf("root outside the cgroup: %v", got)
	}
}

// TestLearner checks per-element timeouts, that an address keeps its later
// expiry, IPv4-mapped addresses, and the errors.
func TestLearner(t *testing.T) {
	nstest.RequireRoot(t)
	s := nstest.New(t, "fglearn")
	if err := Apply(s.Handle, compile(t, specs["denylist"], Params{Sandbox: "learn", UID: 1000})); err != nil {
		t.Fatal(err)
	}
	if _, err := NewLearner(s.Handle); err == nil || !strings.Contains(err.Error(), "set learned4") {
		t.Fatalf("learner on a denylist table: %v", err)
	}
	if err := Apply(s.Handle, compile(t, specs["allowlist"], Params{Sandbox: "learn", UID: 1000})); err != nil {
		t.Fatal(err)
	}
	l, err := NewLearner(s.Handle)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Add(addrs("192.0.2.10", "2001:db8::10"), 90*time.Second); err != nil {
		t.Fatal(err)
	}
	// A shorter TTL for the same address does not cut its expiry short.
	if err := l.Add(addrs("192.0.2.10", "::ffff:192.0.2.20", "192.0.2.20"), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Add(nil, time.Second); err != nil {
		t.Errorf("adding nothing: %v", err)
	}
	if err := l.Add(addrs("192.0.2.30"), 0); err == nil {
		t.Error("a zero timeout was accepted")
	}
	live, err := Read(s.Handle)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]time.Duration{}
	for _, name := range []string{SetLearned4, SetLearned6} {
		for _, e := range live.set(name).elems {
			got[e.from.String()] = e.timeout
			if e.expires <= 0 || e.expires > e.timeout {
				t.Errorf("%s: expires %v with timeout %v", e.from, e.expires, e.timeout)
			}
		}
	}
	if len(got) != 3 || got["192.0.2.10"] < 85*time.Second || got["2001:db8::10"] != 90*time.Second || got["192.0.2.20"] != 30*time.Second {
		t.Errorf("learned elements and timeouts: %v", got)
	}
	kept := regexp.MustCompile(`elements = \{ 192\.0\.2\.10 timeout 1m(30s|29s\d+ms) expires `)
	if text := live.Text(); !kept.MatchString(text) || !strings.Contains(text, "192.0.2.20 timeout 30s expires ") {
		t.Errorf("live text of learned4:\n%s", text)
	}
	// Read renders learned elements as nft does, up to the time that
	// passed between the two reads.
	expires := regexp.MustCompile(`expires [0-9dhms]+`)
	norm := func(s string) string { return expires.ReplaceAllString(zeroCounters(s), "expires X") }
	if a, b := norm(nftList(t, s)), norm(live.Text()); a != b {
		t.Errorf("nft list:\n%s\nlive Text:\n%s", a, b)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if err := l.Add(addrs("192.0.2.40"), time.Second); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("add after close: %v", err)
	}
}

// TestLearnedSetBound: a learned set holds at most LearnedSetSize
// addresses; past that the kernel refuses more, and Add says so (the DNS
// proxy then answers SERVFAIL), until some expire.
func TestLearnedSetBound(t *testing.T) {
	nstest.RequireRoot(t)
	s := nstest.New(t, "fgbound")
	if err := Apply(s.Handle, compile(t, specs["allowlist"], Params{Sandbox: "bound", UID: 1000})); err != nil {
		t.Fatal(err)
	}
	l, err := NewLearner(s.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Set elements only: nothing is sent to these addresses.
	base := uint32(10 << 24)
	batch := make([]netip.Addr, 0, 4096) // more than one netlink attribute holds
	for i := uint32(0); i < LearnedSetSize; i++ {
		batch = append(batch, netip.AddrFrom4([4]byte{byte((base + i) >> 24), byte((base + i) >> 16), byte((base + i) >> 8), byte(base + i)}))
		if len(batch) == cap(batch) {
			if err := l.Add(batch, time.Hour); err != nil {
				t.Fatalf("adding addresses up to the bound, at %d: %v", i, err)
			}
			batch = batch[:0]
		}
	}
	live, err := Read(s.Handle)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(live.set(SetLearned4).elems); n != LearnedSetSize {
		t.Fatalf("learned4 holds %d addresses after adding %d, each accepted", n, LearnedSetSize)
	}
	err = l.Add(addrs("192.0.2.77"), time.Hour)
	if err == nil {
		t.Fatalf("the %d+1st address was accepted", LearnedSetSize)
	}
	if !strings.Contains(err.Error(), "a learned set is full (65536 addresses each)") {
		t.Errorf("error %q does not say that the set is full", err)
	}
	// The other family has its own bound, and an address already there is
	// refreshed, not added.
	if err := l.Add(addrs("2001:db8::77"), time.Hour); err != nil {
		t.Errorf("IPv6 refused while only the IPv4 set is full: %v", err)
	}
	if err := l.Add(addrs("10.0.0.1"), 2*time.Hour); err != nil {
		t.Errorf("refreshing an address in a full set: %v", err)
	}
}

// TestApplyManyCIDRs: a denylist of tens of thousands of CIDR rules reaches
// the kernel whole, in one transaction: elements go in messages small
// enough for netlink's 16-bit attribute lengths (past them the kernel
// silently took a part), and the socket's send buffer takes the whole
// transaction (the default refused it). Read and Diff confirm.
func TestApplyManyCIDRs(t *testing.T) {
	nstest.RequireRoot(t)
	s := nstest.New(t, "fgmany")
	var hosts []string
	for i := range manyCIDRs {
		hosts = append(hosts, fmt.Sprintf("10.%d.%d.0/24", i/256%256, i%256), fmt.Sprintf("11.%d.%d.0/24", i/256%256, i%256))
		hosts = append(hosts, fmt.Sprintf("2001:db8:%x::/48", i))
	}
	r := compile(t, gate.Spec{Mode: gate.Denylist, BlockedHosts: entries(hosts...)}, Params{Sandbox: "many", UID: 1000})
	if err := Apply(s.Handle, r); err != nil {
		t.Fatal(err)
	}
	live, err := Read(s.Handle)
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(r, live); len(d) != 0 {
		n := min(len(d), 5)
		t.Fatalf("%d differences after Apply, first %d: %v", len(d), n, d[:n])
	}
}

// manyCIDRs is how many IPv4 and how many IPv6 CIDR rules
// TestApplyManyCIDRs applies.
const manyCIDRs = 20000

// TestApplyVerifies: with elements sent in one oversized message again (the
// old bug), the kernel takes a set only in part; Apply reads the table
// back and fails instead of passing it for applied, and leaves the
// no-network table in its place.
func TestApplyVerifies(t *testing.T) {
	nstest.RequireRoot(t)
	s := nstest.New(t, "fgverify")
	old := elementsPerMessage
	elementsPerMessage = 1 << 20
	defer func() { elementsPerMessage = old }()
	var hosts []string
	for i := range 1500 {
		hosts = append(hosts, fmt.Sprintf("2001:db8:%x::/48", i))
	}
	r := compile(t, gate.Spec{Mode: gate.Denylist, BlockedHosts: entries(hosts...)}, Params{Sandbox: "verify", UID: 1000})
	err := Apply(s.Handle, r)
	if err == nil || !strings.Contains(err.Error(), "holds another table") || !strings.Contains(err.Error(), "block6") {
		t.Fatalf("Apply of a set the kernel takes in part: %v, want the read-back to refuse it", err)
	}
	if !strings.Contains(err.Error(), "replaced with the no-network table") {
		t.Errorf("Apply's error %q does not say what stands in place of the table", err)
	}
	// What stands is the same sandbox's no-network table, whole.
	live, err := Read(s.Handle)
	if err != nil {
		t.Fatal(err)
	}
	want := compile(t, gate.Spec{Mode: gate.NoNetwork}, Params{Sandbox: "verify", UID: 1000})
	if d := Diff(want, live); len(d) > 0 {
		t.Errorf("after a failed verification the table is not the no-network one: %d differences, the first: %s", len(d), d[0])
	}
}
