package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"flowgate/runtime"
)

func init() {
	var stateDir string
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check that this host enforces every network mode, before a large run",
		Long: `doctor checks the host (root, nftables, owner matching, IPv6 filtering, cgroup v2
socket matching) in a scratch namespace, then runs one sandbox per network mode
against the built-in simulated internet and prints what an agent reached:

  mode | example.com | pypi.org | metadata | model

denylist blocks example.com and allowlist admits pypi.org only; the model is
reached through the model proxy on loopback. Nothing is sent outside
namespaces doctor makes. Exit status 0 when every mode holds, 1 otherwise.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			caps := (&runtime.Local{StateDir: stateDir}).Probe(cmd.Context())
			ok := printHost(out, caps)
			if !caps.Root || !caps.NFTables {
				return &exitError{code: 1, err: errors.New("doctor: this host cannot run sandboxes (see above)")}
			}
			sim, err := runtime.StartSimUplink(stateDir)
			if err != nil {
				return &exitError{code: 1, err: err}
			}
			checks := runtime.CheckModes(cmd.Context(), sim)
			if err := sim.Close(); err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "bench: removing the simulated internet:", err)
			}
			if !printModes(out, checks) {
				ok = false
			}
			if !ok {
				return &exitError{code: 1, err: errors.New("doctor: this host does not enforce every mode as it should (see above)")}
			}
			fmt.Fprintln(out, "\nall modes hold on this host")
			return nil
		},
	}
	cmd.Flags().StringVar(&stateDir, "state-dir", runtime.DefaultStateDir, "where sandboxes keep their state")
	rootCmd.AddCommand(cmd)
}

func mark(ok bool) string {
	if ok {
		return "ok"
	}
	return "MISSING"
}

// printHost prints the host checks and reports whether all passed.
func printHost(w io.Writer, c runtime.Capabilities) bool {
	fmt.Fprintln(w, "host")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range []struct {
		name string
		ok   bool
	}{{"root", c.Root}, {"nftables", c.NFTables}, {"owner match (meta skuid)", c.OwnerMatch},
		{"IPv6 filtering", c.IPv6}, {"cgroup v2 socket match", c.CgroupMatch}} {
		fmt.Fprintf(tw, "  %s\t%s\n", r.name, mark(r.ok))
	}
	tw.Flush()
	for _, m := range c.Missing {
		fmt.Fprintf(w, "  - %s\n", m)
	}
	return c.Root && c.NFTables && c.OwnerMatch
}

// printModes prints the mode table and reports whether every cell was as
// expected.
func printModes(w io.Writer, checks []runtime.ModeCheck) bool {
	fmt.Fprintln(w, "\nmodes (simulated internet; an agent with curl)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  mode\t%s\t\n", strings.Join(runtime.DoctorTargets, "\t"))
	all := true
	var problems []string
	for _, c := range checks {
		if c.Err != nil {
			all = false
			fmt.Fprintf(tw, "  %s\tcheck failed\t\n", c.Mode)
			problems = append(problems, fmt.Sprintf("%s: %v", c.Mode, c.Err))
			continue
		}
		want := runtime.Expected(c.Mode)
		cells := make([]string, len(c.Detail))
		for i, d := range c.Detail {
			cells[i] = d
			if c.Reached[i] != want[i] {
				all = false
				cells[i] = d + " (WRONG)"
				problems = append(problems, fmt.Sprintf("%s: %s should be %s", c.Mode, runtime.DoctorTargets[i], expectation(want[i])))
			}
		}
		fmt.Fprintf(tw, "  %s\t%s\t\n", c.Mode, strings.Join(cells, "\t"))
	}
	tw.Flush()
	for _, p := range problems {
		fmt.Fprintf(w, "  - %s\n", p)
	}
	return all
}

func expectation(reach bool) string {
	if reach {
		return "reachable"
	}
	return "refused"
}
