package nft

import (
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// Text renders the table as `nft list table inet flowgate` prints it:
// byte for byte for the rules flowgate makes, handles left out, counters
// with their values (zero for a compiled ruleset). A Ruleset for a missing
// table renders as "".
func (r *Ruleset) Text() string { return r.text(true) }

// text renders the table; with counters false every counter reads zero, so
// that two renderings compare equal whatever traffic passed.
func (r *Ruleset) text(counters bool) string {
	if !r.Exists() {
		return ""
	}
	var b strings.Builder
	b.WriteString("table inet " + TableName + " {\n")
	delim := ""
	if f := tableFlagsText(r.flags); f != "" {
		b.WriteString("\tflags " + f + "\n")
		delim = "\n"
	}
	for _, s := range r.sets {
		b.WriteString(delim)
		b.WriteString(s.text())
		delim = "\n"
	}
	for _, c := range r.chains {
		b.WriteString(delim)
		b.WriteString(r.chainText(c, counters))
		delim = "\n"
	}
	b.WriteString("}\n")
	return b.String()
}

func tableFlagsText(f uint32) string {
	var names []string
	for _, n := range []struct {
		bit  uint32
		name string
	}{{tableDormant, "dormant"}, {tableOwner, "owner"}, {tablePersist, "persist"}} {
		if f&n.bit != 0 {
			names = append(names, n.name)
			f &^= n.bit
		}
	}
	if f != 0 {
		names = append(names, fmt.Sprintf("0x%x", f))
	}
	return strings.Join(names, ",")
}

// declText is the set's declaration without its elements.
func (s *set) declText() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n", nameText(s.name), keyTypeName(s.keyType))
	if s.size > 0 {
		fmt.Fprintf(&b, "\t\tsize %d\n", s.size)
	}
	var flags []string
	if s.constant {
		flags = append(flags, "constant")
	}
	if s.interval {
		flags = append(flags, "interval")
	}
	if s.timeout {
		flags = append(flags, "timeout")
	}
	if len(flags) > 0 {
		b.WriteString("\t\tflags " + strings.Join(flags, ",") + "\n")
	}
	return b.String()
}

func keyTypeName(t nftables.SetDatatype) string {
	if t.Name != "" {
		return t.Name
	}
	return fmt.Sprintf("type(%d bytes)", t.Bytes)
}

// text is the set block as nft prints it: elements sorted, two to a line
// for IPv4 addresses, one to a line otherwise.
func (s *set) text() string {
	var b strings.Builder
	b.WriteString(s.declText())
	if len(s.elems) > 0 {
		elems := slices.Clone(s.elems)
		slices.SortFunc(elems, func(x, y element) int {
			if x.raw != nil || y.raw != nil {
				return strings.Compare(string(x.raw), string(y.raw))
			}
			return x.from.Compare(y.from)
		})
		pairs := s.keyType.Name == nftables.TypeIPAddr.Name
		b.WriteString("\t\telements = { ")
		for i, e := range elems {
			if i > 0 {
				if pairs && i%2 == 1 {
					b.WriteString(", ")
				} else {
					b.WriteString(",\n\t\t\t     ")
				}
			}
			b.WriteString(elementText(e))
		}
		b.WriteString(" }\n")
	}
	b.WriteString("\t}\n")
	return b.String()
}

// chainText is the chain block as nft prints it.
func (r *Ruleset) chainText(c *chain, counters bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\tchain %s {\n", nameText(c.name))
	if c.hook != nil {
		b.WriteString("\t\t" + c.hook.text() + "\n")
	}
	for _, ru := range c.rules {
		b.WriteString("\t\t" + r.ruleText(ru, counters) + "\n")
	}
	b.WriteString("\t}\n")
	return b.String()
}

var hookNames = map[nftables.ChainHook]string{
	unix.NF_INET_PRE_ROUTING: "prerouting", unix.NF_INET_LOCAL_IN: "input", unix.NF_INET_FORWARD: "forward",
	unix.NF_INET_LOCAL_OUT: "output", unix.NF_INET_POST_ROUTING: "postrouting",
}

// text is a base chain's header line.
func (h *hookSpec) text() string {
	hook, ok := hookNames[h.hooknum]
	if !ok {
		hook = fmt.Sprint(uint32(h.hooknum))
	}
	s := fmt.Sprintf("type %s hook %s priority %s;", h.typ, hook, prioText(h.prio, h.hooknum))
	if h.hasPolicy {
		p := "accept"
		if h.policy == nftables.ChainPolicyDrop {
			p = "drop"
		}
		s += " policy " + p + ";"
	}
	return s
}

// prioText names a priority as nft does for the inet family: a standard
// name, or a standard name plus or minus up to 10, else the number. The
// NAT names only apply to their hooks.
func prioText(p nftables.ChainPriority, hook nftables.ChainHook) string {
	std := []struct {
		v    int32
		name string
	}{{-300, "raw"}, {-150, "mangle"}, {-100, "dstnat"}, {0, "filter"}, {50, "security"}, {100, "srcnat"}}
	for _, s := range std {
		if s.name == "dstnat" && hook != unix.NF_INET_PRE_ROUTING || s.name == "srcnat" && hook != unix.NF_INET_POST_ROUTING {
			continue
		}
		off := int32(p) - s.v
		switch {
		case off == 0:
			return s.name
		case off > 0 && off <= 10:
			return fmt.Sprintf("%s + %d", s.name, off)
		case off < 0 && off >= -10:
			return fmt.Sprintf("%s - %d", s.name, -off)
		}
	}
	return fmt.Sprint(int32(p))
}
