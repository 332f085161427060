package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"flowgate/gate"
)

// MaxSandboxLen bounds a sandbox name, which every rule's comment carries.
const MaxSandboxLen = 32

// maxCommentLen is the longest comment the nft command accepts.
const maxCommentLen = 128

// Params are what a ruleset needs besides the policy.
type Params struct {
	// Sandbox names the sandbox in every rule's comment: [a-z0-9-], at
	// most MaxSandboxLen characters.
	Sandbox string
	// UID is the agent's uid. 0 is refused: rules for root would filter
	// flowgate itself and the verifier.
	UID uint32
	// Cgroup is an optional cgroup v2 path relative to the cgroup2 mount
	// (as /proc/PID/cgroup shows it). Sockets of processes in it, or below
	// it, are filtered like the uid's, so a process of the agent's session
	// stays filtered even if it changes uid. Apply needs the cgroup to
	// exist.
	Cgroup string
	// Ports are flowgate's loopback ports inside the namespace; zero
	// fields take gate.DefaultPorts.
	Ports gate.Ports
	// ModelPort is the model proxy's loopback port, named in the loopback
	// rule's comment; 0 when not known. Loopback is always reachable.
	ModelPort uint16
}

// check validates the params and fills in default ports.
func (p Params) check() (Params, error) {
	if err := checkSandbox(p.Sandbox); err != nil {
		return p, err
	}
	if p.UID == 0 {
		return p, errors.New("uid 0 cannot be filtered: the rules would match flowgate itself and the verifier, which run as root")
	}
	if p.Cgroup != "" {
		c, err := cleanCgroup(p.Cgroup)
		if err != nil {
			return p, err
		}
		p.Cgroup = c
	}
	if p.Ports.DNS == 0 {
		p.Ports.DNS = gate.DefaultPorts.DNS
	}
	if p.Ports.Transparent == 0 {
		p.Ports.Transparent = gate.DefaultPorts.Transparent
	}
	if p.Ports.Proxy == 0 {
		p.Ports.Proxy = gate.DefaultPorts.Proxy
	}
	if p.Ports.DNS == p.Ports.Transparent || p.Ports.DNS == p.Ports.Proxy || p.Ports.Transparent == p.Ports.Proxy {
		return p, fmt.Errorf("ports must differ: DNS %d, transparent %d, proxy %d", p.Ports.DNS, p.Ports.Transparent, p.Ports.Proxy)
	}
	if p.ModelPort != 0 && (p.ModelPort == p.Ports.DNS || p.ModelPort == p.Ports.Transparent || p.ModelPort == p.Ports.Proxy) {
		return p, fmt.Errorf("model proxy port %d is also one of flowgate's ports", p.ModelPort)
	}
	return p, nil
}

// checkSandbox validates a sandbox name: [a-z0-9-], 1 to MaxSandboxLen.
func checkSandbox(s string) error {
	if s == "" {
		return errors.New("sandbox name is empty")
	}
	if len(s) > MaxSandboxLen {
		return fmt.Errorf("sandbox name %q is longer than %d characters", s, MaxSandboxLen)
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return fmt.Errorf("sandbox name %q has character %q; use a-z, 0-9 and -", s, r)
		}
	}
	return nil
}

// Compile builds the ruleset of table inet flowgate for one sandbox: the
// agent's sockets (uid, and cgroup if given) get the policy's mode;
// everyone else's traffic is left alone. It touches neither the kernel nor
// the network; a cgroup path is resolved by Apply.
func Compile(p *gate.Policy, params Params) (*Ruleset, error) {
	if p == nil {
		return nil, errors.New("compiling ruleset: no policy")
	}
	params, err := params.check()
	if err != nil {
		return nil, fmt.Errorf("compiling ruleset: %w", err)
	}
	switch p.Mode {
	case gate.Public, gate.NoNetwork, gate.Denylist, gate.Allowlist:
	default:
		return nil, fmt.Errorf("compiling ruleset: unknown network mode %s", p.Mode)
	}
	c := &compiler{params: params, mode: p.Mode, r: &Ruleset{present: true}}
	if params.Cgroup != "" {
		m, err := findCgroup2()
		if err != nil {
			return nil, fmt.Errorf("compiling ruleset: %w", err)
		}
		c.r.cgroup, c.r.cgroupLevel = params.Cgroup, m.level(params.Cgroup)
		c.r.cgroupNames = map[uint64]string{0: params.Cgroup}
	}
	c.addSets(p)
	c.addChains()
	for _, ch := range c.r.chains {
		for _, ru := range ch.rules {
			if len(ru.comment) > maxCommentLen {
				return nil, fmt.Errorf("compiling ruleset: comment %q is longer than %d characters", ru.comment, maxCommentLen)
			}
		}
	}
	if p.Mode != gate.NoNetwork {
		// What Apply puts in place of a table the kernel took only in
		// part: the same sandbox in no-network mode, which refuses the
		// agent everything but loopback.
		none, err := gate.Compile(gate.Spec{Mode: gate.NoNetwork})
		if err != nil {
			return nil, fmt.Errorf("compiling ruleset: the no-network fallback: %w", err)
		}
		if c.r.lockdown, err = Compile(none, params); err != nil {
			return nil, err
		}
	}
	return c.r, nil
}

type compiler struct {
	params Params
	mode   gate.Mode
	r      *Ruleset
}

// note makes a rule comment naming the sandbox.
func (c *compiler) note(format string, args ...any) string {
	return "flowgate " + c.params.Sandbox + ": " + fmt.Sprintf(format, args...)
}

func (c *compiler) addSets(p *gate.Policy) {
	addrSet := func(name string, v6 bool, prefixes []netip.Prefix) {
		kt := nftables.TypeIPAddr
		if v6 {
			kt = nftables.TypeIP6Addr
		}
		c.r.sets = append(c.r.sets, &set{name: name, keyType: kt, interval: true, elems: intervalElements(prefixes, v6)})
	}
	addrSet(SetMeta4, false, gate.MetadataPrefixes)
	addrSet(SetMeta6, true, gate.MetadataPrefixes)
	switch c.mode {
	case gate.Denylist:
		addrSet(SetBlock4, false, p.CIDRs.Prefixes())
		addrSet(SetBlock6, true, p.CIDRs.Prefixes())
	case gate.Allowlist:
		addrSet(SetAllow4, false, p.CIDRs.Prefixes())
		addrSet(SetAllow6, true, p.CIDRs.Prefixes())
		c.r.sets = append(c.r.sets,
			&set{name: SetLearned4, keyType: nftables.TypeIPAddr, timeout: true, size: LearnedSetSize, learned: true},
			&set{name: SetLearned6, keyType: nftables.TypeIP6Addr, timeout: true, size: LearnedSetSize, learned: true})
	}
}

// natPriority places flowgate's redirects before every nat chain at the
// standard priority (dstnat, -100: iptables' nat OUTPUT, Docker's embedded
// DNS rules in a container's namespace). Of two nat chains at one priority
// the one registered last runs first and the first mapping wins, so at
// -100 a table added after flowgate's could take the agent's DNS or TCP
// past flowgate. It stays after the filter chain (mangle, -150), which
// judges the original destination.
const natPriority = nftables.ChainPriority(-110)

func (c *compiler) addChains() {
	proxied := c.mode.Proxied()
	filter := &chain{name: ChainFilter, hook: &hookSpec{typ: nftables.ChainTypeFilter, hooknum: unix.NF_INET_LOCAL_OUT,
		prio: *nftables.ChainPriorityMangle, policy: nftables.ChainPolicyAccept, hasPolicy: true}}
	filter.rules = c.owner(ChainAgent, "filter")
	c.r.chains = append(c.r.chains, filter, &chain{name: ChainAgent, rules: c.agentRules()}, &chain{name: ChainRefuse, rules: c.refuseRules()})
	if proxied {
		nat := &chain{name: ChainNAT, hook: &hookSpec{typ: nftables.ChainTypeNAT, hooknum: unix.NF_INET_LOCAL_OUT,
			prio: natPriority, policy: nftables.ChainPolicyAccept, hasPolicy: true}}
		nat.rules = c.owner(ChainAgentNAT, "redirect")
		guard := &chain{name: ChainGuard, hook: &hookSpec{typ: nftables.ChainTypeFilter, hooknum: unix.NF_INET_LOCAL_OUT,
			prio: *nftables.ChainPriorityFilter, policy: nftables.ChainPolicyAccept, hasPolicy: true}}
		guard.rules = c.owner(ChainAgentGuard, "check")
		c.r.chains = append(c.r.chains, nat, &chain{name: ChainAgentNAT, rules: c.natRules()},
			guard, &chain{name: ChainAgentGuard, rules: c.guardRules()})
	}
}

// guardRules run after NAT, in the proxied modes, where by then every TCP
// and UDP packet of the agent's has been redirected to flowgate on
// loopback. One that still goes elsewhere is refused: a connection that
// conntrack tracked without NAT before the ruleset came (flowgate attached
// to a running container), or one that a foreign nat chain mapped first.
func (c *compiler) guardRules() []*rule {
	return []*rule{
		newRule(c.note("redirected or local (IPv4)")).daddrPrefix(localhost4).counter().ret().rule(),
		newRule(c.note("redirected or local (IPv6)")).daddrPrefix(loopback6).counter().ret().rule(),
		newRule(c.note("refuse TCP that was not redirected")).l4proto(protoTCP).counter().jump(ChainRefuse).rule(),
		newRule(c.note("refuse UDP that was not redirected")).l4proto(protoUDP).counter().jump(ChainRefuse).rule(),
	}
}

// owner returns the rules that send the agent's packets to a chain: by
// uid, and by cgroup when one is given.
func (c *compiler) owner(target, verb string) []*rule {
	rules := []*rule{newRule(c.note("%s the agent's uid", verb)).skuid(c.params.UID).counter().jump(target).rule()}
	if c.r.cgroup != "" {
		rules = append(rules, newRule(c.note("%s the agent's cgroup", verb)).cgroupv2(c.r.cgroupLevel).counter().jump(target).rule())
	}
	return rules
}

var (
	loopback4 = netip.MustParsePrefix("127.0.0.0/8")
	loopback6 = netip.MustParsePrefix("::1/128")
	// localhost4 is the one IPv4 loopback address the agent may use in the
	// restricted modes: flowgate's and the model proxy's listeners and the
	// agent's own local services are there. Other 127/8 addresses can
	// hold other services of the namespace, such as Docker's embedded
	// resolver at 127.0.0.11, a DNS path past flowgate.
	localhost4 = netip.MustParsePrefix("127.0.0.1/32")
)

// agentRules are the verdicts for the agent's packets, seen with their
// original destination. Every path ends in accept or a refusal.
func (c *compiler) agentRules() []*rule {
	ports := c.params.Ports
	var proxies []string
	if c.mode.Proxied() {
		proxies = append(proxies, fmt.Sprintf("explicit proxy :%d", ports.Proxy))
	}
	if c.params.ModelPort != 0 {
		proxies = append(proxies, fmt.Sprintf("model proxy :%d", c.params.ModelPort))
	}
	lo := "accept loopback (%s)"
	if len(proxies) > 0 {
		lo += ": " + strings.Join(proxies, ", ")
	}
	var rules []*rule
	if c.mode.Proxied() {
		// DNS is redirected to the DNS proxy whatever its destination, so it
		// never reaches a metadata address; accepting it first keeps a
		// resolver in a metadata range (AWS's 169.254.169.253) working.
		rules = append(rules,
			newRule(c.note("accept DNS (UDP), redirected to :%d", ports.DNS)).dport(protoUDP, 53).counter().accept().rule(),
			newRule(c.note("accept DNS (TCP), redirected to :%d", ports.DNS)).dport(protoTCP, 53).counter().accept().rule())
	}
	rules = append(rules,
		newRule(c.note("refuse cloud metadata (IPv4)")).daddrIn(SetMeta4, false).counter().jump(ChainRefuse).rule(),
		newRule(c.note("refuse cloud metadata (IPv6)")).daddrIn(SetMeta6, true).counter().jump(ChainRefuse).rule())
	if c.mode == gate.Public {
		rules = append(rules, newRule(c.note(lo, "IPv4")).daddrPrefix(loopback4).counter().accept().rule())
	} else {
		rules = append(rules,
			newRule(c.note(lo, "127.0.0.1")).daddrPrefix(localhost4).counter().accept().rule(),
			newRule(c.note("refuse the other loopback addresses (Docker's resolver at 127.0.0.11, say)")).
				daddrPrefix(loopback4).counter().jump(ChainRefuse).rule())
	}
	rules = append(rules, newRule(c.note(lo, "IPv6")).daddrPrefix(loopback6).counter().accept().rule())
	switch c.mode {
	case gate.Public:
		rules = append(rules, newRule(c.note("public: accept the rest")).counter().accept().rule())
	case gate.NoNetwork:
		rules = append(rules,
			newRule(c.note("no-network: refuse DNS at once (UDP)")).dport(protoUDP, 53).counter().jump(ChainRefuse).rule(),
			newRule(c.note("no-network: refuse DNS at once (TCP)")).dport(protoTCP, 53).counter().jump(ChainRefuse).rule(),
			newRule(c.note("no-network: refuse the rest")).counter().jump(ChainRefuse).rule())
	case gate.Denylist:
		rules = append(rules,
			newRule(c.note("denylist: refuse blocked CIDRs (IPv4)")).daddrIn(SetBlock4, false).counter().jump(ChainRefuse).rule(),
			newRule(c.note("denylist: refuse blocked CIDRs (IPv6)")).daddrIn(SetBlock6, true).counter().jump(ChainRefuse).rule(),
			newRule(c.note("accept TCP, redirected to :%d", ports.Transparent)).l4proto(protoTCP).counter().accept().rule(),
			newRule(c.note("denylist: accept ICMP")).l4proto(protoICMP).counter().accept().rule(),
			newRule(c.note("denylist: accept ICMPv6")).l4proto(protoICMPv6).counter().accept().rule(),
			newRule(c.note("denylist: refuse other UDP (QUIC included)")).l4proto(protoUDP).counter().jump(ChainRefuse).rule(),
			newRule(c.note("denylist: refuse the rest")).counter().jump(ChainRefuse).rule())
	case gate.Allowlist:
		tcpTo := func(set string, v6 bool, what string) *rule {
			fam := "IPv4"
			if v6 {
				fam = "IPv6"
			}
			return newRule(c.note("accept TCP to %s (%s), redirected to :%d", what, fam, ports.Transparent)).
				l4proto(protoTCP).daddrIn(set, v6).counter().accept().rule()
		}
		rules = append(rules,
			tcpTo(SetAllow4, false, "allowed CIDRs"), tcpTo(SetAllow6, true, "allowed CIDRs"),
			tcpTo(SetLearned4, false, "learned addresses"), tcpTo(SetLearned6, true, "learned addresses"),
			newRule(c.note("allowlist: refuse the rest")).counter().jump(ChainRefuse).rule())
	}
	return rules
}

// refuseRules answer a refusal at once: a reset for TCP, so connect fails
// with ECONNREFUSED, and ICMP admin-prohibited for the rest, which a local
// sender sees as EPERM from send.
func (c *compiler) refuseRules() []*rule {
	return []*rule{
		newRule(c.note("refuse TCP with a reset")).l4proto(protoTCP).counter().rejectTCPReset().rule(),
		newRule(c.note("refuse the rest as admin-prohibited")).counter().rejectICMPX(unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED).rule(),
	}
}

// natRules redirect what the agent chain accepted: DNS to the DNS proxy,
// other TCP (not loopback) to the transparent proxy. Packets reach this
// chain after the filter chain, which already refused the rest.
func (c *compiler) natRules() []*rule {
	ports := c.params.Ports
	return []*rule{
		newRule(c.note("redirect DNS (UDP) to the DNS proxy")).dport(protoUDP, 53).counter().redirect(ports.DNS).rule(),
		newRule(c.note("redirect DNS (TCP) to the DNS proxy")).dport(protoTCP, 53).counter().redirect(ports.DNS).rule(),
		newRule(c.note("leave loopback alone (IPv4)")).daddrPrefix(loopback4).counter().ret().rule(),
		newRule(c.note("leave loopback alone (IPv6)")).daddrPrefix(loopback6).counter().ret().rule(),
		newRule(c.note("redirect TCP to the transparent proxy")).l4proto(protoTCP).counter().redirect(ports.Transparent).rule(),
	}
}
