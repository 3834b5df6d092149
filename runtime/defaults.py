"""Defaults used in more than one place (the API, the server's flags, the scheduler), defined once."""

DEFAULT_BATCH_TOKENS = 65_536  # padded tokens per cross-request pass (profile batching)
# requests one batching run merges: on CPU, 32 merged ran ~20% slower than runs of 8 (the most 8 request threads let queue)
DEFAULT_BATCH_REQUESTS = 8
# shared_context: (questions - 1) x prefix tokens saved below which a request runs the plain rows: the second
# pass, the cache copy per row and the concatenated attention cost about this much (measured on d3-lite-class, CPU).
DEFAULT_MIN_SAVED_TOKENS = 64
