// Package gate is the vocabulary every part of flowgate shares: the network
// mode, the compiled policy, the one host-name canonicaliser and matcher, the
// one URL-path canonicaliser, the decision record with its closed set of
// reason codes, and the table of names and the addresses they resolved to.
//
// gate imports nothing of flowgate's own and never touches the network or
// the kernel: it is pure data and pure functions, so that the DNS proxy, the
// SNI router, the nftables compiler, the CLIs and the tests all agree on what
// a name, a path and a verdict are.
package gate
