package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv/etcdtest"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/reqid"
	"github.com/rdmafs/rdmafs/meta/server"
)

// TestLeaderFailover runs two meta servers on one etcd: one serves, the
// other stands by and answers Unavailable; a client given both addresses
// keeps creating files while the leader stops, and every create succeeds
// exactly once on the new leader.
func TestLeaderFailover(t *testing.T) {
	etcd := etcdtest.StartT(t)
	ctx := context.Background()
	url := etcd.URL("ha")
	secretFile := t.TempDir() + "/secret"
	if _, err := server.FormatStore(ctx, "", url, secretFile, core.StandardLayout()); err != nil {
		t.Fatal(err)
	}
	if _, err := server.FormatStore(ctx, "", url, t.TempDir()+"/s2", core.StandardLayout()); err == nil {
		t.Fatal("formatting a formatted etcd prefix succeeded")
	}
	secret, err := auth.ReadSecretFile(secretFile)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func() *server.Server {
		s, err := server.Start(ctx, server.Config{KV: url, Listen: "127.0.0.1:0", Secret: secret, Logger: quiet, ElectionTTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Stop(ctx) })
		return s
	}
	a := start()
	waitLeader(t, a)
	b := start()
	// b has entered the election once its candidacy key is in etcd, behind
	// a's: from then on only a's resignation or lost lease may elect it.
	waitCandidates(t, etcd.Endpoint(), etcdkv.LeaderPrefix("ha"), 2)
	// A candidate that wrongly skipped the wait would load the state and
	// serve within milliseconds. Not electing is a non-event with nothing to
	// wait on, so this window deliberately lets time pass before looking.
	time.Sleep(200 * time.Millisecond)
	if b.IsLeader() || !a.IsLeader() {
		t.Fatalf("a leader %v, b leader %v: want a only", a.IsLeader(), b.IsLeader())
	}
	// The standby refuses calls with Unavailable.
	if _, err := rawClient(t, b.Addr()).GetAttr(ctx, &metapb.GetAttrRequest{Ino: core.RootIno}); err == nil || client.Errno(err) == 0 {
		t.Fatalf("standby answered: %v", err)
	}
	c, err := client.Dial(b.Addr()+","+a.Addr(), secret)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The creator goes on without pause from before a stops until it has
	// made another batch of files after a.Stop returned, so creates are in
	// flight while a stops and some must fail over to b.
	const batch = 30
	var (
		started = make(chan struct{}) // closed after the first batch
		stopped = make(chan struct{}) // closed when a.Stop returned
		done    = make(chan error, 1)
		files   int
	)
	go func() {
		after := -1 // files made when stopped was seen
		for i := 0; after < 0 || i < after+batch; i++ {
			if i == batch {
				close(started)
			}
			if after < 0 && i >= batch {
				select {
				case <-stopped:
					after = i
				default:
				}
			}
			if _, err := c.Create(ctx, &metapb.CreateRequest{Parent: core.RootIno, Name: fmt.Sprintf("f%d", i), Mode: 0o644, Exclusive: true}); err != nil {
				done <- fmt.Errorf("create f%d: %w", i, err)
				return
			}
			files = i + 1
		}
		done <- nil
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("creates before the failover: %v", err)
	}
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	close(stopped)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d files created across the failover", files)
	if !b.IsLeader() {
		t.Fatal("the standby did not take over")
	}
	if c.Current() != b.Addr() {
		t.Fatalf("client talks to %s, want the new leader %s", c.Current(), b.Addr())
	}
	r, err := c.ReadDir(ctx, &metapb.ReadDirRequest{Ino: core.RootIno, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Entries) != files || files < 2*batch {
		t.Fatalf("%d entries after failover, want %d", len(r.Entries), files)
	}
}

// waitCandidates waits until n meta servers stand in the election under
// prefix on the etcd at endpoint (each holds a key there while campaigning or
// leading).
func waitCandidates(t *testing.T, endpoint, prefix string, n int64) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		r, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatalf("waiting for %d candidates under %s: %v", n, prefix, err)
		}
		if r.Count >= n {
			return
		}
		// Watch from the next revision: the next change of the prefix wakes us.
		wctx, wcancel := context.WithCancel(ctx)
		select {
		case <-cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(r.Header.Revision+1)):
			wcancel()
		case <-ctx.Done():
			wcancel()
			t.Fatalf("%d candidates under %s after 15s, want %d", r.Count, prefix, n)
		}
	}
}

func waitLeader(t *testing.T, s *server.Server) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !s.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("no leader after 15s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLostReplyIsReplayed makes the first attempt of every mutating call
// lose its reply after the server committed it (as when the server dies
// right after the commit): the client's retry must get the original
// outcome, not EEXIST or ENOENT, on both backends.
func TestLostReplyIsReplayed(t *testing.T) {
	etcd := etcdtest.StartT(t)
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, kvURL := range []string{"", etcd.URL("lost")} {
		t.Run(fmt.Sprintf("etcd=%v", kvURL != ""), func(t *testing.T) {
			dir := t.TempDir()
			sf := dir + "/secret"
			if _, err := server.FormatStore(ctx, dir, kvURL, sf, core.StandardLayout()); err != nil {
				t.Fatal(err)
			}
			secret, err := auth.ReadSecretFile(sf)
			if err != nil {
				t.Fatal(err)
			}
			s, err := server.Start(ctx, server.Config{DataDir: dir, KV: kvURL, Listen: "127.0.0.1:0", Secret: secret, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Stop(ctx)
			waitLeader(t, s)
			var lost atomic.Int64
			drop := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				if md, _ := metadata.FromOutgoingContext(ctx); err == nil && len(md.Get(reqid.HeaderRetry)) == 0 && len(md.Get(reqid.HeaderID)) > 0 {
					lost.Add(1)
					return status.Error(codes.Unavailable, "reply lost (test)")
				}
				return err
			}
			c, err := client.Dial(s.Addr(), secret, grpc.WithUnaryInterceptor(drop))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			e, err := c.Create(ctx, &metapb.CreateRequest{Parent: core.RootIno, Name: "f", Mode: 0o644, Exclusive: true})
			if err != nil {
				t.Fatalf("create whose first reply was lost: %v", err)
			}
			if _, err := c.Mkdir(ctx, &metapb.MkdirRequest{Parent: core.RootIno, Name: "d", Mode: 0o755}); err != nil {
				t.Fatalf("mkdir whose first reply was lost: %v", err)
			}
			if _, err := c.Rename(ctx, &metapb.RenameRequest{Parent: core.RootIno, Name: "f", NewParent: core.RootIno, NewName: "g"}); err != nil {
				t.Fatalf("rename whose first reply was lost: %v", err)
			}
			if _, err := c.Unlink(ctx, &metapb.UnlinkRequest{Parent: core.RootIno, Name: "g"}); err != nil {
				t.Fatalf("unlink whose first reply was lost: %v", err)
			}
			if lost.Load() != 4 {
				t.Fatalf("%d replies dropped, want 4", lost.Load())
			}
			r, err := c.ReadDir(ctx, &metapb.ReadDirRequest{Ino: core.RootIno})
			if err != nil || len(r.Entries) != 1 || r.Entries[0].Name != "d" || e.Attr.Ino == 0 {
				t.Fatalf("namespace after the replays: %v %v", r, err)
			}
		})
	}
}
