"""Draft-head training pieces: the draft vocabulary, the TTT attention pattern and loss against slow loop
references, capture, the trainer, online refresh plumbing, resumable offline training and the CLI."""

import io
import json
from collections import Counter

import pytest
import torch
from transformers import DynamicCache

import marsrl.drafter.offline as offline_mod
import marsrl.drafter.train as train_mod
from marsrl.drafter import Eagle3Drafter, FeatureTap
from marsrl.drafter.cli import main as cli_main
from marsrl.drafter.cli import read_jsonl
from marsrl.drafter.train import (
    DraftBatch,
    DraftTrainer,
    ResumeError,
    capture_batch,
    make_batch,
    refresh_draft,
    select_draft_vocab,
    train_offline,
    ttt_attention_mask,
    ttt_loss,
    ttt_unroll,
)
from marsrl.testing import tiny_causal_lm
from tests.drafter.helpers import randomize_
from tests.drafter.reference import old_ttt_loss

V = 64


def tiny_qwen3(seed: int = 0, lm_head_scale: float = 32.0):
    """A 6-layer Qwen3 (V 64, H 32, 4 heads / 2 kv heads, head_dim 8) with its lm_head scaled up.

    The default init gives near-uniform outputs (mean top-1 probability ~0.1 at scale 8); at 32 the
    mean top-1 probability on random contexts is ~0.55, closer to a real LM's, so acceptance means
    something at T = 1."""
    return tiny_causal_lm(vocab=V, seed=seed, lm_head_scale=lm_head_scale)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and on a shared 2-core machine two threads per process
    slowed these tests 20x when another process was busy."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3()


def random_head(target, seed=1, vd=40):
    g = torch.Generator().manual_seed(seed)
    token_ids = torch.randperm(V, generator=g)[:vd].sort().values
    return randomize_(Eagle3Drafter.from_target(target, token_ids=token_ids), seed)


# ------------------------------------------------------------------------------------------ vocabulary


def test_select_draft_vocab_hand_made_counts():
    # most frequent first, ties to the lower id, result sorted
    assert select_draft_vocab(Counter({7: 5, 5: 3, 2: 3, 9: 1}), 3, 10).tolist() == [2, 5, 7]
    assert select_draft_vocab({4: 2, 3: 2, 1: 2}, 2, 10).tolist() == [1, 3]
    # fewer distinct tokens than asked: the lowest unused ids fill in
    assert select_draft_vocab({9: 4, 1: 1}, 4, 10).tolist() == [0, 1, 2, 9]
    # sequences are counted; a [V] count tensor is taken as is
    assert select_draft_vocab([[3, 3, 4], [4, 4, 1], []], 2, 6).tolist() == [3, 4]
    assert select_draft_vocab(torch.tensor([0, 5, 1, 5, 0, 2]), 3, 6).tolist() == [1, 3, 5]
    assert select_draft_vocab([[1]], 6, 6).tolist() == list(range(6))
    with pytest.raises(ValueError, match="outside"):
        select_draft_vocab([[1, 6]], 2, 6)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        select_draft_vocab([[1]], 7, 6)


# ------------------------------------------------------------------------------------------ TTT


def test_ttt_mask_matches_elementwise_loop():
    valid = torch.tensor([[True] * 6, [False, False, True, True, True, True]])
    t = valid.shape[1]
    for step in range(4):
        mask = ttt_attention_mask(step, valid)
        assert mask.shape == (2, 1, t, (step + 1) * t) and mask.dtype == torch.float32
        for b in range(2):
            for q in range(t):
                for k in range((step + 1) * t):
                    block, s = divmod(k, t)
                    # block 0: causal over real keys (and itself); later blocks: the same row only
                    want = (s == q or (s < q and bool(valid[b, s]))) if block == 0 else s == q
                    assert (mask[b, 0, q, k] == 0).item() == want, (step, b, q, k)


def loop_reference(head, feats, ids, steps, pad):
    """Each row's chain drafted one step at a time, as the engine does: step 0 over the real rows up to t
    (causal, fresh cache), then one single-token step per later step on the same cache.

    Returns ref[j][b][t] = logits [Vd] for every (b, t, j) whose token x_{t+j+1} exists."""
    bsz, t_len = ids.shape
    ref = [[{} for _ in range(bsz)] for _ in range(steps)]
    with torch.no_grad():
        for b in range(bsz):
            p = pad[b]
            for t in range(p, t_len - 1):
                cache = DynamicCache()
                pos = torch.arange(p, t + 1).unsqueeze(0)
                hid = head.fuse(feats[b : b + 1, p : t + 1])
                logits, out = head(ids[b : b + 1, p + 1 : t + 2], hid, pos, cache)
                ref[0][b][t] = logits[0, -1]
                h = out[:, -1:]
                for j in range(1, steps):
                    if t + j + 1 >= t_len:
                        break
                    tok = ids[b : b + 1, t + j + 1 : t + j + 2]
                    logits, h = head(tok, h, torch.tensor([[t + j]]), cache)
                    ref[j][b][t] = logits[0, 0]
    return ref


def test_ttt_unroll_matches_engine_style_loop(target):
    """The vectorised unroll (one cache block per step, additive masks) equals drafting each row's chain
    one step at a time, with left padding in one row."""
    head = random_head(target)
    g = torch.Generator().manual_seed(3)
    bsz, t_len, steps = 2, 9, 4
    feats = torch.randn(bsz, t_len, head.config.fc_in_features, generator=g)
    ids = torch.randint(0, V, (bsz, t_len), generator=g)
    pad = [0, 3]
    attn = torch.arange(t_len).unsqueeze(0) >= torch.tensor(pad).unsqueeze(1)
    with torch.no_grad():
        fast = [lg for lg, _ in ttt_unroll(head, feats, ids, steps, attn)]
    ref = loop_reference(head, feats, ids, steps, pad)
    checked = 0
    for j in range(steps):
        for b in range(bsz):
            for t, want in ref[j][b].items():
                torch.testing.assert_close(fast[j][b, t], want, rtol=1e-5, atol=1e-5)
                checked += 1
    assert checked == sum(len(range(p, t_len - 1 - j)) for j in range(steps) for p in pad)


def test_ttt_block_attention_equals_dense_mask_values_and_gradients(target):
    """TTTBlocks (block 0 causal + per-row diagonal scores) = the dense [T, (j+1)T] masked attention, for
    the logits of every step and for the gradients of a loss over all steps, with left padding."""
    g = torch.Generator().manual_seed(5)
    bsz, t_len, steps = 3, 11, 7
    pad = [0, 4, 1]
    attn = torch.arange(t_len).unsqueeze(0) >= torch.tensor(pad).unsqueeze(1)
    feats = torch.randn(bsz, t_len, random_head(target).config.fc_in_features, generator=g)
    ids = torch.randint(0, V, (bsz, t_len), generator=g)
    weights = torch.randn(steps, bsz, t_len, generator=g)
    results = []
    for dense in (False, True):
        head = random_head(target, seed=6)
        outs = list(ttt_unroll(head, feats, ids, steps, attn, dense=dense))
        pairs = zip(weights, outs, strict=True)
        loss = sum((w.unsqueeze(-1) * lg.log_softmax(-1)).sum() for w, (lg, _) in pairs)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in head.named_parameters() if p.grad is not None}
        results.append(([lg.detach() for lg, _ in outs], grads))
    (fast, fast_grads), (dense_out, dense_grads) = results
    for a, b in zip(fast, dense_out, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert set(fast_grads) == set(dense_grads) and "midlayer.self_attn.k_proj.weight" in fast_grads
    for name in fast_grads:
        scale = float(dense_grads[name].abs().max())  # float32 sums in another order: relative to scale
        torch.testing.assert_close(
            fast_grads[name], dense_grads[name], rtol=1e-4, atol=1e-5 * scale, msg=name
        )


def slow_loss(head, batch, ref, steps, decay):
    """ttt_loss written position by position from the loop reference's logits."""
    ids_d = head.target_token_ids
    total, per_step, acc = 0.0, [], []
    for j in range(steps):
        ces, hits = [], []
        for b in range(batch.input_ids.shape[0]):
            for t, logits in ref[j][b].items():
                s = t + j + 1
                z = batch.target_logits[b, s]
                if not batch.loss_mask[b, s] or not head.t2d[z.argmax()]:
                    continue
                p = torch.softmax(z[ids_d], -1)
                ces.append(-(p * torch.log_softmax(logits, -1)).sum())
                hits.append(float(ids_d[logits.argmax()] == z.argmax()))
        loss_j = torch.stack(ces).mean() if ces else torch.tensor(0.0)
        per_step.append(loss_j)
        acc.append(sum(hits) / max(len(hits), 1))
        total = total + decay**j * loss_j
    return total, per_step, acc


def slow_accepted(head, batch, ref, steps):
    """Expected accepted drafts of a greedy chain from each counted row of step 0, row by row: the product
    of the target's (draft-vocabulary, renormalised) probabilities of the head's argmax drafts, summed
    over the chain, which stops at the first step that does not count."""
    ids_d = head.target_token_ids
    per_start = []
    for b in range(batch.input_ids.shape[0]):
        for t in ref[0][b]:
            chain, expected = 1.0, 0.0
            for j in range(steps):
                s = t + j + 1
                if t not in ref[j][b] or s >= batch.input_ids.shape[1]:
                    break
                z = batch.target_logits[b, s]
                if not batch.loss_mask[b, s] or not head.t2d[z.argmax()]:
                    break
                if j == 0:
                    per_start.append(None)  # a counted start
                chain *= float(torch.softmax(z[ids_d], -1)[ref[j][b][t].argmax()])
                expected += chain
            if per_start and per_start[-1] is None:
                per_start[-1] = expected
    return sum(per_start) / len(per_start)


def test_ttt_loss_matches_position_by_position(target):
    head = random_head(target, seed=2)
    g = torch.Generator().manual_seed(4)
    bsz, t_len, steps, decay = 2, 10, 4, 0.8
    pad = [0, 2]
    attn = torch.arange(t_len).unsqueeze(0) >= torch.tensor(pad).unsqueeze(1)
    batch = DraftBatch(
        features=torch.randn(bsz, t_len, head.config.fc_in_features, generator=g),
        input_ids=torch.randint(0, V, (bsz, t_len), generator=g),
        target_logits=3 * torch.randn(bsz, t_len, V, generator=g),
        loss_mask=(torch.rand(bsz, t_len, generator=g) < 0.8) & attn,
        attention_mask=attn,
    )
    # some target argmaxes fall outside the 40-token draft vocabulary: those positions must not count
    assert not head.t2d[batch.target_logits.argmax(-1)].all()
    ref = loop_reference(head, batch.features, batch.input_ids, steps, pad)
    want_total, want_steps, want_acc = slow_loss(head, batch, ref, steps, decay)
    with torch.no_grad():
        total, metrics = ttt_loss(head, batch, steps, decay)
    torch.testing.assert_close(total, want_total, rtol=1e-5, atol=1e-5)
    for j in range(steps):
        torch.testing.assert_close(metrics[f"loss_{j}"], want_steps[j], rtol=1e-5, atol=1e-5)
        assert metrics[f"acc_{j}"].item() == pytest.approx(want_acc[j])
    want_accepted = slow_accepted(head, batch, ref, steps)
    assert 0 < want_accepted < steps
    assert metrics["accepted"].item() == pytest.approx(want_accepted, rel=1e-5)


def test_ttt_loss_ignores_minus_inf_targets_outside_the_counted_positions(target):
    """A trainer may pass logits with -inf entries; a position whose draft columns are all -inf (so its
    argmax is not drafted) must not turn the loss or the gradients into NaN."""
    head = random_head(target, seed=3)
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(1, 8, V, generator=g)
    logits[0, 4, head.target_token_ids] = float("-inf")
    batch = DraftBatch(
        features=torch.randn(1, 8, head.config.fc_in_features, generator=g),
        input_ids=torch.randint(0, V, (1, 8), generator=g),
        target_logits=logits,
        loss_mask=torch.ones(1, 8, dtype=torch.bool),
    )
    loss, metrics = ttt_loss(head, batch, steps=3)
    loss.backward()
    assert torch.isfinite(loss) and metrics["positions"] < 7
    assert all(torch.isfinite(p.grad).all() for p in train_mod.trainable_parameters(head))


def test_ttt_loss_and_gradients_equal_the_former_full_vocabulary_path(target):
    """The loss over ``capture_batch(drafter=...)``'s draft columns with the fused TTT attention equals the
    former loss over full float32 logits with explicit scores (tests/drafter/reference.py): the total,
    every metric and every parameter's gradient, 7 steps, rows of different lengths (right padding)."""
    head = random_head(target, seed=7)
    seqs = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], [2, 7, 1, 8, 2, 8, 1, 8, 2], [1, 6, 1, 8, 0, 3, 3]]
    ids, attn, loss = make_batch(seqs, 12, prompt_lens=[2, 0, 3])
    full = capture_batch(target, ids, attn, head.config.aux_layer_ids, loss_mask=loss)
    draft = capture_batch(target, ids, attn, loss_mask=loss, drafter=head)
    results = []
    for batch, loss_fn in ((draft, ttt_loss), (full, old_ttt_loss)):
        head.zero_grad(set_to_none=True)
        total, metrics = loss_fn(head, batch)
        total.backward()
        grads = {n: p.grad.clone() for n, p in head.named_parameters() if p.grad is not None}
        results.append((metrics, grads))
    (new_m, new_g), (old_m, old_g) = results
    assert set(new_m) - {"accepted"} == set(old_m) and new_m["positions"] > 0  # accepted: new
    for key in old_m:
        torch.testing.assert_close(new_m[key].float(), old_m[key].float(), rtol=1e-5, atol=1e-6, msg=key)
    assert set(new_g) == set(old_g) and "midlayer.self_attn.k_proj.weight" in new_g
    for name, g in old_g.items():
        torch.testing.assert_close(new_g[name], g, rtol=1e-5, atol=1e-6 * float(g.abs().max()), msg=name)


def test_capture_batch_with_a_drafter_keeps_its_draft_columns(target):
    head = random_head(target)
    ids, attn, loss = make_batch([[1, 2, 3, 4, 5, 6], [6, 7, 8, 9]], 6)
    full = capture_batch(target, ids, attn, head.config.aux_layer_ids, loss_mask=loss)
    draft = capture_batch(target, ids, attn, loss_mask=loss, drafter=head)
    assert draft.target_logits.shape == (2, 6, 40) and draft.target_logits.dtype == torch.float32
    torch.testing.assert_close(
        draft.target_logits, full.target_logits[..., head.target_token_ids], rtol=0, atol=0
    )
    drafted = head.t2d[full.target_logits.argmax(-1)]
    assert not drafted[loss].all()  # some learned positions have an argmax outside the draft vocabulary
    assert torch.equal(draft.loss_mask, loss & drafted)
    torch.testing.assert_close(draft.features, full.features, rtol=0, atol=0)


def test_refresh_with_draft_columns_equals_refresh_with_full_logits(target):
    ids, attn, loss = make_batch([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8]], 8)
    heads = [random_head(target, seed=4), random_head(target, seed=4)]
    full = capture_batch(target, ids, attn, heads[0].config.aux_layer_ids, loss_mask=loss)
    draft = capture_batch(target, ids, attn, loss_mask=loss, drafter=heads[0])
    out = [
        refresh_draft(h, DraftTrainer(h, lr=1e-2), b.features, ids, b.target_logits, b.loss_mask, steps=2)
        for h, b in zip(heads, (full, draft), strict=True)
    ]
    assert out[0]["loss_before"] == pytest.approx(out[1]["loss_before"], rel=1e-6)
    assert out[0]["loss"] == pytest.approx(out[1]["loss"], rel=1e-5)
    with pytest.raises(ValueError, match="draft vocabulary 40"):
        ttt_loss(heads[0], DraftBatch(full.features, ids, full.target_logits[..., :50], loss))


# ------------------------------------------------------------------------------------------ capture


def test_capture_batch_features_logits_and_masks(target):
    head = random_head(target)
    ids, attn, loss = make_batch([[1, 2, 3, 4, 5], [6, 7, 8]], max_len=4, prompt_lens=[2, 0])
    assert ids.tolist() == [[1, 2, 3, 4], [6, 7, 8, 0]]
    assert attn.tolist() == [[True] * 4, [True, True, True, False]]
    # position t is learned when token t+1 is real and a response token
    assert loss.tolist() == [[False, True, True, False], [True, True, False, False]]
    batch = capture_batch(target, ids, attn, head.config.aux_layer_ids)
    assert batch.loss_mask.tolist() == [[True, True, True, False], [True, True, False, False]]
    with torch.no_grad():
        out = target(ids[1:, :3], output_hidden_states=True)
    want = torch.cat([out.hidden_states[i] for i in head.config.aux_layer_ids], -1)
    torch.testing.assert_close(batch.features[1:, :3], want)
    torch.testing.assert_close(batch.target_logits[1:, :3], out.logits.float())
    assert batch.target_logits.dtype == torch.float32 and not batch.target_logits.requires_grad


# ------------------------------------------------------------------------------------------ trainer


def test_trainer_never_touches_the_embedding_and_round_trips_its_state(target):
    head = random_head(target)
    emb_before = target.get_input_embeddings().weight.clone()
    trainer = DraftTrainer(head, lr=1e-2)
    assert all(p is not head.embed_tokens.weight for p in trainer.params)
    ids, attn, loss = make_batch([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]], 8)
    batch = capture_batch(target, ids, attn, head.config.aux_layer_ids, loss_mask=loss)
    fc_before = head.fc.weight.detach().clone()
    metrics = trainer.step(batch)
    assert {"loss", "loss_0", "acc_0", "loss_6", "acc_6", "grad_norm", "positions"} <= set(metrics)
    assert not torch.equal(head.fc.weight, fc_before)
    torch.testing.assert_close(target.get_input_embeddings().weight, emb_before, rtol=0, atol=0)
    assert head.embed_tokens.weight.data_ptr() == target.get_input_embeddings().weight.data_ptr()

    twin = random_head(target)
    twin.load_state_dict(head.state_dict())
    twin_trainer = DraftTrainer(twin, lr=1e-2)
    buf = io.BytesIO()
    torch.save(trainer.state_dict(), buf)  # through bytes, as a resume would: no tensors shared
    buf.seek(0)
    twin_trainer.load_state_dict(torch.load(buf, weights_only=True))
    assert twin_trainer.step_count == 1
    a, b = trainer.step(batch), twin_trainer.step(batch)
    assert a["loss"] == b["loss"]
    torch.testing.assert_close(head.lm_head.weight, twin.lm_head.weight, rtol=0, atol=0)


def test_refresh_draft_with_trainer_or_optimizer(target):
    ids, attn, loss = make_batch([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]], 8)
    head = random_head(target)
    with FeatureTap(target, head.config.aux_layer_ids) as tap, torch.no_grad():
        logits = target(ids).logits  # what a trainer's log-prob forward already has
        feats = tap.features()
    m = refresh_draft(head, DraftTrainer(head, lr=1e-2), feats, ids, logits, loss, steps=5)
    assert m["refresh_steps"] == 5 and m["loss"] < m["loss_before"]

    head = random_head(target, seed=5)
    opt = torch.optim.AdamW(train_mod.trainable_parameters(head), lr=1e-3)
    m = refresh_draft(head, opt, feats, ids, logits, loss, steps=3, attention_mask=attn)
    assert m["loss"] < m["loss_before"]
    bad = torch.optim.AdamW([head.embed_tokens.weight, head.fc.weight], lr=1e-2)
    with pytest.raises(ValueError, match="embedding"):
        refresh_draft(head, bad, feats, ids, logits, loss)
    with pytest.raises(ValueError, match="another drafter"):
        refresh_draft(random_head(target), DraftTrainer(head), feats, ids, logits, loss)


# ------------------------------------------------------------------------------------------ offline


def toy_sequences(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, V, (int(torch.randint(6, 14, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def test_resume_after_a_kill_reaches_the_uninterrupted_state(target, tmp_path, monkeypatch):
    seqs = toy_sequences()
    kw = dict(epochs=2, batch_size=4, max_len=12, lr=3e-3, seed=7, save_every=4, progress=False)

    def fresh():
        torch.manual_seed(11)
        return Eagle3Drafter.from_target(target, token_ids=select_draft_vocab(seqs, 48, V))

    whole = fresh()
    full = train_offline(target, whole, seqs, out_dir=tmp_path / "whole", **kw)
    assert full["steps"] == 12

    # kill the second run inside its 7th step: the save after step 4 survives, steps 5-6 are lost
    real_step = DraftTrainer.step

    def dying_step(self, batch):
        if self.step_count == 6:
            raise KeyboardInterrupt("killed")
        return real_step(self, batch)

    monkeypatch.setattr(DraftTrainer, "step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        train_offline(target, fresh(), seqs, out_dir=tmp_path / "cut", **kw)
    monkeypatch.setattr(DraftTrainer, "step", real_step)
    saved = torch.load(tmp_path / "cut" / train_mod.STATE_FILE, weights_only=True)
    assert saved["trainer"]["step"] == 4 and len(saved["losses"]) == 4

    resumed_head = fresh()  # a new process: fresh init, everything else comes from the checkpoint
    resumed = train_offline(target, resumed_head, seqs, out_dir=tmp_path / "cut", **kw)
    assert resumed["start_step"] == 4 and resumed["steps"] == 12
    assert resumed["last_loss"] == full["last_loss"] and resumed["first_loss"] == full["first_loss"]
    for (name, a), b in zip(whole.state_dict().items(), resumed_head.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    loaded = Eagle3Drafter.from_pretrained(tmp_path / "cut", target=target)
    torch.testing.assert_close(loaded.lm_head.weight, whole.lm_head.weight, rtol=0, atol=0)

    # a finished run resumes to a no-op; another schedule refuses to resume
    again = train_offline(target, fresh(), seqs, out_dir=tmp_path / "cut", **kw)
    assert again["start_step"] == again["steps"] == 12
    with pytest.raises(ResumeError, match="batch_size=4"):
        train_offline(target, fresh(), seqs, out_dir=tmp_path / "cut", **{**kw, "batch_size": 3})


def test_a_save_killed_before_its_state_keeps_the_previous_checkpoint(target, tmp_path):
    seqs = toy_sequences(8)
    kw = dict(epochs=1, batch_size=4, max_len=12, seed=0, progress=False)
    head = Eagle3Drafter.from_target(target, token_ids=torch.arange(V))
    train_offline(target, head, seqs, out_dir=tmp_path, max_steps=1, **kw)
    partial = tmp_path / offline_mod._PARTIAL
    head.save_pretrained(partial)  # a later save killed before its trainer state was written
    lm_before = Eagle3Drafter.from_pretrained(tmp_path, target=target).lm_head.weight.clone()
    resumed = Eagle3Drafter.from_target(target, token_ids=torch.arange(V))
    out = train_offline(target, resumed, seqs, out_dir=tmp_path, max_steps=1, **kw)
    assert out["start_step"] == 1 and not partial.exists()
    torch.testing.assert_close(resumed.lm_head.weight, lm_before, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------ CLI


def write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_cli_trains_on_jsonl_and_writes_a_loadable_head(target, tmp_path, capsys):
    target.save_pretrained(tmp_path / "target")
    seqs = toy_sequences(12, seed=1)
    records = [{"prompt_ids": s[:3], "completion_ids": s[3:], "reward": 1.0} for s in seqs[:10]]
    records += [{"input_ids": s} for s in seqs[10:]]
    data = write_jsonl(tmp_path / "data.jsonl", [*records[:5], "", *records[5:]])
    out = tmp_path / "head"
    base = ["draft", "train", "--target", str(tmp_path / "target"), "--data", str(data), "--out", str(out)]
    base += ["--batch-size", "4", "--max-len", "16", "--no-progress", "--device", "cpu"]
    assert cli_main([*base, "--draft-vocab", "24", "--epochs", "2"]) == 0
    assert "6 steps (from 0)" in capsys.readouterr().out
    head = Eagle3Drafter.from_pretrained(out, target=target)
    responses = [s[3:] for s in seqs[:10]] + seqs[10:]
    assert head.target_token_ids.tolist() == select_draft_vocab(responses, 24, V).tolist()
    assert (out / train_mod.STATE_FILE).is_file()
    # run again with more epochs: resumes at step 6; a different draft vocabulary cannot resume
    assert cli_main([*base, "--epochs", "3"]) == 0
    assert "9 steps (from 6)" in capsys.readouterr().out
    assert cli_main([*base, "--draft-vocab", "30"]) == 2
    assert "draft_vocab_size 24" in capsys.readouterr().err


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2, 3]", "expected a JSON object"),
        ('{"text": "hi"}', "no input_ids and no prompt_ids"),
        ('{"prompt_ids": [1, 2]}', "completion_ids is missing"),
        ('{"input_ids": [1, 2], "completion_ids": [3]}', "give either input_ids or prompt_ids"),
        ('{"input_ids": [1, "2"]}', "input_ids must be a list of integer"),
        ('{"input_ids": [1, true]}', "input_ids must be a list of integer"),
        (
            '{"prompt_ids": [1], "completion_ids": [64]}',
            r"completion_ids has ids outside the target vocabulary \[0, 64\): \[64\]",
        ),
        ('{"prompt_ids": [1], "completion_ids": []}', "completion_ids is empty"),
        ('{"input_ids": [5]}', r"input_ids has 1 token\(s\); at least 2"),
    ],
)
def test_bad_data_lines_name_file_and_line(tmp_path, line, message):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input_ids": [1, 2, 3]}, "", line])
    with pytest.raises(ValueError, match=f"d\\.jsonl:3: {message}"):
        read_jsonl(path, vocab_size=V)


def test_cli_reports_bad_data_without_a_traceback(target, tmp_path, capsys):
    target.save_pretrained(tmp_path / "target")
    data = write_jsonl(tmp_path / "d.jsonl", [{"input_ids": [1, 2, 3]}, '{"input_ids": [1, 99]}'])
    argv = ["draft", "train", "--target", str(tmp_path / "target"), "--data", str(data)]
    assert cli_main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert f"{data}:2: input_ids has ids outside" in capsys.readouterr().err
    assert cli_main([*argv[:-1], str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "no such data file" in capsys.readouterr().err
