// Package nft owns flowgate's nftables table, `inet flowgate`, inside a
// sandbox's network namespace: it compiles a policy into a ruleset that
// matches only the agent's sockets (by uid, optionally by cgroup v2),
// applies it in one atomic netlink transaction, reads the live table back,
// renders it as the text `nft list table inet flowgate` prints, diffs the
// two, feeds the learned-address sets, and watches the table for changes
// made by anyone else.
//
// It talks to the kernel through github.com/google/nftables only, never by
// running the nft command. It touches no other table, never flushes the
// whole ruleset, opens no sockets for traffic, and decides nothing about
// names: that is the DNS proxy's and the SNI router's job. It imports gate
// and nothing else of flowgate's.
//
// The table, for a denylist sandbox "bf-1a2b" and uid 1000:
//
//	output_filter  filter hook output, priority mangle (-150): sees the
//	               original destination, before NAT
//	    meta skuid 1000 -> jump agent
//	agent          metadata -> refuse; 127.0.0.1 and ::1 -> accept (in
//	               public mode all of 127/8; in the others the rest of
//	               127/8 is refused); then the mode
//	refuse         tcp -> reset; anything else -> icmpx admin-prohibited
//	output_nat     nat hook output, priority -110, before dstnat (denylist, allowlist)
//	    meta skuid 1000 -> jump agent_nat
//	agent_nat      DNS -> redirect to the DNS proxy; loopback -> return;
//	               tcp -> redirect to the transparent proxy
//	output_guard   filter hook output, priority filter (0), after NAT
//	    meta skuid 1000 -> jump agent_guard
//	agent_guard    127.0.0.1 or ::1 (redirected or local) -> return; TCP
//	               or UDP to anywhere else -> refuse: it escaped the
//	               redirects
package nft
