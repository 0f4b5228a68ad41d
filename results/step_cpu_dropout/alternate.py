"""The paper's ListOps model's training step with the fused dropout and with F.dropout's bernoulli_, alternating.

    python results/step_cpu_dropout/alternate.py none yoso_c_16 softmax

One process per call; per row, 14 rounds of one step each way (batch 32, n = 2048, 1700 real tokens, AdamW), the first
2 rounds left out; it prints the median step of each way. Alternating step by step, the VM's drift between processes
(10-30%) falls on both ways alike.
"""

import statistics
import sys
import time

import torch

import lra.model
import yoso_cuda
from lra.data.tasks import TASKS
from lra.model import AttentionConfig, ModelConfig, build_classifier

torch.set_num_threads(2)
yoso_cuda.kernels()
spec = TASKS["listops"]
for row in sys.argv[1:]:
    torch.manual_seed(0)
    model = build_classifier(spec, 2048, ModelConfig(), AttentionConfig(row)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01)
    input_ids = torch.randint(1, spec.vocab_size, (32, 2048))
    input_ids[:, 1700:] = 0
    labels = torch.randint(0, spec.num_classes, (32,))
    times = {True: [], False: []}
    for round_ in range(14):
        for fused in (True, False):
            lra.model.has_kernel = (lambda device: True) if fused else (lambda device: False)
            start = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(model(input_ids), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if round_ >= 2:
                times[fused].append(time.perf_counter() - start)
    fused, bernoulli = statistics.median(times[True]), statistics.median(times[False])
    print(f"{row} fused {fused:.3f} s bernoulli {bernoulli:.3f} s", flush=True)
