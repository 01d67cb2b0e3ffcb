"""What a step holds outside one graph: the eager code between forward and backward, the rank's state, agreement."""
