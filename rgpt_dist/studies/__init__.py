"""Run planning for the CPU-scale studies: which runs a study trains (`plan`), with which overrides on
top of their grid configs, and how they are launched (`launch.train_runs`, through the training
launcher's module). The reports the runs feed are evaluation (rgpt_dist.studies.compare.report,
rgpt_dist.eval.ablation_table). No torch import.

    compare   make compare: every model of a scaled-down Table 1 cell, two seeds of RecurrentGPT
    ablation  make ablation: the rows of Fig. 5 on the same cell
"""
