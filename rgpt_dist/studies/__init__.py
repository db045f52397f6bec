"""The CPU-scale studies, one home each: which runs a study trains (`plan`), with which overrides on
top of their grid configs, how they are launched (`launch.train_runs`, through the training
launcher's module) and the report they feed. No torch import.

    compare      make compare / compare-long: every model of a scaled-down Table 1 cell (compare/)
    rt_compare   make compare-rt: the Recurrent Transformer against its dense partner (rt_compare/)
    ablation     make ablation: the rows of Fig. 5 on the compare cell, and its report (ablation.py)
    phi          make phi: the looped scaling law's iso-depth sweep at CPU scale (phi.py)
"""
