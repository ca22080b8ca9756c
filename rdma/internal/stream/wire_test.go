package stream

import (
	"bytes"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	cases := []header{
		{op: opSend, length: 4096, psn: 1},
		{op: opWriteImm, length: maxMessage, psn: ^uint32(0), rkey: 0xdeadbeef, raddr: ^uint64(0), imm: 42},
		{op: opReadReq, length: 1 << 20, rkey: 7, raddr: 0x7f0000001000},
		{op: opNak, status: 10, psn: 9},
		{op: opAck, psn: 3},
		{op: opDisconnect},
	}
	for _, h := range cases {
		var b [headerSize]byte
		h.encode(b[:])
		var got header
		if err := got.decode(b[:]); err != nil {
			t.Fatalf("decode %+v: %v", h, err)
		}
		if got != h {
			t.Fatalf("round trip %+v -> %+v", h, got)
		}
	}
}

func TestHeaderRejects(t *testing.T) {
	valid := func() []byte {
		var b [headerSize]byte
		(&header{op: opWrite, length: 10}).encode(b[:])
		return b[:]
	}
	cases := []struct {
		name string
		mut  func(b []byte) []byte
	}{
		{"short", func(b []byte) []byte { return b[:headerSize-1] }},
		{"op zero", func(b []byte) []byte { b[0] = 0; return b }},
		{"op unknown", func(b []byte) []byte { b[0] = opMax + 1; return b }},
		{"reserved", func(b []byte) []byte { b[2] = 1; return b }},
		{"reserved tail", func(b []byte) []byte { b[31] = 1; return b }},
		{"length over max", func(b []byte) []byte { b[7] = 0x80; b[4] = 1; return b }},
		{"status on write", func(b []byte) []byte { b[1] = 10; return b }},
		{"nak without status", func(b []byte) []byte { b[0] = opNak; b[4] = 0; return b }},
		{"ack with length", func(b []byte) []byte { b[0] = opAck; return b }},
	}
	for _, c := range cases {
		var h header
		if err := h.decode(c.mut(valid())); err == nil {
			t.Errorf("%s: decoded without error: %+v", c.name, h)
		}
	}
}

func TestHandshakeRoundTrip(t *testing.T) {
	m := handshake{kind: kindHello, qpn: 5, rnrTimeoutMS: 1000, private: []byte("token")}
	got, err := decodeHandshake(m.encode())
	if err != nil {
		t.Fatal(err)
	}
	if got.kind != m.kind || got.qpn != m.qpn || got.rnrTimeoutMS != m.rnrTimeoutMS || !bytes.Equal(got.private, m.private) {
		t.Fatalf("round trip %+v -> %+v", m, got)
	}
	for _, bad := range [][]byte{nil, []byte("RDTP"), append([]byte("XXXX"), m.encode()[4:]...)} {
		if _, err := decodeHandshake(bad); err == nil {
			t.Errorf("decoded %q", bad)
		}
	}
}

// FuzzHeader checks that any 32 bytes either fail to decode or decode to a header
// that re-encodes to the same bytes, and that decoding never panics.
func FuzzHeader(f *testing.F) {
	for _, h := range []header{{op: opSend, length: 1}, {op: opNak, status: 10}, {op: opReadReq, length: 4096, rkey: 1, raddr: 1 << 40}} {
		var b [headerSize]byte
		h.encode(b[:])
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h header
		if err := h.decode(b); err != nil {
			return
		}
		var out [headerSize]byte
		h.encode(out[:])
		if !bytes.Equal(out[:], b[:headerSize]) {
			t.Fatalf("decode/encode changed %x into %x", b[:headerSize], out)
		}
	})
}

// FuzzHandshake checks the connection handshake decoder.
func FuzzHandshake(f *testing.F) {
	f.Add((&handshake{kind: kindHello, qpn: 1, private: []byte("x")}).encode())
	f.Add((&handshake{kind: kindReject, private: make([]byte, maxPrivateData)}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeHandshake(b)
		if err != nil {
			return
		}
		if len(m.private) > maxPrivateData || !bytes.Equal(m.encode(), b) {
			t.Fatalf("accepted %x as %+v", b, m)
		}
	})
}
