package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"flowgate/gate/nft"
	"flowgate/policyload"
)

// rulesetFlags are what the ruleset of a sandbox is compiled from; rules
// and audit share them, with attach's defaults, so that audit compares
// with what attach applied.
type rulesetFlags struct {
	policy    string
	uid       int64
	sandbox   string
	cgroup    string
	modelPort uint16
}

func (f *rulesetFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.policy, "policy", "", "policy file (YAML: network_mode, allowed_hosts, blocked_hosts, blocked_urls)")
	cmd.Flags().Int64Var(&f.uid, "uid", 0, "the agent's uid whose traffic the rules filter")
	cmd.Flags().StringVar(&f.sandbox, "sandbox", "flowgate", "sandbox name in rule comments ([a-z0-9-], at most 32)")
	cmd.Flags().StringVar(&f.cgroup, "cgroup", "", "also filter sockets of this cgroup v2 path (relative to the cgroup2 mount)")
	cmd.Flags().Uint16Var(&f.modelPort, "model-port", 0, "the model proxy's loopback port, named in the loopback rule's comment")
}

// compile loads the policy and compiles the ruleset; every error is bad
// input (exit 2).
func (f *rulesetFlags) compile() (*nft.Ruleset, error) {
	if f.policy == "" {
		return nil, &exitError{code: 2, err: errors.New("give the policy: --policy FILE")}
	}
	if f.uid <= 0 || f.uid >= 1<<32-1 {
		return nil, &exitError{code: 2, err: fmt.Errorf("--uid %d: give the agent's uid, a number from 1 to %d", f.uid, uint32(1<<32-2))}
	}
	p, err := policyload.LoadPolicyFile(f.policy)
	if err != nil {
		return nil, &exitError{code: 2, err: err}
	}
	r, err := nft.Compile(p, nft.Params{Sandbox: f.sandbox, UID: uint32(f.uid), Cgroup: f.cgroup, ModelPort: f.modelPort})
	if err != nil {
		return nil, &exitError{code: 2, err: err}
	}
	return r, nil
}

// noArgs refuses positional arguments as a usage error (exit 2).
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return &exitError{code: 2, err: fmt.Errorf("%s takes no arguments, got %q", cmd.Name(), args)}
	}
	return nil
}

// resetFlags puts a command's flags back to their defaults, so that
// in-process callers (tests) can run it again.
func resetFlags(cmd *cobra.Command) {
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		f.Value.Set(f.DefValue)
		f.Changed = false
	})
}

func init() {
	var f rulesetFlags
	cmd := &cobra.Command{
		Use:   "rules --policy FILE --uid N",
		Short: "Print the nftables ruleset a policy compiles to (no kernel access)",
		Long: `rules prints table inet flowgate as 'nft list table inet flowgate' would print it
once 'flowgate attach' has applied it for this policy and uid, counters at zero.
It reads the policy file and nothing else: no namespace, no kernel.

Exit status: 0 on success, 2 on a bad policy file or a usage error.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			defer resetFlags(cmd)
			r, err := f.compile()
			if err != nil {
				return err
			}
			if _, err := io.WriteString(cmd.OutOrStdout(), r.Text()); err != nil {
				return fmt.Errorf("rules: writing output: %w", err)
			}
			return nil
		},
	}
	f.add(cmd)
	rootCmd.AddCommand(cmd)
}
