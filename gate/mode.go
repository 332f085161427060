package gate

import (
	"fmt"
	"strings"
)

// Mode is a task's sandbox.network_mode.
type Mode uint8

// The four network modes. The zero value is Public, the default.
const (
	Public Mode = iota
	NoNetwork
	Denylist
	Allowlist
)

var modeNames = [...]string{
	Public:    "public",
	NoNetwork: "no-network",
	Denylist:  "denylist",
	Allowlist: "allowlist",
}

// ModeNames lists the valid spellings of network_mode, in order.
func ModeNames() []string { return append([]string(nil), modeNames[:]...) }

// String returns the mode as a task file spells it.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode reads a network_mode value. The empty string is Public.
func ParseMode(s string) (Mode, error) {
	if s == "" {
		return Public, nil
	}
	for i, n := range modeNames {
		if s == n {
			return Mode(i), nil
		}
	}
	hint := ""
	switch strings.ToLower(strings.ReplaceAll(s, "_", "-")) {
	case "public", "no-network", "denylist", "allowlist":
		hint = fmt.Sprintf(" (did you mean %q?)", strings.ToLower(strings.ReplaceAll(s, "_", "-")))
	case "none", "nonetwork", "offline":
		hint = ` (did you mean "no-network"?)`
	case "blocklist", "blacklist":
		hint = ` (did you mean "denylist"?)`
	case "whitelist":
		hint = ` (did you mean "allowlist"?)`
	}
	return Public, fmt.Errorf("unknown network_mode %q%s; valid: %s", s, hint, strings.Join(modeNames[:], ", "))
}

// Restricted reports whether the mode limits the agent to less than the
// internet minus metadata: no-network, denylist and allowlist. Under these
// modes the model provider's web search is turned off.
func (m Mode) Restricted() bool { return m != Public }

// Proxied reports whether the agent's DNS and TCP go through flowgate's
// proxies (denylist and allowlist).
func (m Mode) Proxied() bool { return m == Denylist || m == Allowlist }
