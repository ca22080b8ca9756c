# rdmafs build, test, demo and benchmark entry points.
GO      ?= go
BIN     ?= bin
PKGS    ?= ./...
FUZZTIME ?= 20s
CLUSTER ?= /tmp/rdmafs-cluster

.PHONY: all build install deps vet test soak fuzz demo cluster-up cluster-down bench bench-rdma bench-meta bench-fs clean

all: build

# The commit --version reports, when the toolchain does not stamp it.
VERSION_LDFLAGS = -X github.com/rdmafs/rdmafs/internal/buildinfo.commit=$(shell git rev-parse HEAD 2>/dev/null) \
	-X github.com/rdmafs/rdmafs/internal/buildinfo.commitTime=$(shell git log -1 --format=%cI 2>/dev/null)

## build: compile rdmafs and chunkd into ./bin
build:
	$(GO) build -ldflags "$(VERSION_LDFLAGS)" -o $(BIN)/ ./cmd/...

## install: rdmafs and chunkd into $(PREFIX)/bin, the mount(8) helper
## /sbin/mount.rdmafs (mount -t rdmafs, fstab lines of type rdmafs), the
## systemd units of deploy/systemd and the docs
PREFIX  ?= /usr/local
SBINDIR ?= /sbin
UNITDIR ?= /etc/systemd/system
install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(SBINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(PREFIX)/share/doc/rdmafs
	install -m 0755 $(BIN)/rdmafs $(BIN)/chunkd $(DESTDIR)$(PREFIX)/bin/
	ln -sf $(PREFIX)/bin/rdmafs $(DESTDIR)$(SBINDIR)/mount.rdmafs
	install -m 0644 deploy/systemd/*.service $(DESTDIR)$(UNITDIR)/
	install -m 0644 docs/*.md $(DESTDIR)$(PREFIX)/share/doc/rdmafs/

## deps: install the Debian packages the tests, demo and benchmarks need (as root)
deps:
	./scripts/install-deps.sh

## vet: static checks, including the cgo verbs transport, and staticcheck
## (a tool dependency in go.mod: go tool staticcheck)
vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags verbs ./rdma/...
	$(GO) tool staticcheck $(PKGS)

## test: the whole suite with the race detector (the README's test command):
## the packages in parallel, then the cluster suites under tests/ one package
## at a time (their stall bounds assume no other cluster suite shares the CPUs)
test: deps vet
	$(GO) test -race -count=1 -timeout 30m $$($(GO) list $(PKGS) | grep -v '/tests/')
	$(GO) test -race -count=1 -timeout 30m -p 1 ./tests/...
	$(GO) test -count=1 -run 'Alloc' $(PKGS)
	$(GO) test -tags verbs -count=1 ./rdma/verbs

## soak: 200 random kill -9 cycles of meta, a chunkd and the mount under a
## write+fsync+verify load (tests/fault TestSoak; SOAK_CYCLES to change), and
## a million fsx-style operations
SOAK_CYCLES ?= 200
soak: deps
	RDMAFS_SOAK=1 RDMAFS_SOAK_CYCLES=$(SOAK_CYCLES) $(GO) test -count=1 -timeout 180m -run 'TestSoak$$' -v ./tests/fault/
	RDMAFS_POSIXCHECK_OPS=1000000 $(GO) test -count=1 -timeout 180m -v ./tests/posixcheck/

## fuzz: run every fuzz target for FUZZTIME each
fuzz:
	./scripts/fuzz-all.sh $(FUZZTIME)

## demo: local cluster (meta + 6 chunkd, EC 4+2), mount, fio job set, tear down
demo:
	./scripts/demo.sh

## cluster-up / cluster-down: a local cluster left mounted at $(CLUSTER)/mnt
cluster-up: deps build
	$(BIN)/rdmafs dev up $(CLUSTER)

cluster-down:
	$(BIN)/rdmafs dev down $(CLUSTER)

## bench: transport, metadata and file system benchmarks, each against a
## baseline measured in the same run
bench: deps build bench-rdma bench-meta bench-fs

bench-rdma:
	$(BIN)/rdmafs bench rdma --loopback --baseline tcp --sizes 4K,64K,1M,8M
	$(BIN)/rdmafs bench rdma --loopback --transport shm --baseline memcpy --sizes 4K,64K,1M,8M --depth 1

bench-meta:
	$(BIN)/rdmafs bench meta

bench-fs:
	$(BIN)/rdmafs bench fs --transport tcp
	$(BIN)/rdmafs bench fs --transport tcp --data disk --rounds 1

clean:
	rm -rf $(BIN)
