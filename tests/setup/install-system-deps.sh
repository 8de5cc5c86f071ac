#!/usr/bin/env bash
# Installs the system packages and npm clients that end-to-end tests need. Idempotent.
# Without root or apt-get (a developer laptop, say) it says so and returns: those tests then skip
# with a reason locally, and fail under CI=true.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-deps: not root or no apt-get; end-to-end tests that need system packages will skip" >&2
  exit 0
fi

need=()
for pkg in $(grep -v '^#' "$here/debian-packages.txt"); do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "install-system-deps: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ -f "$here/node/package.json" ] && command -v npm >/dev/null 2>&1; then
  if [ ! -d "$here/node/node_modules" ] || [ "$here/node/package.json" -nt "$here/node/node_modules" ]; then
    (cd "$here/node" && npm install --no-audit --no-fund --silent && touch node_modules)
  fi
fi
