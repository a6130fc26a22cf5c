"""The fixed instruction and prompt layout for GSM8K-format problems (real or synthetic).

Two ways to pose a problem, with the same words: ``prompt_messages`` for a chat template (the
instruction as the system turn, the question as the user turn) and ``render_prompt`` for a plain
language model, whose training text is ``render_prompt(question) + answer``.  Nothing here tokenizes.
"""

from __future__ import annotations

SYSTEM_PROMPT = "Solve the problem step by step. End with '#### <answer>'."


def render_prompt(question: str) -> str:
    """Plain-text prompt ``"Question: <question>\\nAnswer:\\n"``; the completion starts on a new line."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question: must be a non-empty string")
    return f"Question: {question.strip()}\nAnswer:\n"


def prompt_messages(question: str) -> list[dict[str, str]]:
    """Chat messages posing ``question``: the system instruction, then the question as the user turn."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question: must be a non-empty string")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question.strip()}]
