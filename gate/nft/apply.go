package nft

import (
	"errors"
	"fmt"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func table() *nftables.Table {
	return &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
}

// Apply replaces table inet flowgate in the namespace with r in one
// netlink transaction: the table is added (so that it exists), deleted,
// and added again with its sets, chains and rules. Either all of it takes
// effect or none; no other table is touched. Applying the same ruleset
// twice leaves the same table. Learned addresses do not survive: the
// learned sets start empty. The table is then read back: if the kernel
// holds anything else than r, or reading fails, Apply fails and replaces
// the table with the same sandbox's no-network ruleset (verified the same
// way), so that a part the kernel dropped cannot leave a hole: the agent
// has loopback and nothing else until Remove or another Apply.
func Apply(ns netns.NsHandle, r *Ruleset) error {
	if !r.Exists() {
		return errors.New("applying ruleset: empty ruleset")
	}
	d, err := apply(ns, r)
	if err == nil && len(d) == 0 {
		return nil
	}
	var msg string
	switch {
	case errors.Is(err, errReadBack):
		msg = err.Error() // sent, but what the kernel holds is unknown
	case err != nil:
		return err // the transaction failed: the kernel changed nothing
	default:
		msg = fmt.Sprintf("applying ruleset: the kernel holds another table than the one sent (%d differences; the first: %s)", len(d), d[0])
	}
	const report = "if this repeats, report it with the output of flowgate audit"
	if r.lockdown == nil {
		return fmt.Errorf("%s; the table stays as the kernel took it: remove it (flowgate detach) and apply again; %s", msg, report)
	}
	ld, err := apply(ns, r.lockdown)
	switch {
	case err != nil:
		return fmt.Errorf("%s, and replacing it with the no-network table failed too (%v); the table stays as the kernel took it: "+
			"remove it (flowgate detach) and apply again; %s", msg, err, report)
	case len(ld) > 0:
		return fmt.Errorf("%s, and the no-network table put in its place came back different too (the first: %s); "+
			"remove it (flowgate detach) and apply again; %s", msg, ld[0], report)
	}
	return fmt.Errorf("%s; it was replaced with the no-network table (the agent has loopback only): apply again, "+
		"or remove it (flowgate detach); %s", msg, report)
}

// apply replaces the table with r in one transaction, reads it back and
// returns how the live table differs from r.
func apply(ns netns.NsHandle, r *Ruleset) ([]Difference, error) {
	var cgroupID uint64
	if r.cgroup != "" {
		m, err := findCgroup2()
		if err != nil {
			return nil, fmt.Errorf("applying ruleset: %w", err)
		}
		if cgroupID, err = m.cgroupID(r.cgroup); err != nil {
			return nil, fmt.Errorf("applying ruleset: %w", err)
		}
	}
	c, err := dial(ns)
	if err != nil {
		return nil, fmt.Errorf("applying ruleset: %w", err)
	}
	defer closeLater(c)
	t := table()
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	ids := make(map[string]uint32, len(r.sets))
	for i, s := range r.sets {
		ks := &nftables.Set{Table: t, ID: uint32(i + 1), Name: s.name, KeyType: s.keyType, Interval: s.interval, HasTimeout: s.timeout, Size: s.size}
		ids[s.name] = ks.ID
		if err := c.AddSet(ks, nil); err != nil {
			return nil, fmt.Errorf("applying ruleset: set %s: %w", s.name, err)
		}
		if s.interval {
			if err := addElements(c, ks, kernelElements(s.elems)); err != nil {
				return nil, fmt.Errorf("applying ruleset: set %s: %w", s.name, err)
			}
		}
	}
	chains := make(map[string]*nftables.Chain, len(r.chains))
	for _, ch := range r.chains {
		nc := &nftables.Chain{Name: ch.name, Table: t}
		if h := ch.hook; h != nil {
			hook, prio, policy := h.hooknum, h.prio, h.policy
			nc.Type, nc.Hooknum, nc.Priority = h.typ, &hook, &prio
			if h.hasPolicy {
				nc.Policy = &policy
			}
		}
		chains[ch.name] = c.AddChain(nc)
	}
	for _, ch := range r.chains {
		for _, ru := range ch.rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: chains[ch.name], Exprs: kernelExprs(ru.exprs, ids, cgroupID),
				UserData: userdata.AppendString(nil, userdata.TypeComment, ru.comment)})
		}
	}
	if err := c.Flush(); err != nil {
		if errors.Is(err, unix.EMSGSIZE) {
			return nil, fmt.Errorf("applying ruleset: it is larger than one netlink transaction may be (%d MiB); "+
				"the policy has too many CIDR rules: merge them into wider prefixes: %w", maxBatch>>20, err)
		}
		return nil, fmt.Errorf("applying ruleset: %w", err)
	}
	// The table is read back and compared: a ruleset the kernel took only
	// in part, whatever the reason, must not pass for applied.
	live, err := Read(ns)
	if err != nil {
		return nil, fmt.Errorf("applying ruleset: %w: %w", errReadBack, err)
	}
	return Diff(r, live), nil
}

// errReadBack marks a ruleset the kernel took but that could not be read
// back, which Apply treats like one it took only in part.
var errReadBack = errors.New("reading it back")

// kernelExprs copies a rule's expressions with what only Apply knows: the
// batch ids of the sets that lookups name, and the cgroup id a socket
// cgroupv2 match compares with.
func kernelExprs(in []expr.Any, ids map[string]uint32, cgroupID uint64) []expr.Any {
	out := make([]expr.Any, len(in))
	copy(out, in)
	for i, e := range out {
		switch e := e.(type) {
		case *expr.Lookup:
			l := *e
			l.SetID = ids[e.SetName]
			out[i] = &l
		case *expr.Socket:
			if e.Key == expr.SocketKeyCgroupv2 && i+1 < len(out) {
				if cmp, ok := out[i+1].(*expr.Cmp); ok {
					c := *cmp
					c.Data = binaryutil.NativeEndian.PutUint64(cgroupID)
					out[i+1] = &c
				}
			}
		}
	}
	return out
}

// Remove deletes table inet flowgate from the namespace, leaving its plain
// network to every uid. A missing table is not an error.
func Remove(ns netns.NsHandle) error {
	c, err := dial(ns)
	if err != nil {
		return fmt.Errorf("removing table inet %s: %w", TableName, err)
	}
	defer closeLater(c)
	t := table()
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("removing table inet %s: %w", TableName, err)
	}
	return nil
}

// dial opens a lasting nftables connection inside ns and records its
// netlink port id, so that Watch can tell our own changes from others'.
// The caller closes it with CloseLasting.
func dial(ns netns.NsHandle) (*nftables.Conn, error) {
	key, err := nsKey(ns)
	if err != nil {
		return nil, err
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)), nftables.AsLasting(),
		nftables.WithSockOptions(func(nc *netlink.Conn) error { return own.record(key, nc) }, bigBuffers))
	if err != nil {
		return nil, fmt.Errorf("opening nftables netlink socket: %w", err)
	}
	return c, nil
}

// closeLater closes an nftables socket in the background. Closing a
// netfilter netlink socket waits until the kernel has freed what recent
// transactions replaced (an RCU grace period, ~10 ms on a busy machine);
// the transaction itself is already committed, so callers need not wait.
func closeLater(c *nftables.Conn) {
	go closeConn(c)
}

func closeConn(c *nftables.Conn) { c.CloseLasting() }

// nsID identifies a network namespace: its device and inode.
type nsID struct{ dev, ino uint64 }

func nsKey(ns netns.NsHandle) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(ns), &st); err != nil {
		return nsID{}, fmt.Errorf("reading netns handle: %w", err)
	}
	return nsID{uint64(st.Dev), st.Ino}, nil
}

// portID returns the netlink port id the kernel bound the socket to.
func portID(nc *netlink.Conn) (uint32, error) {
	raw, err := nc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var pid uint32
	var serr error
	if err := raw.Control(func(fd uintptr) {
		var sa unix.Sockaddr
		if sa, serr = unix.Getsockname(int(fd)); serr == nil {
			if nl, ok := sa.(*unix.SockaddrNetlink); ok {
				pid = nl.Pid
			} else {
				serr = errors.New("not a netlink socket")
			}
		}
	}); err != nil {
		return 0, err
	}
	return pid, serr
}

// ownPorts remembers the netlink port ids of this process's recent
// nftables sockets, per namespace. The kernel stamps every change
// notification with the port id of the socket that asked for the change.
// A port id is never handed to another socket while ours is open, and the
// kernel's automatic ids are not reused for a long time after, so the last
// maxOwnPorts sockets are enough to recognise our own changes.
type ownPorts struct {
	mu    sync.Mutex
	ring  [maxOwnPorts]portKey
	next  int
	count map[portKey]int
}

type portKey struct {
	ns  nsID
	pid uint32
}

const maxOwnPorts = 4096

var own = &ownPorts{count: make(map[portKey]int)}

func (o *ownPorts) record(ns nsID, nc *netlink.Conn) error {
	pid, err := portID(nc)
	if err != nil {
		return fmt.Errorf("reading netlink port id: %w", err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if old := o.ring[o.next]; o.count[old] > 0 {
		if o.count[old]--; o.count[old] == 0 {
			delete(o.count, old)
		}
	}
	k := portKey{ns, pid}
	o.ring[o.next] = k
	o.count[k]++
	o.next = (o.next + 1) % maxOwnPorts
	return nil
}

func (o *ownPorts) has(ns nsID, pid uint32) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.count[portKey{ns, pid}] > 0
}

// Socket buffers of flowgate's nftables sockets. A whole ruleset goes in
// one transaction (Apply is atomic), and the defaults (about 200 KiB)
// refuse a ruleset of a few thousand CIDR rules, or overflow with the
// kernel's acknowledgements of its messages. A transaction bigger than
// maxBatch is refused by the kernel with EMSGSIZE: Apply fails, loud.
const (
	maxBatch = 64 << 20
	maxAcks  = 16 << 20
)

// bigBuffers lets one transaction be up to maxBatch bytes and its
// acknowledgements up to maxAcks.
func bigBuffers(nc *netlink.Conn) error {
	raw, err := nc.SyscallConn()
	if err != nil {
		return fmt.Errorf("nftables socket: %w", err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, maxBatch)
		if serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, maxAcks)
		}
	}); err != nil {
		return fmt.Errorf("nftables socket: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("nftables socket: raising its buffers: %w", serr)
	}
	return nil
}

// elementsPerMessage bounds the elements of one NEWSETELEM message. Their
// list is one netlink attribute, whose length is 16 bits: past 64 KiB it
// wraps and the kernel silently takes only the part that fits. An IPv6
// interval element takes about 60 bytes. A variable for one test, which
// raises it to show that Apply's read-back catches a truncated set.
var elementsPerMessage = 512

// addElements queues elems for s in messages of at most
// elementsPerMessage elements, all in the connection's one transaction.
func addElements(c *nftables.Conn, s *nftables.Set, elems []nftables.SetElement) error {
	for len(elems) > 0 {
		n := min(len(elems), elementsPerMessage)
		if err := c.SetAddElements(s, elems[:n]); err != nil {
			return err
		}
		elems = elems[n:]
	}
	return nil
}
