"""``marsrl train --dry-run``: each GPU recipe offline (one line naming the hub ids, or the plan with the
shared GSM8K rows), the plan itself from config-only folders (the published head configs and targets of
the published sizes: no weights anywhere), the tiny world neither built nor rebuilt, and the checks that
must fail before a launch would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from marsrl.cli import main
from marsrl.config import ConfigError
from marsrl.experiment import ExperimentError, load_experiment
from marsrl.experiment import dry_run as dry_run_module
from marsrl.experiment.dry_run import SHARED_GSM8K, dry_run, trainer_ranks

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
GPU_RECIPES = sorted(
    p
    for p in CONFIGS.glob("grpo_*.yaml")
    if not yaml.safe_load(p.read_text())["model"].startswith("tinyworld:")
)
HEADS = REPO.parent / "shared" / "data" / "eagle3-configs"
# config.json of each recipe's target as published on the hub (the sizes the dry run reads), the published
# head config of the same shape as the recipe's drafter, and the published parameter count
TARGETS = {
    "Qwen/Qwen3-8B": (
        "Qwen3Config",
        dict(
            vocab_size=151936,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            tie_word_embeddings=False,
            max_position_embeddings=40960,
            rope_theta=1e6,
        ),
        "specforge-qwen3-8b-eagle3.json",
        "8.19 B parameters",
    ),
    "meta-llama/Llama-3.1-8B-Instruct": (
        "LlamaConfig",
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            tie_word_embeddings=False,
            max_position_embeddings=131072,
            rope_theta=5e5,
        ),
        "eagle-official-llama3.1-8b.json",
        "8.03 B parameters",
    ),
}
IDS = [p.name for p in GPU_RECIPES]


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    """Launch lines run from the repo root (trainer.deepspeed is relative); no launcher's WORLD_SIZE."""
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    yield
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()


def _first_rows() -> list[dict]:
    return [json.loads(line) for line in SHARED_GSM8K.read_text().splitlines()[:2]]


def _assert_one_line_naming(message: str, *names: str):
    assert "\n" not in message.strip() and "Traceback" not in message, message
    for name in names:
        assert f"'{name}'" in message, message


def _tokenizer(folder: Path):
    from marsrl.tinyworld.tokenizer import train_tokenizer

    tok = train_tokenizer(["Solve the problem step by step. Janet's ducks lay 16 eggs."] * 4, vocab_size=300)
    tok.save_pretrained(folder)


def _local_sources(tmp_path: Path, model: str, head_file: str | None = None) -> tuple[Path, Path]:
    """A target folder with config.json and a tokenizer only, and a head folder with config.json only."""
    import transformers

    if not HEADS.is_dir():
        pytest.skip(f"published head configs not available ({HEADS})")
    cls, sizes, published_head, _ = TARGETS[model]
    target, head = tmp_path / "target", tmp_path / "head"
    getattr(transformers, cls)(**sizes).save_pretrained(target)
    _tokenizer(target)
    head.mkdir()
    shutil.copy(HEADS / (head_file or published_head), head / "config.json")
    return target, head


# ---------------------------------------------------------------------------------------- the GPU recipes


@pytest.mark.parametrize("path", GPU_RECIPES, ids=IDS)
def test_recipe_dry_run_offline(path):
    """Offline the hub ids are not cached here: one line naming them; with them cached, the plan."""
    cfg = load_experiment(path)
    try:
        report = dry_run(cfg)
    except ExperimentError as err:
        named = [n for n in (cfg.model, cfg.drafter) if f"'{n}'" in str(err)]
        assert named, str(err)
        _assert_one_line_naming(str(err), *named)
        assert "needs a download" in str(err) or "need downloads" in str(err)
        return
    assert "== resources ==" in report and "ZeRO-3" in report
    if SHARED_GSM8K.is_file():
        assert _first_rows()[0]["question"] in report


@pytest.mark.parametrize("path", GPU_RECIPES, ids=IDS)
def test_recipe_cli_dry_run(path, capsys):
    code = main(["train", "--config", str(path.relative_to(REPO)), "--dry-run"])
    out, err = capsys.readouterr()
    assert code in (0, 2)
    if code == 2:
        assert err.startswith("marsrl train: ") and err.count("\n") == 1 and "Traceback" not in err, err
    else:
        assert "== data ==" in out and err == ""


@pytest.mark.parametrize("path", GPU_RECIPES, ids=IDS)
def test_recipe_plan_from_local_configs(path, tmp_path):
    """The plan itself: folders that hold configs and a tokenizer but no weights stand in for the hub."""
    model = yaml.safe_load(path.read_text())["model"]
    target, head = _local_sources(tmp_path, model)
    out_dir = tmp_path / "outputs"
    over = [f"model={target}", f"drafter={head}", f"output_dir={out_dir}"]
    cfg = load_experiment(path, over)
    if not SHARED_GSM8K.is_file():  # nothing to show for openai/gsm8k offline: one line naming it
        with pytest.raises(ExperimentError) as err:
            dry_run(cfg)
        _assert_one_line_naming(str(err.value), "openai/gsm8k")
        return
    report = dry_run(cfg)
    assert TARGETS[model][3] in report  # counted on the meta device from the config alone
    assert "2 rank(s) (num_processes of configs/accelerate/zero3.yaml" in report
    assert "DeepSpeed ZeRO-3 (configs/deepspeed/zero3.json)" in report
    assert "4 actor(s) x (1 GPU, 1 CPU)" in report and "worker device cuda, dtype bfloat16" in report
    assert "6 GPU(s) on one node" in report and "\nwarning " not in report
    assert "128 completions per optimizer step (16 prompts x G 8)" in report
    for arm in ("strict", "mars", "mars_l0.9"):
        assert f"{cfg.experiment}-{arm}" in report
    rows = _first_rows()
    for row in rows:
        assert row["question"] in report
    assert "(gold answer 18" in report and "<|im_start|>assistant" in report  # rendered by the chat template
    if "chat_template_kwargs" in cfg.trainer:  # Qwen3: no thinking turn
        assert "with chat_template_kwargs {'enable_thinking': False}" in report
    assert yaml.safe_load(report.split("== config (resolved) ==\n")[1].split("\n\n")[0])["model"] == str(
        target
    )
    assert not out_dir.exists()  # nothing written


def test_world_size_from_the_launcher(tmp_path, monkeypatch):
    if not SHARED_GSM8K.is_file():
        pytest.skip("shared GSM8K copy not available")
    target, head = _local_sources(tmp_path, "Qwen/Qwen3-8B")
    assert trainer_ranks(None) == (1, "no launcher and no DeepSpeed: one process")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert trainer_ranks("configs/deepspeed/zero3.json") == (4, "WORLD_SIZE, set by the launcher")
    # in-process, WORLD_SIZE alone would make TrainingArguments join a process group: plan 4 ranks instead
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setattr(dry_run_module, "trainer_ranks", lambda _: (4, "WORLD_SIZE, set by the launcher"))
    report = dry_run(
        load_experiment(CONFIGS / "grpo_qwen3_8b_mars.yaml", [f"model={target}", f"drafter={head}"])
    )
    assert "4 rank(s) (WORLD_SIZE, set by the launcher)" in report
    assert "8 GPU(s) on one node" in report and "~32.8 GB per rank" in report  # 16 B x 8.19e9 / 4
    assert "256 completions per optimizer step" in report


# ---------------------------------------------------------------------------------------- refusals


def test_head_of_another_target_is_refused(tmp_path):
    target, head = _local_sources(tmp_path, "Qwen/Qwen3-8B", head_file="eagle-official-llama3.1-8b.json")
    cfg = load_experiment(CONFIGS / "grpo_qwen3_8b_mars.yaml", [f"model={target}", f"drafter={head}"])
    with pytest.raises(ExperimentError, match=r"does not match target.*vocab_size.*128256.*151936"):
        dry_run(cfg)


def test_mistyped_folder_is_not_sent_to_the_hub(tmp_path):
    cfg = load_experiment(CONFIGS / "grpo_qwen3_8b_mars.yaml", [f"model={tmp_path / 'no-such-model'}"])
    with pytest.raises(ExperimentError, match=r"^model '.*no-such-model': no such folder$"):
        dry_run(cfg)
    target, _ = _local_sources(tmp_path, "Qwen/Qwen3-8B")
    cfg = load_experiment(CONFIGS / "grpo_qwen3_8b_mars.yaml", [f"model={target}", "drafter=./heads/qwen3"])
    with pytest.raises(ExperimentError, match=r"^drafter './heads/qwen3': no such folder$"):
        dry_run(cfg)


def test_hub_data_offline_is_one_line(tmp_path):
    target, head = _local_sources(tmp_path, "Qwen/Qwen3-8B")
    cfg = load_experiment(
        CONFIGS / "grpo_qwen3_8b_mars.yaml",
        [f"model={target}", f"drafter={head}", "data.source=someone/other-math"],
    )
    with pytest.raises(ExperimentError) as err:
        dry_run(cfg)
    _assert_one_line_naming(str(err.value), "someone/other-math")
    assert "offline" in str(err.value)


def test_trainer_and_pool_fields_are_checked(monkeypatch):
    """Every trainer field goes through MarsGRPOConfig, every pool field through PoolConfig, before any
    source is read; the batch is checked against the planned ranks."""
    path = CONFIGS / "grpo_qwen3_8b_mars.yaml"
    refused = (
        ConfigError,
        ExperimentError,
    )  # pool and trainer keys: at load once load_experiment checks them
    with pytest.raises(refused, match="max_stepz"):
        dry_run(load_experiment(path, ["trainer.max_stepz=3"]))
    with pytest.raises(refused, match="temperature must be > 0"):
        dry_run(load_experiment(path, ["trainer.temperature=0"]))
    with pytest.raises(refused, match="num_actorz"):
        dry_run(load_experiment(path, ["pool.num_actorz=3"]))
    with pytest.raises(refused, match="num_draft_tokens must be >= 1"):
        dry_run(load_experiment(path, ["pool.worker.engine.num_draft_tokens=0"]))
    monkeypatch.setattr(dry_run_module, "trainer_ranks", lambda _: (8, "planned"))
    with pytest.raises(ExperimentError, match=r"generation_batch_size 64 is not a multiple.*8 ranks = 128"):
        dry_run(
            load_experiment(
                path, ["trainer.generation_batch_size=64", "trainer.gradient_accumulation_steps=1"]
            )
        )


def test_actor_without_a_gpu_is_flagged(tmp_path):
    if not SHARED_GSM8K.is_file():
        pytest.skip("shared GSM8K copy not available")
    target, head = _local_sources(tmp_path, "Qwen/Qwen3-8B")
    cfg = load_experiment(
        CONFIGS / "grpo_qwen3_8b_mars.yaml",
        [f"model={target}", f"drafter={head}", "pool.num_gpus_per_actor=0"],
    )
    assert "onto cuda:0 beside the trainer" in dry_run(cfg)


# ---------------------------------------------------------------------------------------- the tiny world


def test_tiny_world_is_not_built(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MARSRL_CACHE", str(cache))
    report = dry_run(load_experiment(CONFIGS / "grpo_micro.yaml", ["data.n_train=4", "data.n_eval=2"]))
    assert "NOT built yet: `marsrl train` builds it first" in report
    assert "a plain chat layout (no tokenizer yet)" in report and "<user>" in report
    assert "4 training prompts, 2 held-out problems" in report
    assert not cache.exists()


def test_built_tiny_world_is_read_not_rebuilt(tmp_path, monkeypatch):
    """A world folder whose fingerprint matches is used as is: its config, tokenizer and head config."""
    from transformers import Qwen3Config

    from marsrl.drafter import Eagle3Config
    from marsrl.tinyworld import PRESETS, world_dir

    monkeypatch.setenv("MARSRL_CACHE", str(tmp_path))
    folder = world_dir(PRESETS["micro"])
    Qwen3Config(
        vocab_size=300,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
    ).save_pretrained(folder / "target")
    _tokenizer(folder / "target")
    (folder / "draft").mkdir()
    head = Eagle3Config(
        hidden_size=48,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        draft_vocab_size=64,
    )
    (folder / "draft" / "config.json").write_text(json.dumps(head.to_hf_dict()))
    (folder / "metadata.json").write_text(json.dumps({"fingerprint": PRESETS["micro"].fingerprint()}))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    report = dry_run(load_experiment(CONFIGS / "grpo_micro.yaml", ["data.n_train=4", "data.n_eval=2"]))
    assert "(built, reused)" in report and "8 layers, hidden 48" in report and "draft vocab 64" in report
    assert "the model's chat template" in report and "<|im_start|>assistant" in report
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
