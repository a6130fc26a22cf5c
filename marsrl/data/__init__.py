"""Tasks with verifiable rewards: GSM8K-format problems (loaded from the hub or a local file, or
generated with many equally right phrasings), answer extraction and TRL-style reward functions.
Nothing here tokenizes or trains."""

from .gsm8k import REQUIRED_COLUMNS, canonical_number, extract_answer, extract_last_number, load_gsm8k
from .prompt import SYSTEM_PROMPT, prompt_messages, render_prompt
from .reward import completion_text, format_reward, gold_value, gsm8k_reward, score
from .synth import PRESETS, Difficulty, family_names, generate_problems

__all__ = [
    "PRESETS",
    "REQUIRED_COLUMNS",
    "SYSTEM_PROMPT",
    "Difficulty",
    "canonical_number",
    "completion_text",
    "extract_answer",
    "extract_last_number",
    "family_names",
    "format_reward",
    "generate_problems",
    "gold_value",
    "gsm8k_reward",
    "load_gsm8k",
    "prompt_messages",
    "render_prompt",
    "score",
]
