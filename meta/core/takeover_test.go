package core

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TestTakeover checks what a server that takes the store over from another
// one (Config.Takeover) knows: registered chunkservers count as up, so
// placement works at once, until they miss a heartbeat timeout; without
// Takeover they are down until they send a heartbeat.
func TestTakeover(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.chunkservers(6)
		f := e.create(root, RootIno, "f", 0o644)
		tests := []struct {
			takeover bool
			wantUp   bool
		}{{false, false}, {true, true}}
		for _, tt := range tests {
			s, err := New(e.ctx, Config{Store: e.store, Now: e.clock.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				HeartbeatTimeout: 5 * time.Second, Takeover: tt.takeover})
			if err != nil {
				t.Fatal(err)
			}
			st, err := s.Status(e.ctx, &metapb.StatusRequest{})
			if err != nil {
				t.Fatal(err)
			}
			for _, cs := range st.Chunkservers {
				if cs.Up != tt.wantUp {
					t.Fatalf("takeover=%v: chunkserver %s up=%v, want %v", tt.takeover, cs.Id, cs.Up, tt.wantUp)
				}
			}
			_, err = s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f, Stripes: []uint64{0}})
			if (err == nil) != tt.wantUp {
				t.Fatalf("takeover=%v: grant right after start: %v", tt.takeover, err)
			}
			if tt.takeover {
				// Silent chunkservers go down one heartbeat timeout later.
				e.clock.Advance(6 * time.Second)
				s.members.sweep(e.clock.Now(), s.cfg.HeartbeatTimeout, s.log)
				if s.members.isUp(csID(0)) {
					t.Fatal("a chunkserver without heartbeats stayed up after the timeout")
				}
			}
		}
	})
}
