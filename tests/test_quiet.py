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
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # put back afterwards
    loggers = [logging.getLogger(name) for name in ("DeepSpeed", quiet.RAY_AUTH_LOGGER)]
    before = [list(log.filters) for log in loggers]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # below quiet()'s filters: anything they do not match shows
        quiet.quiet()
        yield caught
    for log, kept in zip(loggers, before, strict=True):
        log.filters[:] = kept


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


def test_ray_auth_notice_only_when_enabled(quiet_filters):
    """Ray's own notice, from its own function: 'enabled' (Ray's default) is silenced, 'disabled' shows
    (a handler on Ray's logger itself: Ray's loggers do not propagate to the root)."""
    from ray._private.authentication import authentication_token_setup as setup

    got = []
    handler = logging.Handler()
    handler.emit = lambda record: got.append(record.getMessage())
    log = logging.getLogger(quiet.RAY_AUTH_LOGGER)
    log.addHandler(handler)
    try:
        setup._warn_token_auth_enabled()
        setup._warn_token_auth_disabled()
    finally:
        log.removeHandler(handler)
    assert len(got) == 1 and got[0].startswith("Token authentication is disabled"), got


def test_marsrl_warnings_print_as_one_line(quiet_filters):
    from marsrl.trainer import trainer as marsrl_module

    ours = warnings.formatwarning("mass lost", UserWarning, marsrl_module.__file__, 386, "x = 1")
    assert ours == "marsrl: UserWarning: mass lost\n"
    theirs = warnings.formatwarning("other", UserWarning, warnings.__file__, 5, "y = 2")
    assert theirs.startswith(warnings.__file__) and "y = 2" in theirs
