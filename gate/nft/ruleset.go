package nft

import (
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// TableName is the name of flowgate's table; its family is inet, so one
// table serves IPv4 and IPv6.
const TableName = "flowgate"

// The chains of the table.
const (
	ChainFilter     = "output_filter" // base chain: filter, hook output, priority mangle
	ChainAgent      = "agent"         // the agent's verdicts
	ChainRefuse     = "refuse"        // how a refusal is answered
	ChainNAT        = "output_nat"    // base chain: nat, hook output, priority -110 (before dstnat)
	ChainAgentNAT   = "agent_nat"     // the agent's redirects
	ChainGuard      = "output_guard"  // base chain: filter, hook output, priority filter, after NAT
	ChainAgentGuard = "agent_guard"   // refuses the agent's packets that NAT did not redirect
)

// The named sets of the table.
const (
	SetMeta4    = "meta4"    // cloud metadata destinations, IPv4 (interval)
	SetMeta6    = "meta6"    // cloud metadata destinations, IPv6 (interval)
	SetBlock4   = "block4"   // denylist: CIDR rules of blocked_hosts, IPv4
	SetBlock6   = "block6"   // denylist: CIDR rules of blocked_hosts, IPv6
	SetAllow4   = "allow4"   // allowlist: CIDR rules of allowed_hosts, IPv4
	SetAllow6   = "allow6"   // allowlist: CIDR rules of allowed_hosts, IPv6
	SetLearned4 = "learned4" // allowlist: addresses of allowed DNS answers, IPv4 (timeout)
	SetLearned6 = "learned6" // allowlist: addresses of allowed DNS answers, IPv6 (timeout)
)

// LearnedSetSize bounds each learned set. When one is full the kernel
// refuses further addresses until some expire (at least gate.MinLearnTTL
// after they were added), and the DNS proxy answers SERVFAIL rather than
// return an address the kernel would not admit: an agent that resolves
// names without end slows only itself.
const LearnedSetSize = 65536

// Table flags as the kernel reports them (NFT_TABLE_F_*).
const (
	tableDormant = 1 << iota
	tableOwner
	tablePersist
)

// Ruleset is the content of table inet flowgate: sets and chains in the
// order `nft list` prints them. Compile makes one from a policy and Read
// from the live kernel; both render the same text for the same table. A
// Ruleset is never changed after it is made and is safe for concurrent
// use.
type Ruleset struct {
	present bool
	flags   uint32
	sets    []*set
	chains  []*chain

	// cgroup and cgroupLevel are set by Compile when Params.Cgroup is
	// given; Apply resolves the path to the cgroup's id.
	cgroup      string
	cgroupLevel uint32
	// cgroupNames names the cgroup ids that rules compare with. Compiled
	// rulesets carry the placeholder id 0 until Apply.
	cgroupNames map[uint64]string

	// lockdown is the same sandbox's no-network ruleset, which Apply puts
	// in place when the kernel took this one only in part (nil for a
	// no-network ruleset and for one Read returns).
	lockdown *Ruleset
}

// Exists reports whether the table exists: false for a Ruleset that Read
// found no table for.
func (r *Ruleset) Exists() bool { return r != nil && r.present }

// set is a named set of addresses.
type set struct {
	name     string
	keyType  nftables.SetDatatype
	interval bool
	timeout  bool
	constant bool
	size     uint32 // the most elements it may hold; 0: no bound
	// learned marks the run-time sets whose elements Diff ignores.
	learned bool
	elems   []element
}

// element is an address range [from, to] (from == to for one address), or
// raw key bytes for a set whose key is not an address.
type element struct {
	from, to netip.Addr
	raw      []byte
	timeout  time.Duration
	expires  time.Duration
}

// chain is a chain and its rules; hook is nil for a regular chain.
type chain struct {
	name  string
	hook  *hookSpec
	rules []*rule
}

// hookSpec is what makes a chain a base chain.
type hookSpec struct {
	typ       nftables.ChainType
	hooknum   nftables.ChainHook
	prio      nftables.ChainPriority
	policy    nftables.ChainPolicy
	hasPolicy bool
}

// rule is one rule: its expressions and its comment. Lookups name their
// set; Apply fills in set ids and the cgroup id.
type rule struct {
	exprs   []expr.Any
	comment string
	handle  uint64 // live rules only
}

func (r *Ruleset) set(name string) *set {
	for _, s := range r.sets {
		if s.name == name {
			return s
		}
	}
	return nil
}

func (r *Ruleset) chain(name string) *chain {
	for _, c := range r.chains {
		if c.name == name {
			return c
		}
	}
	return nil
}
