package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"flowgate/runtime"
)

var gcFlags struct {
	stateDir string
	uplink   string
}

var gcCmd = &cobra.Command{
	Use:   "gc",
	Short: "Remove what killed runs left: sandboxes, links, namespaces, host rules",
	Long: `Remove every sandbox whose bench process is gone: its network namespace, its
veth link and its rules in the host's nftables table inet flowgate_host (and
the table when no sandbox is left), its cgroups and its state directory.
Sandboxes of running bench processes are left alone. The trial folders are
kept.

Prints one line per removed thing. Exit status: 0 when everything could be
removed (also when there was nothing to remove), 1 otherwise.`,
	Args: cobra.NoArgs,
	RunE: func(cmd *cobra.Command, _ []string) error {
		base := cmd.Context()
		if base == nil {
			base = context.Background()
		}
		ctx, stop := signal.NotifyContext(base, os.Interrupt, syscall.SIGTERM)
		defer stop()
		l := &runtime.Local{StateDir: gcFlags.stateDir, Uplink: gcFlags.uplink}
		removed, err := runtime.GC(ctx, l)
		out := cmd.OutOrStdout()
		for _, r := range removed {
			fmt.Fprintln(out, "removed", r)
		}
		if err != nil {
			return &exitError{code: 1, err: err}
		}
		return nil
	},
}

func init() {
	gcCmd.Flags().StringVar(&gcFlags.stateDir, "state-dir", runtime.DefaultStateDir, "the runtime's state directory")
	gcCmd.Flags().StringVar(&gcFlags.uplink, "uplink-netns", "", "path of the uplink network namespace (tests; default: this host's)")
	gcCmd.Flags().MarkHidden("uplink-netns")
	rootCmd.AddCommand(gcCmd)
}
