package main

import "github.com/spf13/cobra"

// newBenchCommand is `rdmafs bench`, the parent of the benchmarks.
func newBenchCommand() *cobra.Command {
	c := &cobra.Command{Use: "bench", Short: "Run benchmarks"}
	c.AddCommand(newBenchMetaCommand())
	return c
}
