package policyload

import (
	"errors"
	"fmt"

	"flowgate/gate"
)

// Capabilities is what a sandbox runtime can enforce. The zero value can
// enforce nothing, so every policy is refused against it.
type Capabilities struct {
	// Runtime names the sandbox runtime in messages ("local", "containerd").
	Runtime string
	// Modes lists the network modes the runtime enforces.
	Modes map[gate.Mode]bool
	// Reasons says why a mode is missing, for the message.
	Reasons map[gate.Mode]string
	// IPv6 reports whether the runtime filters IPv6, so that address and
	// CIDR rules on IPv6 take effect.
	IPv6 bool
	// URLInterception reports whether the runtime can intercept TLS with
	// the sandbox's own CA, which checking blocked_urls paths over HTTPS
	// needs.
	URLInterception bool
}

// UnenforceableError is a policy, or one rule of it, that a sandbox cannot
// enforce. The task is refused: it never runs with a weaker policy.
type UnenforceableError struct {
	Runtime string
	Mode    gate.Mode
	// Rule is the rule that cannot be enforced, or nil when the mode
	// itself is missing.
	Rule *gate.Rule
	// Missing names what the runtime lacks.
	Missing string
}

func (e *UnenforceableError) Error() string {
	subject := "network_mode " + e.Mode.String()
	if e.Rule != nil {
		subject = e.Rule.String()
	}
	return fmt.Sprintf("sandbox runtime %q cannot enforce %s: %s; the task is refused rather than run with a weaker policy",
		e.Runtime, subject, e.Missing)
}

// CheckCapabilities refuses a compiled policy that the runtime cannot
// enforce: a mode it lacks, https blocked_urls without TLS interception,
// and IPv6 address rules without IPv6 filtering. An http blocked_urls rule
// is enforceable without interception: its path is checked on plain HTTP,
// and TLS to its host is refused outright (needs_intercept), which is
// stricter than written, never weaker.
// It returns nil, or one *UnenforceableError per problem, joined.
func CheckCapabilities(p *gate.Policy, c Capabilities) error {
	if p == nil {
		return errors.New("checking sandbox capabilities: no policy")
	}
	if !c.Modes[p.Mode] {
		why := c.Reasons[p.Mode]
		if why == "" {
			why = "the runtime does not support this mode"
		}
		return &UnenforceableError{Runtime: c.Runtime, Mode: p.Mode, Missing: why}
	}
	var errs []error
	for _, r := range p.Rules {
		switch {
		case r.Kind == gate.KindURL && r.Scheme == "https" && !c.URLInterception:
			errs = append(errs, &UnenforceableError{Runtime: c.Runtime, Mode: p.Mode, Rule: r,
				Missing: "blocking a URL path over HTTPS needs TLS interception, which this runtime does not provide"})
		case r.Kind == gate.KindCIDR && r.Prefix.Addr().Is6() && !c.IPv6:
			errs = append(errs, &UnenforceableError{Runtime: c.Runtime, Mode: p.Mode, Rule: r,
				Missing: "an IPv6 rule needs IPv6 filtering, which this runtime does not provide"})
		}
	}
	return errors.Join(errs...)
}
