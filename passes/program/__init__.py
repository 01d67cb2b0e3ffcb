"""The compiled program: fitting it to the budget, its memory account, the eager compiler, measuring a step."""
