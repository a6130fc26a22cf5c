"""TRL writes a model card at every checkpoint and links the wandb run's URL. An offline run has none
(wandb warns on each save): the card is written without the link, wandb's run is untouched, and an
online-looking run still hands its URL to TRL."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from marsrl.trainer import MarsGRPOConfig, MarsGRPOTrainer
from tests.trainer.helpers import length_reward, local_pool, prompt_dataset, save_tiny_world


class FakeRun:
    def __init__(self, offline: bool):
        self.offline = offline
        self.asked = 0

    @property
    def url(self):
        self.asked += 1
        return None if self.offline else "https://wandb.ai/me/proj/runs/abc"


@pytest.mark.parametrize("offline", [True, False])
def test_model_card_asks_an_offline_run_for_no_url(tmp_path, monkeypatch, offline):
    wandb = pytest.importorskip("wandb")
    folder = save_tiny_world(tmp_path / "policy")
    args = MarsGRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        report_to="none",
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        save_strategy="no",
    )
    tok = AutoTokenizer.from_pretrained(folder)
    trainer = MarsGRPOTrainer(
        folder, [length_reward], args, prompt_dataset(8), tok, pool=local_pool(folder, rule="strict")
    )
    run = FakeRun(offline)
    monkeypatch.setattr(wandb, "run", run)
    trainer.create_model_card(model_name="card")
    card = (tmp_path / "out" / "README.md").read_text()
    assert wandb.run is run  # put back
    if offline:
        assert run.asked == 0 and "wandb.ai" not in card
    else:
        assert run.asked == 1 and "https://wandb.ai/me/proj/runs/abc" in card
