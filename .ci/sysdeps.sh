#!/usr/bin/env bash
# Installs the system tools the test suite uses (rsync, nft, ip, tmux, ssh-keygen, sshd, systemd-analyze,
# prometheus, promtool, chromium and chromedriver for the dashboard's browser tests), when run as root
# and missing.
set -euo pipefail
declare -A pkg_for=([rsync]=rsync [nft]=nftables [ip]=iproute2 [tmux]=tmux [ssh-keygen]=openssh-client
    [systemd-analyze]=systemd [sshd]=openssh-server [prometheus]=prometheus [promtool]=prometheus
    [chromium]=chromium [chromedriver]=chromium-driver)
missing=()
for cmd in "${!pkg_for[@]}"; do
    if ! command -v "$cmd" >/dev/null 2>&1 && [[ " ${missing[*]} " != *" ${pkg_for[$cmd]} "* ]]; then
        missing+=("${pkg_for[$cmd]}")
    fi
done
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "sysdeps: missing ${missing[*]}; not root, so the tests that need them will skip" >&2
    exit 0
fi
echo "sysdeps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
