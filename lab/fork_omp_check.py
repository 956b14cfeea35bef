"""Does a process forked after torch started OpenMP threads hang at its first threaded op? (~1-8 s)

The mechanism behind vLLM engine cores that never finished start-up for a multimodal target: the front end's
dummy inputs cross torch's 32,768-element grain (OpenMP threads start), then the engine core is forked and its
first threaded op waits forever. eyas's vLLM workers ask for spawn (engines/vllm.py worker_env); this says
whether the machine's torch has the problem at all. Prints one line; exit 0 either way."""
import os
import signal
import time

import torch

torch.randn(37632).to(torch.bfloat16)            # the Kimi-K2.5 toy's dummy video chunk, cast as vLLM casts it
pid = os.fork()
if pid == 0:
    torch.zeros(256, 4096)                        # vLLM's InputBatch, the engine core's first threaded op
    os._exit(0)
for _ in range(80):
    if os.waitpid(pid, os.WNOHANG)[0]:
        print(f"ok: a child forked after OpenMP ran (torch {torch.__version__}, "
              f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')})")
        break
    time.sleep(0.1)
else:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    print(f"HUNG: a child forked after OpenMP hangs (torch {torch.__version__}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')})")
