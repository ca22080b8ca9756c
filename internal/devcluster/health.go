package devcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Status asks the meta server for its status, with a deadline.
func (c *Cluster) Status(ctx context.Context) (*metapb.StatusReply, error) {
	mc, err := c.Client()
	if err != nil {
		return nil, err
	}
	defer mc.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return mc.Status(ctx, &metapb.StatusRequest{})
}

// FullRedundancy reports whether a status shows up chunkservers up and every
// stripe with all its shards: none degraded or lost, nothing queued for
// repair or in flight. why says what is missing.
func FullRedundancy(st *metapb.StatusReply, up int) (ok bool, why string) {
	n := st.ChunkserversUp()
	r := st.GetRepair()
	var miss []string
	if n < up {
		miss = append(miss, fmt.Sprintf("%d of %d chunkservers up", n, up))
	}
	if st.DegradedStripes != 0 {
		miss = append(miss, fmt.Sprintf("%d stripes with a shard on a down chunkserver", st.DegradedStripes))
	}
	if r == nil {
		miss = append(miss, "no repair status")
	} else {
		if r.DegradedStripes != 0 || r.LostStripes != 0 {
			miss = append(miss, fmt.Sprintf("%d degraded and %d lost stripes", r.DegradedStripes, r.LostStripes))
		}
		if r.Queued != 0 || r.InFlight != 0 {
			miss = append(miss, fmt.Sprintf("repair: %d queued, %d in flight", r.Queued, r.InFlight))
		}
		if r.HealthyStripes != st.Stripes {
			miss = append(miss, fmt.Sprintf("%d of %d stripes healthy", r.HealthyStripes, st.Stripes))
		}
	}
	return len(miss) == 0, strings.Join(miss, "; ")
}

// WaitFullRedundancy polls the meta server until FullRedundancy holds with
// up chunkservers up, or timeout passes; it returns how long that took.
func (c *Cluster) WaitFullRedundancy(ctx context.Context, up int, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	why := ""
	for {
		st, err := c.Status(ctx)
		if err == nil {
			var ok bool
			if ok, why = FullRedundancy(st, up); ok {
				return time.Since(start), nil
			}
		} else {
			why = err.Error()
		}
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("devcluster: no full redundancy after %v: %s", timeout, why)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// LogTails returns the last n bytes of every process log of the cluster
// (meta, chunkd, mount), each under its name.
func (c *Cluster) LogTails(n int) string {
	names, _ := filepath.Glob(filepath.Join(c.Dir, "*.log"))
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		data, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		if len(data) > n {
			data = data[len(data)-n:]
		}
		fmt.Fprintf(&b, "==== %s (last %d bytes)\n%s\n", filepath.Base(name), len(data), data)
	}
	return b.String()
}
