package clustertest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/cmdbuild"
	"github.com/rdmafs/rdmafs/internal/devcluster"
)

// TestStart brings up a cluster of a meta server alone (no chunkd, no
// mount: no root needed) in a subtest and checks that it serves, and that
// once the subtest passed its process is gone and its directory removed.
func TestStart(t *testing.T) {
	bin := cmdbuild.ForTest(t, "./cmd/...") // skips in -short mode
	var c *devcluster.Cluster
	t.Run("cluster", func(t *testing.T) {
		c = Start(t, devcluster.Config{Bin: bin, Chunkservers: -1}, Options{})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.Status(ctx); err != nil {
			t.Fatalf("status of the cluster's meta server: %v", err)
		}
	})
	if c == nil {
		t.Fatal("no cluster")
	}
	if !devcluster.Exited(c.Meta.PID) {
		t.Errorf("meta server (pid %d) still runs after the test", c.Meta.PID)
	}
	if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
		t.Errorf("cluster directory %s left after a passed test: %v", c.Dir, err)
	}
}

func TestDirNameAndTail(t *testing.T) {
	if got := dirName("TestX/sub case#1"); got != "TestX_sub_case_1" {
		t.Errorf("dirName = %q", got)
	}
	if got := len(dirName(string(make([]byte, 100)))); got != 40 {
		t.Errorf("dirName of 100 bytes is %d long, want 40", got)
	}
	if got := Tail("abcdef", 3); got != "def" {
		t.Errorf("Tail = %q", got)
	}
	if got := Tail("ab", 3); got != "ab" {
		t.Errorf("Tail of a short string = %q", got)
	}
}
