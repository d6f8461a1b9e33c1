"""Live jobs: runs kept between appends, the exactly-once ledger of appended chunks, and
notifications (webhooks) of failures, stalls and spikes."""
