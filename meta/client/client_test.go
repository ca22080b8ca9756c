package client

import (
	"reflect"
	"testing"
)

func TestSplitAddrs(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{"127.0.0.1:7400", []string{"127.0.0.1:7400"}, false},
		{"a:1, b:2,,c:3", []string{"a:1", "b:2", "c:3"}, false},
		{"[::1]:7400", []string{"[::1]:7400"}, false},
		{"", nil, true},
		{" , ", nil, true},
		{"a:1,nohostport", nil, true},
	}
	for _, tt := range tests {
		got, err := SplitAddrs(tt.in)
		if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("SplitAddrs(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
	if _, err := Dial("a:1", ""); err == nil {
		t.Error("Dial without a secret succeeded")
	}
}

func TestReadOnlyMethods(t *testing.T) {
	for _, m := range []string{"Lookup", "GetAttr", "KeepAlive", "Heartbeat"} {
		if !readOnly(m) {
			t.Errorf("%s should go without a request id", m)
		}
	}
	for _, m := range []string{"Create", "Unlink", "Rename", "Release", "CloseSession", "SetXattr"} {
		if readOnly(m) {
			t.Errorf("%s must carry a request id", m)
		}
	}
}
