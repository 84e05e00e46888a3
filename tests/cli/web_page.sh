#!/usr/bin/env bash
# The chat page at / (docs/server.md "The web page"): served self-contained (its CSP allows
# nothing from elsewhere), and driven in headless Chromium against `serve` on the embedded
# model (tests/web/chat_page_test.py: streaming, the usage line, a second turn, Stop). Skipped
# (77) where Chromium or selenium is missing; scripts/install-deps.sh installs both.
set -euo pipefail
bin=$(realpath "$1")
model=build/models/tiny-py
. tests/serve_lib.sh
port=$(free_port)
"$bin" serve --model "$model" --host 127.0.0.1 --port "$port" --kv-cache-gb 0.25 \
  --api-key page-key > "$dir/serve.log" 2>&1 &
pid=$!
wait_health "$port"
# The page needs no key (the API does) and says where it may load from: only here.
curl -sf -D "$dir/headers" "http://127.0.0.1:$port/" > "$dir/page.html" || fail "GET /"
grep -qi '^content-type: text/html; charset=utf-8' "$dir/headers" || fail "content type"
grep -qi "^content-security-policy: default-src 'none'" "$dir/headers" || fail "no CSP"
grep -q '<title>moeserve</title>' "$dir/page.html" || fail "not the page"
if grep -Eq '(src|href)="(https?:)?//' "$dir/page.html"; then fail "the page loads something from elsewhere"; fi
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/models")
[ "$code" = 401 ] || fail "the API without the key: $code"

if ! command -v chromedriver > /dev/null || ! python3 -c "import selenium" 2>/dev/null; then
  echo "SKIP: chromium-driver or selenium missing"
  exit 77
fi
python3 tests/web/chat_page_test.py "http://127.0.0.1:$port/" --api-key page-key \
  ${MOESERVE_SCREENSHOT:+--screenshot "$MOESERVE_SCREENSHOT"} || fail "the page in Chromium"
echo PASS
