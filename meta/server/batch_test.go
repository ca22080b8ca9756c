package server_test

import (
	"context"
	"syscall"
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/metatest"
)

// TestBatchReadsItsOwnWrites sends a batch whose calls depend on each other
// (its updates share one group commit, not waiting for each other): a
// lookup and an unlink see the creates before them, a failing call fails
// alone, and everything the batch answered is there for the next call.
func TestBatchReadsItsOwnWrites(t *testing.T) {
	m := metatest.Start(t, metatest.Options{})
	c := m.Client(t)
	ctx := context.Background()
	call := func(method string, req proto.Message) *metapb.BatchCall {
		body, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		return &metapb.BatchCall{Method: method, Request: body}
	}
	reply, err := c.Batch(ctx, &metapb.BatchRequest{Calls: []*metapb.BatchCall{
		call("Create", &metapb.CreateRequest{Parent: core.RootIno, Name: "a", Mode: 0o644}),
		call("Create", &metapb.CreateRequest{Parent: core.RootIno, Name: "b", Mode: 0o644}),
		call("Lookup", &metapb.LookupRequest{Parent: core.RootIno, Name: "a"}),
		call("Unlink", &metapb.UnlinkRequest{Parent: core.RootIno, Name: "b"}),
		call("Create", &metapb.CreateRequest{Parent: core.RootIno, Name: "a", Mode: 0o644, Exclusive: true}),
		call("Mkdir", &metapb.MkdirRequest{Parent: core.RootIno, Name: "d", Mode: 0o755}),
	}})
	if err != nil {
		t.Fatal(err)
	}
	errnos := make([]syscall.Errno, len(reply.Results))
	for i, r := range reply.Results {
		if len(r.Status) > 0 {
			st := &spb.Status{}
			if err := proto.Unmarshal(r.Status, st); err != nil {
				t.Fatal(err)
			}
			errnos[i] = client.Errno(status.ErrorProto(st))
		}
	}
	want := []syscall.Errno{0, 0, 0, 0, syscall.EEXIST, 0}
	for i := range want {
		if errnos[i] != want[i] {
			t.Fatalf("batch results: errnos %v, want %v", errnos, want)
		}
	}
	created := &metapb.EntryReply{}
	looked := &metapb.EntryReply{}
	if err := proto.Unmarshal(reply.Results[0].Reply, created); err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(reply.Results[2].Reply, looked); err != nil {
		t.Fatal(err)
	}
	if looked.Attr.GetIno() == 0 || looked.Attr.GetIno() != created.Attr.GetIno() {
		t.Fatalf("the lookup in the batch found inode %d, the create before it made %d", looked.Attr.GetIno(), created.Attr.GetIno())
	}
	for name, wantErr := range map[string]syscall.Errno{"a": 0, "b": syscall.ENOENT, "d": 0} {
		_, err := c.Lookup(ctx, &metapb.LookupRequest{Parent: core.RootIno, Name: name})
		if got := client.Errno(err); got != wantErr {
			t.Errorf("lookup %s after the batch: %v, want %v", name, got, wantErr)
		}
	}
}
