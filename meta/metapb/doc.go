// Package metapb holds the protocol buffer messages and the gRPC service of the
// rdmafs metadata service, generated from meta.proto with protoc-gen-go and
// protoc-gen-go-grpc (run `go generate` in this directory after changing it).
package metapb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative meta.proto
