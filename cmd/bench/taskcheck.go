package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"flowgate/policyload"
)

// taskCmd groups the commands about task folders.
var taskCmd = &cobra.Command{
	Use:   "task",
	Short: "Work with task folders",
}

var taskCheckCmd = &cobra.Command{
	Use:   "check PATH",
	Short: "Load a task folder and print the policy its agent will run under",
	Long: `Load a task folder (task.md, or task.toml with instruction.md), check every
field, and print the task's name, the agent phase's effective network policy
(the mode, then each rule in canonical form with the field it was written in)
and the host variables its env sections ask for.

Exit status: 0 when the task loads, 1 when it does not (the error names the
file, the line, the field and the fix).`,
	Args: func(_ *cobra.Command, args []string) error {
		if len(args) != 1 {
			return &exitError{code: 1, err: errors.New("task check: give one task folder: bench task check PATH")}
		}
		return nil
	},
	RunE: func(cmd *cobra.Command, args []string) error {
		t, err := policyload.LoadTask(args[0])
		if err != nil {
			return &exitError{code: 1, err: err}
		}
		out := cmd.OutOrStdout()
		fmt.Fprintf(out, "task  %s  (%s)\n", t.Name, t.Dir)
		fmt.Fprint(out, policyload.RenderPolicy(t.Policy))
		if len(t.EnvRefs) == 0 {
			fmt.Fprintln(out, "env refs: none")
		} else {
			fmt.Fprintf(out, "env refs: %s (passed to the sandbox only with --allow-task-env NAME)\n", strings.Join(t.EnvRefs, ", "))
		}
		return nil
	},
}

func init() {
	taskCmd.AddCommand(taskCheckCmd)
	rootCmd.AddCommand(taskCmd)
}
