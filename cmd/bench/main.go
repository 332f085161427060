// Command bench runs benchmark tasks in sandboxes whose network the task's
// policy decides, and checks task folders and hosts.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"flowgate/runtime"
)

// exitError carries a process exit code through cobra; its message, if any,
// has already been printed or is printed by main.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

var rootCmd = &cobra.Command{
	Use:           "bench",
	Short:         "Run benchmark tasks in sandboxes under the task's network policy",
	SilenceUsage:  true,
	SilenceErrors: true,
}

func main() {
	runtime.MaybeInit() // a sandbox phase's init is this binary re-executed
	os.Exit(run(os.Args[1:]))
}

// run executes the command line and returns the exit code: 0 on success,
// the code of an exitError, or 1 for any other error.
func run(args []string) int {
	rootCmd.SetArgs(args)
	err := rootCmd.Execute()
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(rootCmd.ErrOrStderr(), "bench:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(rootCmd.ErrOrStderr(), "bench:", err)
	return 1
}
