"""The command line's filters silence exactly the understood third-party notices: each is raised by its
real source (or, for DeepSpeed's log line, logged as DeepSpeed logs it) and does not show, while another
warning of the same category and module still does."""

import logging
import os
import warnings

import pytest

from marsrl import quiet


@pytest.fixture
def quiet_filters(monkeypatch):
    monkeypatch.delenv("TRL_EXPERIMENTAL_SILENCE", raising=False)
    ds = logging.getLogger("DeepSpeed")
    before = list(ds.filters)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # below quiet()'s filters: anything they do not match shows
        quiet.quiet()
        yield caught
    ds.filters[:] = before


def test_known_warnings_are_silenced_and_others_are_not(quiet_filters):
    from transformers import TrainingArguments

    assert os.environ["TRL_EXPERIMENTAL_SILENCE"] == "1"
    TrainingArguments(output_dir="unused", gradient_checkpointing=True, report_to="none")
    assert not [w for w in quiet_filters if "gradient_checkpointing" in str(w.message)]
    warnings.warn(
        "`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning, stacklevel=1
    )
    warnings.warn(
        "You are using 'rollout_func', which is an experimental feature. ...", UserWarning, stacklevel=1
    )
    assert quiet_filters == []
    warnings.warn(
        "`foo` is deprecated and will be removed in v6.", FutureWarning, stacklevel=1
    )  # not understood: shows
    warnings.warn(
        "`gradient_checkpointing` is deprecated and will be removed in v6.", DeprecationWarning, stacklevel=1
    )
    assert [type(w.message) for w in quiet_filters] == [FutureWarning, DeprecationWarning]


def test_deepspeed_cpu_notice_only_without_cuda(quiet_filters, monkeypatch, caplog):
    ds = logging.getLogger("DeepSpeed")
    with caplog.at_level(logging.WARNING, logger="DeepSpeed"):
        monkeypatch.setattr(quiet, "_no_cuda", lambda: True)
        ds.warning(
            "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
        )
        ds.warning("some other DeepSpeed warning")
        monkeypatch.setattr(quiet, "_no_cuda", lambda: False)  # a GPU is there and DeepSpeed missed it
        ds.warning(
            "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
        )
    got = [r.getMessage() for r in caplog.records if r.name == "DeepSpeed"]
    assert got == ["some other DeepSpeed warning", got[-1]] and got[-1].startswith(
        "Setting accelerator to CPU"
    )
