package chunkserver_test

import (
	"strings"
	"testing"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
	"github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/internal/datakey"
	"github.com/rdmafs/rdmafs/rdma"
)

// TestTokenConnections: a mount holding a mount token connects with the
// token's data key, never the secret; it is served only chunks it presented
// a capability for (what meta gives it for files in its subdirectory), and a
// read-only token's connection reads but every write is refused; a data key
// used with the other read-only bit, or of another cluster, does not
// connect.
func TestTokenConnections(t *testing.T) {
	secret := []byte("the cluster secret")
	s := chunktest.Start(t, chunktest.Options{Secret: secret})
	full, env := s.Dial(t)
	ctx := ctxT(t)
	key := chunk.Key{Chunk: 9, Version: 1}
	want := put(t, full, env, 0, key, 8192)
	outside := chunk.Key{Chunk: 12, Version: 1}
	put(t, full, env, 0, outside, 4096)

	id := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	// The capabilities meta gives the token: chunk 9, and 11 to write.
	roCaps, rwCaps := client.NewCaps(), client.NewCaps()
	roCaps.Add(9, datakey.Capability(secret, id, 9, false), false)
	roCaps.Add(12, datakey.Capability([]byte("forged"), id, 12, false), false)
	rwCaps.Add(9, datakey.Capability(secret, id, 9, false), false) // read only
	rwCaps.Add(11, datakey.Capability(secret, id, 11, true), true)
	dial := func(secret []byte, tok proto.Token, claimReadOnly bool) (*client.Client, *chunktest.ClientEnv, error) {
		e := chunktest.NewClientEnv(t, 1<<20)
		caps := rwCaps
		if claimReadOnly {
			caps = roCaps
		}
		c, err := client.Dial(ctx, e.Dev, e.PD, s.Addr(), client.Options{
			Secret: datakey.ForToken(secret, tok.ID, tok.ReadOnly),
			Token:  &proto.Token{ID: tok.ID, ReadOnly: claimReadOnly}, Caps: caps})
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return c, e, err
	}

	ro, roEnv, err := dial(s.Secret, proto.Token{ID: id, ReadOnly: true}, true)
	if err != nil {
		t.Fatalf("read-only token: %v", err)
	}
	buf := roEnv.Bytes()[:len(want)]
	if _, err := ro.ReadAt(ctx, key, 0, []rdma.SGE{roEnv.SGE(0, len(want))}); err != nil || string(buf) != string(want) {
		t.Fatalf("read with a read-only token: %v", err)
	}
	err = ro.WriteVersion(ctx, chunk.Key{Chunk: 10, Version: 1}, []rdma.SGE{roEnv.SGE(0, 4096)}, store.Checksum(roEnv.Bytes()[:4096]))
	if !proto.IsStatus(err, proto.StatusNotAuthorized) {
		t.Fatalf("write with a read-only token: %v, want not authorized", err)
	}
	if err := ro.Delete(ctx, key); !proto.IsStatus(err, proto.StatusNotAuthorized) {
		t.Fatalf("delete with a read-only token: %v, want not authorized", err)
	}
	// A staging slab holds memory for writes: none for a read-only token.
	if reps, err := ro.Do(ctx, []proto.Request{{Op: proto.OpSlab}}); err != nil || reps[0].Status != proto.StatusNotAuthorized {
		t.Fatalf("slab for a read-only token = %+v, %v; want not authorized", reps, err)
	}
	// A chunk without a capability, or with a forged one, is not served.
	if _, err := ro.Stat(ctx, chunk.Key{Chunk: 10, Version: 1}); !proto.IsStatus(err, proto.StatusNotAuthorized) {
		t.Fatalf("stat of a chunk the token has no capability for: %v, want not authorized", err)
	}
	if _, err := ro.ReadAt(ctx, outside, 0, []rdma.SGE{roEnv.SGE(0, 4096)}); err == nil || !strings.Contains(err.Error(), "not authorized") {
		t.Fatalf("read with a forged capability: %v, want not authorized", err)
	}

	rw, rwEnv, err := dial(s.Secret, proto.Token{ID: id}, false)
	if err != nil {
		t.Fatalf("read-write token: %v", err)
	}
	if err := rw.WriteVersion(ctx, chunk.Key{Chunk: 11, Version: 1}, []rdma.SGE{rwEnv.SGE(0, 4096)}, store.Checksum(rwEnv.Bytes()[:4096])); err != nil {
		t.Fatalf("write with a read-write token: %v", err)
	}
	if reps, err := rw.Do(ctx, []proto.Request{{Op: proto.OpSlab}}); err != nil || reps[0].Status != proto.StatusOK {
		t.Fatalf("slab for a read-write token = %+v, %v", reps, err)
	}
	if err := rw.Delete(ctx, outside); !proto.IsStatus(err, proto.StatusNotAuthorized) {
		t.Fatalf("delete of a chunk the token has no capability for: %v, want not authorized", err)
	}
	// A read capability does not let a read-write token write or delete the
	// chunk; a write capability does not let it delete (meta's GC does).
	if err := rw.WriteVersion(ctx, chunk.Key{Chunk: 9, Version: 2}, []rdma.SGE{rwEnv.SGE(0, 4096)}, store.Checksum(rwEnv.Bytes()[:4096])); !proto.IsStatus(err, proto.StatusNotAuthorized) {
		t.Fatalf("write with a read capability: %v, want not authorized", err)
	}
	if err := rw.Delete(ctx, chunk.Key{Chunk: 11, Version: 1}); !proto.IsStatus(err, proto.StatusNotAuthorized) {
		t.Fatalf("delete by a token's connection: %v, want not authorized", err)
	}
	if _, err := rw.ReadAt(ctx, key, 0, []rdma.SGE{rwEnv.SGE(0, len(want))}); err != nil {
		t.Fatalf("read with a read capability: %v", err)
	}
	if _, err := full.Stat(ctx, outside); err != nil {
		t.Fatalf("the chunk outside after the token's attempts: %v", err)
	}

	// The read-only token's key claiming write access, and a key of
	// another cluster, are refused at the handshake.
	if _, _, err := dial(s.Secret, proto.Token{ID: id, ReadOnly: true}, false); err == nil || !strings.Contains(err.Error(), "not authorized") {
		t.Fatalf("a read-only token's key claiming write access: %v", err)
	}
	if _, _, err := dial([]byte("another secret"), proto.Token{ID: id}, false); err == nil || !strings.Contains(err.Error(), "not authorized") {
		t.Fatalf("a token of another cluster: %v", err)
	}
}
