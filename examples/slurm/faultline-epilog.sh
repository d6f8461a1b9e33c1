#!/bin/bash
# EpilogSlurmctld for jobs watched by Faultline (slurm.conf: EpilogSlurmctld=/etc/slurm/faultline-epilog.sh).
#
# Runs on the controller when a job ends, however it ended. If the job's sidecar died with it
# (time limit, scancel, the batch host lost), this sends what is left of the log and reports
# the exit status; the service resumes each file where it stopped (it knows the offsets), so
# nothing is sent twice. If the sidecar already reported the end, there is no open job with
# this key and nothing happens. Never fails: an epilog error would hold the job.
LOG_DIR=/shared/train-logs/$SLURM_JOB_ID
[ -f "$LOG_DIR/launcher.log" ] || exit 0      # not a Faultline job

# SLURM_JOB_EXIT_CODE2 is "exit:signal"; report it as a shell would (128 + signal)
IFS=: read -r code sig <<< "${SLURM_JOB_EXIT_CODE2:-0:0}"
if [ "${sig:-0}" -ne 0 ]; then status=$((128 + sig)); else status=${code:-0}; fi

export FAULTLINE_DATA_DIR=/var/spool/faultline
timeout 150 /opt/faultline/bin/faultline tail --once --exit-code "$status" \
    --server "${FAULTLINE_SERVER_URL:-http://faultline.internal:8080}" \
    --job-name "$SLURM_JOB_NAME" --job-key "slurm-$SLURM_JOB_ID" --framework megatron \
    --state-dir "$FAULTLINE_DATA_DIR/epilog-$SLURM_JOB_ID" --drain-timeout 120 --quiet \
    "$LOG_DIR/launcher.log" || true
rm -rf "$FAULTLINE_DATA_DIR/epilog-$SLURM_JOB_ID"
exit 0
