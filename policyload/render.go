package policyload

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"flowgate/gate"
)

// RenderPolicy prints a compiled policy for people: the mode and what it
// admits, then each rule in the order written (verdict, kind, canonical
// form, the field it was written in, and the spelling when that differs),
// then the built-in metadata rule. The output depends only on the policy.
//
//	network_mode  denylist  the internet, minus the rules below
//	deny          host      example.com                   sandbox.blocked_hosts[0]
//	deny          url       https://example.org/papers/x  sandbox.blocked_urls[0]
//	deny          metadata  cloud metadata services       builtin (8 address ranges, 4 names)
func RenderPolicy(p *gate.Policy) string {
	if p == nil {
		return "no policy\n"
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
	fmt.Fprintf(w, "network_mode\t%s\t%s\n", p.Mode, modeMeaning(p))
	verb := gate.VerdictDeny
	if p.Mode == gate.Allowlist {
		verb = gate.VerdictAllow
	}
	for _, r := range p.Rules {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s", verb, r.Kind, r.Canonical, r.Field)
		if r.Written != r.Canonical {
			fmt.Fprintf(w, "\t(written %q)", r.Written)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%s\t%s\tcloud metadata services\tbuiltin (%d address ranges, %d names)\n",
		gate.VerdictDeny, gate.KindMetadata, len(gate.MetadataPrefixes), len(gate.MetadataNames))
	w.Flush()
	return b.String()
}

func modeMeaning(p *gate.Policy) string {
	switch p.Mode {
	case gate.Public:
		return "the internet, except cloud metadata addresses"
	case gate.NoNetwork:
		return "only the model, through the model proxy"
	case gate.Denylist:
		if len(p.Rules) == 0 {
			return "the internet (no rules block anything)"
		}
		return "the internet, minus the rules below"
	case gate.Allowlist:
		if len(p.Rules) == 0 {
			return "only the model (allowed_hosts is empty)"
		}
		return "only the rules below, plus the model"
	}
	return "unknown mode"
}
