"""A small data-parallel training job traced the way a team traces its own: torch.profiler on every
rank (schedule wait 1, warm-up 1, active STEPS), DDP on gloo, a DataLoader over a dataset that
sleeps SLEEP_S per sample, and rank SLOW_RANK made late by DELAY_S per step (its forward pass waits),
so the trace reader has a known straggler and a known slow loader to find.

    torchrun --nproc-per-node 2 tests/data/traces/traced_job.py OUT_DIR
"""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile, schedule

SLEEP_S = float(os.environ.get("SLEEP_S", "0.02"))
DELAY_S = float(os.environ.get("DELAY_S", "0.04"))
SLOW_RANK = int(os.environ.get("SLOW_RANK", "1"))
STEPS = int(os.environ.get("STEPS", "4"))


class Sleepy(torch.utils.data.Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        time.sleep(SLEEP_S)                  # a slow decode or a slow file system
        return torch.randn(64), torch.randn(8)


def main(out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                                        torch.nn.Linear(256, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(torch.utils.data.DataLoader(Sleepy(), batch_size=1))
    os.makedirs(out, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=STEPS),
                 record_shapes=True,
                 on_trace_ready=lambda p: p.export_chrome_trace(os.path.join(out, f"rank{rank}.pt.trace.json"))) as prof:
        for _ in range(STEPS + 2):
            x, y = next(batches)
            if rank == SLOW_RANK:
                time.sleep(DELAY_S)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
