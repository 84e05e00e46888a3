#!/usr/bin/env bash
# Installs the Debian packages moeserve builds and tests with. Safe to run again.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config ccache python3
      libgtest-dev libgmock-dev libbenchmark-dev
      nlohmann-json3-dev libfmt-dev libcli11-dev libpcre2-dev libxxhash-dev libcpp-httplib-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
