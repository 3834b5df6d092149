"""`bench`: forward latency per profile (in one process, alternating) and closed-loop HTTP load."""
