// Package metabench measures metadata operations per second through the
// gRPC API: create, stat, readdir of a large directory, rename and unlink,
// with a given number of concurrent clients (each on its own connection).
package metabench

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Options configures a run.
type Options struct {
	// Addr and Secret locate the meta server.
	Addr, Secret string
	// Clients lists the concurrency levels to measure (default 1 and 16).
	Clients []int
	// Files is the number of files created, renamed and unlinked per level
	// (default 4000).
	Files int
	// DirEntries is the size of the directory listed by readdir (default 1000).
	DirEntries int
	// Duration bounds the stat and readdir phases (default 2s each).
	Duration time.Duration
	// Commits, when set, returns the number of durable group commits and of
	// transactions in them so far (of a server whose store reports them),
	// so that each mutating phase reports how well its transactions were
	// batched.
	Commits func() (commits, txns uint64)
}

// Result is the throughput of one operation at one concurrency level.
type Result struct {
	Op       string
	Clients  int
	Ops      int64
	Duration time.Duration
	// Commits and Txns are the group commits during the phase and the
	// transactions in them (zero without Options.Commits).
	Commits, Txns uint64
}

// PerSecond returns the operations per second.
func (r Result) PerSecond() float64 { return float64(r.Ops) / r.Duration.Seconds() }

// Run measures every operation at every concurrency level.
func Run(ctx context.Context, o Options) ([]Result, error) {
	if len(o.Clients) == 0 {
		o.Clients = []int{1, 16}
	}
	if o.Files <= 0 {
		o.Files = 4000
	}
	if o.DirEntries <= 0 {
		o.DirEntries = 1000
	}
	if o.Duration <= 0 {
		o.Duration = 2 * time.Second
	}
	var results []Result
	for _, n := range o.Clients {
		rs, err := runLevel(ctx, o, n)
		if err != nil {
			return results, err
		}
		results = append(results, rs...)
	}
	return results, nil
}

func runLevel(ctx context.Context, o Options, n int) ([]Result, error) {
	clients := make([]*client.Client, n)
	for i := range clients {
		c, err := client.Dial(o.Addr, o.Secret)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		clients[i] = c
		// Connect before measuring: connections are established lazily.
		if _, err := c.GetAttr(ctx, &metapb.GetAttrRequest{Ino: core.RootIno}); err != nil {
			return nil, fmt.Errorf("metabench: connect client %d: %w", i, err)
		}
	}
	c0 := clients[0]
	stamp := time.Now().UnixNano()
	dir, err := c0.Mkdir(ctx, &metapb.MkdirRequest{Parent: core.RootIno, Name: fmt.Sprintf("bench-%d-%d", n, stamp), Mode: 0o755})
	if err != nil {
		return nil, fmt.Errorf("metabench: mkdir: %w", err)
	}
	d := dir.Attr.Ino
	commits := o.Commits
	if commits == nil {
		commits = func() (uint64, uint64) { return 0, 0 }
	}
	var results []Result
	// parallel runs op(client, i) for i in [0, total) split over n clients.
	parallel := func(name string, total int, op func(c *client.Client, i int) error) error {
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, n)
		commits0, txns0 := commits()
		start := time.Now()
		for w := 0; w < n; w++ {
			wg.Add(1)
			go func(c *client.Client) {
				defer wg.Done()
				for {
					i := int(next.Add(1) - 1)
					if i >= total {
						return
					}
					if err := op(c, i); err != nil {
						errs <- fmt.Errorf("metabench: %s %d: %w", name, i, err)
						return
					}
				}
			}(clients[w])
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
		d := time.Since(start)
		commits1, txns1 := commits()
		results = append(results, Result{Op: name, Clients: n, Ops: int64(total), Duration: d,
			Commits: commits1 - commits0, Txns: txns1 - txns0})
		return nil
	}
	// timed runs op repeatedly on every client for o.Duration.
	timed := func(name string, op func(c *client.Client, i int) error) error {
		var count atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, n)
		start := time.Now()
		deadline := start.Add(o.Duration)
		for w := 0; w < n; w++ {
			wg.Add(1)
			go func(c *client.Client, w int) {
				defer wg.Done()
				for i := w; time.Now().Before(deadline); i += n {
					if err := op(c, i); err != nil {
						errs <- fmt.Errorf("metabench: %s: %w", name, err)
						return
					}
					count.Add(1)
				}
			}(clients[w], w)
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
		results = append(results, Result{Op: name, Clients: n, Ops: count.Load(), Duration: time.Since(start)})
		return nil
	}
	name := func(i int) string { return fmt.Sprintf("f%07d", i) }
	if err := parallel("create", o.Files, func(c *client.Client, i int) error {
		_, err := c.Create(ctx, &metapb.CreateRequest{Parent: d, Name: name(i), Mode: 0o644, Exclusive: true})
		return err
	}); err != nil {
		return results, err
	}
	if err := timed("stat", func(c *client.Client, i int) error {
		_, err := c.Lookup(ctx, &metapb.LookupRequest{Parent: d, Name: name(i % o.Files)})
		return err
	}); err != nil {
		return results, err
	}
	big, err := c0.Mkdir(ctx, &metapb.MkdirRequest{Parent: d, Name: "big", Mode: 0o755})
	if err != nil {
		return results, err
	}
	bigIno := big.Attr.Ino
	var fill sync.WaitGroup
	fillErr := make(chan error, n)
	for w := 0; w < n; w++ {
		fill.Add(1)
		go func(c *client.Client, w int) {
			defer fill.Done()
			for i := w; i < o.DirEntries; i += n {
				if _, err := c.Create(ctx, &metapb.CreateRequest{Parent: bigIno, Name: name(i), Mode: 0o644, Exclusive: true}); err != nil {
					fillErr <- err
					return
				}
			}
		}(clients[w], w)
	}
	fill.Wait()
	close(fillErr)
	if err := <-fillErr; err != nil {
		return results, fmt.Errorf("metabench: fill directory: %w", err)
	}
	if err := timed("readdir", func(c *client.Client, i int) error {
		got, cookie := 0, uint64(0)
		for {
			r, err := c.ReadDir(ctx, &metapb.ReadDirRequest{Ino: bigIno, Cookie: cookie, Limit: 1024})
			if err != nil {
				return err
			}
			got += len(r.Entries)
			if len(r.Entries) > 0 {
				cookie = r.Entries[len(r.Entries)-1].Cookie
			}
			if r.Eof {
				break
			}
		}
		if got != o.DirEntries {
			return fmt.Errorf("listed %d entries, want %d", got, o.DirEntries)
		}
		return nil
	}); err != nil {
		return results, err
	}
	if err := parallel("rename", o.Files, func(c *client.Client, i int) error {
		_, err := c.Rename(ctx, &metapb.RenameRequest{Parent: d, Name: name(i), NewParent: d, NewName: name(i) + ".r"})
		return err
	}); err != nil {
		return results, err
	}
	if err := parallel("unlink", o.Files, func(c *client.Client, i int) error {
		_, err := c.Unlink(ctx, &metapb.UnlinkRequest{Parent: d, Name: name(i) + ".r"})
		return err
	}); err != nil {
		return results, err
	}
	return results, nil
}

// Print writes the results as a table; with commit counts, the mutating
// phases also show the transactions per group commit.
func Print(w io.Writer, results []Result) {
	batched := false
	for _, r := range results {
		batched = batched || r.Commits > 0
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if batched {
		fmt.Fprintln(tw, "op\tclients\tops\tseconds\tops/s\ttxns/commit\t")
	} else {
		fmt.Fprintln(tw, "op\tclients\tops\tseconds\tops/s\t")
	}
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%.0f\t", r.Op, r.Clients, r.Ops, r.Duration.Seconds(), r.PerSecond())
		switch {
		case r.Commits > 0:
			fmt.Fprintf(tw, "%.1f\t", float64(r.Txns)/float64(r.Commits))
		case batched:
			fmt.Fprint(tw, "\t")
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// PrintComparison writes, for every operation and concurrency level found
// in both runs, the throughput of base and of other and their ratio
// other/base.
func PrintComparison(w io.Writer, baseName string, base []Result, otherName string, other []Result) {
	type key struct {
		op      string
		clients int
	}
	idx := map[key]Result{}
	for _, r := range base {
		idx[key{r.Op, r.Clients}] = r
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "op\tclients\t%s ops/s\t%s ops/s\t%s/%s\t\n", baseName, otherName, otherName, baseName)
	for _, r := range other {
		b, ok := idx[key{r.Op, r.Clients}]
		if !ok || b.PerSecond() == 0 {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.2fx\t\n", r.Op, r.Clients, b.PerSecond(), r.PerSecond(), r.PerSecond()/b.PerSecond())
	}
	tw.Flush()
}
