#!/usr/bin/env bash
# Builds otel-ofu's OpenTelemetry Collector distribution and telemetrygen from pinned upstream Go modules:
#   build/otelcol/otelcol-ofu    (the OpenTelemetry Collector Builder, from builder/manifest.yaml)
#   build/otelcol/telemetrygen   (the Collector project's load generator, same release line)
# Skips the work when both binaries exist and were built from the current manifest and this script
# (a stamp holds their hash); `--force` rebuilds. Uses the default Go module and build caches, so a
# warm rebuild takes seconds and a cold one downloads and compiles everything (see README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."

# One release line for every collector module: the builder and telemetrygen match the manifest.
OTELCOL_VERSION=v0.161.0
MANIFEST=collector/otelcol/builder/manifest.yaml
OUT=build/otelcol
STAMP=$OUT/.stamp

command -v go >/dev/null || { echo "otelcol: Go is required to build the Collector (go not found in PATH)" >&2; exit 1; }

want=$(cat "$MANIFEST" "$0" | sha256sum | cut -d' ' -f1)
if [[ "${1:-}" != "--force" && -x $OUT/otelcol-ofu && -x $OUT/telemetrygen && -f $STAMP && "$(cat "$STAMP")" == "$want" ]]; then
    echo "otelcol: $OUT/otelcol-ofu and $OUT/telemetrygen are up to date"
    exit 0
fi

mkdir -p "$OUT/tools"
start=$(date +%s)
# The builder and telemetrygen as `go install` builds them (-trimpath, stripped), into build/ only.
GOBIN="$PWD/$OUT/tools" go install -trimpath -ldflags='-s -w' \
    "go.opentelemetry.io/collector/cmd/builder@$OTELCOL_VERSION"
GOBIN="$PWD/$OUT/tools" go install -trimpath -ldflags='-s -w' \
    "github.com/open-telemetry/opentelemetry-collector-contrib/cmd/telemetrygen@$OTELCOL_VERSION"
# Each binary replaced by a rename: one that a running Collector or test holds open is not "Text file busy".
install_binary() { cp "$1" "$2.new" && mv -f "$2.new" "$2"; }
install_binary "$OUT/tools/telemetrygen" "$OUT/telemetrygen"
# The builder compiles with -trimpath and -ldflags='-s -w' by default (smaller binary, less to link).
"$OUT/tools/builder" --config "$MANIFEST"
install_binary "$OUT/src/otelcol-ofu" "$OUT/otelcol-ofu"
echo "$want" > "$STAMP"
echo "otelcol: built $OUT/otelcol-ofu and $OUT/telemetrygen in $(( $(date +%s) - start ))s"
