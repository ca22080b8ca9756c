// Package client is the Go client of the metadata service, used by the FUSE
// client and by chunkd: a gRPC connection that presents the cluster secret,
// session management with keepalives, and errno conversion.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Flow-control windows for what the server sends (replies of ReadDir and
// GetStripes can be large).
const (
	streamWindow = 1 << 20
	connWindow   = 8 << 20
)

// Client is a connection to the metadata service. All metapb.MetaClient
// methods are available on it directly.
type Client struct {
	metapb.MetaClient
	fo *failover
	bg *behind // calls sent behind (behind.go); MetaClient's calls go through it
}

// Dial connects to the metadata service at addrs: one host:port, or several
// separated by commas (meta servers sharing one etcd, of which one serves).
// Calls go to the server that answered last; on Unavailable or a connection
// error they move on to the next address and are retried, for up to
// FailoverTimeout (or the call's deadline). Mutating calls carry a request
// id, so that a retry of a call whose first attempt committed returns the
// original outcome. Connections are established lazily; extra grpc options
// are appended.
func Dial(addrs, secret string, opts ...grpc.DialOption) (*Client, error) {
	if secret == "" {
		return nil, errors.New("client: empty cluster secret")
	}
	return dial(addrs, auth.SecretCredentials(secret), opts)
}

// CapSink receives the chunk capabilities meta puts in a token mount's
// replies (chunkserver/client.Caps is one).
type CapSink interface {
	Add(chunk uint64, capability []byte, write bool)
}

// DialToken is Dial for a mount holding a mount token instead of the
// secret: its calls carry grant (auth.MountToken.Grant), meta restricts them
// to what the token allows, and the chunk capabilities in every reply go to
// caps (if not nil).
func DialToken(addrs, grant string, caps CapSink, opts ...grpc.DialOption) (*Client, error) {
	if grant == "" {
		return nil, errors.New("client: empty mount token")
	}
	if caps != nil {
		opts = append([]grpc.DialOption{grpc.WithChainUnaryInterceptor(collectCaps(caps))}, opts...)
	}
	return dial(addrs, auth.TokenCredentials(grant), opts)
}

// collectCaps hands the capabilities of the shards in each reply to caps.
func collectCaps(caps CapSink) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if m, ok := reply.(proto.Message); ok && err == nil {
			metapb.EachShard(m, func(sh *metapb.Shard) {
				if len(sh.Cap) > 0 {
					caps.Add(sh.ChunkId, sh.Cap, sh.CapWrite)
				}
			})
		}
		return err
	}
}

func dial(addrs string, creds credentials.PerRPCCredentials, opts []grpc.DialOption) (*Client, error) {
	list, err := SplitAddrs(addrs)
	if err != nil {
		return nil, err
	}
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(creds),
		// A server that was down (or a standby) must be retried soon
		// after it comes back, not after grpc's default backoff of up to
		// two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond,
			Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}, MinConnectTimeout: 2 * time.Second}),
		// Static flow-control windows: metadata messages are small, and
		// the dynamic window's bandwidth probe (a PING and a WINDOW_UPDATE
		// after most messages received) doubled the frames, syscalls and
		// wake-ups of every call.
		grpc.WithStaticStreamWindowSize(streamWindow), grpc.WithStaticConnWindowSize(connWindow),
	}, opts...)
	fo := &failover{client: randomClientID()}
	for _, a := range list {
		conn, err := grpc.NewClient(a, all...)
		if err != nil {
			fo.close()
			return nil, fmt.Errorf("client: dial meta at %s: %w", a, err)
		}
		fo.conns = append(fo.conns, conn)
		fo.addrs = append(fo.addrs, a)
	}
	bg := newBehind(fo)
	return &Client{MetaClient: metapb.NewMetaClient(bg), fo: fo, bg: bg}, nil
}

// SplitAddrs splits a comma-separated list of host:port addresses.
func SplitAddrs(addrs string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(addrs, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("client: meta address %q: want host:port: %w", a, err)
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("client: no meta address in %q", addrs)
	}
	return out, nil
}

// DialFiles is Dial with the secret read from secretFile and, when tls names
// any file, TLS to the servers (see auth.TLSFiles.ClientConfig).
func DialFiles(addrs, secretFile string, tls auth.TLSFiles, opts ...grpc.DialOption) (*Client, error) {
	secret, err := auth.ReadSecretFile(secretFile)
	if err != nil {
		return nil, err
	}
	cfg, err := tls.ClientConfig()
	if err != nil {
		return nil, err
	}
	return Dial(addrs, secret, append([]grpc.DialOption{WithTLS(cfg)}, opts...)...)
}

// WithTLS returns the option that makes Dial speak TLS with cfg (nil: no
// option, the connection stays plaintext).
func WithTLS(cfg *tls.Config) grpc.DialOption {
	if cfg == nil {
		return grpc.EmptyDialOption{}
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg))
}

// Close closes the connections. Calls still behind are dropped: a mount
// waits for them first (Session.Close).
func (c *Client) Close() error {
	c.bg.close()
	return c.fo.close()
}

// SetFailoverTimeout bounds how long a call keeps trying the meta servers
// when its context has no deadline (default 2 minutes).
func (c *Client) SetFailoverTimeout(d time.Duration) { c.fo.timeout.Store(int64(d)) }

// Current returns the address calls go to now.
func (c *Client) Current() string { return c.fo.addrs[c.fo.cur.Load()%int64(len(c.fo.addrs))] }

// Errno returns the POSIX errno an error from any RPC stands for (0 for nil,
// EIO for errors without a POSIX meaning).
func Errno(err error) syscall.Errno { return metaerr.Errno(err) }

// ConflictStripes returns the stripes that lost the version compare-and-set
// in a failed CommitStripes call (nil for any other error). The writer gets
// new grants for them and writes again.
func ConflictStripes(err error) []uint64 { return metaerr.ConflictStripes(err) }

// Session is a client session kept alive in the background. Files opened in
// it stay readable after an unlink until released or the session ends.
type Session struct {
	c      *Client
	id     uint64
	root   uint64 // RootIno
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	err    error
	inos   inoPool
}

// StartSession opens a session named client with the given TTL (0: server
// default) and renews it every third of the TTL until Close.
func (c *Client) StartSession(ctx context.Context, client string, ttl time.Duration) (*Session, error) {
	r, err := c.OpenSession(ctx, &metapb.OpenSessionRequest{Client: client, TtlMs: ttl.Milliseconds()})
	if err != nil {
		return nil, fmt.Errorf("client: open session: %w", err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	s := &Session{c: c, id: r.SessionId, root: r.RootIno, cancel: cancel, done: make(chan struct{})}
	// Inode numbers at hand from the start: the first creates can be
	// answered early too. A session that may have none (a mount token's)
	// just goes without.
	s.inos.fetching = true
	s.fetchInos(ctx)
	go s.keepalive(kctx, time.Duration(r.TtlMs)*time.Millisecond/3)
	return s, nil
}

// ID returns the session id to pass in Create, Open, Release and SetAttr.
func (s *Session) ID() uint64 { return s.id }

// RootIno returns the inode the session's mount must show as its root: a
// mount token's subdirectory, or 0 for the file system's root.
func (s *Session) RootIno() uint64 { return s.root }

// Err returns the error that ended the keepalives (the session expired), or nil.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *Session) keepalive(ctx context.Context, every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(max(every, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, every)
		_, err := s.c.KeepAlive(cctx, &metapb.KeepAliveRequest{SessionId: s.id})
		cancel()
		if err != nil && Errno(err) == syscall.ESTALE {
			s.mu.Lock()
			s.err = fmt.Errorf("client: session %d lost: %w", s.id, err)
			s.mu.Unlock()
			return
		}
		// Other errors (meta restarting) are retried at the next tick.
	}
}

// Close stops the keepalives and closes the session on the server, which
// releases its open files. The calls sent behind go first.
func (s *Session) Close(ctx context.Context) error {
	if err := s.WaitBehind(ctx); err != nil {
		return fmt.Errorf("client: close session %d: %w", s.id, err)
	}
	s.cancel()
	<-s.done
	if _, err := s.c.CloseSession(ctx, &metapb.CloseSessionRequest{SessionId: s.id}); err != nil {
		return fmt.Errorf("client: close session %d: %w", s.id, err)
	}
	return nil
}

// Recalls gives back the directory leases release (granted in epoch) and
// waits up to about half a second for recalls of the leases the session
// holds; it returns meta's answer: its epoch, the ids of the leases
// recalled and how long it keeps the leases of a silent holder. It goes
// straight to meta: a long poll would hold back calls queued behind.
func (s *Session) Recalls(ctx context.Context, epoch uint64, release []uint64) (*metapb.RecallsReply, error) {
	r := &metapb.RecallsReply{}
	err := s.c.fo.Invoke(ctx, metapb.Meta_Recalls_FullMethodName,
		&metapb.RecallsRequest{SessionId: s.id, Epoch: epoch, Release: release}, r)
	if status.Code(err) == codes.Unimplemented {
		return nil, fmt.Errorf("client: recalls: %w", ErrNoLeases)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// ErrNoLeases is the error of Recalls to a meta server that grants no
// directory leases (an older one).
var ErrNoLeases = errors.New("the meta server grants no directory leases")
