"""The draft kept in step: the EAGLE-3 head learns from the trainer's own policy forward.

- A refresh due rides the training forward when fused (no separate no-grad forward), and what the head
  learns from it equals what the separate forward gives: the loss before the update and the gradient's
  norm agree to 1e-5 on the same rollouts (fused vs ``fuse_policy_forward=False``, every row kept).
- The head's TTT loss on the policy's current states (a fresh ``capture_batch`` forward of the policy after
  the step, on the completions it just trained on) falls after a refresh; the policy is untouched by it.
- Its cost is logged in the step: ``draft/seconds`` > 0 and 0 < ``draft/share_of_step`` <= 1.
- Padding the kept rows (left and right, as TRL pads prompts and completions) changes nothing.
- The gate: the served head changes only to the live head as it was measured, when its TTT loss on the
  refresh's rows (fresh to both) is below the served head's; a live head made worse (a learning rate that
  wrecks it) is never served; the live head survives a checkpoint round trip.

Rollouts: mars at theta = 0 with sampled drafts from a random head, 8 completions of up to 8 tokens a step,
tiny world (V = 23), seeded."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from marsrl.drafter import FeatureTap
from marsrl.drafter.target import final_norm
from marsrl.drafter.train import capture_batch, ttt_loss
from marsrl.trainer import MarsGRPOConfig, MarsGRPOTrainer
from marsrl.trainer.draft import DraftRefresher
from tests.rollout.helpers import tiny_head
from tests.trainer.helpers import length_reward, local_pool, prompt_dataset, save_tiny_world
from tests.trainer.test_correction import _recording
from tests.trainer.test_fused import _forwards


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_world(tmp_path_factory.mktemp("policy"))


def _args(tmp, fuse: bool, **extra) -> MarsGRPOConfig:
    fields = dict(
        output_dir=str(tmp),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        is_correction="token_truncate",
        draft_refresh_every=1,
        draft_refresh_rows=None,
        draft_refresh_lr=1e-2,
        draft_refresh_gate=False,  # the served head trained in place; the gate has its own tests below
        fuse_policy_forward=fuse,
    )
    fields.update(extra)
    return MarsGRPOConfig(**fields)


def _trainer(folder, tmp, fuse: bool, **extra) -> MarsGRPOTrainer:
    model = AutoModelForCausalLM.from_pretrained(folder)
    head = tiny_head(model, seed=3)  # shares the trainer's policy embedding, as marsrl train builds it
    tok = AutoTokenizer.from_pretrained(folder)
    args = _args(tmp, fuse, **extra)
    return MarsGRPOTrainer(
        model, [length_reward], args, prompt_dataset(), tok, pool=local_pool(folder), drafter=head
    )


def _logged(trainer) -> dict:
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    return log


def test_refresh_rides_the_training_forward_and_equals_the_separate_one(folder, tmp_path):
    fused = _trainer(folder, tmp_path / "a", fuse=True)
    calls_f = _forwards(fused)
    fused.train()
    two = _trainer(folder, tmp_path / "b", fuse=False)
    calls_t = _forwards(two)
    two.train()

    assert calls_f == [True, True], "a refresh due keeps the fused path: no separate no-grad forward"
    assert calls_t == [False, True, True]
    log_f, log_t = _logged(fused), _logged(two)
    assert fused.draft_refreshes == two.draft_refreshes == 1
    assert log_f["draft/rows"] == log_t["draft/rows"] == 8  # every row of the generation batch
    assert log_f["draft/positions"] == log_t["draft/positions"] > 0
    assert log_f["draft/loss"] == pytest.approx(log_t["draft/loss"], rel=1e-5)
    assert log_f["draft/grad_norm"] == pytest.approx(log_t["draft/grad_norm"], rel=1e-5)
    for log in (log_f, log_t):
        assert log["draft/seconds"] > 0
        assert 0 < log["draft/share_of_step"] <= 1
        assert log["draft/seconds"] <= log["step_seconds"]
    assert fused._draft_dirty, "the refreshed head goes to the pool at the next sync"


def test_head_loss_on_the_policys_current_states_falls_after_a_refresh(folder, tmp_path):
    trainer = _trainer(folder, tmp_path, fuse=True, draft_refresh_steps=5)
    head = trainer.drafter
    before = copy.deepcopy(head)
    seen = _recording(trainer)
    trainer.train()

    ids = torch.cat([torch.cat([s["prompt_ids"], s["completion_ids"]], 1) for s in seen])
    attn = torch.cat([torch.cat([s["prompt_mask"], s["completion_mask"]], 1) for s in seen]).bool()
    mask = torch.cat([s["completion_mask"] for s in seen]).bool()
    width = seen[0]["prompt_ids"].shape[1]
    learn = torch.zeros_like(attn)
    learn[:, width - 1 : -1] = mask
    policy = trainer.accelerator.unwrap_model(trainer.model)
    states = capture_batch(policy, ids, attn, loss_mask=learn, drafter=head)  # the policy after the step

    with torch.no_grad():
        loss_before, _ = ttt_loss(before, states)
        loss_after, _ = ttt_loss(head, states)
    assert _logged(trainer)["draft/loss"] == pytest.approx(float(loss_before), rel=0.05)
    assert float(loss_after) < 0.95 * float(loss_before), (float(loss_before), float(loss_after))
    trainer._sync_weights()  # what the next generation does first: the refreshed head reaches the pool
    pool_head = trainer.pool.worker.drafter
    for name, value in head.state_dict().items():
        assert torch.equal(pool_head.state_dict()[name], value), name
    trained = {id(p) for p in trainer._refresher.trainer.params}
    assert id(head.embed_tokens.weight) not in trained, "the shared embedding is the policy's, not the head's"
    assert all(id(p) not in trained for p in policy.parameters())


def _captured(policy, head, ids, attn):
    """What the trainer's forward keeps: the three feature layers and the final norm's output."""
    kept = {}
    handle = final_norm(policy).register_forward_hook(lambda m, a, out: kept.update(h=out.detach()))
    with torch.no_grad(), FeatureTap(policy, head.config.aux_layer_ids) as tap:
        policy(input_ids=ids, attention_mask=attn.long())
        kept["features"] = tap.features()
    handle.remove()
    return kept["features"], kept["h"]


def test_padding_of_the_kept_rows_changes_nothing(folder):
    """Four rows with prompts of 6, 5, 4, 3 tokens and completions of 6, 4, 6, 5: kept together (prompts
    left-padded, completions right-padded, as TRL batches them) or each alone with no padding (then
    joined by the refresher), the head's loss and gradient norm agree."""
    policy = AutoModelForCausalLM.from_pretrained(folder).eval()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, policy.config.vocab_size, (4, 12), generator=gen)
    prompt_lens, completion_lens = (6, 5, 4, 3), (6, 4, 6, 5)
    args = _args("/tmp/unused", fuse=True, draft_refresh_rows=None)

    def refresh(parts):
        head = tiny_head(policy, seed=5)
        refresher = DraftRefresher(head, args, total_refreshes=1)
        for ids, attn, cmask in parts:
            features, hidden = _captured(policy, head, ids, attn)
            refresher.add(features, hidden, ids, attn, cmask, share=1.0)
        return refresher.refresh(policy.get_output_embeddings())

    alone = []
    for i, (p, c) in enumerate(zip(prompt_lens, completion_lens, strict=True)):
        ids = torch.cat([tokens[i, :p], tokens[i, 6 : 6 + c]]).unsqueeze(0)
        alone.append((ids, torch.ones_like(ids, dtype=torch.bool), torch.ones(1, c, dtype=torch.bool)))
    ids = torch.zeros(4, 12, dtype=torch.long)
    attn = torch.zeros(4, 12, dtype=torch.bool)
    for i, (p, c) in enumerate(zip(prompt_lens, completion_lens, strict=True)):
        ids[i, 6 - p : 6], attn[i, 6 - p : 6] = tokens[i, :p], True
        ids[i, 6 : 6 + c], attn[i, 6 : 6 + c] = tokens[i, 6 : 6 + c], True
    together = refresh([(ids, attn, attn[:, 6:])])
    apart = refresh(alone)
    assert together["draft/rows"] == apart["draft/rows"] == 4
    assert together["draft/positions"] == apart["draft/positions"] > 0
    assert together["draft/loss"] == pytest.approx(apart["draft/loss"], rel=1e-5)
    assert together["draft/grad_norm"] == pytest.approx(apart["draft/grad_norm"], rel=1e-5)


def test_refresher_state_round_trip_continues_the_same_run(folder):
    """A refresher rebuilt from another's state_dict (optimizer moments, schedule position, count) and
    the same head weights takes the same next step, to the bit: what a resumed run relies on. Warm-up 3
    steps, so a schedule restarted from 0 would step with another learning rate."""
    policy = AutoModelForCausalLM.from_pretrained(folder).eval()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, policy.config.vocab_size, (3, 10), generator=gen)
    attn = torch.ones_like(ids, dtype=torch.bool)
    cmask = torch.ones(3, 5, dtype=torch.bool)
    args = _args("/tmp/unused", fuse=True, draft_refresh_warmup_steps=3)
    head = tiny_head(policy, seed=7)
    features, hidden = _captured(policy, head, ids, attn)
    lm_head = policy.get_output_embeddings()

    first = DraftRefresher(head, args, total_refreshes=4)
    for _ in range(2):
        first.add(features, hidden, ids, attn, cmask, share=1.0)
        first.refresh(lm_head)
    copy_head = copy.deepcopy(head)
    second = DraftRefresher(copy_head, args, total_refreshes=4)
    second.load_state_dict(copy.deepcopy(first.state_dict()))
    assert second.refreshes == 2
    for refresher in (first, second):
        refresher.add(features, hidden, ids, attn, cmask, share=1.0)
    a, b = first.refresh(lm_head), second.refresh(lm_head)
    assert a["draft/lr"] == b["draft/lr"] == pytest.approx(args.draft_refresh_lr)  # warm-up over
    for (name, p), q in zip(head.named_parameters(), copy_head.parameters(), strict=True):
        assert torch.equal(p, q), name
    fresh = DraftRefresher(copy.deepcopy(copy_head), args, total_refreshes=4)
    fresh.add(features, hidden, ids, attn, cmask, share=1.0)
    assert fresh.refresh(lm_head)["draft/lr"] < args.draft_refresh_lr  # without the state: warm-up again


def _gate_setup(folder, seed: int, **extra):
    """A policy, a head, a refresher (gated unless ``extra`` says) and a function that adds 4 fresh random
    rows to it."""
    policy = AutoModelForCausalLM.from_pretrained(folder).eval()
    head = tiny_head(policy, seed=seed)
    args = _args("/tmp/unused", fuse=True, **{"draft_refresh_gate": True, **extra})
    refresher = DraftRefresher(head, args, total_refreshes=8)
    gen = torch.Generator().manual_seed(seed)

    def add_rows():
        ids = torch.randint(3, policy.config.vocab_size, (4, 10), generator=gen)
        attn = torch.ones_like(ids, dtype=torch.bool)
        features, hidden = _captured(policy, head, ids, attn)
        refresher.add(features, hidden, ids, attn, torch.ones(4, 5, dtype=torch.bool), share=1.0)

    return policy, head, refresher, add_rows


def _batch_of(refresher, lm_head):
    """The DraftBatch the refresher's next refresh trains on (its kept rows, not consumed)."""
    from marsrl.drafter.train import DraftBatch
    from marsrl.trainer.draft import _cut, _join

    part = _join([_cut(p) for p in refresher._pending])
    logits, learn = refresher._targets(lm_head, part["hidden"], part["learn"])
    return DraftBatch(part["features"], part["input_ids"], logits, learn, part["attention_mask"])


def _weights(head) -> dict:
    return {k: v.clone() for k, v in head.state_dict().items()}


def test_gate_serves_the_live_head_only_when_it_beat_the_served_one(folder):
    """Seed 11, 6 refreshes of 4 fresh random rows each at lr 1e-2: after the first (which serves
    nothing), the served head after each refresh is the live head as it was before it when its TTT loss
    on the refresh's rows (checked here against a fresh measurement of both heads) is below the served
    head's, else the served head unchanged."""
    policy, head, refresher, add_rows = _gate_setup(folder, seed=11)
    lm_head = policy.get_output_embeddings()
    start = _weights(head)
    add_rows()
    first = refresher.refresh(lm_head)
    assert first["draft/published"] == 0.0, "the first refresh has nothing measured to serve"
    for k, v in head.state_dict().items():
        assert torch.equal(v, start[k]), k
    assert refresher.live is not head and refresher.live.embed_tokens.weight is head.embed_tokens.weight
    served_any = False
    for _ in range(5):
        served, live = _weights(head), _weights(refresher.live)
        add_rows()
        batch = _batch_of(refresher, lm_head)
        measured = {
            name: refresher._measure(h, batch) for name, h in (("served", head), ("live", refresher.live))
        }
        out = refresher.refresh(lm_head)
        assert out["draft/served_accepted"] == pytest.approx(measured["served"]["accepted"], rel=1e-6)
        assert out["draft/accepted"] == pytest.approx(measured["live"]["accepted"], rel=1e-6)
        assert out["draft/served_loss"] == pytest.approx(measured["served"]["loss"], rel=1e-6)
        assert out["draft/loss"] == pytest.approx(measured["live"]["loss"], rel=1e-6)
        if out["draft/loss"] < out["draft/served_loss"]:
            assert out["draft/published"] == 1.0
            expected, served_any = live, True
        else:
            assert out["draft/published"] == 0.0
            expected = served
        for k, v in head.state_dict().items():
            assert torch.equal(v, expected[k]), k
    assert served_any, "at lr 1e-2 on one world the live head beats the random start at least once"


def test_gate_never_serves_a_live_head_made_worse(folder):
    """Seed 12: the head first learns for 12 ungated refreshes (lr 1e-2), then a gated refresher at head
    lr 5.0 without clipping wrecks the live head at every step, so its TTT loss on fresh rows is above the
    served head's: 5 refreshes serve nothing and the served head stays as it was."""
    policy, head, warm, add_rows = _gate_setup(folder, seed=12, draft_refresh_gate=False)
    lm_head = policy.get_output_embeddings()
    for _ in range(12):
        add_rows()
        warm.refresh(lm_head)
    args = _args("/tmp/unused", fuse=True, draft_refresh_gate=True, draft_refresh_lr=5.0,
                 draft_refresh_grad_clip=None)  # fmt: skip
    refresher = DraftRefresher(head, args, total_refreshes=8)
    start = _weights(head)
    for i in range(5):
        add_rows()
        refresher._pending, warm._pending = warm._pending, []
        out = refresher.refresh(lm_head)
        assert out["draft/published"] == 0.0
        if i > 0:
            assert out["draft/loss"] > out["draft/served_loss"]
    for k, v in head.state_dict().items():
        assert torch.equal(v, start[k]), k


def test_gated_refresher_round_trip_keeps_the_live_head(folder):
    """The live head (apart from the served one) is in the refresher's state, without the shared
    embedding: a refresher rebuilt on a copy of the served head and that state takes the same next step,
    to the bit."""
    policy, head, first, add_rows = _gate_setup(folder, seed=13)
    lm_head = policy.get_output_embeddings()
    for _ in range(2):
        add_rows()
        first.refresh(lm_head)
    state = copy.deepcopy(first.state_dict())
    assert "embed_tokens.weight" not in state["live"]
    served = copy.deepcopy(head)
    second = DraftRefresher(served, first.args, total_refreshes=8)
    second.load_state_dict(state)
    add_rows()
    second._pending = copy.deepcopy(first._pending)  # the same kept rows for both
    a, b = first.refresh(lm_head), second.refresh(lm_head)
    assert a["draft/loss"] == b["draft/loss"] and a["draft/published"] == b["draft/published"]
    for (name, p), q in zip(first.live.named_parameters(), second.live.parameters(), strict=True):
        assert torch.equal(p, q), name
    for (name, p), q in zip(head.named_parameters(), served.parameters(), strict=True):
        assert torch.equal(p, q), name
