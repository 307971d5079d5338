"""The error hierarchy: one root, bad input as ValueError, device and store errors not."""

from __future__ import annotations

import pytest

from frontier.errors import (
    CompositionError,
    EnergyCalculusError,
    FormatError,
    InputError,
    InternalError,
    InvalidSignatureError,
)
from measure.device import DeviceError, PermissionDeniedError, UnsupportedSettingError
from measure.factory import UserCodeError
from measure.locks import LockedError
from measure.nvml import GpuLostError, RestoreFailedError
from measure.store import StoreError
from solvers.feasibility import CertificateError
from solvers.model import InfeasibleError, ProblemError


def test_root_is_an_exception_not_a_value_error():
    assert issubclass(EnergyCalculusError, Exception)
    assert not issubclass(EnergyCalculusError, ValueError)


@pytest.mark.parametrize("cls", [GpuLostError, LockedError, RestoreFailedError, PermissionDeniedError,
                                 DeviceError, StoreError])
def test_device_and_store_errors_are_not_value_errors(cls):
    # a training loop's `except ValueError` must never swallow a lost GPU or a damaged store
    assert issubclass(cls, EnergyCalculusError) and not issubclass(cls, ValueError)


@pytest.mark.parametrize("cls", [FormatError, InvalidSignatureError, CompositionError, ProblemError,
                                 InfeasibleError, UnsupportedSettingError])
def test_bad_input_is_a_value_error(cls):
    assert issubclass(cls, EnergyCalculusError) and issubclass(cls, ValueError)
    assert issubclass(cls, InputError) or issubclass(cls, DeviceError)


def test_internal_and_user_code_errors_are_in_the_hierarchy():
    assert issubclass(CertificateError, InternalError) and issubclass(CertificateError, RuntimeError)
    assert issubclass(UserCodeError, EnergyCalculusError) and not issubclass(UserCodeError, ValueError)


def test_the_cli_shows_an_internal_error_as_a_bug(monkeypatch, capsys):
    from ecal import cli, commands

    def broken(args):
        raise CertificateError("the plan's own check failed")

    monkeypatch.setattr(commands, "cmd_compose", broken)
    assert cli.main(["compose", "x.json"]) == cli.INTERNAL_ERROR_EXIT == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and "CertificateError" in err and "this is a bug" in err


@pytest.mark.parametrize("exc", [ValueError("deep inside"), KeyError("k"), TypeError("t")])
def test_a_stray_builtin_error_is_a_bug_not_bad_input(monkeypatch, capsys, exc):
    """Only the project's own errors and OSError are the user's fault (exit 2, one line);
    a bare ValueError/KeyError from deep inside is shown as the bug it is (exit 70)."""
    from ecal import cli, commands

    def broken(args):
        raise exc

    monkeypatch.setattr(commands, "cmd_compose", broken)
    assert cli.main(["compose", "x.json"]) == 70
    assert "Traceback" in capsys.readouterr().err


def test_the_projects_own_bad_input_stays_one_line_exit_2(tmp_path, capsys):
    from ecal import cli

    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "ecal.workbook/1", "signatures": {"a": {"time_s": -1}}}')
    assert cli.main(["compose", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.json" in err[0]
