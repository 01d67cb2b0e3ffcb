"""What the joint graph is: the user's names for its nodes, what each op is, why dynamo could not capture."""
