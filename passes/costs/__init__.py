"""What each op costs: the profile pass (bytes, FLOPs, seconds, scratch) and how one op is timed."""
