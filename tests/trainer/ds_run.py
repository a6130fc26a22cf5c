"""One MarsGRPOTrainer run under DeepSpeed on CPU (gloo), for tests/trainer/test_deepspeed.py.

    torchrun --nproc_per_node 2 tests/trainer/ds_run.py FOLDER OUT.json --stage 3 --per-device 4
    python tests/trainer/ds_run.py FOLDER OUT.json --stage 2 --per-device 8     # one rank

Rank 0 owns an in-process LocalPool (the Ray pool's interface, no cluster); every rank writes
OUT.json.rank<r> with its losses and the completions it received, rank 0 also OUT.json."""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
    os.environ.setdefault(key, value)

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import deepspeed  # noqa: E402
import torch  # noqa: E402

deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # skip the shared-memory op's 22 s JIT
torch.set_num_threads(1)


def main() -> None:
    from transformers import AutoTokenizer

    from marsrl.trainer import MarsGRPOConfig, MarsGRPOTrainer
    from tests.trainer.helpers import length_reward, local_pool, prompt_dataset

    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("out")
    parser.add_argument("--stage", type=int, default=3)
    parser.add_argument("--per-device", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    a = parser.parse_args()
    rank = int(os.environ["RANK"])
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "configs", "deepspeed", f"zero{a.stage}.json")) as f:
        ds = json.load(f)
    args = MarsGRPOConfig(
        output_dir=a.out + ".trainer",
        use_cpu=True,
        bf16=False,
        report_to="none",
        deepspeed=ds,
        per_device_train_batch_size=a.per_device,
        num_generations=4,
        max_completion_length=6,
        max_steps=a.steps,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        is_correction="token_truncate",
    )
    tok = AutoTokenizer.from_pretrained(a.folder)
    pool = local_pool(a.folder) if rank == 0 else None
    trainer = MarsGRPOTrainer(a.folder, [length_reward], args, prompt_dataset(), tok, pool=pool)
    received = []
    inner = trainer._compute_loss

    def record(model, inputs):
        received.append(inputs["completion_ids"].tolist())
        return inner(model, inputs)

    trainer._compute_loss = record
    trainer.train()
    result = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage,
        "global_step": trainer.state.global_step,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "bias": [h.get("bias/is_ratio_mean") for h in trainer.state.log_history if "loss" in h],
        "versions": [h.get("policy/version") for h in trainer.state.log_history if "loss" in h],
        "received": received,
        "pool_version": None if pool is None else pool.version,
    }
    with open(f"{a.out}.rank{rank}", "w") as f:
        json.dump(result, f)
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
