// Package runtime owns the sandboxes bench runs tasks in: the local runtime
// (the embedded default), which gives each trial its own network namespace
// joined to the host by a veth pair with NAT, a private root filesystem of
// overlays over the host's system directories, and a fresh PID namespace
// per phase, so that no process of one phase survives into the next.
//
// What it makes is named after the trial and recorded in a state file
// before it is made; Sandbox.Close removes it, and GC removes what a killed
// run left. On the host it touches only its own nftables table
// (`inet flowgate_host`, and in it only the rules that carry a sandbox's
// name), links and namespaces it made, its cgroup subtree (flowgate/) and
// its state directory.
//
// It never decides what the agent may reach: the policy is enforced inside
// the sandbox's namespace by gate/gateway, which the caller attaches to
// Sandbox.NetNS for Sandbox.AgentUID. What runtime guarantees is the
// boundary that policy relies on: agent processes run as their own uid with
// no_new_privs and no capabilities, and nothing of the install phase is
// left running when the agent starts.
//
// Programs that create sandboxes must call MaybeInit first thing in main
// (and in TestMain): each phase runs under a re-execution of the current
// binary as the sandbox's init.
package runtime
