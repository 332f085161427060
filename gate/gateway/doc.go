// Package gateway wires flowgate's parts into one sandbox namespace for one
// agent uid: the nftables ruleset (gate/nft), the DNS proxy (gate/dns) and
// the TCP data plane (gate/sni), sharing one gate.Names table whose learned
// addresses it pushes into the ruleset's sets.
//
// Attach applies the rules first (an allowlist's learned sets must exist
// before the data plane opens them; until the listeners are up the agent's
// redirected traffic is refused), then starts the data plane. Close stops
// the data plane and leaves the rules in place: the agent's redirected traffic then reaches no
// listener and is refused (fail closed) until Detach removes the table.
// The gateway never touches another table, another namespace, or the
// host's resolver configuration.
package gateway
