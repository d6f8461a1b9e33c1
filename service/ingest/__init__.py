"""Ingest: bytes from a file, an upload or a live append become whole-line buffers (one
function for all three, with the binary, encoding and length checks)."""
