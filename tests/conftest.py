"""Shared test set-up: device journals and locks go to a per-test folder, never the user's."""

import pytest


@pytest.fixture(autouse=True)
def _private_state_dir(tmp_path_factory, monkeypatch):
    # NVMLDevice writes journals and GPU locks under $ECAL_STATE_DIR; a test must not leave
    # files in ~/.cache or see another run's journal.
    monkeypatch.setenv("ECAL_STATE_DIR", str(tmp_path_factory.mktemp("ecal-state")))
    # a developer's shell may point at a real zeusd: fake-NVML tests must never relay to it
    monkeypatch.delenv("ZEUSD_SOCK_PATH", raising=False)
    monkeypatch.delenv("ZEUSD_TOKEN", raising=False)
