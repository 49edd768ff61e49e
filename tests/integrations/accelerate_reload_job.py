"""An Accelerate job that loads a checkpoint inside its HetrainSync block (issue 68, item 7): run by
``accelerate launch`` from tests/integrations/test_accelerate_reload.py.

Three passes over a shared loader of 16 samples in batches of 4 (4 batches an epoch, over all
processes); after the first, process 0 saves the state (the shared loader's epoch reads 1); after the
second, every process loads it (the epoch back to 1); each process writes the batches it took per pass.
"""

import argparse
import datetime
import json
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

import hetrain.integrations.accelerate as hetrain_accelerate  # before Accelerator() is made
from hetrain.transport.job import job_store

parser = argparse.ArgumentParser()
parser.add_argument("--protocol", required=True)
parser.add_argument("--state", required=True)
parser.add_argument("--out", required=True)
args = parser.parse_args()

accelerator = Accelerator(cpu=True)
torch.manual_seed(accelerator.process_index)  # each process its own start: the protocol averages them
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
generator = torch.Generator().manual_seed(7)
data = TensorDataset(torch.randn(16, 4, generator=generator), torch.randint(0, 2, (16,), generator=generator))
loader = DataLoader(data, batch_size=4, shuffle=True)
store = job_store()

with hetrain_accelerate.HetrainSync(accelerator, model, optimizer, protocol=args.protocol, timeout_s=60) as sync:
    accelerator.register_for_checkpointing(sync)
    shared = sync.shared_loader(loader)
    per_pass = []
    for number in range(3):
        taken = 0
        for x, y in shared:
            optimizer.zero_grad()
            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            taken += 1
        per_pass.append(taken)
        if number == 0:
            if accelerator.is_main_process:
                accelerator.save_state(args.state)
                store.set("reload/saved", "1")
            store.wait(["reload/saved"], datetime.timedelta(seconds=60))  # the state is whole on disk
        elif number == 1:
            accelerator.load_state(args.state)
Path(args.out, f"rank{accelerator.process_index}.json").write_text(json.dumps({"per_pass": per_pass}))
