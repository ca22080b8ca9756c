package fs

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// groupCacheTTL bounds how long a process's supplementary groups are reused.
const groupCacheTTL = time.Second

// callers turns the caller of a FUSE request into a metapb.Caller with its
// supplementary groups, caching the groups per pid briefly.
type callers struct {
	session uint64 // the mount's session, named in every caller
	mu      sync.Mutex
	cache   map[uint32]groupEntry
}

type groupEntry struct {
	groups []uint32
	at     time.Time
}

func newCallers(session uint64) *callers {
	return &callers{session: session, cache: map[uint32]groupEntry{}}
}

// of returns the caller of the request ctx belongs to.
func (c *callers) of(ctx context.Context) *metapb.Caller {
	fc, ok := fuse.FromContext(ctx)
	if !ok {
		return &metapb.Caller{Session: c.session}
	}
	caller := &metapb.Caller{Uid: fc.Uid, Gid: fc.Gid, Session: c.session}
	if fc.Uid != 0 && fc.Pid != 0 {
		caller.Groups = c.groups(fc.Pid)
	}
	return caller
}

func (c *callers) groups(pid uint32) []uint32 {
	now := time.Now()
	c.mu.Lock()
	e, ok := c.cache[pid]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < groupCacheTTL {
		return e.groups
	}
	groups, err := readGroups(pid)
	if err != nil {
		return nil // the process is gone; its request still runs with uid/gid
	}
	c.mu.Lock()
	if len(c.cache) > 4096 {
		clear(c.cache)
	}
	c.cache[pid] = groupEntry{groups: groups, at: now}
	c.mu.Unlock()
	return groups
}

// readGroups reads the supplementary groups of a process from /proc.
func readGroups(pid uint32) ([]uint32, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "Groups:") {
			continue
		}
		var groups []uint32
		for _, g := range strings.Fields(line[len("Groups:"):]) {
			n, err := strconv.ParseUint(g, 10, 32)
			if err == nil {
				groups = append(groups, uint32(n))
			}
		}
		return groups, nil
	}
	return nil, fmt.Errorf("no Groups line in /proc/%d/status", pid)
}
