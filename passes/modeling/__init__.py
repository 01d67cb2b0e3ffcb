"""The torch-free Problem built from a profiled joint graph: its steps, Inductor's fusion, policies, liveness."""
