#!/bin/sh
# Slurm Epilog: remove this job from the GPU job-mapping files the prolog wrote (see prolog.sh).
# A file left with no job is removed, so an idle GPU has no job.id. Never fails (a failing epilog
# drains the node).

dir="${OTEL_OFU_SLURM_MAPPING_DIR:-/run/otel-ofu/job-mapping}"
job="${SLURM_JOB_ID:-}"
gpus="${SLURM_JOB_GPUS:-${SLURM_STEP_GPUS:-}}"

[ -n "$job" ] && [ -d "$dir" ] || exit 0
# Without the GPU list (older Slurm), look through every file.
if [ -n "$gpus" ]; then
    files=$(printf '%s' "$gpus" | tr ',' ' ')
else
    files=$(ls "$dir" 2>/dev/null)
fi

for index in $files; do
    case "$index" in
        *[!0-9.]*|'') continue ;;
    esac
    file="$dir/$index"
    [ -f "$file" ] || continue
    (
        flock -w 5 9 || exit 0
        grep -vx "$job" "$file" >"$file.tmp" 2>/dev/null
        if [ -s "$file.tmp" ]; then
            mv "$file.tmp" "$file"
        else
            rm -f "$file" "$file.tmp"
        fi
    ) 9>"$dir/.lock"
done
exit 0
