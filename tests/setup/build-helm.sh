#!/usr/bin/env bash
# Builds the real helm CLI (a Go module) into build/helm/helm, for the chart tests (`helm lint`,
# `helm template`). Idempotent: nothing to do when build/helm/helm already runs. Needs Go >= 1.24 and
# the Go module proxy; without Go it says so and returns, and the chart tests skip (fail under CI=true).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
version=${HELM_VERSION:-v3.22.0}
out="$root/build/helm"

if [ -x "$out/helm" ] && "$out/helm" version --short 2>/dev/null | grep -q "^${version}"; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "build-helm: no go toolchain; chart tests that need helm will skip" >&2
  exit 0
fi
mkdir -p "$out"
echo "build-helm: building helm $version into $out (first time only)"
# `go install pkg@version` builds the exact release from the module proxy without a go.mod of ours.
# helm reports its version from ldflags; without them `helm version` says only the minor version.
GOBIN="$out" CGO_ENABLED=0 go install -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${version}" \
  "helm.sh/helm/v3/cmd/helm@${version}"
"$out/helm" version --short
