package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/server"
)

func rawClient(t *testing.T, addr string) metapb.MetaClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return metapb.NewMetaClient(conn)
}

func sleep(d time.Duration) { time.Sleep(d) }

// formatted formats a new data directory with the standard layout and
// returns it and its cluster secret.
func formatted(t *testing.T) (dir, secret string) {
	t.Helper()
	dir = t.TempDir()
	sf := dir + "/secret"
	if _, err := server.Format(context.Background(), dir, sf, core.StandardLayout()); err != nil {
		t.Fatal(err)
	}
	secret, err := auth.ReadSecretFile(sf)
	if err != nil {
		t.Fatal(err)
	}
	return dir, secret
}
