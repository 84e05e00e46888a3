#!/usr/bin/env bash
# Installs the Debian packages moeserve builds and tests with. Safe to run again.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config ccache python3 python3-pip
      libgtest-dev libgmock-dev libbenchmark-dev
      nlohmann-json3-dev libfmt-dev libcli11-dev libpcre2-dev libxxhash-dev libcpp-httplib-dev
      libdnnl-dev  # oneDNN, the baseline in moeserve-bench only
      libucx-dev  # UCX: KV transfer between units (src/transfer)
      libopenmpi-dev openmpi-bin  # Open MPI: expert parallelism across processes (src/ep)
      chromium chromium-driver fonts-liberation)  # headless Chromium: tests/cli/web_page.sh
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
# The official OpenAI Python client, for tests/cli/server_openai.sh. pip may refuse a system
# Python (PEP 668) or lack write access: try the usual ways in turn.
if ! python3 -c "import openai" 2>/dev/null; then
  python3 -m pip install --quiet openai 2>/dev/null ||
    python3 -m pip install --quiet --user openai 2>/dev/null ||
    python3 -m pip install --quiet --user --break-system-packages openai 2>/dev/null ||
    echo "install-deps: could not pip install openai (tests/cli/server_openai.sh needs it)" >&2
fi
# jsonschema validates the replies of tests/cli/structured_outputs.sh against their schemas;
# jinja2 renders the chat templates in tests/cli/chat_templates.sh; gguf (llama.cpp's own
# reader and writer) and ml_dtypes (an FP8 decoder) are tools/export_gguf.py and its test;
# anthropic, the official Anthropic client, drives /v1/messages in tests/cli/agent_apis.sh.
for mod in jsonschema jinja2 gguf ml_dtypes anthropic; do
  if ! python3 -c "import $mod" 2>/dev/null; then
    python3 -m pip install --quiet "$mod" 2>/dev/null ||
      python3 -m pip install --quiet --user "$mod" 2>/dev/null ||
      python3 -m pip install --quiet --user --break-system-packages "$mod" 2>/dev/null ||
      echo "install-deps: could not pip install $mod (tests/cli/ needs it)" >&2
  fi
done
# selenium drives Chromium through Debian's chromedriver in tests/cli/web_page.sh.
if ! python3 -c "import selenium" 2>/dev/null; then
  python3 -m pip install --quiet selenium 2>/dev/null ||
    python3 -m pip install --quiet --user selenium 2>/dev/null ||
    python3 -m pip install --quiet --user --break-system-packages selenium 2>/dev/null ||
    echo "install-deps: could not pip install selenium (tests/cli/web_page.sh needs it)" >&2
fi
