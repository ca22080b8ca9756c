package metapb

import (
	"google.golang.org/protobuf/proto"
	protoreflect "google.golang.org/protobuf/reflect/protoreflect"
)

// SameShards reports whether two shard lists name the same chunks on the same
// chunkservers, in the same order (addresses aside).
func SameShards(a, b []*Shard) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].GetChunkId() != b[i].GetChunkId() || a[i].GetServerId() != b[i].GetServerId() {
			return false
		}
	}
	return true
}

// EachShard calls fn with every Shard in m, at any depth (the shards of a
// reply's stripes, whatever the reply).
func EachShard(m proto.Message, fn func(*Shard)) {
	Walk(m.ProtoReflect(), func(m protoreflect.Message) bool {
		if sh, ok := m.Interface().(*Shard); ok {
			fn(sh)
			return false
		}
		return true
	})
}

// Walk calls fn with m and, depth first, every message set in its fields and
// lists (not maps), descending into a message only when fn returns true.
func Walk(m protoreflect.Message, fn func(protoreflect.Message) bool) {
	if !fn(m) {
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Kind() != protoreflect.MessageKind || fd.IsMap():
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				Walk(l.Get(i).Message(), fn)
			}
		default:
			Walk(v.Message(), fn)
		}
		return true
	})
}
