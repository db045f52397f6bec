"""What the test launches' forkserver imports once (tests.helpers.dist): the libraries every
training worker imports, so that a forked worker starts with them loaded. Importing must not start
a thread or touch a GPU (the server forks after it), and nothing here may change another library:
rgpt_dist.parallel.tensor_parallel patches megatron-core when imported (rgpt_dist.parallel.
megatron_cpu), so a worker imports it itself, as a fresh process would
(tests/parallel/test_megatron_cpu.py runs megatron unpatched first)."""
import sys
import threading

from rgpt_dist.parallel.deepspeed_lib import use_cpu_accelerator

use_cpu_accelerator()  # before DeepSpeed's import, as the trainer does

import deepspeed  # noqa: E402,F401
import megatron.core.tensor_parallel  # noqa: E402,F401
import torch._dynamo  # noqa: E402,F401

import launcher.train  # noqa: E402,F401
import rgpt_dist.train.run  # noqa: E402,F401

assert threading.active_count() == 1, f"a forkserver must not fork with threads: {threading.enumerate()}"
sys.stdout.flush()  # what the imports printed must not be inherited by every child's buffer
sys.stderr.flush()
