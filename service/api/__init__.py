"""HTTP routes of the job API: /diagnose, /jobs, /healthz, /metrics."""
