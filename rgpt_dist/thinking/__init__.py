"""Silent-thinking depth recurrence (the first abstract of related_abstracts.txt; SPEC section 8):
one shared bidirectional block iterated for T thinking steps with a depth embedding, LayerScale
gains and an identity-biased gate, trained with the loss on the final step only, on three reasoning
tasks (graph reachability, nested boolean logic, relational text). These are classifiers, not language
models, so not a model family: the package reuses the algorithmic suite's seeds and RNG, and the
trainer through its own spec (docs/thinking.md).
"""
