package dump_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/dump"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/kv/bolt"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv/etcdtest"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

func all(t *testing.T, s kv.Store) map[string]string {
	t.Helper()
	out := map[string]string{}
	if err := s.View(context.Background(), func(r kv.Reader) error {
		return r.Scan(nil, nil, 0, func(k, v []byte) error { out[string(k)] = string(v); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// populate formats s and creates a small tree through the service.
func populate(t *testing.T, s kv.Store) {
	t.Helper()
	ctx := context.Background()
	if _, err := core.Format(ctx, s, core.StandardLayout(), time.Now()); err != nil {
		t.Fatal(err)
	}
	svc, err := core.New(ctx, core.Config{Store: s, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	d, err := svc.Mkdir(ctx, &metapb.MkdirRequest{Parent: core.RootIno, Name: "dir", Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 300; i++ {
		if _, err := svc.Create(ctx, &metapb.CreateRequest{Parent: d.Attr.Ino, Name: fmt.Sprintf("f%03d", i), Mode: 0o644}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := svc.SetXattr(ctx, &metapb.SetXattrRequest{Ino: d.Attr.Ino, Name: "user.big", Value: bytes.Repeat([]byte("x"), 60000)}); err != nil {
		t.Fatal(err)
	}
}

// TestMoveBetweenBackends dumps a file system from one backend and loads it
// into the other, both ways, and checks every key arrived unchanged.
func TestMoveBetweenBackends(t *testing.T) {
	etcd := etcdtest.StartT(t)
	ctx := context.Background()
	n := 0
	backends := map[string]func(t *testing.T) kv.Store{
		"bolt": func(t *testing.T) kv.Store {
			s, err := bolt.Open(t.TempDir(), bolt.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		"etcd": func(t *testing.T) kv.Store {
			n++
			s, err := etcdkv.Open(ctx, etcdkv.Options{Endpoints: []string{etcd.Endpoint()}, Prefix: fmt.Sprintf("dump%d", n), Batch: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
	}
	for _, tt := range []struct{ from, to string }{{"bolt", "etcd"}, {"etcd", "bolt"}, {"etcd", "etcd"}} {
		t.Run(tt.from+"->"+tt.to, func(t *testing.T) {
			src, dst := backends[tt.from](t), backends[tt.to](t)
			populate(t, src)
			var buf bytes.Buffer
			st, err := dump.Write(ctx, src, &buf, tt.from)
			if err != nil {
				t.Fatal(err)
			}
			want := all(t, src)
			if st.Records != uint64(len(want)) {
				t.Fatalf("dumped %d records, store has %d", st.Records, len(want))
			}
			data := buf.Bytes()
			if _, err := dump.Load(ctx, dst, bytes.NewReader(data), dump.LoadOptions{BatchKeys: 50}); err != nil {
				t.Fatal(err)
			}
			got := all(t, dst)
			if len(got) != len(want) {
				t.Fatalf("loaded %d keys, want %d", len(got), len(want))
			}
			for k, v := range want {
				if got[k] != v {
					t.Fatalf("key %q differs after the move", k)
				}
			}
			if _, err := core.New(ctx, core.Config{Store: dst, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
				t.Fatalf("the loaded store does not serve: %v", err)
			}
			if _, err := dump.Load(ctx, dst, bytes.NewReader(data), dump.LoadOptions{}); err == nil || !strings.Contains(err.Error(), "not empty") {
				t.Fatalf("load into a non-empty store: %v", err)
			}
		})
	}
}

// TestMalformed checks that broken dumps are refused with a clear error and
// leave the target unformatted.
func TestMalformed(t *testing.T) {
	ctx := context.Background()
	src, err := bolt.Open(t.TempDir(), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	populate(t, src)
	var buf bytes.Buffer
	if _, err := dump.Write(ctx, src, &buf, "test"); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	flip := func(i int) []byte { b := bytes.Clone(good); b[i] ^= 0x40; return b }
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "magic"},
		{"not a dump", []byte("hello world, this is not a dump"), "magic"},
		{"truncated", good[:len(good)/2], "truncated"},
		{"no trailer", good[:len(good)-40], ""},
		{"corrupt byte in a value", flip(len(good) / 2), ""},
		{"extra data", append(bytes.Clone(good), 0), "after the trailer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst, err := bolt.Open(t.TempDir(), bolt.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Close()
			_, err = dump.Load(ctx, dst, bytes.NewReader(tt.data), dump.LoadOptions{BatchKeys: 10})
			if err == nil {
				t.Fatal("a malformed dump loaded")
			}
			if !errors.Is(err, dump.ErrMalformed) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want ErrMalformed mentioning %q", err, tt.want)
			}
			if _, err := core.New(ctx, core.Config{Store: dst}); !errors.Is(err, core.ErrNotFormatted) {
				t.Fatalf("after a failed load the store is not left unformatted: %v", err)
			}
		})
	}
}

func FuzzReader(f *testing.F) {
	src, err := bolt.Open(f.TempDir(), bolt.Options{})
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	if _, err := core.Format(ctx, src, core.StandardLayout(), time.Unix(1, 0)); err != nil {
		f.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := dump.Write(ctx, src, &buf, "fuzz"); err != nil {
		f.Fatal(err)
	}
	src.Close()
	f.Add(buf.Bytes())
	f.Add([]byte(dump.Magic))
	f.Add(append([]byte(dump.Magic), 0xff, 0xff, 0xff, 0xff, 0x0f))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := dump.NewReader(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, dump.ErrMalformed) {
				t.Fatalf("error without ErrMalformed: %v", err)
			}
			return
		}
		for i := 0; ; i++ {
			_, _, err := d.Next()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				if !errors.Is(err, dump.ErrMalformed) {
					t.Fatalf("error without ErrMalformed: %v", err)
				}
				return
			}
		}
	})
}
