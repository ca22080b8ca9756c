package main

import "github.com/spf13/cobra"

// newAdminCommand is `rdmafs admin`: operations on a running cluster's metadata
// and data (dump/load, repair, drain, rebalance). Each subcommand lives in its own
// file and registers itself in adminSubcommands so that files do not collide.
func newAdminCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "admin",
		Short: "Administer a running cluster: metadata export/import, repair, drain, rebalance",
	}
	for _, sub := range adminSubcommands() {
		cmd.AddCommand(sub)
	}
	return cmd
}

// adminSubcommands lists the admin subcommands. Add one line per subcommand.
func adminSubcommands() []*cobra.Command {
	return []*cobra.Command{
		newAdminRepairCommand(),
		newAdminCheckCommand(),
		newAdminScrubCommand(),
		newAdminDrainCommand(),
		newAdminRebalanceCommand(),
		newAdminDumpCommand(),
		newAdminLoadCommand(),
		newAdminWALRecoverCommand(),
		newAdminTokenCommand(),
	}
}
