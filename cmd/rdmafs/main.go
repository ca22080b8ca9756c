// Command rdmafs is the rdmafs multi-tool: the metadata server, the FUSE client,
// administration and benchmarks. Each subcommand lives in its own file and only
// parses flags, wires components together and handles signals; the logic lives in
// the library packages.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/internal/buildinfo"
	"github.com/rdmafs/rdmafs/internal/gctune"
)

func main() {
	gctune.Apply()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCommand()
	if filepath.Base(os.Args[0]) == mountHelperName {
		args, fake, verbose, err := mountHelperArgs(os.Args[1:])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if fake || verbose {
			fmt.Fprintln(os.Stderr, "rdmafs", strings.Join(args, " "))
		}
		if fake {
			return
		}
		os.Args = append([]string{"rdmafs"}, args...) // a background mount runs them again
		root.SetArgs(args)
	}
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "rdmafs:", err)
		os.Exit(1)
	}
}

// newRootCommand assembles the command tree. Subcommands register themselves in
// subcommands (one constructor per file) so that files do not collide.
func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "rdmafs",
		Short:         "rdmafs: an erasure-coded distributed file system with an RDMA data path",
		Version:       buildinfo.Read().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newMetaCommand())
	root.AddCommand(newFormatCommand())
	root.AddCommand(newCertsCommand())
	root.AddCommand(newLayoutCommand())
	root.AddCommand(newRelayoutCommand())
	root.AddCommand(newInfoCommand())
	root.AddCommand(newSnapshotCommand())
	root.AddCommand(newRmrCommand())
	root.AddCommand(newTrashCommand())
	root.AddCommand(newConfigCommand())
	root.AddCommand(newQuotaCommand())
	root.AddCommand(newStatusCommand())
	root.AddCommand(newStatsCommand())
	root.AddCommand(newMountCommand())
	root.AddCommand(newUmountCommand())
	root.AddCommand(newDevCommand())
	root.AddCommand(newBenchCommand())
	root.AddCommand(newAdminCommand())
	return root
}
