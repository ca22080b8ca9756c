#!/usr/bin/env bash
# Installs the Debian packages rdmafs' tests, demo and benchmarks need, when run as
# root on a machine that lacks them. Idempotent and quiet when all is present.
set -euo pipefail
pkgs=(fio fuse3 libibverbs-dev librdmacm-dev etcd-server sqlite3 iproute2 nftables util-linux mount systemd chromium)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: missing packages: ${missing[*]} (run as root, or install them)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
