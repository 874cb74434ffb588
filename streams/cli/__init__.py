"""`reflect`, the command line (`main`, also `python -m streams.cli`), and what
only its commands use: `reflect up` (`stack`), `reflect demo` with its sample
history and scoring, `reflect dlq`, and the reads against a running API."""
