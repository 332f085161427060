package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"flowgate/gate/nft"
)

func init() {
	var (
		f  rulesetFlags
		ns nsFlags
	)
	cmd := &cobra.Command{
		Use:   "audit (--netns PATH | --pid PID) --policy FILE --uid N",
		Short: "Check the live nftables table of a namespace against a policy",
		Long: `audit reads table inet flowgate in the namespace and compares it with the
ruleset the policy compiles to (see 'flowgate rules'), given the same
--sandbox, --cgroup and --model-port that attach used. Counter values,
handles and the learned addresses of an allowlist are not compared; rules,
their order, chains, sets and their elements, and the table's flags are.

Each difference is printed on its own line:

  missing in chain agent: RULE
  extra in set block4: element 10.0.0.0/8
  changed in chain agent_nat: want RULE; got RULE

Exit status: 0 when the live table matches, 1 when it differs (or is
missing), 2 on a bad policy file, a bad namespace, a usage error, or when
the table could not be read.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			defer resetFlags(cmd)
			want, err := f.compile()
			if err != nil {
				return err
			}
			h, err := ns.open()
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			defer h.Close()
			live, err := nft.Read(h)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("audit: %w", err)}
			}
			diffs := nft.Diff(want, live)
			out := cmd.OutOrStdout()
			if len(diffs) == 0 {
				fmt.Fprintf(out, "table inet %s matches the policy\n", nft.TableName)
				return nil
			}
			for _, d := range diffs {
				fmt.Fprintln(out, d.String())
			}
			return &exitError{code: 1, err: fmt.Errorf("audit: table inet %s differs from the policy in %d places", nft.TableName, len(diffs))}
		},
	}
	ns.add(cmd)
	f.add(cmd)
	rootCmd.AddCommand(cmd)
}
