"""The wire protocol between the sidecar and the service, in one place for both sides."""

READ_AGE_HEADER = "X-Faultline-Read-Age"
"""Seconds between the sidecar reading a batch and sending it: the service measures
write-to-visible latency from the read, not from the request."""
