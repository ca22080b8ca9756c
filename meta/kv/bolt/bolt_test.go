package bolt

import (
	"context"
	"testing"

	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/kv/kvtest"
)

func TestConformance(t *testing.T) {
	kvtest.Run(t, func(t *testing.T) kv.Store {
		s, err := Open(t.TempDir(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestReopenKeepsData(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Update(context.Background(), func(tx kv.Txn) error { return tx.Put([]byte("k"), []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(context.Background(), func(tx kv.Txn) error { return nil }); err != kv.ErrClosed {
		t.Fatalf("Update after Close: %v", err)
	}
	s, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var v []byte
	s.View(context.Background(), func(r kv.Reader) (err error) { v, _, err = r.Get([]byte("k")); return err })
	if string(v) != "v" {
		t.Fatalf("after reopen k = %q", v)
	}
}
