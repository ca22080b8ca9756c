package main

import "github.com/spf13/cobra"

// newBenchCommand groups the benchmarks.
func newBenchCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "bench",
		Short: "Measure rdmafs components against baselines measured in the same run",
	}
	c.AddCommand(newBenchRDMACommand())
	c.AddCommand(newBenchMetaCommand())
	c.AddCommand(newBenchFSCommand())
	return c
}
