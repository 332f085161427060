package nft

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"flowgate/gate"
)

var update = flag.Bool("update", false, "rewrite testdata/*.nft from Compile")

// TestGolden pins the text of each mode's ruleset. The files are what
// `nft list table inet flowgate` prints for them (TestTextMatchesNft checks
// that on the kernel).
func TestGolden(t *testing.T) {
	for name, spec := range specs {
		t.Run(name, func(t *testing.T) {
			r := compile(t, spec, Params{Sandbox: "bf-1a2b", UID: 1000, ModelPort: 4000})
			path := filepath.Join("testdata", name+".nft")
			if *update {
				if err := os.WriteFile(path, []byte(r.Text()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Text(); got != string(want) {
				t.Errorf("Text differs from %s:\n%s", path, got)
			}
		})
	}
}

func TestParamsRefused(t *testing.T) {
	p, err := gate.Compile(gate.Spec{Mode: gate.Denylist})
	if err != nil {
		t.Fatal(err)
	}
	ok := Params{Sandbox: "bf-1a2b", UID: 1000}
	cases := []struct {
		name   string
		change func(*Params)
		want   string
	}{
		{"empty sandbox", func(p *Params) { p.Sandbox = "" }, "sandbox name is empty"},
		{"long sandbox", func(p *Params) { p.Sandbox = strings.Repeat("a", 33) }, "longer than 32 characters"},
		{"upper case", func(p *Params) { p.Sandbox = "Bf" }, `has character 'B'; use a-z, 0-9 and -`},
		{"quote", func(p *Params) { p.Sandbox = `a"b` }, `has character '"'`},
		{"uid 0", func(p *Params) { p.UID = 0 }, "uid 0 cannot be filtered"},
		{"root cgroup", func(p *Params) { p.Cgroup = "/" }, "names the root cgroup"},
		{"dot dot", func(p *Params) { p.Cgroup = "a/../b" }, "is not clean"},
		{"space", func(p *Params) { p.Cgroup = "a b" }, `has character ' '`},
		{"quote cgroup", func(p *Params) { p.Cgroup = `a"b` }, `has character '"'`},
		{"long cgroup", func(p *Params) { p.Cgroup = strings.Repeat("a/", 101) }, "longer than 200"},
		{"same ports", func(p *Params) { p.Ports = gate.Ports{DNS: 1, Transparent: 1, Proxy: 2} }, "ports must differ"},
		{"model port", func(p *Params) { p.ModelPort = gate.DefaultPorts.Proxy }, "model proxy port 15080 is also one of flowgate's ports"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			params := ok
			tc.change(&params)
			r, err := Compile(p, params)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "compiling ruleset: ") {
				t.Fatalf("got %v, %v; want an error containing %q", r, err, tc.want)
			}
		})
	}
	if _, err := Compile(nil, ok); err == nil || err.Error() != "compiling ruleset: no policy" {
		t.Errorf("nil policy: %v", err)
	}
	if _, err := Compile(&gate.Policy{Mode: gate.Mode(9)}, ok); err == nil || !strings.Contains(err.Error(), "unknown network mode mode(9)") {
		t.Errorf("bad mode: %v", err)
	}
}

func TestDefaultPorts(t *testing.T) {
	r := compile(t, gate.Spec{Mode: gate.Denylist}, Params{Sandbox: "x", UID: 5, Ports: gate.Ports{DNS: 5353}})
	text := r.Text()
	for _, want := range []string{"redirect to :5353", "redirect to :15001", "explicit proxy :15080"} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q", want)
		}
	}
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

func TestIntervalElements(t *testing.T) {
	in := prefixes("10.1.0.0/16", "10.0.0.0/8", "10.0.0.0/8", "192.0.2.7/32", "::ffff:198.51.100.0/120",
		"11.0.0.0/8", "2001:db8::/32", "2001:db8:1::/48", "0.0.0.0/0", "::/0")
	var got4, got6 []string
	for _, e := range intervalElements(in, false) {
		got4 = append(got4, elementText(e))
	}
	for _, e := range intervalElements(in, true) {
		got6 = append(got6, elementText(e))
	}
	// 0.0.0.0/0 holds every IPv4 prefix; ::/0 every IPv6 one.
	if strings.Join(got4, " ") != "0.0.0.0/0" || strings.Join(got6, " ") != "::/0" {
		t.Errorf("with /0: %v %v", got4, got6)
	}
	got4 = nil
	for _, e := range intervalElements(in[:8], false) {
		got4 = append(got4, elementText(e))
	}
	if want := "10.0.0.0/8 11.0.0.0/8 192.0.2.7 198.51.100.0/24"; strings.Join(got4, " ") != want {
		t.Errorf("IPv4: got %v, want %s", got4, want)
	}
}

func TestIntervalRoundTrip(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		elems := intervalElements(prefixes("10.0.0.0/8", "11.0.0.0/8", "192.0.2.7/32", "255.255.255.0/24",
			"2001:db8::/32", "ffff::/16", "::1/128"), v6)
		raw := kernelElements(elems)
		// The nft command adds an end at the zero address; it opens nothing.
		zero := make([]byte, 4)
		if v6 {
			zero = make([]byte, 16)
		}
		raw = append(raw, nftables.SetElement{Key: zero, IntervalEnd: true})
		back, err := decodeInterval(raw)
		if err != nil {
			t.Fatal(err)
		}
		if len(back) != len(elems) {
			t.Fatalf("v6 %v: %d elements back, want %d", v6, len(back), len(elems))
		}
		for i := range elems {
			if back[i].from != elems[i].from || back[i].to != elems[i].to {
				t.Errorf("v6 %v: element %d: %v, want %v", v6, i, back[i], elems[i])
			}
		}
	}
	if _, err := decodeInterval([]nftables.SetElement{{Key: []byte{10, 0, 0, 1}, IntervalEnd: true}}); err == nil {
		t.Error("an end without a start decoded")
	}
	if _, err := decodeInterval([]nftables.SetElement{{Key: []byte{1, 2, 3}}}); err == nil {
		t.Error("a 3-byte key decoded")
	}
}

func TestElementText(t *testing.T) {
	a := netip.MustParseAddr
	cases := []struct {
		e    element
		want string
	}{
		{element{from: a("192.0.2.5"), to: a("192.0.2.9")}, "192.0.2.5-192.0.2.9"},
		{element{from: a("192.0.2.0"), to: a("192.0.2.255")}, "192.0.2.0/24"},
		{element{from: a("::1.2.3.4"), to: a("::1.2.3.4")}, "::1.2.3.4"},
		{element{from: a("::2"), to: a("::2")}, "::2"},
		{element{from: a("::ffff:1.2.3.4"), to: a("::ffff:1.2.3.4")}, "::ffff:1.2.3.4"},
		{element{from: a("192.0.2.7"), to: a("192.0.2.7"), timeout: 90 * time.Second, expires: 89992 * time.Millisecond}, "192.0.2.7 timeout 1m30s expires 1m29s992ms"},
		{element{from: a("192.0.2.7"), to: a("192.0.2.7"), timeout: 24 * time.Hour}, "192.0.2.7 timeout 1d"},
		{element{raw: []byte{0, 80}}, "0x0050"},
	}
	for _, tc := range cases {
		if got := elementText(tc.e); got != tc.want {
			t.Errorf("%+v: got %q, want %q", tc.e, got, tc.want)
		}
	}
}

func TestPrioText(t *testing.T) {
	out := uint32(3) // NF_INET_LOCAL_OUT
	cases := []struct {
		p    int32
		hook uint32
		want string
	}{
		{-150, out, "mangle"}, {-100, out, "-100"}, {-100, 0, "dstnat"}, {-145, out, "mangle + 5"},
		{-160, out, "mangle - 10"}, {-200, out, "-200"}, {0, out, "filter"}, {100, out, "100"}, {100, 4, "srcnat"},
	}
	for _, tc := range cases {
		if got := prioText(nftables.ChainPriority(tc.p), nftables.ChainHook(tc.hook)); got != tc.want {
			t.Errorf("priority %d hook %d: got %q, want %q", tc.p, tc.hook, got, tc.want)
		}
	}
}

// TestDiffKinds checks Diff on rulesets edited in memory: the kinds and the
// text of what it reports.
func TestDiffKinds(t *testing.T) {
	params := Params{Sandbox: "d", UID: 1000}
	want := compile(t, specs["denylist"], params)
	if d := Diff(want, compile(t, specs["denylist"], params)); len(d) != 0 {
		t.Fatalf("identical rulesets differ: %v", d)
	}
	if d := Diff(want, nil); len(d) != 1 || d[0].String() != "missing in table inet flowgate: table inet flowgate" {
		t.Errorf("nil live: %v", d)
	}
	if d := Diff(&Ruleset{}, want); len(d) != 1 || d[0].Kind != Extra {
		t.Errorf("unexpected table: %v", d)
	}
	live := compile(t, specs["denylist"], params)
	agent := live.chain(ChainAgent)
	// Swap the two metadata rules: both are moved.
	agent.rules[0], agent.rules[1] = agent.rules[1], agent.rules[0]
	got := Diff(want, live)
	if len(got) != 1 || !strings.HasPrefix(got[0].String(), "moved in chain agent: ") {
		t.Errorf("swapped rules: %v", got)
	}
	live = compile(t, specs["allowlist"], params)
	got = Diff(want, live)
	var lines []string
	for _, d := range got {
		lines = append(lines, d.String())
	}
	text := strings.Join(lines, "\n")
	for _, w := range []string{
		"missing in set block4: set block4 { type ipv4_addr flags interval elements",
		"extra in set allow4: set allow4 { type ipv4_addr flags interval elements",
		"extra in set learned4: set learned4 { type ipv4_addr size 65536 flags timeout }",
		`missing in chain agent: ip daddr @block4 counter packets 0 bytes 0 jump refuse comment "flowgate d: denylist: refuse blocked CIDRs (IPv4)"`,
		`extra in chain agent: counter packets 0 bytes 0 jump refuse comment "flowgate d: allowlist: refuse the rest"`,
	} {
		if !strings.Contains(text, w) {
			t.Errorf("diff lacks %q:\n%s", w, text)
		}
	}
	// Learned elements are run-time state: never a difference.
	allow := compile(t, specs["allowlist"], params)
	liveAllow := compile(t, specs["allowlist"], params)
	liveAllow.set(SetLearned4).elems = []element{{from: netip.MustParseAddr("192.0.2.9"), to: netip.MustParseAddr("192.0.2.9"), timeout: time.Minute}}
	if d := Diff(allow, liveAllow); len(d) != 0 {
		t.Errorf("learned elements made a difference: %v", d)
	}
}
