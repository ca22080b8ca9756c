package reqid

import (
	"context"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    ID
		wantErr bool
	}{
		{"00000000000000ff-7-1740000000123", ID{Client: 255, Seq: 7, Millis: 1740000000123}, false},
		{"ffffffffffffffff-18446744073709551615-18446744073709551615", ID{Client: ^uint64(0), Seq: ^uint64(0), Millis: ^uint64(0)}, false},
		{"00000000000000ff-7-0", ID{Client: 255, Seq: 7}, false},
		{"ff-7-1", ID{}, true},
		{"00000000000000ff-7", ID{}, true},
		{"00000000000000ff", ID{}, true},
		{"00000000000000fg-1-1", ID{}, true},
		{"00000000000000ff--1-1", ID{}, true},
		{"00000000000000ff-1-x", ID{}, true},
		{"00000000000000ff-1-1-1", ID{}, true},
		{"", ID{}, true},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("Parse(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	for _, id := range []ID{{Client: 1, Seq: 2, Millis: 1740000000005}, {Client: 3, Seq: 4, Millis: 1740000000006, Retry: true}} {
		got, ok, err := FromIncoming(NewIncoming(context.Background(), id))
		if err != nil || !ok || got != id {
			t.Errorf("round trip of %v: %v %v %v", id, got, ok, err)
		}
	}
	if _, ok, err := FromIncoming(context.Background()); ok || err != nil {
		t.Errorf("no metadata: %v %v", ok, err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("00000000000000ff-7-1740000000123")
	f.Add("x-1")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := Parse(s)
		if err != nil {
			return
		}
		back, err := Parse(id.String())
		if err != nil || back != id {
			t.Fatalf("%q parsed to %v which does not round-trip: %v %v", s, id, back, err)
		}
	})
}
