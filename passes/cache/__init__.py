"""What one process leaves the next: plans, measured op costs and whole compiled programs, on disk."""
