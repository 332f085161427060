package main

import (
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"flowgate/policyload"
)

func init() {
	var policyPath string
	cmd := &cobra.Command{
		Use:   "check --policy FILE TARGET...",
		Short: "Say whether a policy allows each target, and by which rule (no network access)",
		Long: `Decide each TARGET (a host, host:port, or an http(s) URL) with the same
matcher the gateway uses, without touching the network. One line per target:

  VERDICT  TARGET  reason=CODE  rule=RULE

VERDICT is allow or deny, CODE one of the gateway's reason codes, RULE the
field and canonical form of the rule that decided, or "default" when the
mode's default did. Host targets are decided by name (or address); URL
targets also by their path against blocked_urls. The answer is what this
build's gateway does: it does not intercept TLS, so an https URL to a host
that blocked_urls rules cover is refused whole (needs_intercept) unless its
path is blocked outright.

A bad target is reported on standard error and the other targets are still
decided. Exit status: 0 if every target is allowed, 1 if any is denied, 2 on
a bad policy file, a bad target or a usage error.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return &exitError{code: 2, err: errors.New("check: give at least one target (a host, host:port or URL)")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			path := policyPath
			policyPath = "" // in-process callers (tests) run the command again
			if path == "" {
				return &exitError{code: 2, err: errors.New("check: give the policy: --policy FILE")}
			}
			p, err := policyload.LoadPolicyFile(path)
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 8, 2, ' ', 0)
			var bad, denied bool
			for _, t := range args {
				d, err := p.Target(t)
				if err != nil {
					bad = true
					fmt.Fprintf(cmd.ErrOrStderr(), "flowgate: check %q: %v\n", t, err)
					continue
				}
				denied = denied || !d.Allow
				fmt.Fprintf(w, "%-5s\t%s\treason=%s\trule=%s\n", d.Verdict(), t, d.Reason, d.RuleText())
			}
			if err := w.Flush(); err != nil {
				return fmt.Errorf("check: writing output: %w", err)
			}
			switch {
			case bad:
				return &exitError{code: 2}
			case denied:
				return &exitError{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&policyPath, "policy", "", "policy file (YAML: network_mode, allowed_hosts, blocked_hosts, blocked_urls)")
	rootCmd.AddCommand(cmd)
}
