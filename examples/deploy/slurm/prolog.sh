#!/bin/sh
# Slurm Prolog: record which job holds which GPU, for otel-ofu (and dcgm-exporter --hpc-job-mapping-dir).
#
# slurm.conf:  Prolog=/etc/slurm/prolog.d/otel-ofu-prolog.sh
#              Epilog=/etc/slurm/epilog.d/otel-ofu-epilog.sh
# Writes one file per GPU index in OTEL_OFU_SLURM_MAPPING_DIR, one job id per line; the job id is
# appended, so the last line is the most recently started job (what otel-ofu attributes the GPU to).
# A prolog that fails drains the node, so this script never fails: a missing mapping only costs the
# job its attribution.

dir="${OTEL_OFU_SLURM_MAPPING_DIR:-/run/otel-ofu/job-mapping}"
job="${SLURM_JOB_ID:-}"
gpus="${SLURM_JOB_GPUS:-${SLURM_STEP_GPUS:-}}"

[ -n "$job" ] && [ -n "$gpus" ] || exit 0
mkdir -p "$dir" 2>/dev/null || exit 0
chmod 0755 "$dir" 2>/dev/null

for index in $(printf '%s' "$gpus" | tr ',' ' '); do
    case "$index" in
        *[!0-9.]*|'') continue ;;  # indices only (MIG instances as GPU.INSTANCE)
    esac
    (
        flock -w 5 9 || exit 0
        grep -qx "$job" "$dir/$index" 2>/dev/null || printf '%s\n' "$job" >>"$dir/$index"
    ) 9>"$dir/.lock"
done
exit 0
