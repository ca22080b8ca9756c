package proto

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"syscall"
	"testing"
	"time"
)

func sampleRequests() []Request {
	return []Request{
		{Op: OpReadLease, Chunk: 1, Version: 2},
		{Op: OpRenewLease, LeaseID: 77},
		{Op: OpReleaseLease, LeaseID: 78},
		{Op: OpPrepareWrite, Chunk: 3, Version: 4, Length: 1 << 20},
		{Op: OpCommit, Chunk: 3, Version: 4, CRC: 0xdeadbeef},
		{Op: OpAbort, Chunk: 3, Version: 5},
		{Op: OpDelete, Chunk: 3, Version: 1},
		{Op: OpStat, Chunk: 3, Version: 4},
		{Op: OpList, Chunk: 3},
		{Op: OpPreparePatch, Chunk: 3, Version: 6, Length: 4096, Base: 4},
		{Op: OpClone, Chunk: 3, Version: 7, Base: 0xffffffffffff},
		{Op: OpSlab},
		{Op: OpPatchSlab, Chunk: 3, Version: 8, Length: 5000, Base: 7, Slab: 3 * SlabAlign},
		{Op: OpPatchSlab, Chunk: 3, Version: 9, Length: 1, Base: 8, Slab: MaxSlab - SlabAlign},
	}
}

func sampleReplies() []Reply {
	return []Reply{
		{Op: OpReadLease, LeaseID: 9, Addr: 0x7f0000001000, RKey: 0x1234, Length: 4096, CRC: 5, TTL: 10000},
		{Op: OpPrepareWrite, Status: StatusNoSpace},
		{Op: OpList, Versions: []VersionInfo{{Version: 1, Length: 10, CRC: 2}, {Version: 3, Length: 4, CRC: 5}}},
		{Op: OpCommit, Status: StatusChecksumMismatch},
		{Op: OpCommit, Length: 1 << 20, CRC: 0xfeedface},
		{Op: OpPreparePatch, Addr: 0x7f0000002000, RKey: 0x55, Length: 24, TTL: 60000},
		{Op: OpClone, Length: 4096, CRC: 7},
		{Op: OpSlab, Addr: 0x7f0000003000, RKey: 0x56, Length: 256 << 10},
	}
}

func TestRequestsRoundTrip(t *testing.T) {
	reqs := sampleRequests()
	buf := make([]byte, 4096)
	n, err := EncodeRequests(buf, 42, reqs)
	if err != nil || n != RequestsSize(len(reqs)) {
		t.Fatalf("EncodeRequests = %d, %v", n, err)
	}
	id, got, err := DecodeRequests(buf[:n], make([]Request, 0, 16))
	if err != nil || id != 42 || !reflect.DeepEqual(got, reqs) {
		t.Fatalf("DecodeRequests = %d %+v %v", id, got, err)
	}
}

func TestSlabOffsetRefused(t *testing.T) {
	buf := make([]byte, 4096)
	for _, off := range []uint32{1, SlabAlign + 17, MaxSlab} {
		if _, err := EncodeRequests(buf, 1, []Request{{Op: OpPatchSlab, Chunk: 1, Version: 2, Base: 1, Length: 8, Slab: off}}); err == nil {
			t.Errorf("slab offset %d encoded", off)
		}
	}
}

func TestRepliesRoundTrip(t *testing.T) {
	reps := sampleReplies()
	buf := make([]byte, 4096)
	n, err := EncodeReplies(buf, 43, reps)
	if err != nil {
		t.Fatal(err)
	}
	id, got, err := DecodeReplies(buf[:n], nil)
	if err != nil || id != 43 || !reflect.DeepEqual(got, reps) {
		t.Fatalf("DecodeReplies = %d %+v %v", id, got, err)
	}
}

func TestDecodeErrors(t *testing.T) {
	buf := make([]byte, 4096)
	n, _ := EncodeRequests(buf, 1, sampleRequests())
	good := append([]byte(nil), buf[:n]...)
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	tests := []struct {
		name string
		b    []byte
		cap  int
		want error
	}{
		{"empty", nil, 16, ErrShort},
		{"magic", mod(func(b []byte) []byte { b[0] ^= 1; return b }), 16, ErrMagic},
		{"version", mod(func(b []byte) []byte { b[2] = 9; return b }), 16, ErrVersion},
		{"kind", mod(func(b []byte) []byte { b[3] = KindReply.b(); return b }), 16, ErrKind},
		{"truncated", good[:len(good)-1], 16, ErrShort},
		{"trailing", append(append([]byte(nil), good...), 0), 16, ErrTrailing},
		{"op", mod(func(b []byte) []byte { b[HeaderLen] = 200; return b }), 16, ErrOp},
		{"batch too large", good, 2, ErrTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := DecodeRequests(tc.b, make([]Request, 0, tc.cap)); !errors.Is(err, tc.want) {
				t.Fatalf("DecodeRequests = %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := EncodeRequests(make([]byte, 40), 1, sampleRequests()); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("EncodeRequests into a small buffer = %v", err)
	}
}

func (k Kind) b() byte { return byte(k) }

func TestStatusError(t *testing.T) {
	err := StatusChecksumMismatch.Err(OpCommit)
	if !IsStatus(err, StatusChecksumMismatch) || !errors.Is(err, &StatusError{Status: StatusChecksumMismatch}) {
		t.Fatalf("status error does not match: %v", err)
	}
	if StatusOK.Err(OpCommit) != nil {
		t.Fatal("OK is an error")
	}
	if err.Error() != "chunkd Commit: checksum mismatch" {
		t.Fatalf("text %q", err.Error())
	}
	if errors.Is(err, syscall.ENOSPC) {
		t.Fatal("checksum mismatch is ENOSPC")
	}
}

// TestNoSpaceIsENOSPC: a full chunkserver's answer reads as ENOSPC through the
// client's wrapping, and still as its status.
func TestNoSpaceIsENOSPC(t *testing.T) {
	for _, op := range []Op{OpPrepareWrite, OpCommit} {
		err := fmt.Errorf("prepare 1.2: %w", StatusNoSpace.Err(op))
		if !errors.Is(err, syscall.ENOSPC) || !IsStatus(err, StatusNoSpace) {
			t.Fatalf("%v: errors.Is ENOSPC %v, IsStatus %v", err, errors.Is(err, syscall.ENOSPC), IsStatus(err, StatusNoSpace))
		}
		if errors.Is(err, syscall.EIO) {
			t.Fatalf("%v is EIO", err)
		}
	}
}

func TestConnectAccept(t *testing.T) {
	secret := []byte("cluster secret")
	now := time.Now()
	cd := ConnectData{Time: now, Nonce: [8]byte{1, 2, 3}}
	b := EncodeConnect(secret, cd)
	if len(b) != ConnectDataLen || len(b) > 56 {
		t.Fatalf("connect data is %d bytes", len(b))
	}
	got, err := DecodeConnect(secret, b, now.Add(time.Second), time.Minute)
	if err != nil || !got.Time.Equal(now) || got.Nonce != cd.Nonce {
		t.Fatalf("DecodeConnect = %+v, %v", got, err)
	}
	if _, err := DecodeConnect([]byte("other"), b, now, time.Minute); !errors.Is(err, ErrAuth) {
		t.Fatalf("wrong secret: %v", err)
	}
	if _, err := DecodeConnect(secret, b, now.Add(time.Hour), time.Minute); !errors.Is(err, ErrAuth) {
		t.Fatalf("stale token: %v", err)
	}
	if _, err := DecodeConnect(secret, b[:20], now, time.Minute); !errors.Is(err, ErrAuth) {
		t.Fatalf("short token: %v", err)
	}
	a := AcceptData{Credits: 32, MaxBatch: 64, MaxMsg: 4096, MaxLength: 16 << 20, LeaseTTL: 10 * time.Second, Slab: 256 << 10}
	ab := EncodeAccept(secret, b, a)
	if len(ab) != AcceptDataLen {
		t.Fatalf("accept data %d bytes", len(ab))
	}
	ga, err := DecodeAccept(secret, b, ab)
	if err != nil || ga != a {
		t.Fatalf("DecodeAccept = %+v, %v", ga, err)
	}
	// A slab this client cannot address is no slab, not a refused connection.
	for _, bad := range []int{SlabAlign + 1, MaxSlab + SlabAlign} {
		odd := a
		odd.Slab = bad
		if ga, err := DecodeAccept(secret, b, EncodeAccept(secret, b, odd)); err != nil || ga.Slab != 0 {
			t.Fatalf("accept with a slab of %d = %+v, %v; want no slab", bad, ga, err)
		}
	}
	other := EncodeConnect(secret, ConnectData{Time: now, Nonce: [8]byte{9}})
	if _, err := DecodeAccept(secret, other, ab); !errors.Is(err, ErrAuth) {
		t.Fatalf("accept bound to another connect: %v", err)
	}
}

func FuzzDecodeRequests(f *testing.F) {
	buf := make([]byte, 4096)
	n, _ := EncodeRequests(buf, 5, sampleRequests())
	f.Add(append([]byte(nil), buf[:n]...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, reqs, err := DecodeRequests(b, make([]Request, 0, 64))
		if err != nil {
			return
		}
		out := make([]byte, RequestsSize(len(reqs)))
		m, err := EncodeRequests(out, id, reqs)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		_, again, err := DecodeRequests(out[:m], make([]Request, 0, 64))
		if err != nil || !reflect.DeepEqual(again, reqs) {
			t.Fatalf("round trip changed %+v -> %+v (%v)", reqs, again, err)
		}
	})
}

func FuzzDecodeReplies(f *testing.F) {
	buf := make([]byte, 4096)
	n, _ := EncodeReplies(buf, 6, sampleReplies())
	f.Add(append([]byte(nil), buf[:n]...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, reps, err := DecodeReplies(b, nil)
		if err != nil {
			return
		}
		out := make([]byte, len(b))
		m, err := EncodeReplies(out, id, reps)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		// Reserved bytes may differ; the decoded values must not.
		_, again, err := DecodeReplies(out[:m], nil)
		if err != nil || !reflect.DeepEqual(again, reps) {
			t.Fatalf("round trip changed %+v -> %+v (%v)", reps, again, err)
		}
	})
}

func FuzzDecodeConnect(f *testing.F) {
	secret := []byte("s")
	now := time.Unix(1700000000, 0)
	f.Add(EncodeConnect(secret, ConnectData{Time: now}))
	f.Add([]byte("short"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeConnect(secret, b, now, time.Minute)
		if err != nil {
			return
		}
		if !bytes.Equal(EncodeConnect(secret, c), b[:ConnectDataLen]) {
			t.Fatalf("accepted token does not re-encode to itself")
		}
	})
}

func FuzzDecodeAccept(f *testing.F) {
	secret := []byte("s")
	connect := EncodeConnect(secret, ConnectData{Time: time.Unix(1700000000, 0)})
	f.Add(EncodeAccept(secret, connect, AcceptData{Credits: 1, MaxBatch: 1, MaxMsg: 4096, MaxLength: 1, LeaseTTL: time.Second, Slab: 64 << 10}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := DecodeAccept(secret, connect, b)
		if err != nil {
			return
		}
		if a.Credits < 1 || a.MaxBatch < 1 || a.Slab%SlabAlign != 0 || a.Slab > MaxSlab {
			t.Fatalf("unusable limits accepted: %+v", a)
		}
	})
}
