package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/server"
)

// storeFlags are the --data and --kv flags of the commands that open a
// metadata store directly (dump, load), with no meta server in between.
type storeFlags struct {
	dataDir, kvURL string
}

// register adds --data and --kv to f; what the help says of each follows
// the command's use of the store.
func (s *storeFlags) register(f *pflag.FlagSet, dataHelp, kvHelp string) {
	f.StringVar(&s.dataDir, "data", "", dataHelp)
	f.StringVar(&s.kvURL, "kv", "", kvHelp)
}

// where names the store: the data directory or the etcd URL.
func (s *storeFlags) where() string {
	if s.kvURL != "" {
		return s.kvURL
	}
	return s.dataDir
}

// check reports an error unless exactly one of --data and --kv was given;
// verb prefixes it ("admin dump").
func (s *storeFlags) check(verb string) error {
	if (s.dataDir == "") == (s.kvURL == "") {
		return fmt.Errorf("%s: give exactly one of --data DIR and --kv etcd://HOST:PORT/PREFIX", verb)
	}
	return nil
}

// open checks the flags and opens the store they name; verb prefixes its
// errors.
func (s *storeFlags) open(ctx context.Context, verb string) (kv.Store, error) {
	if err := s.check(verb); err != nil {
		return nil, err
	}
	store, err := server.OpenStore(ctx, s.dataDir, s.kvURL, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", verb, err)
	}
	return store, nil
}
