// Package integration holds flowgate's end-to-end tests and benchmarks: a
// sandbox namespace joined to the simulated internet (integration/simnet),
// flowgate attached to it (in-process through gateway.Attach, or as the
// flowgate command), and real clients (curl, Python's urllib, the Go agent
// client in internal/agentclient) run as the agent's uid 1000 inside it.
//
// The package has no code of its own besides these tests. They need root,
// nftables and network namespaces; everything they make (namespaces,
// /etc/netns entries, processes, temporary files) is removed when they end,
// also when they fail. They never send traffic anywhere but the namespaces
// they made. bench.sh runs the benchmarks.
package integration
