package proto

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/rdmafs/rdmafs/internal/datakey"
)

// Connection setup. The client connects with ConnectData as the rdma_cm private
// data (52 bytes, within rdma.MaxConnectPrivateData): a timestamp, a random nonce and
// an HMAC-SHA256 of both under the cluster secret — or, for a mount holding a
// mount token, the token's id and an HMAC (cut to 24 bytes) under its data key. chunkd accepts with AcceptData
// (56 bytes): the connection's limits and an HMAC that binds them to the client's
// nonce, so the client knows it reached a chunkd that holds the secret. chunkd
// rejects a bad token with a short text reason as the reject private data.

const (
	connectMagic uint16 = 0xC3D5
	acceptMagic  uint16 = 0xC3D6
	// ConnectDataLen is the size of the connect private data.
	ConnectDataLen = 52
	// AcceptDataLen is the size of the accept private data.
	AcceptDataLen = 56
	macLen        = 32
)

// ErrAuth is returned for private data whose MAC does not verify.
var ErrAuth = errors.New("proto: authentication failed")

// ConnectData is the private data of a connection request.
type ConnectData struct {
	Time  time.Time // when the client made the token
	Nonce [8]byte   // random, unique per connection
	// Token, when set, says the client holds a mount token, not the
	// secret: it authenticates with the token's data key
	// (datakey.ForToken), which the token's id and read-only bit, sent in
	// clear, select. chunkd refuses writes on a read-only token's
	// connection.
	Token *Token
}

// Token is the mount token a connection authenticates with.
type Token struct {
	ID       [8]byte
	ReadOnly bool
}

// Connect flags (byte 3). With flagToken the token id follows the nonce and
// the MAC is cut to tokenMACLen bytes, to fit the 56 bytes of private data.
const (
	flagToken    = 1 << 0
	flagReadOnly = 1 << 1
	tokenMACLen  = 24
)

// Key returns the key the connection is authenticated with: the secret, or
// a token's data key derived from it. chunkd's accept is made with it.
func (c ConnectData) Key(secret []byte) []byte {
	if c.Token == nil {
		return secret
	}
	return datakey.ForToken(secret, c.Token.ID, c.Token.ReadOnly)
}

func mac(secret []byte, label string, parts ...[]byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(label))
	for _, p := range parts {
		h.Write(p)
	}
	return h.Sum(nil)
}

// EncodeConnect returns the connect private data for c under key: the
// cluster secret, or with c.Token the token's data key.
func EncodeConnect(key []byte, c ConnectData) []byte {
	b := make([]byte, ConnectDataLen)
	binary.LittleEndian.PutUint16(b[0:], connectMagic)
	b[2] = Version
	b[3] = 0
	binary.LittleEndian.PutUint64(b[4:], uint64(c.Time.UnixNano()))
	copy(b[12:20], c.Nonce[:])
	if t := c.Token; t != nil {
		b[3] = flagToken
		if t.ReadOnly {
			b[3] |= flagReadOnly
		}
		copy(b[20:28], t.ID[:])
		copy(b[28:], mac(key, "rdmafs chunkd connect\x00", b[:28])[:tokenMACLen])
		return b
	}
	copy(b[20:], mac(key, "rdmafs chunkd connect\x00", b[:20]))
	return b
}

// DecodeConnect checks connect private data against secret and returns it. A token
// older or newer than maxSkew relative to now fails, as does a bad MAC.
func DecodeConnect(secret, b []byte, now time.Time, maxSkew time.Duration) (ConnectData, error) {
	if len(b) < ConnectDataLen {
		return ConnectData{}, fmt.Errorf("%w: %d bytes of private data, want %d", ErrAuth, len(b), ConnectDataLen)
	}
	b = b[:ConnectDataLen] // transports may pad private data
	if binary.LittleEndian.Uint16(b) != connectMagic {
		return ConnectData{}, fmt.Errorf("%w: not a chunk protocol client", ErrAuth)
	}
	if b[2] != Version {
		return ConnectData{}, fmt.Errorf("%w %d", ErrVersion, b[2])
	}
	c := ConnectData{Time: time.Unix(0, int64(binary.LittleEndian.Uint64(b[4:])))}
	switch flags := b[3]; {
	case flags == 0:
		if !hmac.Equal(b[20:], mac(secret, "rdmafs chunkd connect\x00", b[:20])) {
			return ConnectData{}, fmt.Errorf("%w: bad token (wrong cluster secret?)", ErrAuth)
		}
	case flags&^(flagToken|flagReadOnly) == 0 && flags&flagToken != 0:
		t := &Token{ReadOnly: flags&flagReadOnly != 0}
		copy(t.ID[:], b[20:28])
		key := datakey.ForToken(secret, t.ID, t.ReadOnly)
		if !hmac.Equal(b[28:], mac(key, "rdmafs chunkd connect\x00", b[:28])[:tokenMACLen]) {
			return ConnectData{}, fmt.Errorf("%w: bad mount token connection (token of another cluster?)", ErrAuth)
		}
		c.Token = t
	default:
		return ConnectData{}, fmt.Errorf("%w: unknown connect flags %#x", ErrAuth, flags)
	}
	copy(c.Nonce[:], b[12:20])
	if d := now.Sub(c.Time); d > maxSkew || d < -maxSkew {
		return ConnectData{}, fmt.Errorf("%w: token time %v is %v away from ours (clock skew or replay)", ErrAuth, c.Time.UTC(), d)
	}
	return c, nil
}

// AcceptData is what chunkd tells a client it accepted.
type AcceptData struct {
	Credits   int           // request messages the client may have outstanding
	MaxBatch  int           // requests per message
	MaxMsg    int           // bytes per message (requests and replies)
	MaxLength int           // largest chunk version length
	LeaseTTL  time.Duration // default lease time
	// Slab is the size of the staging slab the connection may ask for
	// (OpSlab); 0: chunkd has none (it predates slabs, or is configured
	// without), and patches go through OpPreparePatch.
	Slab int
}

// EncodeAccept returns the accept private data for a, bound to the client's
// connect data.
func EncodeAccept(secret []byte, connect []byte, a AcceptData) []byte {
	b := make([]byte, AcceptDataLen)
	binary.LittleEndian.PutUint16(b[0:], acceptMagic)
	b[2] = Version
	b[3] = 0
	binary.LittleEndian.PutUint16(b[4:], uint16(a.Credits))
	binary.LittleEndian.PutUint16(b[6:], uint16(a.MaxBatch))
	binary.LittleEndian.PutUint32(b[8:], uint32(a.MaxMsg))
	binary.LittleEndian.PutUint32(b[12:], uint32(a.MaxLength))
	binary.LittleEndian.PutUint32(b[16:], uint32(a.LeaseTTL/time.Millisecond))
	binary.LittleEndian.PutUint32(b[20:], uint32(a.Slab))
	copy(b[24:], mac(secret, "rdmafs chunkd accept\x00", connect, b[:24]))
	return b
}

// DecodeAccept checks accept private data against secret and the connect data the
// client sent.
func DecodeAccept(secret, connect, b []byte) (AcceptData, error) {
	if len(b) < AcceptDataLen {
		return AcceptData{}, fmt.Errorf("%w: %d bytes of accept data, want %d", ErrAuth, len(b), AcceptDataLen)
	}
	b = b[:AcceptDataLen]
	if binary.LittleEndian.Uint16(b) != acceptMagic {
		return AcceptData{}, fmt.Errorf("%w: peer is not a chunkd", ErrAuth)
	}
	if b[2] != Version {
		return AcceptData{}, fmt.Errorf("%w %d", ErrVersion, b[2])
	}
	if !hmac.Equal(b[24:], mac(secret, "rdmafs chunkd accept\x00", connect, b[:24])) {
		return AcceptData{}, fmt.Errorf("%w: chunkd's answer does not verify (wrong cluster secret?)", ErrAuth)
	}
	a := AcceptData{
		Credits:   int(binary.LittleEndian.Uint16(b[4:])),
		MaxBatch:  int(binary.LittleEndian.Uint16(b[6:])),
		MaxMsg:    int(binary.LittleEndian.Uint32(b[8:])),
		MaxLength: int(binary.LittleEndian.Uint32(b[12:])),
		LeaseTTL:  time.Duration(binary.LittleEndian.Uint32(b[16:])) * time.Millisecond,
		Slab:      int(binary.LittleEndian.Uint32(b[20:])),
	}
	if a.Credits < 1 || a.MaxBatch < 1 || a.MaxMsg < RequestsSize(1) || a.MaxMsg < HeaderLen+ReplyLen {
		return AcceptData{}, fmt.Errorf("proto: accept data with unusable limits %+v", a)
	}
	if a.Slab%SlabAlign != 0 || a.Slab > MaxSlab {
		a.Slab = 0 // a slab this client cannot address: patches are staged
	}
	return a, nil
}
