"""The tailing client (`faultline tail`): follows files, sends whole lines, checkpoints what
the service acknowledged. Imports nothing of the server but the wire protocol."""
