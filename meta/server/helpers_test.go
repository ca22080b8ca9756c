package server_test

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rdmafs/rdmafs/meta/metapb"
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
