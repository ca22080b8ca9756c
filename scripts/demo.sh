#!/usr/bin/env bash
# make demo: bring up a local rdmafs (a meta server and six chunkd processes on
# 127.0.0.1, EC 4+2, data under one directory), mount it, run the fio job set
# (sequential 1 MiB write with crc32c verify, cold sequential read, 4 KiB random
# reads), print the results and tear everything down. Needs root (FUSE mount).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
go build -o bin/ ./cmd/...
dir=$(mktemp -d /tmp/rdmafs-demo.XXXXXX)
cleanup() {
	bin/rdmafs dev down "$dir" >/dev/null 2>&1 || true
	rm -rf "$dir"
}
trap cleanup EXIT
bin/rdmafs dev up "$dir"
echo
echo "== fio job set on $dir/mnt (bench/jobs.fio)"
DIR="$dir/mnt" SIZE="${SIZE:-512M}" RUNTIME="${RUNTIME:-10}" fio bench/jobs.fio |
	grep -E '^[a-z0-9-]+: \(groupid|^ +(read|write): |err=|verify' || true
echo
bin/rdmafs status "$(jq -r .meta_addr "$dir/cluster.json" 2>/dev/null || grep -o '"meta_addr": *"[^"]*"' "$dir/cluster.json" | cut -d'"' -f4)" \
	--secret-file "$dir/meta/secret" --tls-ca "$dir/tls/ca.pem" --tls-cert "$dir/tls/client.pem" --tls-key "$dir/tls/client-key.pem" || true
echo
echo "== at rest: files and directories in $dir open to group or others (public certificates aside)"
find "$dir" -path "$dir/mnt" -prune -o -perm /077 ! -name '*.pem' -printf '%m %p\n' | head -20
echo "$(find "$dir" -path "$dir/mnt" -prune -o -type f ! -perm /077 -print | wc -l) files private (mode 0600 or 0400)"
find "$dir" -path "$dir/mnt" -prune -o -printf '%m\n' | sort | uniq -c | awk '{printf "   %5d entries of mode %04d\n", $1, $2}'
