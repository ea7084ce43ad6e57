"""The batch tier's storage and queue: files, batches, their lines and results, and the Valkey
stream the workers drain.

- `files.FileStore`: uploaded and produced files, written in parts as they arrive (never whole in
  memory), in the ledger's database or a directory (`batch.files_dir`).
- `lines`: an input file checked as OpenAI checks it, streamed, giving each line's place in the file.
- `jobs.BatchStore`: batches, their lines (where each is in the file) and results (one per line,
  written once: the key is the batch and the line), and the status sequence.
- `queue.LineQueue`: the work on a Valkey stream with a consumer group; what a dead worker held is
  claimed again (XAUTOCLAIM).
- `wire`: OpenAI's file and batch objects and the output files' lines.

What runs a line (routing, budgets, metering, through the gateway) is `switchyard.batch.runner`.
"""
