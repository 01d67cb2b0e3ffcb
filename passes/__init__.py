"""FX passes (``remat.passes``), a subpackage per stage: capture (what the graph is), costs (what each
op costs), modeling (the torch-free Problem), decide (the planner and its record), program (the compiled
program fitted to the budget), cache (what one process leaves the next), scope (what a step holds outside
one graph); torch_adapter holds every private torch API."""
