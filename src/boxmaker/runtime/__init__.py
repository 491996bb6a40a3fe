"""What the daemons run on: their command lines' shared parts (the log, exit codes, a
clean stop), their Unix listeners, the one NDJSON frame reader, a value handed from one
task to another, and the seam for blocking work in a worker thread."""
