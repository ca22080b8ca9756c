# rdmafs build, test and benchmark entry points.
GO      ?= go
BIN     ?= bin
PKGS    ?= ./...
FUZZTIME ?= 20s

.PHONY: all build test test-unit vet fuzz bench bench-rdma deps clean

all: build

## build: compile rdmafs and chunkd into ./bin
build:
	$(GO) build -o $(BIN)/ ./cmd/...

## deps: install the system packages the tests and the demo need (Debian, as root)
deps:
	./scripts/install-deps.sh

## vet: static checks
vet:
	$(GO) vet $(PKGS)

## test: the whole suite with the race detector (the README's test command)
test: deps vet
	$(GO) test -race -count=1 -timeout 30m $(PKGS)
	$(GO) vet -tags verbs ./rdma/...
	$(GO) test -tags verbs -count=1 ./rdma/verbs

## fuzz: run every fuzz target for FUZZTIME each
fuzz:
	./scripts/fuzz-all.sh $(FUZZTIME)

## bench: transport benchmark (rdma verbs over tcp vs plain TCP, same run)
bench: build bench-rdma

bench-rdma:
	$(BIN)/rdmafs bench rdma --loopback --baseline tcp

clean:
	rm -rf $(BIN)
