"""Decisions as policies (defined in ``remat.passes.modeling.policies``): pass one as ``policy=``.

    import remat
    remat.compile(model, budget_gb=20, policy=remat.policies.save_matmuls)
    remat.compile(model, budget_gb=20, policy=remat.policies.save_ops("addmm") | my_policy)
"""

from remat.passes.modeling.policies import (
    SAFETY,
    Pin,
    Policy,
    Verdict,
    never_recompute_collectives,
    never_recompute_mutations,
    never_recompute_random,
    recompute_ops,
    save_matmuls,
    save_ops,
    user_tags,
)

__all__ = ["SAFETY", "Pin", "Policy", "Verdict", "never_recompute_collectives", "never_recompute_mutations",
           "never_recompute_random", "recompute_ops", "save_matmuls", "save_ops", "user_tags"]
