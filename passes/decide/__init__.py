"""The decision for one graph: the partitioner hook, one compile attempt, the plan record, the request."""
