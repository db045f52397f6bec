"""The Recurrent Looped Transformer (RLT-0/1/2): config.py (RLTConfig, FLAVOURS), model.py (RLT).

Not yet a registered family: this package defines no `SPEC`, so `rgpt_dist.models.spec` discovery
(which imports every package under rgpt_dist/models and keeps those whose `SPEC` is a FamilySpec)
skips it, and the family-contract tests, which parametrise over every registered family, do not
run on it before its export, tensor parallelism and cached generation exist (issue 25). Build it
directly: `RLT(RLTConfig(**FLAVOURS["rlt-debug"]))`. Imports no torch.
"""
